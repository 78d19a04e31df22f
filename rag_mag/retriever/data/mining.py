"""Build training triples from question/answer pairs and a corpus, the DPR way.

For each question, BM25 ranks the corpus; the best-ranked passages that contain a gold answer
(SQuAD-normalized, whole tokens) become positives, and the best-ranked passages that contain none
become hard negatives. Questions that also occur in an evaluation set (same id, or the same
normalized question text) are left out, so mined data never leaks evaluation questions.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rag_mag.data import EvalRecord, Passage, QAPair
from rag_mag.metrics.answers import contains_answer, normalize_answer
from rag_mag.retriever.bm25 import BM25Index

logger = logging.getLogger(__name__)


@dataclass
class MiningStats:
    pairs: int = 0
    excluded_by_id: int = 0
    excluded_by_text: int = 0
    without_positive: int = 0
    without_negative: int = 0
    written: int = 0
    examples_excluded: list[str] = field(default_factory=list)


def evaluation_keys(records: Iterable[EvalRecord]) -> tuple[set[str], set[str]]:
    """Ids and normalized question texts of evaluation questions (what mined data must not contain)."""
    ids, texts = set(), set()
    for record in records:
        ids.add(record.id)
        texts.add(normalize_answer(record.question))
    return ids, texts


def mine_triples(pairs: Sequence[QAPair], corpus: Sequence[Passage], excluded_ids: set[str] = frozenset(),
                 excluded_questions: set[str] = frozenset(), top_k: int = 100, max_positives: int = 1,
                 hard_negatives: int = 4, show_progress: bool = True) -> tuple[list[dict], MiningStats]:
    """Return triple records ``{id, query, answers, positives, hard_negatives, source}`` and counts."""
    if top_k < 1 or max_positives < 1 or hard_negatives < 0:
        raise ValueError("top_k and max_positives must be at least 1, hard_negatives at least 0")
    stats = MiningStats(pairs=len(pairs))
    kept = []
    for pair in pairs:
        if pair.id in excluded_ids:
            stats.excluded_by_id += 1
        elif normalize_answer(pair.question) in excluded_questions:
            stats.excluded_by_text += 1
        else:
            kept.append(pair)
            continue
        if len(stats.examples_excluded) < 5:
            stats.examples_excluded.append(pair.question)
    index = BM25Index(corpus, show_progress=show_progress)
    ranked, _ = index.search([pair.question for pair in kept], top_k)
    triples = []
    for pair, row in zip(kept, ranked, strict=True):
        positives, negatives = [], []
        for passage_index in row:
            passage = corpus[int(passage_index)]
            if contains_answer(passage.content, pair.answers):
                if len(positives) < max_positives:
                    positives.append(passage)
            elif len(negatives) < hard_negatives:
                negatives.append(passage)
            if len(positives) >= max_positives and len(negatives) >= hard_negatives:
                break
        if not positives:
            stats.without_positive += 1
            continue
        if hard_negatives and not negatives:
            stats.without_negative += 1
        triples.append({"id": pair.id, "query": pair.question, "answers": list(pair.answers),
                        "positives": [_record(p) for p in positives],
                        "hard_negatives": [_record(p) for p in negatives], "source": "mined-bm25"})
    stats.written = len(triples)
    return triples, stats


def _record(passage: Passage) -> dict:
    return {"id": passage.id, "title": passage.title, "text": passage.text}
