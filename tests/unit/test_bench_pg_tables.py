"""Benchmark rows on pgvector without a server: the table of a (checkpoint, corpus) index, when it is reused or
copied again, and when the benchmark needs PostgreSQL at all (the real server: tests/integration/)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from rag_mag.bench import pg_tables
from rag_mag.bench.config import BenchConfig, PipelineEntry
from rag_mag.bench.pg_tables import bench_table, ensure_table, mismatch, uses_pgvector
from rag_mag.bench.systems import Row, System
from rag_mag.serving.pipelines import PIPELINES_DIR
from tests.unit.test_bench import supporting_dataset

MANIFEST = {"count": 455, "checkpoint": "07652a6e0545d8ff", "strategy": "cosine"}
TAG = {"checkpoint": "07652a6e0545d8ff", "strategy": "cosine"}


def test_a_table_is_named_by_dataset_and_index_key_deterministically_and_validly():
    assert bench_table("2wikimultihopqa", Path("artifacts/bench/indexes/1b38cb7ae3be")) == \
        "bench_2wikimultihopqa_1b38cb7ae3be"
    assert bench_table("sample", Path("/x/indexes/365ac68b1ad7")) == bench_table("sample", Path("/y/365ac68b1ad7"))
    names = {bench_table(dataset, Path(key)) for dataset in ("sample", "musique") for key in ("aaa111", "bbb222")}
    assert len(names) == 4  # one table per (dataset, index)
    long = bench_table("My-Own.Data set with a very long name indeed, longer than fits", Path("0123456789abcdef"))
    assert len(long) <= 51 and long.startswith("bench_my_own_data_set") and long.endswith("_0123456789ab")
    with pytest.raises(ValueError, match="no name"):
        bench_table("sample", Path("/"))


@pytest.mark.parametrize(("tag", "rows", "reason"), [
    ({}, None, "no such table"),
    ({}, 455, "checkpoint is None"),  # an untagged table (filled by hand) is not trusted
    ({**TAG, "checkpoint": "3c887e7a8c58e4b1"}, 455, "checkpoint is 3c887e7a8c58e4b1, the index's 07652a6e0545d8ff"),
    ({**TAG, "strategy": "qnorm"}, 455, "strategy is qnorm, the index's cosine"),
    (TAG, 454, "454 rows, the index 455"),
])
def test_a_table_is_reused_only_with_the_index_checkpoint_strategy_and_row_count(tag, rows, reason):
    assert mismatch(MANIFEST, TAG, 455) is None
    assert reason in mismatch(MANIFEST, tag, rows)


@pytest.fixture
def fake_server(tmp_path, monkeypatch):
    """A table state per name, copy_index and the table lock recorded instead of run."""
    folder = tmp_path / "indexes" / "1b38cb7ae3be"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps(MANIFEST))
    server = {"folder": folder, "states": [], "copies": [], "locks": []}

    def table_state(url, table):
        return server["states"].pop(0) if len(server["states"]) > 1 else server["states"][0]

    def copy_index(index_dir, table, progress=True):
        server["copies"].append((index_dir, table))
        server["states"] = [(TAG, 455)]
        return {"rows": 455, "seconds": 0.1}

    @contextlib.contextmanager
    def table_lock(url, table):
        server["locks"].append(table)
        yield

    monkeypatch.setattr(pg_tables, "table_state", table_state)
    monkeypatch.setattr(pg_tables.pgvector, "copy_index", copy_index)
    monkeypatch.setattr(pg_tables.pgvector, "table_lock", table_lock)
    return server


def test_a_matching_table_is_reused_without_a_copy_or_a_lock(fake_server):
    fake_server["states"] = [(TAG, 455)]
    assert ensure_table("postgresql://u@h/db", "musique", fake_server["folder"]) == "bench_musique_1b38cb7ae3be"
    assert fake_server["copies"] == [] and fake_server["locks"] == []


@pytest.mark.parametrize("state", [({}, None), (TAG, 12), ({**TAG, "checkpoint": "other"}, 455)])
def test_a_missing_short_or_foreign_table_is_copied_again_under_its_lock(fake_server, state):
    fake_server["states"] = [state]
    table = ensure_table("postgresql://u@h/db", "musique", fake_server["folder"])
    assert fake_server["copies"] == [(fake_server["folder"], table)] and fake_server["locks"] == [table]


def test_a_table_another_benchmark_filled_while_this_one_waited_is_not_copied_twice(fake_server):
    fake_server["states"] = [({}, None), (TAG, 455)]  # missing at first look, complete once the lock is held
    ensure_table("postgresql://u@h/db", "musique", fake_server["folder"])
    assert fake_server["copies"] == [] and fake_server["locks"] == ["bench_musique_1b38cb7ae3be"]


def test_only_the_pgvector_pipelines_need_a_table():
    assert uses_pgvector(PIPELINES_DIR / "rag_hybrid.yaml") and uses_pgvector(PIPELINES_DIR / "rag_pgvector.yaml")
    assert not uses_pgvector(PIPELINES_DIR / "rag.yaml") and not uses_pgvector(PIPELINES_DIR / "rag_multihop.yaml")


def test_the_bench_starts_postgres_only_for_an_unfinished_pgvector_cell(tmp_path, monkeypatch):
    from rag_mag.bench.runner import BenchRunner
    from rag_mag.serving.db import pgvector

    started = []

    @contextlib.contextmanager
    def using_server(url=None):
        started.append(url)
        yield "postgresql://ragmag@127.0.0.1:5433/ragmag"

    monkeypatch.setattr(pgvector, "using_server", using_server)
    runner = BenchRunner(BenchConfig(datasets=["toy=a.jsonl"], output_dir=str(tmp_path)), "test.yaml", "rag-mag bench",
                         pg_url="postgresql://given@host/db")
    system = System("base_cosine", 0, tmp_path, "digest")
    dense, hybrid = (Row(system, PipelineEntry(f"pipelines/{name}.yaml")) for name in ("rag", "rag_hybrid"))
    saved = set()
    monkeypatch.setattr(runner, "_saved", lambda dataset, row, scorer: {} if row.name in saved else None)
    dataset = supporting_dataset()
    with runner.database([(dataset, dense), (dataset, Row(System("bm25", 0, None), None))], None) as url:
        assert url is None and started == []  # no pgvector pipeline: no server
    with runner.database([(dataset, dense), (dataset, hybrid)], None) as url:
        assert url.startswith("postgresql://") and started == ["postgresql://given@host/db"]
    saved.add(hybrid.name)
    with runner.database([(dataset, hybrid)], None) as url:
        assert url is None and len(started) == 1  # its cell is done: the report needs no server


def test_searches_of_one_store_run_one_at_a_time_across_the_benchmarks_threads(monkeypatch):
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from rag_mag.bench.pg_tables import serialize_queries
    from rag_mag.serving.pipelines import load_pipeline

    monkeypatch.setenv("RAG_MAG_PG_URL", "postgresql://u:p@127.0.0.1:9/none")  # built, never connected
    pipeline = load_pipeline(PIPELINES_DIR / "rag_hybrid.yaml")
    stores = [pipeline.get_component(name).document_store for name in ("retriever", "keyword_retriever")]
    active, most = [0], [0]
    guard = threading.Lock()

    def search(*args, **kwargs):
        with guard:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.01)
        with guard:
            active[0] -= 1
        return []

    for store in stores:
        monkeypatch.setattr(store, "_embedding_retrieval", search)
        monkeypatch.setattr(store, "_keyword_retrieval", search)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: stores[0]._embedding_retrieval([0.0]), range(16)))
    assert most[0] > 1  # unserialized, the threads overlap (what makes the shared cursor unsafe)
    assert serialize_queries(pipeline) == 2 and serialize_queries(pipeline) == 2  # idempotent: one lock per store
    most[0] = 0
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: stores[0]._embedding_retrieval([0.0]) if i % 2 else stores[0]._keyword_retrieval("q"),
                      range(16)))
    assert most[0] == 1


@pytest.mark.parametrize("before", [None, "postgresql://u:p@127.0.0.1:9/given"])
def test_a_server_started_for_a_block_leaves_the_url_as_it_was(monkeypatch, before):
    """``connect_url`` exports the URL it used; once ``using_server`` has stopped the server it started, that URL
    points at nothing, and a later command of the same process took it for a running server."""
    from rag_mag.serving.db import pgvector, postgres

    if before is None:
        monkeypatch.delenv(postgres.URL_ENV, raising=False)
    else:
        monkeypatch.setenv(postgres.URL_ENV, before)
    started_url, stopped = "postgresql://ragmag:secret@127.0.0.1:5433/ragmag", []

    def connect_url(url=None):
        os.environ[postgres.URL_ENV] = started_url
        return started_url, True

    monkeypatch.setattr(pgvector, "connect_url", connect_url)
    monkeypatch.setattr(postgres, "stop", lambda: stopped.append(True))
    with pgvector.using_server() as url:
        assert url == os.environ[postgres.URL_ENV] == started_url
    assert stopped == [True] and os.environ.get(postgres.URL_ENV) == before
