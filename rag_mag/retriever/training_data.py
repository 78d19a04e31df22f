"""Training data that teaches relevance: gold pairs first, mined pairs only where they can be trusted.

``build_training_data(spec)`` turns a ``DataSpec`` (one YAML file, see ``eval/configs/train_data.yaml``)
into two triple files, ``train.jsonl`` and ``val.jsonl``, plus ``stats.json``:

* ``triples`` sources: files that already hold gold positives (HotpotQA supporting paragraphs).
* ``gold`` sources: evaluation-schema files whose contexts mark the gold passage (NQ-open oracle);
  each question's ``is_supporting`` contexts (or, lacking the flag, every context) are its positives.
* ``mined`` sources: question/answer pairs without passages. BM25 ranks a corpus; a passage becomes a
  positive only if it holds the answer, ranks within ``positive_top_k``, and the answer is specific:
  not yes/no, not a bare number or a one-letter string, and found in at most
  ``max_answer_passages`` passages of the corpus (a generic answer such as "american" makes almost
  any passage a "positive").

Hard negatives never contain a gold answer: given ones that do are dropped, and missing ones are
filled from the BM25 ranking of ``negatives_corpus``. ``negative_miner`` says what the *training* rows end
with: ``bm25`` keeps those lexical negatives; ``dense`` replaces them with the nearest answer-free passages
of ``negatives_corpus`` under an encoder (``dense_model``, default the packaged base), passages that look
close in meaning whether or not they share the question's words; ``mixed`` keeps half of each. A dense
negative never shares a title with a positive (the same article is too often relevant). Validation rows
always keep the lexical negatives, so recipes compare on one validation set.

``positives`` says which of a training row's positives the trainer may sample: ``all``, or ``linked``:
where a row has several (HotpotQA's two supporting paragraphs), only those whose title the question
names. A bridge paragraph, reachable only through the first one, is then no longer a target for the
question alone (a single retrieval round cannot find it from the question's words; the multi-hop
pipeline's second round searches with the first passages). A row where no title is named keeps all of
its positives. Validation rows keep all of theirs.

Every question of every ``exclude`` evaluation set is dropped from all sources, by SQuAD-normalized
question text. The validation split is drawn
from gold sources only (mined positives are noisy judges) and is the same for every source mix.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rag_mag import durable
from rag_mag.data import Passage, read_corpus, read_eval, read_pairs, read_triples, write_jsonl
from rag_mag.errors import ConfigError
from rag_mag.metrics.answers import contains_answer, normalize_answer
from rag_mag.precision import parse_precision, use_bf16

logger = logging.getLogger(__name__)

SOURCE_KINDS = ("triples", "gold", "mined")
NEGATIVE_MINERS = ("bm25", "dense", "mixed")
POSITIVE_CHOICES = ("all", "linked")
UNFILTERED_TOP_K = 100  # what `rag-mag mine` searches
GENERIC_ANSWERS = frozenset({"yes", "no", "none", "unknown", "true", "false"})


@dataclass
class SourceSpec:
    name: str
    kind: str
    path: str
    corpus: str = ""        # mined: the corpus searched for positives
    limit: int = 0          # use only the first N records (0: all)
    fraction: float = 1.0   # use a seeded share of the records (the data-size axis)
    filters: bool = True    # mined: the answer-specificity filters (off: any answer-bearing passage in the top 100)
    ablation_only: bool = False  # written to ablation.jsonl for ablation runs, never to train.jsonl

    def __post_init__(self) -> None:
        if self.kind not in SOURCE_KINDS:
            raise ConfigError(f"source {self.name!r}: unknown kind {self.kind!r}; valid kinds are: "
                              f"{', '.join(SOURCE_KINDS)}")
        if self.kind == "mined" and not self.corpus:
            raise ConfigError(f"source {self.name!r}: a mined source needs a corpus to search")
        if not 0.0 < float(self.fraction) <= 1.0:
            raise ConfigError(f"source {self.name!r}: fraction must be in (0, 1], got {self.fraction}")
        if int(self.limit) < 0:
            raise ConfigError(f"source {self.name!r}: limit must be 0 or more, got {self.limit}")


@dataclass
class DataSpec:
    out: str
    sources: list[SourceSpec]
    exclude: list[str] = field(default_factory=list)    # evaluation JSONL files (their questions never train)
    negatives_corpus: str = ""                           # where missing hard negatives are mined from
    hard_negatives: int = 4
    negative_miner: str = "bm25"                         # the training rows' negatives: bm25, dense or mixed
    dense_model: str = ""                                # dense/mixed: a rag-mag checkpoint or base model folder
    precision: str = "auto"                              # dense/mixed: the encoder's precision (auto, bf16, fp32)
    positives: str = "all"                               # training rows: all positives, or question-linked ones
    negative_top_k: int = 50
    positive_top_k: int = 20
    max_answer_passages: int = 20
    min_answer_chars: int = 2
    val_queries: int = 300
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.sources:
            raise ConfigError("the data spec lists no sources")
        names = [source.name for source in self.sources]
        if len(set(names)) != len(names):
            raise ConfigError(f"source names must be unique, got {names}")
        for name in ("hard_negatives", "val_queries"):
            if int(getattr(self, name)) < 0:
                raise ConfigError(f"{name} must be 0 or more, got {getattr(self, name)}")
        for name in ("negative_top_k", "positive_top_k", "max_answer_passages", "min_answer_chars"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.negative_miner not in NEGATIVE_MINERS:
            raise ConfigError(f"negative_miner must be one of {', '.join(NEGATIVE_MINERS)}, "
                              f"got {self.negative_miner!r}")
        if self.positives not in POSITIVE_CHOICES:
            raise ConfigError(f"positives must be one of {', '.join(POSITIVE_CHOICES)}, got {self.positives!r}")
        self.precision = parse_precision(self.precision)
        if self.negative_miner != "bm25" and not self.negatives_corpus:
            raise ConfigError(f"negative_miner {self.negative_miner!r} needs a negatives_corpus to search")


def load_data_spec(path: str | Path, data_root: Path | None, overrides: dict[str, Any] | None = None) -> DataSpec:
    """Read a data spec YAML; ``{data_root}`` in paths is replaced by the shared data folder."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"data spec {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"data spec {path} is not valid YAML: {error}") from None
    raw.update(overrides or {})

    def resolve(value: str) -> str:
        if "{data_root}" in value and data_root is None:
            raise ConfigError(f"{path} refers to {{data_root}}, but no data root was found; set RAG_MAG_DATA_ROOT")
        return value.replace("{data_root}", str(data_root))

    try:
        sources = [SourceSpec(**{k: resolve(v) if isinstance(v, str) else v for k, v in source.items()})
                   for source in raw.pop("sources", [])]
        raw["exclude"] = [resolve(p) for p in raw.get("exclude", [])]
        raw["negatives_corpus"] = resolve(raw.get("negatives_corpus", ""))
        raw["dense_model"] = resolve(raw.get("dense_model", ""))
        return DataSpec(sources=sources, **raw)
    except TypeError as error:
        raise ConfigError(f"invalid data spec {path}: {error}") from None


# ------------------------------------------------------------------------------ answer specificity
class AnswerFrequency:
    """How many passages of a corpus hold an answer (whole normalized tokens), via an inverted index."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        self._texts = [f" {normalize_answer(p.content)} " for p in passages]
        self._postings: dict[str, set[int]] = defaultdict(set)
        for index, text in enumerate(self._texts):
            for token in set(text.split()):
                self._postings[token].add(index)

    def passages_with(self, answer: str) -> int:
        tokens = normalize_answer(answer).split()
        if not tokens:
            return 0
        candidates = set.intersection(*(self._postings.get(t, set()) for t in tokens))
        needle = f" {' '.join(tokens)} "
        return sum(1 for index in candidates if needle in self._texts[index])


def answer_problem(answers: Sequence[str], min_chars: int) -> str:
    """Why an answer cannot identify a positive passage ("" when it can)."""
    normalized = [normalize_answer(a) for a in answers]
    if all(a in GENERIC_ANSWERS for a in normalized):
        return "yes/no or generic"
    if all(len(a) < min_chars for a in normalized):
        return "too short"
    if all(re.fullmatch(r"\d{1,3}", a) for a in normalized):
        return "bare small number"
    return ""


# ------------------------------------------------------------------------------ building
@dataclass
class SourceStats:
    records: int = 0
    excluded_eval_overlap: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    negatives_with_answer_dropped: int = 0
    dense_negatives: int = 0   # training rows' negatives that the dense miner found
    unlinked_positives_dropped: int = 0  # positives: linked
    written: int = 0

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1


class _NegativeMiner:
    """BM25 over the negatives corpus, built once, searched in batches."""

    def __init__(self, corpus_path: str) -> None:
        from rag_mag.retriever.bm25 import BM25Index

        self.corpus = read_corpus(corpus_path)
        self.index = BM25Index(self.corpus, show_progress=True)

    def ranked(self, questions: Sequence[str], k: int) -> list[list[Passage]]:
        rows, _ = self.index.search(list(questions), k)
        return [[self.corpus[int(i)] for i in row] for row in rows]


class _DenseNegativeMiner:
    """The nearest passages of the negatives corpus under an encoder (its own similarity), encoded once."""

    def __init__(self, corpus_path: str, model: str, bf16: bool = False) -> None:
        from rag_mag.retriever.encoder import CONFIG_NAME, MagnitudeEncoder

        self.bf16 = bf16
        self.encoder = (MagnitudeEncoder.load(model) if model and (Path(model) / CONFIG_NAME).is_file()
                        else MagnitudeEncoder.build(model or None))
        self.corpus = read_corpus(corpus_path)
        logger.info("dense negatives: encoding %d passages of %s", len(self.corpus), corpus_path)
        self.documents = self.encoder.encode([p.content for p in self.corpus], "document", show_progress=True,
                                             bf16=bf16)

    def ranked(self, questions: Sequence[str], k: int) -> list[list[Passage]]:
        import numpy as np

        queries = self.encoder.encode(list(questions), "query", bf16=self.bf16)
        rows = []
        for start in range(0, len(queries), 256):
            scores = queries[start:start + 256] @ self.documents.T
            top = np.argpartition(-scores, min(k, scores.shape[1] - 1), axis=1)[:, :k]
            for row_scores, row in zip(scores, top, strict=True):
                rows.append([self.corpus[int(i)] for i in row[np.argsort(-row_scores[row])]])
        return rows


def _record(query_id: str, query: str, answers: Sequence[str], positives: Sequence[Passage],
            negatives: Sequence[Passage], source: str) -> dict:
    as_dict = lambda p: {"id": p.id, "title": p.title, "text": p.text}  # noqa: E731
    return {"id": query_id, "query": query, "answers": list(answers), "positives": [as_dict(p) for p in positives],
            "hard_negatives": [as_dict(p) for p in negatives], "source": source}


def _subsample(items: list, source: SourceSpec, seed: int) -> list:
    if source.limit:
        items = items[: source.limit]
    if source.fraction < 1.0:
        keep = sorted(random.Random(seed).sample(range(len(items)), max(1, int(len(items) * source.fraction))))
        items = [items[i] for i in keep]
    return items


def build_training_data(spec: DataSpec) -> dict[str, Any]:
    """Write ``train.jsonl``, ``val.jsonl`` (and ``ablation.jsonl``) and ``stats.json`` under ``spec.out``."""
    # By normalized question text: ids are not comparable across files (some files number their lines).
    excluded_texts = {normalize_answer(record.question) for path in spec.exclude for record in read_eval(path)}
    miner = _NegativeMiner(spec.negatives_corpus) if spec.negatives_corpus and spec.hard_negatives else None
    rows_by_source: dict[str, list[dict]] = {}
    stats: dict[str, SourceStats] = {}
    for source in spec.sources:
        source_stats = stats[source.name] = SourceStats()
        candidates = _candidates(source, spec, source_stats, miner)
        kept = []
        for candidate in candidates:
            if normalize_answer(candidate["query"]) in excluded_texts:
                source_stats.excluded_eval_overlap += 1
            else:
                kept.append(candidate)
        rows_by_source[source.name] = _subsample(kept, source, spec.seed)
        logger.info("source %s: %d candidates, %d after excluding evaluation questions, %d used", source.name,
                    len(candidates), len(kept), len(rows_by_source[source.name]))
    rows_by_source = _fill_negatives(rows_by_source, spec, stats, miner)
    train, validation, ablation = _split(rows_by_source, spec, stats)
    if spec.negative_miner != "bm25" and spec.hard_negatives:
        _dense_negatives(train + ablation, spec, stats)
    if spec.positives == "linked":
        _keep_linked_positives(train + ablation, stats)
    summary = {"train": len(train), "val": len(validation), "ablation": len(ablation),
               "sources": {name: asdict(value) for name, value in stats.items()},
               "spec": {k: v for k, v in asdict(spec).items() if k != "sources"},
               "source_specs": [asdict(s) for s in spec.sources]}
    files = {"train.jsonl": train, "val.jsonl": validation, **({"ablation.jsonl": ablation} if ablation else {})}
    write_outputs(Path(spec.out), files, summary)
    return summary


def write_outputs(out: Path, files: dict[str, list[dict]], summary: dict[str, Any]) -> None:
    """Write every output file whole into a staging folder beside ``out`` before any replaces its old version,
    so a full disk (or a kill) while writing leaves the previous build, never train.jsonl of one build beside
    val.jsonl of another."""
    durable.recover_dir(out)
    staging = durable.staging_dir(out)
    try:
        for name, rows in files.items():
            write_jsonl(staging / name, rows)
        durable.write_text(staging / "stats.json", json.dumps(summary, indent=2))
        out.mkdir(parents=True, exist_ok=True)
        for path in sorted(staging.iterdir()):
            os.replace(path, out / path.name)
        durable.fsync_dir(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _candidates(source: SourceSpec, spec: DataSpec, stats: SourceStats, miner: _NegativeMiner | None) -> list[dict]:
    if source.kind == "triples":
        rows = []
        for triple in read_triples(source.path):
            stats.records += 1
            rows.append(_record(triple.id, triple.query, triple.answers, triple.positives, triple.hard_negatives,
                                source.name))
        return rows
    if source.kind == "gold":
        rows = []
        for record in read_eval(source.path):
            stats.records += 1
            positives = [c for c in record.contexts if c.is_supporting] or list(record.contexts)
            if not positives:
                stats.drop("no gold passage")
                continue
            passages = [Passage(id=c.id, title=c.title, text=c.text) for c in positives]
            rows.append(_record(record.id, record.question, record.answers, passages, [], source.name))
        return rows
    return _mine(source, spec, stats)


def _mine(source: SourceSpec, spec: DataSpec, stats: SourceStats) -> list[dict]:
    from rag_mag.retriever.bm25 import BM25Index

    pairs = read_pairs(source.path)
    stats.records = len(pairs)
    corpus = read_corpus(source.corpus)
    frequency = AnswerFrequency(corpus)
    usable = []
    for pair in pairs:
        if not source.filters:
            usable.append(pair)
            continue
        problem = answer_problem(pair.answers, spec.min_answer_chars)
        if not problem and min(frequency.passages_with(a) for a in pair.answers) > spec.max_answer_passages:
            problem = f"answer in more than {spec.max_answer_passages} passages"
        if problem:
            stats.drop(problem)
        else:
            usable.append(pair)
    index = BM25Index(corpus, show_progress=True)
    top_k = spec.positive_top_k if source.filters else UNFILTERED_TOP_K
    ranked, _ = index.search([pair.question for pair in usable], top_k)
    rows = []
    for pair, row in zip(usable, ranked, strict=True):
        positive = next((corpus[int(i)] for i in row if contains_answer(corpus[int(i)].content, pair.answers)), None)
        if positive is None:
            stats.drop(f"no answer passage in BM25 top {top_k}")
            continue
        rows.append(_record(pair.id, pair.question, pair.answers, [positive], [], source.name))
    return rows


def _fill_negatives(rows_by_source: dict[str, list[dict]], spec: DataSpec, stats: dict[str, SourceStats],
                    miner: _NegativeMiner | None) -> dict[str, list[dict]]:
    """Drop given negatives that hold an answer; top up to ``hard_negatives`` from BM25 (answer-free)."""
    for name, rows in rows_by_source.items():
        for row in rows:
            clean = [n for n in row["hard_negatives"] if not contains_answer(f"{n['title']}\n{n['text']}",
                                                                             row["answers"])]
            stats[name].negatives_with_answer_dropped += len(row["hard_negatives"]) - len(clean)
            row["hard_negatives"] = clean
        lacking = [row for row in rows if len(row["hard_negatives"]) < spec.hard_negatives]
        if miner is None or not lacking:
            continue
        for row, ranked in zip(lacking, miner.ranked([r["query"] for r in lacking], spec.negative_top_k),
                               strict=True):
            taken = {p["id"] for p in row["positives"]} | {p["text"] for p in row["positives"]}
            taken |= {n["id"] for n in row["hard_negatives"]}
            for passage in ranked:
                if len(row["hard_negatives"]) >= spec.hard_negatives:
                    break
                if passage.id in taken or passage.text in taken or contains_answer(passage.content, row["answers"]):
                    continue
                row["hard_negatives"].append({"id": passage.id, "title": passage.title, "text": passage.text})
                taken.add(passage.id)
    return rows_by_source


def _dense_negatives(rows: list[dict], spec: DataSpec, stats: dict[str, SourceStats]) -> None:
    """Give each training row ``hard_negatives`` negatives: for ``mixed`` the first half (rounded up) of its
    lexical ones, then answer-free dense neighbours that share no positive's id, text or title."""
    miner = _DenseNegativeMiner(spec.negatives_corpus, spec.dense_model, bf16=use_bf16(spec.precision))
    keep = (spec.hard_negatives + 1) // 2 if spec.negative_miner == "mixed" else 0
    for row, ranked in zip(rows, miner.ranked([r["query"] for r in rows], spec.negative_top_k), strict=True):
        row["hard_negatives"] = row["hard_negatives"][:keep]
        taken = {p["id"] for p in row["positives"]} | {p["text"] for p in row["positives"]}
        taken |= {n["id"] for n in row["hard_negatives"]} | {n["text"] for n in row["hard_negatives"]}
        titles = {p["title"] for p in row["positives"] if p["title"]}
        for passage in ranked:
            if len(row["hard_negatives"]) >= spec.hard_negatives:
                break
            if (passage.id in taken or passage.text in taken or passage.title in titles
                    or contains_answer(passage.content, row["answers"])):
                continue
            row["hard_negatives"].append({"id": passage.id, "title": passage.title, "text": passage.text})
            taken |= {passage.id, passage.text}
            stats[row["source"]].dense_negatives += 1


def title_words(title: str) -> str:
    """A title as the question would name it: without a disambiguation such as "(album)", normalized."""
    return normalize_answer(re.sub(r"\s*\([^)]*\)", " ", title))


def linked_positives(query: str, positives: list[dict]) -> list[dict]:
    """The positives whose title the question names (as whole words), or all of them if it names none."""
    question = f" {normalize_answer(query)} "
    linked = [p for p in positives if (words := title_words(p["title"])) and f" {words} " in question]
    return linked or positives


def _keep_linked_positives(rows: list[dict], stats: dict[str, SourceStats]) -> None:
    for row in rows:  # a lone positive is kept whether or not it is named (linked_positives never empties a row)
        kept = linked_positives(row["query"], row["positives"])
        stats[row["source"]].unlinked_positives_dropped += len(row["positives"]) - len(kept)
        row["positives"] = kept


def _split(rows_by_source: dict[str, list[dict]], spec: DataSpec,
           stats: dict[str, SourceStats]) -> tuple[list[dict], list[dict], list[dict]]:
    """Validation: a seeded share of the gold sources' queries (by normalized text); the rest trains.

    Returns (train, validation, ablation): ``ablation_only`` sources go to the third list.
    """
    gold = [row for source in spec.sources if source.kind != "mined" and not source.ablation_only
            for row in rows_by_source[source.name]]
    queries = sorted({normalize_answer(row["query"]) for row in gold})
    random.Random(spec.seed).shuffle(queries)
    held_out = set(queries[: spec.val_queries])
    train, validation, ablation = [], [], []
    for source in spec.sources:
        for row in rows_by_source[source.name]:
            if normalize_answer(row["query"]) in held_out:
                (validation if source.kind != "mined" and not source.ablation_only else []).append(row)
            else:
                (ablation if source.ablation_only else train).append(row)
        stats[source.name].written = sum(1 for row in rows_by_source[source.name]
                                         if normalize_answer(row["query"]) not in held_out)
        logger.info("source %s: %d training triples", source.name, stats[source.name].written)
    random.Random(spec.seed + 1).shuffle(train)
    random.Random(spec.seed + 2).shuffle(ablation)
    return train, validation, ablation
