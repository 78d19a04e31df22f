"""A dataset's corpus: read from a corpus file in the unified schema, or pooled from its questions' contexts."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from rag_mag.bench.dataset_rows import line_of, rows_from_json
from rag_mag.data import EvalRecord, Passage
from rag_mag.errors import DataError


def load_corpus(path: Path, cache_dir: str | os.PathLike | None) -> list[Passage]:
    table = rows_from_json(path, cache_dir)
    columns = set(table.column_names)
    text_column = "text" if "text" in columns else "contents" if "contents" in columns else None
    if "id" not in columns or text_column is None:
        raise DataError(f"{path}: a corpus needs 'id' and 'text' fields, found {', '.join(sorted(columns))}")
    ids, texts = table["id"], table[text_column]
    titles = table["title"] if "title" in columns else [""] * len(ids)
    passages, seen = [], set()
    for index, (passage_id, title, text) in enumerate(zip(ids, titles, texts, strict=True)):
        if passage_id is None or not isinstance(text, str):
            raise DataError(f"{path}:{line_of(path, index)}: a passage needs an id and a text string")
        passage_id = str(passage_id)
        if passage_id in seen:
            raise DataError(f"{path}:{line_of(path, index)}: duplicate passage id {passage_id!r}; ids must be unique")
        seen.add(passage_id)
        passages.append(Passage(id=passage_id, title=str(title or ""), text=text))
    if not passages:
        raise DataError(f"corpus {path} holds no passages")
    return passages


def corpus_from_contexts(records: Sequence[EvalRecord]) -> list[Passage]:
    passages: dict[str, Passage] = {}
    for record in records:
        for context in record.contexts:
            passages.setdefault(context.id, Passage(id=context.id, title=context.title, text=context.text))
    return list(passages.values())
