"""Rows of an eval file: read from local JSON or the hub, and parsed into ``EvalRecord``s."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rag_mag.bench.dataset_specs import ContextFormat, DatasetSpec, FieldMap, HubSource
from rag_mag.data import Context, EvalRecord, iter_jsonl
from rag_mag.errors import DataError


def rows_from_json(path: Path, cache_dir: str | os.PathLike | None):
    import datasets

    try:
        return datasets.load_dataset("json", data_files=str(path), split="train",
                                     cache_dir=str(cache_dir) if cache_dir else None)
    except datasets.exceptions.DatasetGenerationError as error:
        for _ in iter_jsonl(path):  # raises DataError naming the first bad line
            pass
        cause = error.__cause__ or error
        raise DataError(f"{path}: the datasets library cannot read it ({cause}); make every line a JSON object "
                        "whose fields keep one type throughout the file") from None


def rows_from_hub(hub: HubSource, cache_dir: str | os.PathLike | None):
    import datasets

    try:
        return datasets.load_dataset(hub.path, hub.name, split=hub.split, revision=hub.revision,
                                     cache_dir=str(cache_dir) if cache_dir else None)
    except Exception as error:  # datasets raises many types (connection, offline mode, missing config)
        raise DataError(f"cannot load {hub.path} ({hub.name or 'default'}, split {hub.split}) from the hub: "
                        f"{type(error).__name__}: {error}. Without a hub, use the local files (source='local', "
                        "RAG_MAG_DATA_ROOT)") from error


def line_of(path: Path, row_index: int) -> int:
    """Line number of the ``row_index``-th record (blank lines are skipped by both readers)."""
    for index, (number, _) in enumerate(iter_jsonl(path)):
        if index == row_index:
            return number
    return row_index + 1


def _get(row: Mapping, dotted: str) -> Any:
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _passage_id(prefix: str, title: str, text: str) -> str:
    digest = hashlib.md5((title + "\n" + text).encode("utf-8")).hexdigest()
    return f"{prefix}_{digest[:12]}"


def _contexts(row: Mapping, fmt: ContextFormat, prefix: str) -> tuple[Context, ...]:
    value = _get(row, fmt.field)
    if not value:
        return ()
    if fmt.format == "list":
        if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
            raise ValueError(f"field {fmt.field!r} must be a list of objects")
        items = [(item.get(fmt.id) if fmt.id else None, str(item.get(fmt.title) or ""), item.get(fmt.text),
                  bool(item.get(fmt.supporting)) if fmt.supporting else False) for item in value]
    else:
        if isinstance(value, list):  # original HotpotQA / 2Wiki JSON: [[title, [sentences]], ...]
            titles, texts = [pair[0] for pair in value], [pair[1] for pair in value]
        else:
            titles, texts = value.get(fmt.title) or [], value.get(fmt.text) or []
        supporting = _get(row, fmt.supporting) if fmt.supporting else None
        if supporting is None and fmt.supporting and isinstance(_get(row, fmt.supporting.split(".")[0]), list):
            supporting = [pair[0] for pair in _get(row, fmt.supporting.split(".")[0])]
        gold = set(supporting or [])
        items = [(None, str(title), fmt.joiner.join(text) if isinstance(text, list) else text, title in gold)
                 for title, text in zip(titles, texts, strict=True)]
    contexts = []
    for passage_id, title, text, is_supporting in items:
        if not isinstance(text, str):
            raise ValueError(f"a passage of {fmt.field!r} has no text ({fmt.text!r})")
        text = re.sub(r"\s+", " ", text).strip()
        contexts.append(Context(id=str(passage_id) if passage_id is not None else _passage_id(prefix, title, text),
                                title=title, text=text, is_supporting=is_supporting))
    return tuple(contexts)


def _answers(row: Mapping, columns: Sequence[str]) -> tuple[str, ...]:
    answers: list[str] = []
    for column in columns:
        value = _get(row, column)
        for answer in value if isinstance(value, list) else [value] if value is not None else []:
            if not isinstance(answer, (str, int, float)):
                raise ValueError(f"answers in {column!r} must be strings, got {type(answer).__name__}")
            if str(answer).strip() and str(answer) not in answers:
                answers.append(str(answer))
    return tuple(answers)


def parse_records(spec: DatasetSpec, rows, fields: FieldMap, limit: int | None, where) -> list[EvalRecord]:
    records, seen = [], set()
    for index, row in enumerate(rows):
        if limit is not None and len(records) >= limit:
            break
        try:
            question = _get(row, fields.question)
            if not isinstance(question, str) or not question.strip():
                raise ValueError(f"missing or empty question ({fields.question!r})")
            answers = _answers(row, fields.answers)
            if not answers:
                raise ValueError(f"no gold answer (looked at {', '.join(repr(c) for c in fields.answers)})")
            record_id = _get(row, fields.id) if fields.id else None
            record_id = str(index + 1) if record_id is None else str(record_id)
            if record_id in seen:
                raise ValueError(f"duplicate question id {record_id!r}")
            contexts = _contexts(row, fields.contexts, spec.name) if fields.contexts else ()
        except (ValueError, TypeError, IndexError) as error:
            raise DataError(f"{where(index)}: {error}") from None
        seen.add(record_id)
        records.append(EvalRecord(id=record_id, question=question, answers=answers, contexts=contexts))
    if not records:
        raise DataError(f"dataset {spec.name!r} holds no questions")
    return records
