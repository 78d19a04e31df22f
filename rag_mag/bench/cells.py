"""One benchmark cell: a system on one dataset, scored from what the YAML pipelines return.

* Dense systems (a strategy's trained checkpoint, or ``base_cosine``): the corpus is embedded with
  ``RagMagDocumentEmbedder`` into an on-disk ``FAISSDocumentStore`` (built once per checkpoint and
  corpus). The retrieval pipeline (``pipelines/retrieve.yaml``) ranks the corpus for every question
  (recall@k, nDCG@10, MRR@10: the retriever's ranking); the scored pipeline (``rag.yaml``,
  ``rag_multihop.yaml`` or a user's file) answers every question through ``Pipeline.run``.
* Reader baselines answer through the reader pipeline (``pipelines/reader.yaml``): ``bm25`` with the
  BM25 top-k, ``closed_book`` with no passages, ``oracle`` with the question's gold passages.

"Retrieval at budget": the passages the reader was given (for a multi-hop pipeline, the union of all
rounds, as ``answer_builder.documents`` holds them) are judged at their own number, the budget; the
retriever's first round alone is judged at the same budget (its top-``budget`` for the question).
Their difference says whether the later rounds helped.

A cell returns plain JSON: aggregates, per-question values (for bootstrap and paired tests), the
predictions, and the paper's diagnostics.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from haystack import Document

from rag_mag.bench.datasets import EvalDataset
from rag_mag.metrics.retrieval import recall

logger = logging.getLogger(__name__)
RECALL_CURVE_K = 20


def corpus_documents(dataset: EvalDataset) -> list[Document]:
    return [Document(id=p.id, content=p.text, meta={"title": p.title}) for p in dataset.corpus]


@dataclass(frozen=True)
class BuiltIndex:
    path: Path
    document_raw_norms: np.ndarray  # (n_passages,), in corpus order


def build_index(dataset: EvalDataset, checkpoint: Path, folder: Path, precision: str = "auto") -> BuiltIndex:
    """Embed the corpus with the checkpoint into a FAISS index folder (reused when it is already there)."""
    from rag_mag.components.document_embedder import RAW_NORM_KEY, RagMagDocumentEmbedder
    from rag_mag.components.faiss_document_store import FAISSDocumentStore

    store = FAISSDocumentStore(path=str(folder))
    if store.exists():
        stored = {d.id: d.meta.get(RAW_NORM_KEY) for d in store.filter_documents()}
    else:
        embedder = RagMagDocumentEmbedder(model=str(checkpoint), batch_size=64, progress_bar=True,
                                          precision=precision)
        embedder.warm_up()
        embedded = embedder.run(corpus_documents(dataset))["documents"]
        FAISSDocumentStore(path=str(folder), recreate=True).write_documents(embedded)
        stored = {d.id: d.meta.get(RAW_NORM_KEY) for d in embedded}
    norms = np.array([stored[p.id] for p in dataset.corpus], dtype=float)
    return BuiltIndex(path=folder, document_raw_norms=norms)


def ranking_result(outputs: dict) -> dict:
    """What the benchmark keeps of one retrieval pipeline run (its declared ``documents`` output): ranked ids and
    the query's raw norm."""
    if "documents" not in outputs:
        raise ValueError("the retrieval pipeline declares no documents output (metadata.rag_mag.outputs.documents)")
    documents = outputs["documents"]
    raw = next((d.meta.get("query_raw_norm") for d in documents if d.meta.get("query_raw_norm") is not None), None)
    return {"ids": [d.id for d in documents], "query_raw_norm": raw}


def answer_result(outputs: dict) -> dict:
    """What the benchmark keeps of one answering pipeline run: the raw reply and the passages the reader got
    (with the retrieval round of each, where the pipeline tags it), from its declared ``answers`` output, and
    the number of retrieval rounds (its ``queries`` output, where it declares one, as rag_multihop.yaml does)."""
    from rag_mag.serving.answers import first_answer

    answer = first_answer(outputs)
    return {"reply": answer.data or "",
            "documents": [[d.id, (d.meta or {}).get("hop")] for d in (answer.documents or [])],
            "rounds": len(outputs["queries"]) if outputs.get("queries") else 1}


def bm25_rank(dataset: EvalDataset, top_k: int) -> list[list[str]]:
    from rag_mag.retriever.bm25 import BM25Index

    rows, _ = BM25Index(dataset.corpus).search([r.question for r in dataset.records], top_k)
    return [[dataset.corpus[i].id for i in row] for row in rows]


def gold_documents(dataset: EvalDataset, cap: int) -> list[list[Document]] | None:
    """Per question, its gold passages: the supporting ones where the data names them, else its own
    answer-bearing contexts (at most ``cap`` of those). ``None`` when no question has any (no oracle)."""
    passages = {p.id: p for p in dataset.corpus}
    gold: list[list[Document]] = []
    for record in dataset.records:
        if dataset.mode_of(record) == "supporting":
            ids = [i for i in record.supporting_ids if i in passages]
        else:
            ids = list(dataset.known_answer_ids(record))[:cap]
        gold.append([Document(id=i, content=passages[i].text, meta={"title": passages[i].title}) for i in ids])
    return gold if any(gold) else None


def budget_recall(dataset: EvalDataset, given: Sequence[Sequence[str]],
                  ranked: Sequence[Sequence[str]] | None) -> dict[str, np.ndarray]:
    """Per question: the budget (number of passages the reader got), recall of those passages at that
    budget, and recall of the retriever's own first-round ranking cut at the same budget.

    Recall is the dataset's: the fraction of supporting passages found, or an answer-bearing hit."""
    budgets, union, first = [], [], []
    for index, record in enumerate(dataset.records):
        ids = list(dict.fromkeys(given[index]))
        budget = len(ids)
        budgets.append(budget)
        union.append(recall(dataset.judge(record, ids), budget) if budget else 0.0)
        if ranked is not None:
            top = list(ranked[index])[:budget]
            first.append(recall(dataset.judge(record, top), budget) if budget and top else 0.0)
    result = {"budget": np.asarray(budgets, dtype=float), "recall@budget": np.asarray(union, dtype=float)}
    if ranked is not None:
        result["round1_recall@budget"] = np.asarray(first, dtype=float)
    return result


def ranking_scores(dataset: EvalDataset, ranked: Sequence[Sequence[str]]) -> dict:
    """The retriever's ranking metrics (recall@1/5/20, complete@k, nDCG@10, MRR@10) and recall curve."""
    from rag_mag.metrics import recall_curve, score_retrieval

    judgements = dataset.judge_all([list(ids) for ids in ranked])
    scores = score_retrieval(judgements)
    return {"retrieval": dict(scores.means), "retrieval_mode": scores.mode,
            "retrieval_per_example": {k: v.tolist() for k, v in scores.per_example.items()},
            "recall_curve": recall_curve(judgements, RECALL_CURVE_K)}


def answer_scores(predictions: list[str], golds: list[list[str]]) -> dict:
    from rag_mag.metrics import contains_answer, load_qa_metric, score_answers

    scores = score_answers(predictions, golds)
    official = load_qa_metric().compute(predictions=predictions, references=golds)
    # "accuracy": a gold alias occurs in the prediction (lenient; small generators answer in sentences)
    accuracy = np.array([float(contains_answer(p, g)) for p, g in zip(predictions, golds, strict=True)])
    return {"rag": {"em": official["exact_match"], "f1": official["f1"], "accuracy": 100.0 * float(accuracy.mean())},
            "rag_per_example": {"em": scores.em_per_example.tolist(), "f1": scores.f1_per_example.tolist(),
                                "accuracy": accuracy.tolist()},
            "predictions": predictions}


def add_budget(cell: dict, budget: dict[str, np.ndarray]) -> None:
    """Put the at-budget recalls into the cell's retrieval block (means in [0, 100], per-question values)."""
    cell.setdefault("retrieval", {})
    cell.setdefault("retrieval_per_example", {})
    for metric in ("recall@budget", "round1_recall@budget"):
        if metric in budget:
            cell["retrieval"][metric] = 100.0 * float(budget[metric].mean()) if len(budget[metric]) else 0.0
            cell["retrieval_per_example"][metric] = budget[metric].tolist()
    cell["budget"] = {"mean": float(budget["budget"].mean()) if len(budget["budget"]) else 0.0,
                      "max": int(budget["budget"].max()) if len(budget["budget"]) else 0}


def diagnostics(dataset: EvalDataset, query_raw_norms: np.ndarray, document_raw_norms: np.ndarray) -> dict:
    """The paper's norm diagnostics of one retriever on one dataset, and samples for the histograms."""
    from rag_mag.retriever.diagnostics import diagnostics_of_norms

    relevant = dataset.relevant_passage_mask()
    return {
        "diagnostics": {**diagnostics_of_norms(query_raw_norms, document_raw_norms, relevant),
                        "n_relevant_passages": int(relevant.sum())},
        "norm_samples": {"relevant": _sample(document_raw_norms[relevant]),
                         "irrelevant": _sample(document_raw_norms[~relevant])},
    }


def _sample(values: np.ndarray, size: int = 2000) -> list[float]:
    """At most ``size`` values (seeded) for the norm histograms."""
    if len(values) > size:
        values = np.random.default_rng(0).choice(values, size=size, replace=False)
    return [round(float(v), 4) for v in values]


def side_predictors(datasets: dict[str, EvalDataset], train_file: Path, config) -> dict:
    """delta-CV and Fisher predictions of qnorm vs dnorm from the *base* model, before any training.

    On the training data (what fine-tuning starts from): queries, their first positive and first hard
    negative. Per dataset: the questions and the passages judged relevant to them (delta-CV only).
    """
    from rag_mag.data import read_triples
    from rag_mag.retriever.diagnostics import predict_side_by_fisher, select_side_by_cv
    from rag_mag.retriever.encoder import MagnitudeEncoder

    encoder = MagnitudeEncoder.build(config.train.get("base_model") or None, "cosine")
    triples = [t for t in read_triples(train_file) if t.hard_negatives]
    rng = np.random.default_rng(0)
    chosen = [triples[i] for i in sorted(rng.choice(len(triples), size=min(len(triples), 256), replace=False))]
    queries = encoder.encode([t.query for t in chosen], "query", treated=False)
    positives = encoder.encode([t.positives[0].content for t in chosen], "document", treated=False)
    negatives = encoder.encode([t.hard_negatives[0].content for t in chosen], "document", treated=False)
    temperature = float(config.train.get("temperature", 0.05))
    fisher = predict_side_by_fisher(queries, np.concatenate([positives, negatives]), temperature=temperature,
                                    max_examples=config.fisher_examples)
    result = {"training_data": {"delta_cv": select_side_by_cv(queries, np.concatenate([positives, negatives]))
                                .to_dict(), "fisher": fisher.to_dict()}, "datasets": {}}
    for name, dataset in datasets.items():
        relevant = [p for p, keep in zip(dataset.corpus, dataset.relevant_passage_mask(), strict=True) if keep]
        if not relevant:
            continue
        q = encoder.encode([r.question for r in dataset.records], "query", treated=False)
        d = encoder.encode([p.content for p in relevant[:1000]], "document", treated=False)
        result["datasets"][name] = {"delta_cv": select_side_by_cv(q, d).to_dict()}
    return result
