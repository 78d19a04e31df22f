"""A benchmark row on PostgreSQL for real: `rag-mag bench` with pipelines/rag_hybrid.yaml next to rag.yaml on the
bundled sample, against the server of `rag-mag db start` (started by .ci/run; started here when none runs) and the
real vLLM server. The cell's FAISS index goes into a table of its own, which the next run reuses."""

from __future__ import annotations

import json
import logging

import psycopg
import pytest

from rag_mag.bench import pg_tables
from rag_mag.cli.main import main
from rag_mag.models import REPO_ROOT, artifacts_dir
from rag_mag.serving.db import pgvector

pytestmark = pytest.mark.integration

CONFIG = """\
name: hybrid_check
datasets: ["sample=data/sample/questions.jsonl,data/sample/corpus.jsonl"]
max_questions: 8
answer_questions: 6
strategies: []
baselines: [base_cosine]
pipelines: [pipelines/rag.yaml, pipelines/rag_hybrid.yaml]
train:
  train_data: data/sample/train_triples.jsonl
reader: smollm2-135m-reader
base_reader: null
rag_top_k: 3
bootstrap_resamples: 100
llm_timeout: 900
"""


@pytest.fixture(scope="module")
def pg_url():
    with pgvector.using_server() as url:
        yield url


def sample_tables(url: str) -> dict[str, tuple[dict, int | None]]:
    with psycopg.connect(url, autocommit=True) as connection:
        names = [row[0] for row in connection.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'bench\\_sample\\_%'")]
    return {name: pg_tables.table_state(url, name) for name in names}


def test_a_hybrid_row_is_scored_from_its_own_table_which_the_next_run_reuses(pg_url, vllm_server, tmp_path,
                                                                             monkeypatch, caplog, capsys):
    config = tmp_path / "hybrid.yaml"
    config.write_text(CONFIG)
    out = tmp_path / "report"
    assert main(["bench", str(config), "--output-dir", str(out), "--llm-url", vllm_server]) == 0
    results = json.loads((out / "results.json").read_text())
    rows = {row["system"]: row for row in results["results"]}
    assert set(rows) == {"rag:base_cosine", "rag_hybrid:base_cosine"} and results["failures"] == []
    hybrid = rows["rag_hybrid:base_cosine"]
    assert hybrid["n_questions"] == 6 and hybrid["budget"]["max"] == 3  # the joiner's top_k: rag_top_k
    assert 0 <= hybrid["rag"]["em"] <= hybrid["rag"]["em_ci"][1] <= 100
    assert "rag_hybrid:base_cosine" in (out / "report.md").read_text()

    # one table, named by the index folder it was copied from, tagged and complete
    tables = sample_tables(pg_url)
    index = next(name for name in tables if (artifacts_dir() / "bench" / "indexes" / name.rsplit("_", 1)[1]).is_dir())
    folder = artifacts_dir() / "bench" / "indexes" / index.rsplit("_", 1)[1]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert pg_tables.bench_table("sample", folder) == index
    tag, rows_in_table = tables[index]
    assert rows_in_table == manifest["count"] == 455 and tag["checkpoint"] == manifest["checkpoint"]
    assert tag["strategy"] == "cosine"
    hybrid_cell = json.loads((out / "cells" / "sample__rag_hybrid__base_cosine__s0.json").read_text())
    corpus_ids = {json.loads(line)["id"] for line in (REPO_ROOT / "data/sample/corpus.jsonl").open()}
    assert all(set(ids) <= corpus_ids and len(ids) == 3 for ids in hybrid_cell["top_ids"])

    # a matching table is reused as it is; one that lost a row is copied again
    def no_copy(*args, **kwargs):
        raise AssertionError("a matching table was copied again")

    with monkeypatch.context() as patch, caplog.at_level(logging.INFO, logger="rag_mag.bench.pg_tables"):
        patch.setattr(pgvector, "copy_index", no_copy)
        assert pg_tables.ensure_table(pg_url, "sample", folder) == index
    assert "reused" in caplog.text
    with psycopg.connect(pg_url, autocommit=True) as connection:
        connection.execute(f"DELETE FROM {index} WHERE id = (SELECT id FROM {index} LIMIT 1)")
    assert pg_tables.table_state(pg_url, index)[1] == 454
    assert pg_tables.ensure_table(pg_url, "sample", folder) == index
    assert pg_tables.table_state(pg_url, index)[1] == 455
    with psycopg.connect(pg_url, autocommit=True) as connection:
        connection.execute(f"DROP TABLE {index}")

    # a wrong password is one line naming the URL without it, before any cell is scored
    wrong = _with_password(pg_url, "not-the-password")
    capsys.readouterr()
    code = main(["bench", str(config), "--output-dir", str(tmp_path / "refused"), "--llm-url", vllm_server,
                 "--pg-url", wrong])
    message = capsys.readouterr().err
    assert code == 2 and "cannot use PostgreSQL at" in message and "not-the-password" not in message
    assert "Traceback" not in message and not (tmp_path / "refused" / "cells").exists()


def _with_password(url: str, password: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{password}@{parts.hostname}:{parts.port}"))
