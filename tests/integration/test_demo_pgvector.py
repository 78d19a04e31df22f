"""``rag-mag serve`` on a PostgreSQL table (pipelines/rag_pgvector.yaml and rag_hybrid.yaml), against a PostgreSQL
server of this module's own and the real vLLM server: answers cite their sources with the score parts, the
documents panel lists the table and refuses uploads, and a table of another retriever is refused at start.
(The server going down during the demo is a fault case: tests/faults/test_fault_pgvector.py.)"""

from __future__ import annotations

import math

import httpx
import pytest

from rag_mag.cli.main import main
from rag_mag.models import REPO_ROOT
from rag_mag.serving.db import postgres
from rag_mag.serving.processes import find_free_port
from tests.integration.demo_support import QUESTION, DemoProcess, demo_indexes, supporting_ids

pytestmark = pytest.mark.integration

TABLE = "demo_served"
TIMEOUT = httpx.Timeout(300.0, connect=10.0)


def pipeline(name: str) -> str:
    return str(REPO_ROOT / "pipelines" / f"{name}.yaml")


@pytest.fixture(scope="module")
def pg_server(tmp_path_factory):
    """A PostgreSQL of this module's own (its own data folder and port): the default one is never touched."""
    folder = postgres.PgFolder(tmp_path_factory.mktemp("pg-demo") / "pg")
    url = postgres.start(folder, find_free_port())
    yield folder, url
    postgres.stop(folder)


def fill_table(url: str, index_dir, table: str) -> None:
    """``rag-mag export-index INDEX_DIR --pgvector TABLE`` on the server at ``url``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(postgres.URL_ENV, url)
        assert main(["export-index", str(index_dir), "--pgvector", table]) == 0


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    return demo_indexes(tmp_path_factory.mktemp("demo-indexes"))


@pytest.fixture(scope="module")
def table(pg_server, specs) -> str:
    fill_table(pg_server[1], specs[0].index_dir, TABLE)  # the qnorm index
    return TABLE


@pytest.fixture(scope="module", params=["rag_pgvector", "rag_hybrid"])
def demo(request, pg_server, specs, table, vllm_server, tmp_path_factory):
    server = DemoProcess([], vllm_server, tmp_path_factory.mktemp("demo-pg") / "serve.log", "--pipeline",
                         pipeline(request.param), "--table", table, "--pg-url", pg_server[1], "--retriever",
                         str(specs[0].retriever_dir))
    try:
        yield request.param, server.wait_ready()
    finally:
        assert server.stop() == 0, f"rag-mag serve did not stop cleanly; see {server.log_path}"


def test_a_question_on_the_table_is_answered_with_its_sources(demo):
    name, url = demo
    indexes = httpx.get(f"{url}/api/indexes", timeout=TIMEOUT).json()["indexes"]
    assert [(item["name"], item["table"], item["index_dir"]) for item in indexes] == [("qnorm", TABLE, None)]
    response = httpx.post(f"{url}/api/ask", json={"question": QUESTION, "top_k": 4}, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["index"] == "qnorm" and isinstance(body["answer"], str) and body["answer"].strip()
    sources = body["sources"]
    assert [source["rank"] for source in sources] == list(range(1, 5))  # the joiner takes top_k too
    assert supporting_ids() & {source["id"] for source in sources}, "no passage about the Quakers retrieved"
    assert all(source["title"] and source["text"] for source in sources)
    dense = [source for source in sources if source["cosine"] is not None]
    assert dense and (name == "rag_hybrid" or len(dense) == len(sources))
    if name == "rag_pgvector":  # the raw inner product, explained: cosine x query norm x document norm
        for source in sources:
            product = source["cosine"] * source["query_norm"] * source["document_norm"]
            assert math.isclose(source["score"], product, rel_tol=1e-4, abs_tol=1e-6)


def test_the_documents_panel_lists_the_table_and_refuses_uploads(demo):
    _, url = demo
    listing = httpx.get(f"{url}/api/documents", timeout=TIMEOUT).json()
    assert listing["table"] == TABLE and listing["uploads_dir"] is None and listing["documents"] > 0
    upload = httpx.post(f"{url}/api/documents", headers={"X-RagMag-Upload": "1"},
                        files={"file": ("notes.txt", b"some notes")}, timeout=TIMEOUT)
    assert upload.status_code == 409, upload.text
    assert f"rag-mag index PATH --store pgvector --table {TABLE}" in upload.json()["error"]["message"]


def test_a_table_of_another_retriever_is_refused_naming_both(pg_server, specs, table, capsys):
    cosine = specs[1].retriever_dir
    code = main(["serve", "--pipeline", pipeline("rag_pgvector"), "--table", table, "--pg-url", pg_server[1],
                 "--retriever", str(cosine), "--port", str(find_free_port())])
    message = capsys.readouterr().err.strip()
    assert code == 2 and len(message.splitlines()) == 1, message
    assert f"table {table} holds vectors of retriever checkpoint" in message
    assert "the pipeline's retriever is" in message


def test_a_missing_table_and_flags_of_the_other_store_are_one_line(pg_server, specs, capsys):
    retriever = ["--retriever", str(specs[0].retriever_dir), "--port", str(find_free_port())]
    assert main(["serve", "--pipeline", pipeline("rag_pgvector"), "--table", "no_such_table", "--pg-url",
                 pg_server[1], *retriever]) == 2
    assert "has no table no_such_table" in capsys.readouterr().err
    assert main(["serve", "--table", TABLE, *retriever]) == 2  # pipelines/rag.yaml reads FAISS folders
    assert "are for pipelines on PostgreSQL" in capsys.readouterr().err


def test_serve_starts_the_server_it_needs_and_stops_it_on_exit(specs, vllm_server, tmp_path, monkeypatch):
    import uvicorn

    from rag_mag.serving.db.pgvector import DEFAULT_TABLE

    folder, port = postgres.PgFolder(tmp_path / "pg"), find_free_port()
    url = postgres.start(folder, port)
    try:
        fill_table(url, specs[0].index_dir, DEFAULT_TABLE)
    finally:
        postgres.stop(folder)
    # `rag-mag db start`'s server, here in a folder and on a port of this test's own (5433 may be in use)
    start = postgres.start
    monkeypatch.delenv(postgres.URL_ENV, raising=False)  # no URL given (a module fixture before may have set one)
    monkeypatch.setattr(postgres, "default_folder", lambda: folder)
    monkeypatch.setattr(postgres, "start", lambda folder, **_: start(folder, port))
    seen = {}

    def serving(app, **_) -> None:  # instead of serving until Ctrl-C: what runs while the demo serves
        seen["port"] = postgres.running_port(folder)
        seen["indexes"] = app.state.service.index_info()

    monkeypatch.setattr(uvicorn, "run", serving)
    assert main(["serve", "--pipeline", pipeline("rag_pgvector"), "--retriever", str(specs[0].retriever_dir),
                 "--llm-url", vllm_server, "--port", str(find_free_port())]) == 0
    assert seen["port"] == port and [item["table"] for item in seen["indexes"]] == [DEFAULT_TABLE]
    assert postgres.running_port(folder) is None  # started by serve, so stopped by it


def test_concurrent_searches_on_one_store_get_their_own_rows(pg_server, table, monkeypatch):
    """The demo's questions share a store's connection and cursor (rag_mag/demo/tables.py says why that is safe)."""
    import asyncio

    import numpy as np

    from rag_mag.serving.db import pgvector

    monkeypatch.setenv(postgres.URL_ENV, pg_server[1])
    store = pgvector.table_store(table, 384)
    queries = np.random.default_rng(0).standard_normal((40, 384)).tolist()
    serial = [[d.id for d in store._embedding_retrieval(query, top_k=5)] for query in queries]

    async def concurrent() -> list[list[str]]:
        found = await asyncio.gather(*(store._embedding_retrieval_async(query, top_k=5) for query in queries))
        await store.close_async()
        return [[d.id for d in documents] for documents in found]

    assert asyncio.run(concurrent()) == serial
    store.close()
