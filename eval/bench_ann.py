"""Approximate search against exact search, for cosine and qnorm vectors: recall@10, queries/s, build, memory.

For each strategy and corpus size n, the index types of FAISSDocumentStore are built over the same vectors
and searched with the same queries:

* ``flat``: exact inner product, the baseline for speed and the ground truth for recall;
* ``hnsw``: HNSW built directly on inner product (the baseline the issue reports failing on varied norms);
* ``hnsw_mips``: HNSW over the MIPS-to-L2 reduction (rag_mag.components.mips_index);
* ``ivf``: IVF-Flat with inner product, nlist = about 4 sqrt(n).

Vectors. The first ``--real`` are real: passages of the wiki_pool corpus encoded by the retriever, on the
document side of its strategy (qnorm keeps raw magnitude). Beyond them, vectors are sampled to match the
real ones: each takes a random real vector as parent, moves its direction by Gaussian noise shaped like the
real directions' covariance (scaled so that a synthetic vector is as close to its parent as a real vector
is to its nearest real neighbour, by median cosine), and takes the parent's norm times a log-normal
factor (sigma 0.05; none where the real vectors are unit, as cosine's are), so the norm distribution and
its tie to direction are kept. ``--norm-spread S`` is
a stress case: every vector is then multiplied by exp(N(0, S)), for a model whose norms vary far more
than the retriever's own (rows carry ``norm_spread`` and the measured ``norm_cv``). Queries are real:
``--queries`` training questions (never evaluation questions), encoded on the query side.

Speed, two ways: ``qps`` is all queries in one call on ``--threads`` threads, best of ``--repeats`` (a
benchmark's pattern; exact search then runs as one BLAS product); ``qps_single`` is the first
``--single-queries`` queries one per call (the demo's and ``rag-mag ask``'s pattern). ``speedup_vs_exact``
and ``speedup_single`` are ratios to the flat index's in the same cell. Memory: the index's serialized size (what it
holds in RAM). Results go to ``--out`` (a list of rows) as each cell finishes; cells are cached, so a rerun
resumes.

    .venv/bin/python eval/bench_ann.py --sizes 10000 100000 1000000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from rag_mag import durable  # noqa: E402
from rag_mag.bench.config import fingerprint  # noqa: E402
from rag_mag.components.faiss_index import (  # noqa: E402
    EF_CONSTRUCTION,
    HNSW_M,
    build_index,
    configure_search,
    default_nlist,
)

CORPUS = REPO_ROOT.parent / "shared" / "data" / "wiki_pool" / "wiki_pool_corpus.jsonl.gz"
QUESTIONS = REPO_ROOT / "data" / "train_default" / "train.jsonl.gz"
RETRIEVERS = {"cosine": REPO_ROOT / "artifacts" / "retriever-cosine",
              "qnorm": REPO_ROOT / "artifacts" / "retriever-default"}
OUT = REPO_ROOT / "eval" / "reports" / "ann" / "results.json"
CACHE = REPO_ROOT / "eval" / "reports" / "ann" / "cache"


def encoded(strategy: str, retriever: Path, args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    """(real document vectors, query vectors) as the strategy serves them; cached by checkpoint and counts."""
    import torch

    from rag_mag.components.checkpoints import load_checkpoint
    from rag_mag.data import iter_corpus, iter_jsonl
    from rag_mag.precision import use_bf16

    checkpoint = load_checkpoint(str(retriever))
    if checkpoint.strategy != strategy:
        sys.exit(f"{retriever} is a {checkpoint.strategy} retriever, expected {strategy}; pass --retriever-{strategy}")
    cache = CACHE / f"{strategy}-{checkpoint.fingerprint}-{args.real}-{args.queries}.npz"
    if cache.is_file():
        data = np.load(cache)
        return data["documents"], data["queries"]
    encoder, bf16 = checkpoint.encoder, use_bf16("auto", checkpoint.encoder.device)
    passages = [p.content for _, p in zip(range(args.real), iter_corpus(args.corpus), strict=False)]
    questions = [r["query"] for _, (_, r) in zip(range(args.queries), iter_jsonl(args.questions), strict=False)]
    raw = encoder.encode(passages, "document", batch_size=64, treated=False, show_progress=True, bf16=bf16)
    documents = encoder.document_treatment().apply(torch.from_numpy(raw)).numpy()
    queries = encoder.encode(questions, "query", batch_size=64, treated=True, bf16=bf16)
    CACHE.mkdir(parents=True, exist_ok=True)
    with durable.atomic_write(cache, "wb") as handle:
        np.savez(handle, documents=documents, queries=queries)
    return documents, queries


def synthesize(real: np.ndarray, count: int, seed: int) -> np.ndarray:
    """``count`` vectors sampled to match ``real`` (see the module doc), in chunks to bound memory."""
    rng = np.random.default_rng(seed)
    norms = np.linalg.norm(real, axis=1)
    unit_norm = bool(np.allclose(norms, 1.0, atol=1e-3))  # cosine: synthetic vectors stay unit
    directions = real / norms[:, None]
    sample = directions[rng.choice(len(real), min(2000, len(real)), replace=False)]
    similarity = sample @ directions.T
    similarity[similarity > 0.99999] = -1.0  # itself
    target = float(np.median(similarity.max(axis=1)))
    centred = directions - directions.mean(axis=0)
    eigenvalues, eigenvectors = np.linalg.eigh(centred.T @ centred / len(centred))
    scale = np.sqrt(np.clip(eigenvalues, 0, None))

    def noise(n: int) -> np.ndarray:
        return ((rng.standard_normal((n, real.shape[1])) * scale) @ eigenvectors.T).astype(np.float32)

    def moved(parents: np.ndarray, epsilon: float, shift: np.ndarray) -> np.ndarray:
        vectors = directions[parents] + epsilon * shift
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    probe_parents, probe_noise = rng.integers(0, len(real), 2000), noise(2000)
    low, high = 0.0, 10.0
    for _ in range(40):  # bisect epsilon: median cosine to the parent equals the real nearest-neighbour cosine
        middle = (low + high) / 2
        cosine = np.median(np.einsum("ij,ij->i", moved(probe_parents, middle, probe_noise), directions[probe_parents]))
        low, high = (middle, high) if cosine > target else (low, middle)
    epsilon = (low + high) / 2
    out = np.empty((count, real.shape[1]), np.float32)
    for start in range(0, count, 100_000):
        stop = min(count, start + 100_000)
        parents = rng.integers(0, len(real), stop - start)
        factor = np.ones(stop - start) if unit_norm else np.exp(rng.normal(0.0, 0.05, stop - start))
        out[start:stop] = moved(parents, epsilon, noise(stop - start)) * (norms[parents] * factor)[:, None]
    return out


def timed_search(index, queries: np.ndarray, k: int, repeats: int) -> tuple[float, np.ndarray]:
    best, rows = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        _, rows = index.search(queries, k)
        best = min(best, time.perf_counter() - started)
    return len(queries) / best, rows


def single_query_qps(index, queries: np.ndarray, k: int) -> float:
    """Queries/s when each query is its own call, as the demo and `rag-mag ask` search (no batching)."""
    index.search(queries[:1], k)  # warm
    started = time.perf_counter()
    for row in range(len(queries)):
        index.search(queries[row: row + 1], k)
    return len(queries) / (time.perf_counter() - started)


def recall_at(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f[f >= 0]) & set(t)) / len(t) for f, t in zip(found, truth, strict=True)]))


def index_megabytes(index) -> float:
    import faiss

    graph = getattr(index, "graph", index)  # MipsHnswIndex keeps its FAISS graph in .graph
    return round(faiss.serialize_index(graph).nbytes / 2**20, 1)


def cell(strategy: str, n: int, documents: np.ndarray, queries: np.ndarray, args: argparse.Namespace) -> list[dict]:
    import faiss

    faiss.omp_set_num_threads(args.threads)
    vectors = documents[:n] if n <= len(documents) else np.vstack(
        [documents, synthesize(documents, n - len(documents), seed=args.seed)])
    if args.norm_spread:  # the stress case: norms spread far wider than this retriever's
        vectors = vectors * np.exp(np.random.default_rng(args.seed + 1).normal(0.0, args.norm_spread, n))[:, None]
        vectors = vectors.astype(np.float32)
    rows = []
    norms = np.linalg.norm(vectors, axis=1)
    norm_cv = round(float(norms.std() / norms.mean()), 3)
    print(f"[{strategy} n={n:,}] norm mean {norms.mean():.3f} cv {norm_cv}", flush=True)
    started = time.perf_counter()
    exact = build_index(vectors, "flat", args.hnsw_m, args.ef_construction, 1)
    build_exact = time.perf_counter() - started
    exact_qps, truth = timed_search(exact, queries, 10, args.repeats)
    single = queries[: args.single_queries]
    exact_single = single_query_qps(exact, single, 10)
    rows.append({"index_type": "flat", "strategy": strategy, "n": n, "recall@10": 1.0, "qps": round(exact_qps, 1),
                 "speedup_vs_exact": 1.0, "qps_single": round(exact_single, 1), "speedup_single": 1.0,
                 "build_s": round(build_exact, 2), "memory_mb": index_megabytes(exact), "params": {},
                 "norm_spread": args.norm_spread, "norm_cv": norm_cv})
    del exact
    nlist = default_nlist(n)
    searches = {"hnsw": [{"ef_search": ef} for ef in args.ef], "hnsw_mips": [{"ef_search": ef} for ef in args.ef],
                "ivf": [{"nprobe": probe} for probe in args.nprobe]}
    for index_type, settings in searches.items():
        started = time.perf_counter()
        index = build_index(vectors, index_type, args.hnsw_m, args.ef_construction, nlist)
        build_s = time.perf_counter() - started
        memory = index_megabytes(index)
        for params in settings:
            configure_search(index, params.get("ef_search", 16), params.get("nprobe", 1))
            qps, found = timed_search(index, queries, 10, args.repeats)
            qps_single = single_query_qps(index, single, 10)
            extra = {"hnsw_m": args.hnsw_m, "ef_construction": args.ef_construction} if "ef_search" in params \
                else {"nlist": nlist}
            row = {"index_type": index_type, "strategy": strategy, "n": n,
                   "recall@10": round(recall_at(found, truth), 4), "qps": round(qps, 1),
                   "speedup_vs_exact": round(qps / exact_qps, 2), "qps_single": round(qps_single, 1),
                   "speedup_single": round(qps_single / exact_single, 2), "build_s": round(build_s, 2),
                   "memory_mb": memory, "params": {**params, **extra}, "norm_spread": args.norm_spread,
                   "norm_cv": norm_cv}
            rows.append(row)
            print(f"  {index_type:9s} {json.dumps(row['params'])}: recall@10 {row['recall@10']:.4f}, "
                  f"{row['qps']:,.0f} q/s ({row['speedup_vs_exact']}x exact), one at a time "
                  f"{row['qps_single']:,.0f} q/s ({row['speedup_single']}x), build {row['build_s']} s, "
                  f"{row['memory_mb']} MB", flush=True)
        del index
    return rows


def markdown_table(rows: list[dict]) -> str:
    """The results as one table: a row per index and search setting, a column per (strategy, n, norm spread);
    each cell is recall@10 / batched speed-up / one-query-per-call speed-up against exact."""
    def search_setting(row: dict) -> tuple[str, str]:
        return row["index_type"], json.dumps({k: v for k, v in row["params"].items() if k in ("ef_search", "nprobe")})

    columns = sorted({(r["strategy"], r["n"], r.get("norm_spread", 0.0)) for r in rows})
    settings = list(dict.fromkeys(search_setting(row) for row in rows))
    order = {"flat": 0, "hnsw": 1, "hnsw_mips": 2, "ivf": 3}
    settings.sort(key=lambda s: (order.get(s[0], 9), list(json.loads(s[1]).values())))
    names = [(f"{s} {n / 1e6:g}M" if n >= 1_000_000 else f"{s} {n // 1000:,}k") + (f" spread {x:g}" if x else "")
             for s, n, x in columns]
    lines = ["| index, setting | " + " | ".join(names) + " |", "|---" * (len(columns) + 1) + "|"]
    by_key = {(r["strategy"], r["n"], r.get("norm_spread", 0.0), *search_setting(r)): r for r in rows}
    for index_type, params in settings:
        label = index_type + "".join(f" {k} {v}" for k, v in json.loads(params).items())
        cells = []
        for column in columns:
            row = by_key.get((*column, index_type, params))
            if row is None:
                cells.append("")
            elif index_type == "flat":
                cells.append(f"{row['qps']:,.0f} / {row['qps_single']:,.0f} q/s")
            else:
                cells.append(f"{row['recall@10']:.3f} / {row['speedup_vs_exact']:g}x / {row['speedup_single']:g}x")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--strategies", nargs="+", choices=sorted(RETRIEVERS), default=["cosine", "qnorm"])
    parser.add_argument("--retriever-cosine", type=Path, default=RETRIEVERS["cosine"])
    parser.add_argument("--retriever-qnorm", type=Path, default=RETRIEVERS["qnorm"])
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="real passages (JSONL or JSONL.gz)")
    parser.add_argument("--questions", type=Path, default=QUESTIONS, help="training questions ({query}) for queries")
    parser.add_argument("--real", type=int, default=10_000, help="real passages encoded; the rest is sampled")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--ef", type=int, nargs="+", default=[32, 64, 128, 256, 512, 1024])
    parser.add_argument("--nprobe", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256])
    parser.add_argument("--hnsw-m", type=int, default=HNSW_M, help="default: the store's")
    parser.add_argument("--ef-construction", type=int, default=EF_CONSTRUCTION, help="default: the store's")
    parser.add_argument("--single-queries", type=int, default=200,
                        help="queries searched one per call for qps_single (the serving pattern)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--norm-spread", type=float, default=0.0,
                        help="stress case: multiply every vector by exp(N(0, S)), so norms vary far more than the "
                             "retriever's own (0: as encoded)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--table", action="store_true", help="print --out as a markdown table and exit")
    args = parser.parse_args()
    results = json.loads(args.out.read_text()) if args.out.is_file() else []
    if args.table:
        print(markdown_table(results))
        return
    for strategy in args.strategies:
        retriever = getattr(args, f"retriever_{strategy}")
        documents, queries = encoded(strategy, retriever, args)
        for n in args.sizes:
            plan = fingerprint(args.real, args.queries, args.seed, args.single_queries, args.norm_spread, args.ef,
                               args.nprobe, args.hnsw_m, args.ef_construction, args.threads)
            cached = CACHE / f"cell-{strategy}-{n}-{plan}.json"
            if cached.is_file():
                rows = json.loads(cached.read_text())
                print(f"[{strategy} n={n:,}] cached: {cached}")
            else:
                rows = cell(strategy, n, documents, queries, args)
                durable.write_text(cached, json.dumps(rows))
            results = [r for r in results if (r["strategy"], r["n"], r.get("norm_spread", 0.0))
                       != (strategy, n, args.norm_spread)] + rows
            args.out.parent.mkdir(parents=True, exist_ok=True)
            durable.write_text(args.out, json.dumps(results, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
