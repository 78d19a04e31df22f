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

The spec lives in ``spec``, the negative miners in ``negative_miners``, the linked-positives
rule in ``linked_positives``; this module mines the positives, builds, splits and writes.
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
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rag_mag import durable, stopping
from rag_mag.data import Passage, read_corpus, read_eval, read_pairs, read_triples, write_jsonl
from rag_mag.metrics.answers import contains_answer, normalize_answer
from rag_mag.retriever.data.linked_positives import keep_linked_positives
from rag_mag.retriever.data.negative_miners import BM25NegativeMiner, dense_negatives, fill_negatives
from rag_mag.retriever.data.spec import DataSpec, SourceSpec, SourceStats

logger = logging.getLogger(__name__)

UNFILTERED_TOP_K = 100  # what `rag-mag mine` searches
GENERIC_ANSWERS = frozenset({"yes", "no", "none", "unknown", "true", "false"})


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
    miner = BM25NegativeMiner(spec.negatives_corpus) if spec.negatives_corpus and spec.hard_negatives else None
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
    rows_by_source = fill_negatives(rows_by_source, spec, stats, miner)
    train, validation, ablation = _split(rows_by_source, spec, stats)
    if spec.negative_miner != "bm25" and spec.hard_negatives:
        dense_negatives(train + ablation, spec, stats)
    if spec.positives == "linked":
        keep_linked_positives(train + ablation, stats)
    summary = {"train": len(train), "val": len(validation), "ablation": len(ablation),
               "sources": {name: asdict(value) for name, value in stats.items()},
               "spec": {k: v for k, v in asdict(spec).items() if k != "sources"},
               "source_specs": [asdict(s) for s in spec.sources]}
    files = {"train.jsonl": train, "val.jsonl": validation, **({"ablation.jsonl": ablation} if ablation else {})}
    durable.fault_point("data:built")
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
        with stopping.graceful():  # a stop signal waits until every file is replaced
            for path in sorted(staging.iterdir()):
                os.replace(path, out / path.name)
                durable.fault_point("data:replaced")
            durable.fsync_dir(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _candidates(source: SourceSpec, spec: DataSpec, stats: SourceStats, miner: BM25NegativeMiner | None) -> list[dict]:
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
