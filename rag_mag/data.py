"""JSONL data in the schema of ``shared/data``, read into frozen dataclasses.

* corpus: ``{id, title, text}``
* eval: ``{id, question, answers: [str], contexts?: [{id, title, text, is_supporting?|has_answer?}]}``
* train triples: ``{query, positives: [{title?, text} | str], hard_negatives: [...], answers?}``
* pairs: ``{question|query, answer|answers, ...}`` (question/answer pairs without passages, for mining)

Every reader accepts ``.jsonl`` and ``.jsonl.gz`` and reports a bad line by file and line number.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_mag.errors import DataError


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str

    @property
    def content(self) -> str:
        """What the encoder reads: the title, then the text."""
        return f"{self.title}\n{self.text}" if self.title else self.text


@dataclass(frozen=True)
class Context:
    id: str
    title: str
    text: str
    is_supporting: bool = False


@dataclass(frozen=True)
class EvalRecord:
    id: str
    question: str
    answers: tuple[str, ...]
    contexts: tuple[Context, ...] = ()

    @property
    def supporting_ids(self) -> tuple[str, ...]:
        return tuple(context.id for context in self.contexts if context.is_supporting)


@dataclass(frozen=True)
class Triple:
    query: str
    positives: tuple[Passage, ...]
    hard_negatives: tuple[Passage, ...] = ()
    answers: tuple[str, ...] = ()
    id: str = ""


@dataclass(frozen=True)
class QAPair:
    id: str
    question: str
    answers: tuple[str, ...]
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


# ------------------------------------------------------------------------------ raw lines
def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, record)``; blank lines are skipped, anything else must be a JSON object."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist; check the path")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise DataError(f"{path}:{number}: not valid JSON ({error.msg}); "
                                    "each line must be one JSON object") from None
                if not isinstance(record, dict):
                    raise DataError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
                yield number, record
    except (OSError, EOFError, UnicodeDecodeError) as error:
        if isinstance(error, DataError):
            raise
        raise DataError(f"cannot read {path}: {error}") from None


def write_jsonl(path: str | os.PathLike, records: Iterable[dict]) -> int:
    """Write records atomically and durably (rag_mag.durable). Returns the number written."""
    from rag_mag import durable

    count = 0
    with durable.atomic_write(path) as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    return count


def _field(path: Path, number: int, record: dict, *names: str, kind: type | tuple = str) -> Any:
    for name in names:
        if name in record and record[name] is not None:
            value = record[name]
            if not isinstance(value, kind):
                raise DataError(f"{path}:{number}: field {name!r} must be {_kind_name(kind)}, "
                                f"got {type(value).__name__}")
            return value
    raise DataError(f"{path}:{number}: missing field {' or '.join(repr(n) for n in names)}")


def _kind_name(kind: type | tuple) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join({str: "a string", list: "a list", dict: "an object"}.get(k, k.__name__) for k in kinds)


def _answers(path: Path, number: int, record: dict) -> tuple[str, ...]:
    value = _field(path, number, record, "answers", "answer", "golden_answers", kind=(list, str))
    answers = (value,) if isinstance(value, str) else tuple(str(answer) for answer in value)
    if not answers:
        raise DataError(f"{path}:{number}: 'answers' is empty; give at least one gold answer")
    return answers


def _as_list(value: Any) -> list:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _passage(path: Path, number: int, value: Any, fallback_id: str) -> Passage:
    if isinstance(value, str):
        return Passage(id=fallback_id, title="", text=value)
    if not isinstance(value, dict) or "text" not in value:
        raise DataError(f"{path}:{number}: a passage must be a string or an object with 'text'")
    return Passage(id=str(value.get("id") or fallback_id), title=str(value.get("title") or ""),
                   text=str(value["text"]))


# ------------------------------------------------------------------------------ typed readers
def iter_corpus(path: str | os.PathLike) -> Iterator[Passage]:
    """The passages of a corpus file one at a time, in file order (ids checked for uniqueness)."""
    seen = set()
    for number, record in iter_jsonl(path):
        passage_id = str(_field(Path(path), number, record, "id", kind=(str, int)))
        text = _field(Path(path), number, record, "text", "contents")
        if passage_id in seen:
            raise DataError(f"{path}:{number}: duplicate passage id {passage_id!r}; ids must be unique")
        seen.add(passage_id)
        yield Passage(id=passage_id, title=str(record.get("title") or ""), text=text)


def read_corpus(path: str | os.PathLike) -> list[Passage]:
    passages = list(iter_corpus(path))
    if not passages:
        raise DataError(f"corpus {path} holds no passages")
    return passages


def read_eval(path: str | os.PathLike, limit: int | None = None) -> list[EvalRecord]:
    records = []
    for number, record in iter_jsonl(path):
        if limit is not None and len(records) >= limit:
            break
        contexts = tuple(
            Context(id=str(c.get("id", "")), title=str(c.get("title") or ""), text=str(c.get("text") or ""),
                    is_supporting=bool(c.get("is_supporting", False)))
            for c in _field(Path(path), number, record, "contexts", kind=list)
        ) if record.get("contexts") else ()
        question = _field(Path(path), number, record, "question")
        if not question.strip():
            raise DataError(f"{path}:{number}: empty question")
        records.append(EvalRecord(id=str(record.get("id", number)), question=question,
                                  answers=_answers(Path(path), number, record), contexts=contexts))
    if not records:
        raise DataError(f"eval file {path} holds no questions")
    return records


def read_triples(path: str | os.PathLike) -> list[Triple]:
    triples = []
    for number, record in iter_jsonl(path):
        path_ = Path(path)
        query = _field(path_, number, record, "query", "question")
        positives = tuple(_passage(path_, number, value, f"L{number}-pos{i}")
                          for i, value in enumerate(_as_list(record.get("positives", record.get("positive")))))
        if not positives:
            raise DataError(f"{path}:{number}: 'positives' is empty; each query needs at least one positive")
        negatives = tuple(_passage(path_, number, value, f"L{number}-neg{i}")
                          for i, value in enumerate(_as_list(record.get("hard_negatives", record.get("negatives")))))
        answers = record.get("answers") or ()
        triples.append(Triple(query=query, positives=positives, hard_negatives=negatives,
                              answers=tuple(answers) if isinstance(answers, list) else (str(answers),),
                              id=str(record.get("id", f"L{number}"))))
    if not triples:
        raise DataError(f"training file {path} holds no examples")
    return triples


def read_pairs(path: str | os.PathLike) -> list[QAPair]:
    pairs = []
    for number, record in iter_jsonl(path):
        question = _field(Path(path), number, record, "question", "query")
        pair_id = str(record.get("id", record.get("idx", f"L{number}")))
        pairs.append(QAPair(id=pair_id, question=question, answers=_answers(Path(path), number, record)))
    if not pairs:
        raise DataError(f"pairs file {path} holds no questions")
    return pairs
