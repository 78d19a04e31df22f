"""Named evaluation datasets loaded through ``datasets``: ``EvalDataset`` and ``load_eval_dataset``.

Public API::

    from rag_mag.bench.dataset_specs import load_registry, parse_dataset_arg
    from rag_mag.bench.datasets import load_eval_dataset

    registry = load_registry()                        # name -> DatasetSpec (the registry, data/datasets.yaml)
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

Rows become records in ``dataset_rows``, corpus files passages in ``dataset_corpus``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rag_mag.bench.dataset_corpus import corpus_from_contexts, load_corpus
from rag_mag.bench.dataset_rows import line_of, parse_records, rows_from_hub, rows_from_json
from rag_mag.bench.dataset_specs import DatasetSpec, parse_dataset_arg
from rag_mag.data import EvalRecord, Passage
from rag_mag.errors import ConfigError, DataError
from rag_mag.metrics.answers import contains_answer
from rag_mag.metrics.retrieval import Judgement, judge_answers, judge_supporting
from rag_mag.models import REPO_ROOT

logger = logging.getLogger(__name__)

SOURCES = ("auto", "local", "hub")


def data_root(explicit: str | os.PathLike | None = None) -> Path | None:
    """Where registry paths point: the argument, ``$RAG_MAG_DATA_ROOT``, or ``../shared/data`` if present."""
    if explicit:
        return Path(explicit).expanduser().resolve()
    if os.environ.get("RAG_MAG_DATA_ROOT"):
        return Path(os.environ["RAG_MAG_DATA_ROOT"]).expanduser().resolve()
    shared = REPO_ROOT.parent / "shared" / "data"
    return shared.resolve() if shared.is_dir() else None


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
        rows = rows_from_json(eval_path, cache_dir)
        records = parse_records(spec, rows, spec.local.fields, limit,
                                where=lambda i: f"{eval_path}:{line_of(eval_path, i)}")
        corpus_file = corpus or spec.local.corpus
        origin = f"local {eval_path}"
    else:
        if spec.hub is None:
            raise ConfigError(f"dataset {spec.name!r} has no hub id in the registry; use its local files "
                              "(set RAG_MAG_DATA_ROOT) or source='local'")
        hub = spec.hub
        rows = rows_from_hub(hub, cache_dir)
        records = parse_records(spec, rows, hub.fields, limit, where=lambda i: f"{hub.path} [{hub.split}] row {i}")
        corpus_file = corpus or (spec.local.corpus if spec.local and hub.corpus is None else None)
        origin = f"hub {hub.path}" + (f"/{hub.name}" if hub.name else "") + f" [{hub.split}]"
    if corpus_file:
        root_kind = "cwd" if corpus else (spec.local.root if spec.local else "data")
        corpus_path = _resolve(corpus_file, root_kind, root, spec.name)
        passages = load_corpus(corpus_path, cache_dir)
        origin += f" + corpus {corpus_path}"
    else:
        passages = corpus_from_contexts(records)
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
