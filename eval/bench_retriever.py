#!/usr/bin/env python
"""Query latency and throughput: FAISSEmbeddingRetriever vs Haystack's InMemoryEmbeddingRetriever.

Both search the same passages by dot product (384-d vectors with spread-out norms, as un-normalized
document embeddings have) for the same queries, with top_k=10:

* latency: one query at a time through each retriever's ``run`` (median and p95, in ms);
* throughput: queries per second, one at a time and batched. Haystack's retriever has no batch
  API, so its batched figure is its one-at-a-time figure; ours uses ``search_batch``.
* agreement: the share of InMemory's top-10 that FAISS also returns (both are exact, so ~100%).

    .venv/bin/python eval/bench_retriever.py                       # 10k and 100k passages
    .venv/bin/python eval/bench_retriever.py --sizes 10000 --queries 100 --json-out bench.json

InMemory is slow at 100k passages (about 1 query/s), so it gets fewer queries (--inmemory-queries).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")


def make_vectors(count: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    """Random directions with log-normal norms (mean ~2.6, like raw MiniLM passage vectors)."""
    vectors = rng.standard_normal((count, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors * rng.lognormal(mean=0.95, sigma=0.15, size=(count, 1)).astype(np.float32)


def timed_queries(run_one, queries: np.ndarray) -> tuple[list[float], list[list[str]]]:
    latencies, results = [], []
    for query in queries:
        started = time.perf_counter()
        documents = run_one(query)
        latencies.append(time.perf_counter() - started)
        results.append([d.id for d in documents])
    return latencies, results


def summarize(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {"queries": len(latencies), "median_ms": 1000 * statistics.median(ordered),
            "p95_ms": 1000 * ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
            "qps": len(latencies) / sum(latencies)}


def bench_size(size: int, args: argparse.Namespace, inmemory_queries: int) -> dict:
    from haystack import Document
    from haystack.components.retrievers.in_memory import InMemoryEmbeddingRetriever
    from haystack.document_stores.in_memory import InMemoryDocumentStore

    from rag_mag.components.faiss_document_store import FAISSDocumentStore
    from rag_mag.components.faiss_retriever import FAISSEmbeddingRetriever

    rng = np.random.default_rng(args.seed)
    vectors = make_vectors(size, args.dim, rng)
    queries = make_vectors(args.queries, args.dim, rng)
    documents = [Document(id=f"p{i}", content=f"passage {i}", embedding=vector.tolist())
                 for i, vector in enumerate(vectors)]

    started = time.perf_counter()
    faiss_store = FAISSDocumentStore()
    faiss_store.write_documents(documents)
    faiss_retriever = FAISSEmbeddingRetriever(document_store=faiss_store, top_k=args.top_k)
    faiss_retriever.run(query_embedding=queries[0].tolist())  # builds the index
    faiss_build = time.perf_counter() - started

    started = time.perf_counter()
    memory_store = InMemoryDocumentStore(embedding_similarity_function="dot_product")
    memory_store.write_documents(documents)
    memory_retriever = InMemoryEmbeddingRetriever(document_store=memory_store, top_k=args.top_k, scale_score=False)
    memory_build = time.perf_counter() - started

    faiss_latencies, faiss_ids = timed_queries(
        lambda q: faiss_retriever.run(query_embedding=q.tolist())["documents"], queries)
    memory_latencies, memory_ids = timed_queries(
        lambda q: memory_retriever.run(query_embedding=q.tolist())["documents"], queries[:inmemory_queries])

    started = time.perf_counter()
    batched = faiss_retriever.search_batch(queries)
    faiss_batch_seconds = time.perf_counter() - started
    assert [[d.id for d in docs] for docs in batched] == faiss_ids

    exact = np.argsort(-(queries @ vectors.T), axis=1)[:, :args.top_k]  # brute-force numpy reference
    faiss_exact = np.mean([len(set(ids) & {f"p{i}" for i in row}) / args.top_k
                           for ids, row in zip(faiss_ids, exact, strict=True)])
    agreement = np.mean([len(set(a) & set(b)) / args.top_k for a, b in zip(memory_ids, faiss_ids, strict=False)])
    faiss_single, memory_single = summarize(faiss_latencies), summarize(memory_latencies)
    return {
        "passages": size, "dim": args.dim, "top_k": args.top_k,
        "build_seconds": {"faiss": faiss_build, "inmemory": memory_build},
        "faiss_one_at_a_time": faiss_single, "inmemory_one_at_a_time": memory_single,
        "faiss_batched_qps": args.queries / faiss_batch_seconds, "inmemory_batched_qps": memory_single["qps"],
        "faiss_recall_vs_numpy": float(faiss_exact), "top_k_agreement_with_inmemory": float(agreement),
        "ratios": {"median_latency_inmemory_over_faiss": memory_single["median_ms"] / faiss_single["median_ms"],
                   "qps_faiss_over_inmemory": faiss_single["qps"] / memory_single["qps"],
                   "batched_qps_faiss_over_inmemory": (args.queries / faiss_batch_seconds) / memory_single["qps"]},
    }


def print_result(result: dict) -> None:
    f, m, r = result["faiss_one_at_a_time"], result["inmemory_one_at_a_time"], result["ratios"]
    print(f"\n== {result['passages']:,} passages x {result['dim']} dims, top_k={result['top_k']}")
    print(f"   build (write + index)   FAISS {result['build_seconds']['faiss']:7.2f} s   "
          f"InMemory {result['build_seconds']['inmemory']:7.2f} s")
    print(f"   latency median / p95    FAISS {f['median_ms']:7.2f} / {f['p95_ms']:7.2f} ms ({f['queries']} q)   "
          f"InMemory {m['median_ms']:8.1f} / {m['p95_ms']:8.1f} ms ({m['queries']} q)   "
          f"ratio x{r['median_latency_inmemory_over_faiss']:.0f}")
    print(f"   one-at-a-time q/s       FAISS {f['qps']:9.1f}   InMemory {m['qps']:9.2f}   "
          f"ratio x{r['qps_faiss_over_inmemory']:.0f}")
    print(f"   batched q/s             FAISS {result['faiss_batched_qps']:9.1f}   InMemory {m['qps']:9.2f} "
          f"(no batch API)   ratio x{r['batched_qps_faiss_over_inmemory']:.0f}")
    print(f"   FAISS recall@{result['top_k']} vs brute-force numpy {result['faiss_recall_vs_numpy']:.3f}; "
          f"top-{result['top_k']} agreement with InMemory {result['top_k_agreement_with_inmemory']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000], help="passage counts")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=200, help="queries for FAISS (one at a time and batched)")
    parser.add_argument("--inmemory-queries", type=int, nargs="+", default=[40, 5],
                        help="queries for InMemory, per size (the last value repeats)")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", type=Path, help="also write the figures as JSON")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    import faiss

    print(f"FAISS {faiss.__version__}, {faiss.omp_get_max_threads()} threads; {os.cpu_count()} CPUs; "
          f"load average {os.getloadavg()[0]:.1f} (other work on the machine slows both sides)")
    results = []
    for i, size in enumerate(args.sizes):
        inmemory_queries = min(args.inmemory_queries[min(i, len(args.inmemory_queries) - 1)], args.queries)
        results.append(bench_size(size, args, inmemory_queries))
        print_result(results[-1])
        print(f"   load average now {os.getloadavg()[0]:.1f}")
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
