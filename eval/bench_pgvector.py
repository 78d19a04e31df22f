"""pgvector on the server of `rag-mag db start` against FAISS: latency, throughput, recall@10, bulk load.

Vectors are those of eval/bench_ann.py: real wiki_pool passages encoded on the document side of the qnorm
retriever (raw magnitude kept), and beyond them vectors sampled around real ones (``synthesize``: a real parent,
noise shaped like the real directions, the parent's norm times a log-normal factor), up to each size. Queries are
training-side questions, never evaluation questions. The ground truth is FAISS's exact inner-product top-10.

For each size, each a cell of ``--out`` (a rerun skips cells already there):

* ``load``: rows/s of COPY (binary, pgvector's psycopg adapter) into a fresh table, and of INSERT (executemany,
  autocommit off, on the first ``--insert-rows``);
* ``faiss_flat`` and ``faiss_hnsw`` (M 32, efConstruction 100, efSearch 512: FAISSDocumentStore's defaults);
* ``pg_exact`` (a sequential scan, ``ORDER BY embedding <#> q``) and ``pg_hnsw`` at each ``--ef-search``
  (``CREATE INDEX ... USING hnsw (embedding vector_ip_ops)``, m 16, ef_construction 64, pgvector's defaults);

each with recall@10 against exact search, latency p50/p95 of single queries, and queries/s at 1 and 8 concurrent
clients (threads, one connection each; FAISS searches release the GIL).

    .venv/bin/rag-mag db start && .venv/bin/python eval/bench_pgvector.py --sizes 100000     # ~15 min on 2 cores

Stop the vLLM server first: an idle one takes a third of a core.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "eval"))

from bench_ann import CORPUS, QUESTIONS, RETRIEVERS, encoded, synthesize  # noqa: E402

from rag_mag import durable  # noqa: E402

OUT = REPO_ROOT / "eval" / "reports" / "pgvector" / "results.json"
TABLE = "bench_vectors"


def recall(found: list[list[int]], truth: np.ndarray) -> float:
    return float(np.mean([len(set(row) & set(truth_row.tolist())) / len(truth_row)
                          for row, truth_row in zip(found, truth, strict=True)]))


def clients_run(search, queries: np.ndarray, clients: int) -> dict:
    """Each of ``clients`` threads runs its share of the queries one at a time: latencies and queries/s."""
    latencies: list[float] = []
    lock = threading.Lock()
    shares = np.array_split(np.arange(len(queries)), clients)

    barrier = threading.Barrier(clients + 1)

    def work(rows, state):
        search(queries[rows[0]], state)  # connect and warm up, untimed
        barrier.wait()
        for row in rows:
            started = time.perf_counter()
            search(queries[row], state)
            with lock:
                latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=work, args=(rows, {})) for rows in shares]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    ordered = sorted(latencies)
    return {"clients": clients, "qps": round(len(queries) / seconds, 1),
            "p50_ms": round(1000 * statistics.median(ordered), 2),
            "p95_ms": round(1000 * ordered[int(0.95 * (len(ordered) - 1))], 2)}


def measured(search, queries: np.ndarray, truth: np.ndarray, clients: list[int]) -> dict:
    found = [search(query, {}) for query in queries]
    return {"recall_at_10": round(recall(found, truth), 4), "runs": [clients_run(search, queries, c) for c in clients]}


# ------------------------------------------------------------------------------------------ FAISS
def faiss_cells(documents: np.ndarray, queries: np.ndarray, truth: np.ndarray, clients: list[int]) -> dict:
    from rag_mag.components import faiss_index

    cells = {}
    for kind in ("flat", "hnsw"):
        started = time.perf_counter()
        index = faiss_index.build_index(documents, kind, faiss_index.HNSW_M, faiss_index.EF_CONSTRUCTION, None)
        build = time.perf_counter() - started
        faiss_index.configure_search(index, faiss_index.EF_SEARCH, 32)

        def search(query, state, index=index):
            with faiss_index.single_thread():
                return index.search(query[None, :], 10)[1][0].tolist()

        cells[f"faiss_{kind}"] = {"build_s": round(build, 1), **measured(search, queries, truth, clients)}
    return cells


# ------------------------------------------------------------------------------------------ pgvector
def connect(url: str):
    import psycopg
    from pgvector.psycopg import register_vector

    connection = psycopg.connect(url, autocommit=True)
    register_vector(connection)
    return connection


def load_cell(url: str, documents: np.ndarray, insert_rows: int) -> dict:
    connection = connect(url)
    dim = documents.shape[1]
    connection.execute(f"DROP TABLE IF EXISTS {TABLE}")
    connection.execute(f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, embedding vector({dim}))")
    started = time.perf_counter()
    with connection.transaction(), connection.cursor().copy(
            f"COPY {TABLE} (id, embedding) FROM STDIN WITH (FORMAT BINARY)") as copy:
        copy.set_types(["int8", "vector"])
        for row, vector in enumerate(documents):
            copy.write_row((row, vector))
    copy_seconds = time.perf_counter() - started
    connection.execute(f"CREATE TABLE {TABLE}_insert (id bigint PRIMARY KEY, embedding vector({dim}))")
    started = time.perf_counter()
    with connection.transaction(), connection.cursor() as cursor:
        cursor.executemany(f"INSERT INTO {TABLE}_insert (id, embedding) VALUES (%s, %s)",
                           [(row, documents[row]) for row in range(min(insert_rows, len(documents)))])
    insert_seconds = max(time.perf_counter() - started, 1e-9)
    connection.execute(f"DROP TABLE {TABLE}_insert")
    connection.execute(f"VACUUM ANALYZE {TABLE}")
    connection.close()
    return {"copy_rows_per_s": round(len(documents) / copy_seconds), "copy_s": round(copy_seconds, 1),
            "insert_rows_per_s": round(min(insert_rows, len(documents)) / insert_seconds),
            "insert_rows": min(insert_rows, len(documents))}


def pg_search(url: str, ef_search: int | None):
    def search(query, state):
        if "connection" not in state:
            state["connection"] = connect(url)
            if ef_search is None:  # exact: never the graph
                state["connection"].execute("SET enable_indexscan = off")
            else:
                state["connection"].execute(f"SET hnsw.ef_search = {int(ef_search)}")
        rows = state["connection"].execute(f"SELECT id FROM {TABLE} ORDER BY embedding <#> %s LIMIT 10",
                                           (query,)).fetchall()
        return [row[0] for row in rows]

    return search


def pg_hnsw_cells(url: str, queries: np.ndarray, truth: np.ndarray, clients: list[int], ef_values: list[int],
                  graph: tuple[int, int] | None = None, build_memory: str = "2GB") -> dict:
    """Build the HNSW index (pgvector's defaults, or ``graph`` = (m, ef_construction)) and search it.

    A graph that outgrows ``build_memory`` (maintenance_work_mem) is built on disk, many times slower: pgvector
    says so in a NOTICE, printed here."""
    connection = connect(url)
    connection.add_notice_handler(lambda notice: print(f"postgres: {notice.message_primary}", flush=True))
    connection.execute(f"SET maintenance_work_mem = '{build_memory}'")
    connection.execute(f"DROP INDEX IF EXISTS {TABLE}_hnsw")
    options = f" WITH (m = {int(graph[0])}, ef_construction = {int(graph[1])})" if graph else ""
    prefix = f"pg_hnsw_m{graph[0]}_efc{graph[1]}" if graph else "pg_hnsw"
    started = time.perf_counter()
    connection.execute(f"CREATE INDEX {TABLE}_hnsw ON {TABLE} USING hnsw (embedding vector_ip_ops){options}")
    cells: dict = {f"{prefix}_build_s": round(time.perf_counter() - started, 1)}
    connection.close()
    for ef in ef_values:
        cells[f"{prefix}_ef{ef}"] = measured(pg_search(url, ef), queries, truth, clients)
    return cells


def pg_cells(url: str, queries: np.ndarray, truth: np.ndarray, clients: list[int], ef_values: list[int]) -> dict:
    return {"pg_exact": measured(pg_search(url, None), queries, truth, clients),
            **pg_hnsw_cells(url, queries, truth, clients, ef_values)}


def vectors(n: int, real: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ``n`` document vectors of a size (the same on every run: seeded by ``n``) and the exact top-10."""
    documents = real[:n] if n <= len(real) else np.concatenate([real, synthesize(real, n - len(real), seed=n)])
    documents = np.ascontiguousarray(documents, dtype=np.float32)
    return documents, np.argsort(-(queries @ documents.T), axis=1)[:, :10]


def add_graph(row: dict, real: np.ndarray, queries: np.ndarray, args, url: str) -> None:
    """``--pg-graph M EFC`` on a size already measured: reload its vectors and add that graph's cells."""
    documents, truth = vectors(row["n"], real, queries)
    load_cell(url, documents, 0)
    row.update(pg_hnsw_cells(url, queries, truth, args.clients, args.ef_search, tuple(args.pg_graph),
                             args.pg_build_memory))


def run_size(n: int, real: np.ndarray, queries: np.ndarray, args, url: str) -> dict:
    documents, truth = vectors(n, real, queries)
    result = {"n": n, "real": min(n, len(real)), "queries": len(queries)}
    result["load"] = load_cell(url, documents, args.insert_rows)
    result.update(faiss_cells(documents, queries, truth, args.clients))
    result.update(pg_cells(url, queries, truth, args.clients, args.ef_search))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--real", type=int, default=33_063, help="real passages encoded (wiki_pool has 33,063)")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--ef-search", type=int, nargs="+", default=[40, 100, 200, 400])
    parser.add_argument("--insert-rows", type=int, default=20_000)
    parser.add_argument("--pg-graph", type=int, nargs=2, metavar=("M", "EF_CONSTRUCTION"),
                        help="on sizes already measured: add pgvector HNSW cells for this graph")
    parser.add_argument("--pg-build-memory", default="2GB", help="maintenance_work_mem for --pg-graph's build: a "
                        "graph larger than this is built on disk (1M vectors at m 32 need more than 2GB)")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--questions", type=Path, default=QUESTIONS)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    from rag_mag.serving.db.pgvector import connect_url

    url, _ = connect_url(start=False)
    real, queries = encoded("qnorm", RETRIEVERS["qnorm"], args)
    rows = json.loads(args.out.read_text()) if args.out.is_file() else []
    for n in args.sizes:
        row = next((row for row in rows if row["n"] == n), None)
        if row is not None and args.pg_graph:
            add_graph(row, real, queries, args, url)
        elif row is not None:
            print(f"n={n}: already measured in {args.out}")
            continue
        else:
            rows.append(run_size(n, real, queries, args, url))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        durable.write_text(args.out, json.dumps(rows, indent=2) + "\n")
        print(json.dumps(row or rows[-1], indent=2))
    connection = connect(url)
    connection.execute(f"DROP TABLE IF EXISTS {TABLE}")
    connection.close()


if __name__ == "__main__":
    main()
