"""Faults of the PostgreSQL path, against real servers: a wrong password, an unreachable URL, a server that goes
down before `ask` and during the demo (`rag-mag serve` on a table, with the real vLLM server), kill -9 of the
server while a folder is indexed, two writers of one table, and filter values full of SQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rag_mag.cli.main import main
from rag_mag.models import REPO_ROOT, default_retriever_dir
from rag_mag.serving.db import pgvector, postgres
from rag_mag.serving.processes import find_free_port
from tests.faults.test_fault_disk import one_error_line
from tests.files import write_pdf

pytestmark = [pytest.mark.faults, pytest.mark.integration]

RAG_PGVECTOR = str(REPO_ROOT / "pipelines" / "rag_pgvector.yaml")
RETRIEVER = ["--retriever", str(default_retriever_dir())]


@pytest.fixture(scope="module")
def private_server(tmp_path_factory):
    """A PostgreSQL of this module's own (its own data folder and port), which the tests may stop and kill."""
    folder = postgres.PgFolder(tmp_path_factory.mktemp("pg-faults") / "pg")
    port = find_free_port()
    url = postgres.start(folder, port)
    yield folder, port, url
    postgres.stop(folder)


def facts_folder(root: Path, count: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for number in range(count):
        sentences = " ".join(f"Fact {number}-{line} says the item number {number} weighs {line} kilograms."
                             for line in range(30))
        (root / f"file{number:03d}.txt").write_text(sentences)
    return root


def test_a_wrong_password_is_one_line_without_the_password(private_server, capsys, fault_case):
    _, port, _ = private_server
    url = f"postgresql://ragmag:not-the-password@127.0.0.1:{port}/ragmag"
    assert main(["ask", "Who?", "--pipeline", RAG_PGVECTOR, "--pg-url", url, *RETRIEVER]) == 2
    message = capsys.readouterr().err.strip()
    assert len(message.splitlines()) == 1 and "not-the-password" not in message
    assert f"postgresql://ragmag:***@127.0.0.1:{port}/ragmag" in message and "password" in message
    fault_case.clear_error()


def test_an_unreachable_url_is_one_line_within_2_seconds(capsys, fault_case):
    url = f"postgresql://ragmag:secret@127.0.0.1:{find_free_port()}/ragmag"
    started = time.perf_counter()
    assert main(["index", str(REPO_ROOT / "data"), "--store", "pgvector", "--pg-url", url, *RETRIEVER]) == 2
    message = capsys.readouterr().err.strip()
    assert time.perf_counter() - started < 2.0 + 1.5  # the connect timeout, and the CLI's own start
    assert len(message.splitlines()) == 1 and "secret" not in message and "cannot use PostgreSQL" in message
    fault_case.clear_error()


def test_the_server_down_before_ask_is_one_line(private_server, tmp_path, capsys, fault_case):
    folder, port, url = private_server
    docs = facts_folder(tmp_path / "docs", 2)
    assert main(["index", str(docs), "--store", "pgvector", "--pg-url", url, *RETRIEVER]) == 0
    capsys.readouterr()
    postgres.stop(folder)
    try:
        started = time.perf_counter()
        code = main(["ask", "What weighs 3 kilograms?", "--pipeline", RAG_PGVECTOR, "--pg-url", url, *RETRIEVER])
        seconds = time.perf_counter() - started
        message = capsys.readouterr().err.strip()
        assert code == 2 and seconds < 2.0 and len(message.splitlines()) == 1
        assert "cannot use PostgreSQL at" in message and "***" in message
    finally:
        postgres.start(folder, port)
    fault_case.clear_error()


def test_sql_in_a_filter_value_changes_only_the_result(private_server, tmp_path, fault_case):
    _, _, url = private_server
    os.environ[postgres.URL_ENV] = url
    docs = facts_folder(tmp_path / "docs", 2)
    assert main(["index", str(docs), "--store", "pgvector", "--table", "test_sql", "--pg-url", url, *RETRIEVER]) == 0
    store = pgvector.table_store("test_sql", 384)
    before = store.count_documents()
    for value in ["x'); DROP TABLE test_sql; --", "file000.txt' OR '1'='1", "\\'; DELETE FROM test_sql; --"]:
        assert store.filter_documents({"field": "meta.file", "operator": "==", "value": value}) == []
        assert store.filter_documents({"field": "meta.file", "operator": "in", "value": [value]}) == []
    assert store.count_documents() == before > 0
    fault_case.survived()


def test_a_second_writer_of_a_table_is_refused(private_server, tmp_path, capsys, fault_case):
    _, _, url = private_server
    docs = facts_folder(tmp_path / "docs", 2)
    with pgvector.table_lock(url, "test_locked"):
        code = main(["index", str(docs), "--store", "pgvector", "--table", "test_locked", "--pg-url", url,
                     *RETRIEVER])
    message = capsys.readouterr().err
    assert code == 2 and "table test_locked is being written by another process" in message
    assert pgvector.table_files("test_locked", url) == [] if _exists(url, "test_locked") else True
    assert main(["index", str(docs), "--store", "pgvector", "--table", "test_locked", "--pg-url", url,
                 *RETRIEVER]) == 0
    fault_case.clear_error()


def _exists(url: str, table: str) -> bool:
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        return connection.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0] is not None


def _chunks_by_file(url: str, table: str) -> dict[str, list[int]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        rows = connection.execute(f"SELECT meta->>'file', (meta->>'chunk_index')::int FROM {table}").fetchall()
    grouped: dict[str, list[int]] = {}
    for name, index in rows:
        grouped.setdefault(name, []).append(index)
    return {name: sorted(indexes) for name, indexes in grouped.items()}


def test_kill_9_of_the_server_while_indexing_loses_nothing_committed(private_server, tmp_path, fault_case):
    folder, port, url = private_server
    docs = facts_folder(tmp_path / "docs", 160)
    write_pdf(docs / "pages.pdf")
    reference = tmp_path / "faiss"  # what each file's chunks are, from the FAISS path
    assert main(["index", str(docs), "--out", str(reference), *RETRIEVER]) == 0
    expected = {name: sorted(c) for name, c in _faiss_chunks(reference).items()}
    command = [sys.executable, "-m", "rag_mag.cli.main", "index", str(docs), "--store", "pgvector", "--table",
               "test_kill", "--pg-url", url, *RETRIEVER]
    child = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and not (_exists(url, "test_kill") and len(_chunks_by_file(url, "test_kill")) >= 5):
        time.sleep(0.2)
    postmaster = int((folder.data / "postmaster.pid").read_text().splitlines()[0])
    os.kill(postmaster, signal.SIGKILL)
    _, stderr = child.communicate(timeout=120)
    assert child.returncode != 0 and "Traceback" not in stderr, stderr[-2000:]
    for pid in subprocess.run(["pgrep", "-f", str(folder.data)], capture_output=True, text=True).stdout.split():
        os.kill(int(pid), signal.SIGKILL)  # the postmaster's children, orphaned
    time.sleep(1)
    postgres.start(folder, port)  # crash recovery replays the log
    survived = _chunks_by_file(url, "test_kill")
    assert 0 < len(survived) < len(expected)
    for name, indexes in survived.items():
        assert indexes == expected[name], name  # whole, never half a file
    assert main(["index", str(docs), "--store", "pgvector", "--table", "test_kill", "--pg-url", url, *RETRIEVER]) == 0
    assert _chunks_by_file(url, "test_kill") == expected
    fault_case.survived()


def _faiss_chunks(index: Path) -> dict[str, list[int]]:
    from rag_mag.components.faiss_document_store import FAISSDocumentStore

    grouped: dict[str, list[int]] = {}
    for document in FAISSDocumentStore(path=str(index)).filter_documents():
        grouped.setdefault(document.meta["file"], []).append(document.meta["chunk_index"])
    return grouped


def test_the_server_down_during_the_demo_is_one_line_and_the_demo_recovers(private_server, vllm_server, tmp_path,
                                                                            fault_case):
    from tests.integration.demo_support import QUESTION, DemoProcess, demo_indexes

    folder, port, url = private_server
    qnorm = demo_indexes(tmp_path / "indexes")[0]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(postgres.URL_ENV, url)
        assert main(["export-index", str(qnorm.index_dir), "--pgvector", "test_demo_down"]) == 0
    demo = DemoProcess([], vllm_server, tmp_path / "serve.log", "--pipeline", RAG_PGVECTOR, "--table",
                       "test_demo_down", "--pg-url", url, "--retriever", str(qnorm.retriever_dir))

    def ask() -> httpx.Response:
        return httpx.post(f"{demo.url}/api/ask", json={"question": QUESTION, "top_k": 3}, timeout=300.0)

    try:
        demo.wait_ready()
        assert ask().status_code == 200
        postgres.stop(folder)
        try:
            started = time.perf_counter()
            down = ask()
            seconds = time.perf_counter() - started
            error = down.json()["error"]
            assert down.status_code == 503 and seconds < 2.0, (down.status_code, seconds, error)
            assert error["code"] == "database_unavailable" and len(error["message"].splitlines()) == 1
            assert f"lost PostgreSQL at {postgres.redact(url)}" in error["message"] and "***" in error["message"]
            assert postgres.read_password(folder) not in error["message"]
            assert "`rag-mag db start`" in error["message"]
            streamed = httpx.post(f"{demo.url}/api/ask/stream", json={"question": QUESTION}, timeout=300.0)
            assert streamed.status_code == 503 and streamed.json()["error"]["code"] == "database_unavailable"
            health = httpx.get(f"{demo.url}/health", timeout=30.0)
            assert health.status_code == 503 and health.json()["database"]["reachable"] is False
            assert health.json()["llm"]["reachable"] is True and "***" in health.json()["database"]["error"]
        finally:
            postgres.start(folder, port)
        health = httpx.get(f"{demo.url}/health", timeout=30.0)
        assert health.status_code == 200 and health.json()["database"] == {"reachable": True}
        back = ask()  # the same demo process: its stores open new connections
        assert back.status_code == 200, back.text
        assert back.json()["answer"].strip() and len(back.json()["sources"]) == 3
    finally:
        assert demo.stop() == 0
    log = demo.log_path.read_text()
    assert "Traceback" not in log, log[-3000:]
    assert sum("lost PostgreSQL" in line for line in log.splitlines()) == 2, log[-3000:]  # one line per question
    fault_case.survived()


@pytest.fixture
def server_on_a_small_disk(tmp_path):
    """A PostgreSQL whose data folder is on a 160 MB tmpfs of its own (needs root to mount; CI runs as root)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160m,mode=0755", "tmpfs", str(disk)],
                             capture_output=True, text=True, timeout=30)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or 'not permitted'}; it needs root)")
    folder = postgres.PgFolder(disk / "pg")
    port = find_free_port()
    try:
        yield disk, folder, postgres.start(folder, port)
    finally:
        postgres.stop(folder)
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_nearly_full_data_disk_refuses_the_write_and_reads_keep_working(server_on_a_small_disk, tmp_path,
                                                                          capsys, fault_case):
    """Before a file's rows would leave PostgreSQL less than 64 MB for its WAL, `index` stops with one line;
    the server stays up (a full WAL disk would PANIC it), the files committed before stay readable, and once
    space is freed the same command completes."""
    from rag_mag import durable

    disk, folder, url = server_on_a_small_disk
    docs = facts_folder(tmp_path / "docs", 3)
    table = ["--store", "pgvector", "--table", "test_disk", "--pg-url", url, *RETRIEVER]
    assert main(["index", str(docs / "file000.txt"), *table]) == 0
    ballast = disk / "ballast"
    with open(ballast, "wb") as handle:  # leave 40 MB: under the 64 MB reserve
        handle.write(b"\0" * max(0, durable.free_bytes(disk) - (40 << 20)))
    capsys.readouterr()
    assert main(["index", str(docs), *table]) == 2
    message = one_error_line(capsys.readouterr().err, "index")
    assert "not enough disk space for writing file001.txt into test_disk" in message and "64 MB kept free" in message
    assert postgres.running_port(folder) is not None  # the server did not stop
    assert pgvector.table_files("test_disk", url) == ["file000.txt"]  # reads work; nothing half-written
    ballast.unlink()
    assert main(["index", str(docs), *table]) == 0
    assert sorted(pgvector.table_files("test_disk", url)) == ["file000.txt", "file001.txt", "file002.txt"]
    fault_case.clear_error()


def test_a_disk_full_error_of_the_server_is_one_line(fault_case):
    """A full disk on a remote server (not checked beforehand) comes back as SQLSTATE 53100: one line."""
    import psycopg

    from rag_mag.errors import DiskFullError

    url = "postgresql://ragmag:secret@db.example:5432/ragmag"
    with pytest.raises(DiskFullError, match=r"PostgreSQL at postgresql://ragmag:\*\*\*@db.example:5432/ragmag ran "
                                            r"out of resources while writing t .*rolled back.*committed is kept"):
        with pgvector.connection_errors(url, "writing t"):
            raise psycopg.errors.DiskFull("could not extend file \"base/5/16384\": No space left on device")
    fault_case.clear_error()
