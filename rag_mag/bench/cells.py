"""One benchmark cell: a system (dense retriever, BM25 or closed book) on one dataset.

Dense systems run the product's own Haystack components: ``RagMagDocumentEmbedder`` into a
``FAISSDocumentStore``, ``RagMagTextEmbedder`` and ``FAISSEmbeddingRetriever`` for the queries.
A cell returns plain JSON: aggregates, per-question values (for bootstrap and paired tests),
the predictions, and the paper's diagnostics.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from haystack import Document

from rag_mag.bench.config import BenchConfig
from rag_mag.datasets import EvalDataset

logger = logging.getLogger(__name__)
RECALL_CURVE_K = 20


def _documents(dataset: EvalDataset) -> list[Document]:
    return [Document(id=p.id, content=p.text, meta={"title": p.title}) for p in dataset.corpus]


def dense_retrieve(dataset: EvalDataset, checkpoint: Path, top_k: int, bf16: bool = False,
                   ) -> tuple[list[list[Document]], dict]:
    """Rank the dataset's corpus for each question; also return raw norms for the diagnostics."""
    from rag_mag.components.document_embedder import RAW_NORM_KEY, RagMagDocumentEmbedder
    from rag_mag.components.faiss_document_store import FAISSDocumentStore
    from rag_mag.components.faiss_retriever import FAISSEmbeddingRetriever
    from rag_mag.components.text_embedder import RagMagTextEmbedder

    document_embedder = RagMagDocumentEmbedder(model=str(checkpoint), batch_size=64, progress_bar=True, bf16=bf16)
    document_embedder.warm_up()
    embedded = document_embedder.run(_documents(dataset))["documents"]
    store = FAISSDocumentStore()
    store.write_documents(embedded)
    text_embedder = RagMagTextEmbedder(model=str(checkpoint))
    queries, query_raw_norms = text_embedder.embed([r.question for r in dataset.records])
    retriever = FAISSEmbeddingRetriever(document_store=store, top_k=top_k)
    ranked = retriever.search_batch(queries, top_k)
    norms = {"query_raw": query_raw_norms.astype(float),
             "document_raw": np.array([d.meta[RAW_NORM_KEY] for d in embedded], dtype=float)}
    return ranked, norms


def bm25_retrieve(dataset: EvalDataset, top_k: int) -> list[list[Document]]:
    from rag_mag.bm25 import BM25Index

    index = BM25Index(dataset.corpus)
    rows, scores = index.search([r.question for r in dataset.records], top_k)
    documents = _documents(dataset)
    return [[Document(id=documents[i].id, content=documents[i].content, meta=documents[i].meta, score=float(s))
             for i, s in zip(row, row_scores, strict=True)] for row, row_scores in zip(rows, scores, strict=True)]


def evaluate_cell(dataset: EvalDataset, system, generator, config: BenchConfig) -> dict:
    from rag_mag.diagnostics import coefficient_of_variation, cohens_d
    from rag_mag.metrics import contains_answer, load_qa_metric, recall_curve, score_answers, score_retrieval

    questions = [r.question for r in dataset.records]
    golds = [list(r.answers) for r in dataset.records]
    cell: dict = {"n_questions": len(questions)}
    ranked: list[list[Document]] | None = None
    if system.name == "bm25":
        ranked = bm25_retrieve(dataset, config.retrieval_top_k)
    elif system.checkpoint is not None:
        ranked, norms = dense_retrieve(dataset, system.checkpoint, config.retrieval_top_k, config.encode_bf16)
        relevant = dataset.relevant_passage_mask()
        cell["diagnostics"] = {
            "document_norm_cohens_d": cohens_d(norms["document_raw"][relevant], norms["document_raw"][~relevant]),
            "query_norm_cv": coefficient_of_variation(norms["query_raw"]),
            "document_norm_cv": coefficient_of_variation(norms["document_raw"]),
            "query_norm_mean": float(norms["query_raw"].mean()),
            "document_norm_mean": float(norms["document_raw"].mean()),
            "n_relevant_passages": int(relevant.sum()),
        }
        cell["norm_samples"] = {"relevant": _sample(norms["document_raw"][relevant]),
                                "irrelevant": _sample(norms["document_raw"][~relevant])}
    if ranked is not None:
        judgements = dataset.judge_all([[d.id for d in docs] for docs in ranked])
        retrieval = score_retrieval(judgements)
        cell["retrieval"] = retrieval.means
        cell["retrieval_mode"] = retrieval.mode
        cell["retrieval_per_example"] = {k: v.tolist() for k, v in retrieval.per_example.items()}
        cell["recall_curve"] = recall_curve(judgements, RECALL_CURVE_K)
        cell["top_ids"] = [[d.id for d in docs[: config.rag_top_k]] for docs in ranked]
    contexts = None if system.name == "closed_book" else [docs[: config.rag_top_k] for docs in ranked]
    predictions = generator.answer_all(questions, contexts, progress=f"{dataset.name}/{system.label}")
    scores = score_answers(predictions, golds)
    official = load_qa_metric().compute(predictions=predictions, references=golds)
    # "accuracy": a gold alias occurs in the prediction (lenient; small generators answer in sentences)
    accuracy = np.array([float(contains_answer(p, g)) for p, g in zip(predictions, golds, strict=True)])
    cell["rag"] = {"em": official["exact_match"], "f1": official["f1"], "accuracy": 100.0 * float(accuracy.mean())}
    cell["rag_per_example"] = {"em": scores.em_per_example.tolist(), "f1": scores.f1_per_example.tolist(),
                               "accuracy": accuracy.tolist()}
    cell["predictions"] = predictions
    return cell


def _sample(values: np.ndarray, size: int = 2000) -> list[float]:
    """At most ``size`` values (seeded) for the norm histograms."""
    if len(values) > size:
        values = np.random.default_rng(0).choice(values, size=size, replace=False)
    return [round(float(v), 4) for v in values]


def side_predictors(datasets: dict[str, EvalDataset], train_file: Path, config: BenchConfig) -> dict:
    """delta-CV and Fisher predictions of qnorm vs dnorm from the *base* model, before any training.

    On the training data (what fine-tuning starts from): queries, their first positive and first hard
    negative. Per dataset: the questions and the passages judged relevant to them (delta-CV only).
    """
    from rag_mag.data import read_triples
    from rag_mag.diagnostics import predict_side_by_fisher, select_side_by_cv
    from rag_mag.encoder import MagnitudeEncoder

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
