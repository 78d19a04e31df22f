"""Named evaluation datasets: a registry (``data/datasets.yaml``), loaded through ``datasets``.

Public API::

    registry = load_registry()                        # name -> DatasetSpec
    spec = parse_dataset_arg("hotpot_qa")             # a registered name ...
    spec = parse_dataset_arg("mine=q.jsonl,c.jsonl")  # ... or NAME=EVAL[,CORPUS] in the unified schema
    dataset = load_eval_dataset(spec, limit=500)      # EvalDataset: records, corpus, judge()
    judgements = dataset.judge_all(ranked_ids_per_question)   # -> rag_mag.metrics.score_retrieval

Local files (the unified schema of ``shared/data``) are read with ``datasets.load_dataset("json", ...)``,
which works offline; a record that cannot be read or converted is reported as ``file:line``. Paths in
the registry are relative to the data root: ``data_root`` argument, else ``$RAG_MAG_DATA_ROOT``, else
``../shared/data`` next to the repository when it exists. Hub ids, configs, splits and a field mapping
are used where a hub is reachable (``source="hub"``, or ``"auto"`` when the local files are missing).

Relevance, per question: a question whose contexts name supporting passages is judged by
supporting-passage recall; one without (TriviaQA and NQ contexts carry ``has_answer``, 2Wiki has
answers only) by answer recall, see ``rag_mag.metrics.retrieval``. A registry entry may force
``relevance: answer`` or ``supporting``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from rag_mag.data import Context, EvalRecord, Passage, iter_jsonl
from rag_mag.errors import ConfigError, DataError
from rag_mag.metrics.answers import contains_answer
from rag_mag.metrics.retrieval import Judgement, judge_answers, judge_supporting
from rag_mag.models import REPO_ROOT

logger = logging.getLogger(__name__)

REGISTRY_PATH = REPO_ROOT / "data" / "datasets.yaml"
SOURCES = ("auto", "local", "hub")
RELEVANCE = ("auto", "supporting", "answer")
CONTEXT_FORMATS = ("list", "columnar")


def data_root(explicit: str | os.PathLike | None = None) -> Path | None:
    """Where registry paths point: the argument, ``$RAG_MAG_DATA_ROOT``, or ``../shared/data`` if present."""
    if explicit:
        return Path(explicit).expanduser().resolve()
    if os.environ.get("RAG_MAG_DATA_ROOT"):
        return Path(os.environ["RAG_MAG_DATA_ROOT"]).expanduser().resolve()
    shared = REPO_ROOT.parent / "shared" / "data"
    return shared.resolve() if shared.is_dir() else None


# ------------------------------------------------------------------------------ specs
@dataclass(frozen=True)
class ContextFormat:
    """Where a row keeps its passages. ``list``: a list of objects; ``columnar``: ``{title: [...],
    text: [[sentence, ...], ...]}`` (or ``[[title, [sentences]], ...]``) with supporting *titles*."""

    format: str = "list"
    field: str = "contexts"
    id: str | None = "id"              # None: id = name + md5(title, text), as in shared/data
    title: str = "title"
    text: str = "text"
    supporting: str | None = "is_supporting"
    joiner: str = " "                  # columnar: how sentences join into a passage


@dataclass(frozen=True)
class FieldMap:
    """How a row becomes an ``EvalRecord``: dotted column names; all ``answers`` columns are pooled."""

    id: str | None = "id"
    question: str = "question"
    answers: tuple[str, ...] = ("answers", "answer", "golden_answers")
    contexts: ContextFormat | None = field(default_factory=ContextFormat)


@dataclass(frozen=True)
class LocalSource:
    eval: str
    corpus: str | None = None
    root: str = "data"                 # "data": relative to the data root; "repo": to this repository;
                                       # "cwd": the working directory, then the data root (NAME=PATH)
    fields: FieldMap = field(default_factory=FieldMap)


@dataclass(frozen=True)
class HubSource:
    path: str
    split: str
    name: str | None = None
    revision: str | None = None
    fields: FieldMap = field(default_factory=FieldMap)
    corpus: str | None = None          # "contexts": the union of the questions' passages


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    description: str = ""
    relevance: str = "auto"
    local: LocalSource | None = None
    hub: HubSource | None = None


_NESTED: dict[type, dict[str, type]] = {
    DatasetSpec: {"local": LocalSource, "hub": HubSource},
    LocalSource: {"fields": FieldMap},
    HubSource: {"fields": FieldMap},
    FieldMap: {"contexts": ContextFormat},
}


def _build(kind: type, values: Any, where: str) -> Any:
    """A spec dataclass from a YAML mapping: unknown keys are errors, nested specs are built too."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(values).__name__}")
    allowed = set(kind.__dataclass_fields__)
    unknown = set(values) - allowed
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
                          f"allowed: {', '.join(sorted(allowed))}")
    values = dict(values)
    for key, nested_kind in _NESTED.get(kind, {}).items():
        if values.get(key) is not None:
            values[key] = _build(nested_kind, values[key], f"{where}.{key}")
    if isinstance(values.get("answers"), str):
        values["answers"] = (values["answers"],)
    elif isinstance(values.get("answers"), list):
        values["answers"] = tuple(values["answers"])
    return kind(**values)


def spec_from_mapping(name: str, values: Mapping, where: str = "") -> DatasetSpec:
    """One registry entry -> ``DatasetSpec`` (validated; messages name the entry and key)."""
    where = where or f"dataset {name!r}"
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where}: expected a mapping of settings, got {type(values).__name__}")
    spec = _build(DatasetSpec, {"name": name, **values}, where)
    if spec.relevance not in RELEVANCE:
        raise ConfigError(f"{where}: relevance {spec.relevance!r} is not one of {', '.join(RELEVANCE)}")
    if spec.local and spec.local.root not in ("data", "repo"):
        raise ConfigError(f"{where}: local.root {spec.local.root!r} must be 'data' or 'repo'")
    for source in (spec.local, spec.hub):
        contexts = source.fields.contexts if source else None
        if contexts is not None and contexts.format not in CONTEXT_FORMATS:
            raise ConfigError(f"{where}: contexts format {contexts.format!r} is not one of "
                              f"{', '.join(CONTEXT_FORMATS)}")
    if spec.hub and spec.hub.corpus not in (None, "contexts"):
        raise ConfigError(f"{where}: hub.corpus must be 'contexts' or absent, got {spec.hub.corpus!r}")
    if spec.local is None and spec.hub is None:
        raise ConfigError(f"{where}: give a 'local' or a 'hub' source")
    return spec


def load_registry(path: str | os.PathLike | None = None) -> dict[str, DatasetSpec]:
    """Read ``data/datasets.yaml`` (or ``path``) into ``name -> DatasetSpec``."""
    path = Path(path) if path else REGISTRY_PATH
    if not path.is_file():
        raise ConfigError(f"dataset registry {path} does not exist; restore data/datasets.yaml from git")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"dataset registry {path} is not valid YAML: {error}") from None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"dataset registry {path} must map dataset names to entries")
    return {str(name): spec_from_mapping(str(name), values, f"{path}: {name}") for name, values in raw.items()}


def parse_dataset_arg(text: str, registry: Mapping[str, DatasetSpec] | None = None) -> DatasetSpec:
    """``NAME`` (registered) or ``NAME=EVAL.jsonl[,CORPUS.jsonl]`` (any file in the unified schema)."""
    text = text.strip()
    if "=" not in text:
        registry = load_registry() if registry is None else registry
        if text not in registry:
            raise ConfigError(f"unknown dataset {text!r}; registered datasets are: {', '.join(sorted(registry))}. "
                              "Other files in the unified schema can be given as NAME=EVAL.jsonl[,CORPUS.jsonl]")
        return registry[text]
    name, _, paths = text.partition("=")
    parts = [part.strip() for part in paths.split(",")]
    if not name.strip() or not parts[0] or len(parts) > 2:
        raise ConfigError(f"cannot read dataset argument {text!r}; the form is NAME=EVAL.jsonl[,CORPUS.jsonl]")
    local = LocalSource(eval=parts[0], corpus=parts[1] if len(parts) == 2 and parts[1] else None, root="cwd")
    return DatasetSpec(name=name.strip(), description=f"user files {paths}", local=local)


# ------------------------------------------------------------------------------ the loaded dataset
@dataclass
class EvalDataset:
    """Questions and the corpus they are searched in, with the relevance rule of the benchmark."""

    name: str
    records: list[EvalRecord]
    corpus: list[Passage]
    source: str
    relevance: str = "auto"
    _texts: dict[str, str] = field(init=False, repr=False)
    _answer_ids: dict[str, tuple[str, ...]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._texts = {passage.id: passage.content for passage in self.corpus}
        self._answer_ids = {}

    def __len__(self) -> int:
        return len(self.records)

    def mode_of(self, record: EvalRecord) -> str:
        """``supporting`` if the question names gold passages (and answer mode is not forced)."""
        if self.relevance == "answer":
            return "answer"
        return "supporting" if record.supporting_ids else "answer"

    def known_answer_ids(self, record: EvalRecord) -> tuple[str, ...]:
        """Ids of the question's own contexts (present in the corpus) whose title or text holds an alias."""
        if record.id not in self._answer_ids:
            self._answer_ids[record.id] = tuple(
                context.id for context in record.contexts
                if context.id in self._texts and contains_answer(self._texts[context.id], record.answers))
        return self._answer_ids[record.id]

    def judge(self, record: EvalRecord, ranked_ids: Sequence[str],
              ranked_texts: Sequence[str] | None = None) -> Judgement:
        """Judge one ranked list (ids best first). Answer mode matches aliases in each passage's title and
        text (``Passage.content``), looked up in the corpus unless ``ranked_texts`` are given."""
        if self.mode_of(record) == "supporting":
            return judge_supporting(ranked_ids, record.supporting_ids)
        if ranked_texts is None:
            missing = [passage_id for passage_id in ranked_ids if passage_id not in self._texts]
            if missing:
                raise ValueError(f"passage id {missing[0]!r} is not in the corpus of {self.name}; "
                                 "pass ranked_texts for passages retrieved from another corpus")
            ranked_texts = [self._texts[passage_id] for passage_id in ranked_ids]
        return judge_answers(ranked_ids, ranked_texts, record.answers, self.known_answer_ids(record))

    def judge_all(self, rankings: Sequence[Sequence[str]]) -> list[Judgement]:
        """One ranked id list per question, in the order of ``records``."""
        if len(rankings) != len(self.records):
            raise ValueError(f"got {len(rankings)} rankings for {len(self.records)} questions of {self.name}")
        return [self.judge(record, ranked) for record, ranked in zip(self.records, rankings, strict=True)]

    def relevant_passage_mask(self) -> np.ndarray:
        """Boolean per corpus passage: relevant to some question (supporting, or answer-bearing context)."""
        relevant: set[str] = set()
        for record in self.records:
            if self.mode_of(record) == "supporting":
                relevant.update(record.supporting_ids)
            else:
                relevant.update(self.known_answer_ids(record))
        return np.array([passage.id in relevant for passage in self.corpus], dtype=bool)


# ------------------------------------------------------------------------------ loading
def load_eval_dataset(spec: str | DatasetSpec, data_root_dir: str | os.PathLike | None = None,
                      source: str = "auto", limit: int | None = None, corpus: str | os.PathLike | None = None,
                      cache_dir: str | os.PathLike | None = None,
                      registry: Mapping[str, DatasetSpec] | None = None) -> EvalDataset:
    """Load questions (the first ``limit``) and their corpus (``corpus`` overrides the spec's file).

    source: ``auto`` (local files when they exist, else the hub), ``local`` or ``hub``.
    """
    spec = parse_dataset_arg(spec, registry) if isinstance(spec, str) else spec
    if source not in SOURCES:
        raise ConfigError(f"unknown dataset source {source!r}; valid sources are: {', '.join(SOURCES)}")
    if limit is not None and limit < 1:
        raise ConfigError(f"limit must be a positive number of questions, got {limit}")
    root = data_root(data_root_dir)
    use_local = source == "local" or (source == "auto" and (spec.hub is None or _local_available(spec, root)))
    if use_local:
        if spec.local is None:
            raise ConfigError(f"dataset {spec.name!r} has no local files in the registry; use source='hub'")
        eval_path = _resolve(spec.local.eval, spec.local.root, root, spec.name)
        rows = _rows_from_json(eval_path, cache_dir)
        records = _records(spec, rows, spec.local.fields, limit, where=lambda i: f"{eval_path}:{_line(eval_path, i)}")
        corpus_file = corpus or spec.local.corpus
        origin = f"local {eval_path}"
    else:
        if spec.hub is None:
            raise ConfigError(f"dataset {spec.name!r} has no hub id in the registry; use its local files "
                              "(set RAG_MAG_DATA_ROOT) or source='local'")
        hub = spec.hub
        rows = _rows_from_hub(hub, cache_dir)
        records = _records(spec, rows, hub.fields, limit, where=lambda i: f"{hub.path} [{hub.split}] row {i}")
        corpus_file = corpus or (spec.local.corpus if spec.local and hub.corpus is None else None)
        origin = f"hub {hub.path}" + (f"/{hub.name}" if hub.name else "") + f" [{hub.split}]"
    if corpus_file:
        root_kind = "cwd" if corpus else (spec.local.root if spec.local else "data")
        corpus_path = _resolve(corpus_file, root_kind, root, spec.name)
        passages = _read_corpus(corpus_path, cache_dir)
        origin += f" + corpus {corpus_path}"
    else:
        passages = _corpus_from_contexts(records)
        if not passages:
            raise DataError(f"dataset {spec.name!r} has no corpus file and its questions carry no passages; "
                            "give a corpus as NAME=EVAL.jsonl,CORPUS.jsonl")
        origin += " + corpus from its contexts"
    dataset = EvalDataset(name=spec.name, records=records, corpus=passages, source=origin, relevance=spec.relevance)
    _check_relevance(dataset)
    logger.info("dataset %s: %d questions, %d passages (%s)", spec.name, len(records), len(passages), origin)
    return dataset


def _local_available(spec: DatasetSpec, root: Path | None) -> bool:
    if spec.local is None:
        return False
    try:
        _resolve(spec.local.eval, spec.local.root, root, spec.name)
    except DataError:
        return False
    return True


def _resolve(path: str | os.PathLike, root_kind: str, root: Path | None, name: str) -> Path:
    candidate = Path(path).expanduser()
    if candidate.is_absolute():
        tried = [candidate]
    elif root_kind == "repo":
        tried = [REPO_ROOT / candidate]
    elif root_kind == "cwd":
        tried = [Path.cwd() / candidate] + ([root / candidate] if root else [])
    else:
        if root is None:
            raise DataError(f"dataset {name!r}: no data root for {path}; set RAG_MAG_DATA_ROOT to the folder that "
                            "holds the shared data (or place it at ../shared/data next to the repository)")
        tried = [root / candidate]
    for option in tried:
        if option.is_file():
            return option.resolve()
    raise DataError(f"dataset {name!r}: file {path} not found (looked at {', '.join(str(t) for t in tried)}); "
                    "check the path or RAG_MAG_DATA_ROOT")


def _rows_from_json(path: Path, cache_dir: str | os.PathLike | None):
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


def _rows_from_hub(hub: HubSource, cache_dir: str | os.PathLike | None):
    import datasets

    try:
        return datasets.load_dataset(hub.path, hub.name, split=hub.split, revision=hub.revision,
                                     cache_dir=str(cache_dir) if cache_dir else None)
    except Exception as error:  # datasets raises many types (connection, offline mode, missing config)
        raise DataError(f"cannot load {hub.path} ({hub.name or 'default'}, split {hub.split}) from the hub: "
                        f"{type(error).__name__}: {error}. Without a hub, use the local files (source='local', "
                        "RAG_MAG_DATA_ROOT)") from error


def _line(path: Path, row_index: int) -> int:
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


def _records(spec: DatasetSpec, rows, fields: FieldMap, limit: int | None, where) -> list[EvalRecord]:
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


def _read_corpus(path: Path, cache_dir: str | os.PathLike | None) -> list[Passage]:
    table = _rows_from_json(path, cache_dir)
    columns = set(table.column_names)
    text_column = "text" if "text" in columns else "contents" if "contents" in columns else None
    if "id" not in columns or text_column is None:
        raise DataError(f"{path}: a corpus needs 'id' and 'text' fields, found {', '.join(sorted(columns))}")
    ids, texts = table["id"], table[text_column]
    titles = table["title"] if "title" in columns else [""] * len(ids)
    passages, seen = [], set()
    for index, (passage_id, title, text) in enumerate(zip(ids, titles, texts, strict=True)):
        if passage_id is None or not isinstance(text, str):
            raise DataError(f"{path}:{_line(path, index)}: a passage needs an id and a text string")
        passage_id = str(passage_id)
        if passage_id in seen:
            raise DataError(f"{path}:{_line(path, index)}: duplicate passage id {passage_id!r}; ids must be unique")
        seen.add(passage_id)
        passages.append(Passage(id=passage_id, title=str(title or ""), text=text))
    if not passages:
        raise DataError(f"corpus {path} holds no passages")
    return passages


def _corpus_from_contexts(records: Sequence[EvalRecord]) -> list[Passage]:
    passages: dict[str, Passage] = {}
    for record in records:
        for context in record.contexts:
            passages.setdefault(context.id, Passage(id=context.id, title=context.title, text=context.text))
    return list(passages.values())


def _check_relevance(dataset: EvalDataset) -> None:
    corpus_ids = {passage.id for passage in dataset.corpus}
    if dataset.relevance == "supporting":
        lacking = [record.id for record in dataset.records if not record.supporting_ids]
        if lacking:
            raise DataError(f"dataset {dataset.name!r} forces supporting-passage relevance, but question "
                            f"{lacking[0]!r} (and {len(lacking) - 1} more) names no supporting passage; "
                            "use relevance: auto or answer")
    missing = sum(1 for record in dataset.records if dataset.mode_of(record) == "supporting"
                  for passage_id in record.supporting_ids if passage_id not in corpus_ids)
    if missing:
        logger.warning("dataset %s: %d supporting passages are not in its corpus; those questions cannot reach "
                       "full recall", dataset.name, missing)


def with_corpus(spec: DatasetSpec, corpus: str) -> DatasetSpec:
    """The same questions searched in another corpus (for example the pooled wiki_pool corpus)."""
    if spec.local is None:
        raise ConfigError(f"dataset {spec.name!r} has no local files to pair with corpus {corpus}")
    return replace(spec, local=replace(spec.local, corpus=corpus))
