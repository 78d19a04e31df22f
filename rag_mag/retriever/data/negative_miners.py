"""Hard negatives for training rows: BM25 and dense miners over the negatives corpus, answer-free by construction."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from rag_mag.data import Passage, read_corpus
from rag_mag.metrics.answers import contains_answer
from rag_mag.precision import use_bf16
from rag_mag.retriever.data.spec import DataSpec, SourceStats

logger = logging.getLogger(__name__)


class BM25NegativeMiner:
    """BM25 over the negatives corpus, built once, searched in batches."""

    def __init__(self, corpus_path: str) -> None:
        from rag_mag.retriever.bm25 import BM25Index

        self.corpus = read_corpus(corpus_path)
        self.index = BM25Index(self.corpus, show_progress=True)

    def ranked(self, questions: Sequence[str], k: int) -> list[list[Passage]]:
        rows, _ = self.index.search(list(questions), k)
        return [[self.corpus[int(i)] for i in row] for row in rows]


class DenseNegativeMiner:
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


def fill_negatives(rows_by_source: dict[str, list[dict]], spec: DataSpec, stats: dict[str, SourceStats],
                   miner: BM25NegativeMiner | None) -> dict[str, list[dict]]:
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


def dense_negatives(rows: list[dict], spec: DataSpec, stats: dict[str, SourceStats]) -> None:
    """Give each training row ``hard_negatives`` negatives: for ``mixed`` the first half (rounded up) of its
    lexical ones, then answer-free dense neighbours that share no positive's id, text or title."""
    miner = DenseNegativeMiner(spec.negatives_corpus, spec.dense_model, bf16=use_bf16(spec.precision))
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
