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
from pathlib import Path
from typing import Any

from rag_mag.metrics.files import hub_counts, hubness

SAMPLE = 200
MIN_CHUNKS = 100  # below this, 1% of the chunks is a single chunk and the figure says little
QUERY_WORDS = 30


def index_hubness(index: Path, retriever: Path, sample: int = SAMPLE, k: int = 5, seed: int = 0
                  ) -> dict[str, Any] | None:
    """``{"hubness@5": 0-100, "queries": n, "chunks": N, "top_hub": {"file", "text", "rankings"}}``, or None for an
    index of fewer than ``MIN_CHUNKS`` chunks."""
    from rag_mag.components.faiss_document_store import FAISSDocumentStore
    from rag_mag.serving.pipelines import default_pipeline, load_pipeline, question_inputs

    documents = FAISSDocumentStore(path=str(index)).filter_documents()
    if len(documents) < MIN_CHUNKS:
        return None
    askers = random.Random(seed).sample(documents, min(sample, len(documents)))
    pipeline = load_pipeline(default_pipeline("retrieve"), {"index": str(index), "retriever": str(retriever),
                                                            "top_k": k + 1})
    pipeline.warm_up()
    rankings = []
    for asker in askers:
        query = " ".join((asker.content or "").split()[:QUERY_WORDS])
        found = pipeline.run(question_inputs(pipeline, query))["retriever"]["documents"]
        rankings.append([document.id for document in found if document.id != asker.id][:k])
    counts = hub_counts(rankings, k)
    top_id, top_count = min(counts.items(), key=lambda item: (-item[1], item[0]))
    top = next(document for document in documents if document.id == top_id)
    return {f"hubness@{k}": round(100 * hubness(rankings, len(documents), k=k), 1), "queries": len(askers),
            "chunks": len(documents),
            "top_hub": {"file": (top.meta or {}).get("file"), "text": " ".join((top.content or "").split()[:20]),
                        "rankings": top_count}}


def hubness_line(figures: dict[str, Any], k: int = 5) -> str:
    top = figures["top_hub"]
    return (f"hubness@{k}: {figures[f'hubness@{k}']:.1f}% of {figures['queries']} chunks, asked as questions, find "
            f"one of the 1% most retrieved chunks in their top {k}; the most retrieved ({top['rankings']} times) is "
            f"in {top['file']}: \"{top['text']} ...\"")
