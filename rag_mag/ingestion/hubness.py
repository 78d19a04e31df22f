"""Hubness of an index of files, for its summary: do a few chunks turn up in every ranking?

An index has no questions of its own, so chunks ask for each other (the k-occurrence view of hubness): up to
``sample`` chunks, chosen by a fixed seed, each ask their first ``QUERY_WORDS`` words through
``pipelines/retrieve.yaml``; a chunk's own result is left out of its ranking. The figure is the benchmark's
(``rag_mag.metrics.files.hubness``): the share of those rankings whose top ``k`` holds one of the 1% of chunks
retrieved most often. Under qnorm a short or generic chunk with a large norm shows up here as a hub; the summary
names the most retrieved chunk so that a user can see what it is.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rag_mag.metrics.files import hub_counts, hubness

SAMPLE = 200
MIN_CHUNKS = 100  # below this, 1% of the chunks is a single chunk and the figure says little
QUERY_WORDS = 30


def sampled_hubness(chunks: list[tuple[str, str]], rank: Callable[[list[str], int], list[list[str]]],
                    sample: int = SAMPLE, k: int = 5, seed: int = 0) -> dict[str, Any]:
    """Hubness of ``chunks`` (``(id, text)`` pairs) asked by a sample of themselves; ``rank(queries, n)`` gives the
    first ``n`` chunk ids for each query (a system of the benchmark, or an index's retrieval pipeline)."""
    askers = random.Random(seed).sample(chunks, min(sample, len(chunks)))
    queries = [" ".join(text.split()[:QUERY_WORDS]) for _, text in askers]
    rankings = [[chunk for chunk in ranking if chunk != asker][:k]
                for (asker, _), ranking in zip(askers, rank(queries, k + 1), strict=True)]
    counts = hub_counts(rankings, k)
    top_id, top_count = min(counts.items(), key=lambda item: (-item[1], item[0]))
    return {f"hubness@{k}": round(100 * hubness(rankings, len(chunks), k=k), 1), "queries": len(askers),
            "chunks": len(chunks), "top_hub": {"id": top_id, "rankings": top_count}}


def index_hubness(index: Path, retriever: Path, sample: int = SAMPLE, k: int = 5, seed: int = 0
                  ) -> dict[str, Any] | None:
    """``sampled_hubness`` of a FAISS index of files through ``pipelines/retrieve.yaml``, with the most retrieved
    chunk's file and first words; None for an index of fewer than ``MIN_CHUNKS`` chunks."""
    from rag_mag.components.faiss_document_store import FAISSDocumentStore
    from rag_mag.serving.pipelines import default_pipeline, load_pipeline, question_inputs

    documents = {document.id: document for document in FAISSDocumentStore(path=str(index)).filter_documents()}
    if len(documents) < MIN_CHUNKS:
        return None
    pipeline = load_pipeline(default_pipeline("retrieve"), {"index": str(index), "retriever": str(retriever),
                                                            "top_k": k + 1})
    pipeline.warm_up()

    def rank(queries: list[str], top_k: int) -> list[list[str]]:
        return [[d.id for d in pipeline.run(question_inputs(pipeline, query))["retriever"]["documents"]]
                for query in queries]

    figures = sampled_hubness([(d.id, d.content or "") for d in documents.values()], rank, sample, k, seed)
    top = documents[figures["top_hub"]["id"]]
    figures["top_hub"].update(file=(top.meta or {}).get("file"), text=" ".join((top.content or "").split()[:20]))
    return figures


def hubness_line(figures: dict[str, Any], k: int = 5) -> str:
    top = figures["top_hub"]
    return (f"hubness@{k}: {figures[f'hubness@{k}']:.1f}% of {figures['queries']} chunks, asked as questions, find "
            f"one of the 1% most retrieved chunks in their top {k}; the most retrieved ({top['rankings']} times) is "
            f"in {top['file']}: \"{top['text']} ...\"")
