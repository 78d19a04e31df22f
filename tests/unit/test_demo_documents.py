"""The demo's documents panel without a model server: upload files into a served index, watch the background job,
see the files with their chunk counts, retrieve from them through the served store, delete one.

A tiny random encoder and a small corpus index built by pipelines/indexing.yaml; each test works on its own copy of
the index, so the uploads of one never reach another. The vLLM URL points at a closed port (answering is tested in
the integration tier, tests/integration/test_demo_documents_browser.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from rag_mag import durable
from rag_mag.components.faiss_document_store import FAISSDocumentStore
from rag_mag.demo import document_jobs
from rag_mag.demo.app import create_app
from rag_mag.demo.document_jobs import uploads_dir
from rag_mag.demo.indexes import IndexSpec
from rag_mag.demo.loading import load_index
from rag_mag.demo.service import DemoService
from rag_mag.ingestion import file_indexing
from rag_mag.serving.pipelines import PIPELINES_DIR, load_pipeline, run_pipeline
from tests.files import write_pdf
from tests.local import closed_port_url
from tests.tiny import tiny_encoder

RAG = PIPELINES_DIR / "rag.yaml"
UPLOAD = {"X-RagMag-Upload": "1"}
CORPUS = [("Paris", "paris is the capital city of france"), ("Berlin", "berlin is the capital of germany"),
          ("Rome", "rome is the capital of italy")]




@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("documents")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"p{i}", "title": t, "text": x}) + "\n"
                              for i, (t, x) in enumerate(CORPUS)))
    checkpoint = tiny_encoder(root / "tok", "qnorm", seed=1).save(root / "retriever-qnorm")
    run_pipeline(load_pipeline(PIPELINES_DIR / "indexing.yaml", {
        "corpus": str(corpus), "retriever": str(checkpoint), "out": str(root / "index-qnorm"),
        "embedder.progress_bar": False}), {})
    return root / "index-qnorm", checkpoint


@pytest.fixture
def index_copy(built, tmp_path) -> IndexSpec:
    shutil.copytree(built[0], tmp_path / "index-qnorm")
    return IndexSpec("qnorm", tmp_path / "index-qnorm", built[1])


@pytest.fixture
def service(index_copy) -> DemoService:
    url = closed_port_url()
    return DemoService([load_index(index_copy, RAG, url)], url, max_upload_mb=1)


@pytest.fixture
def client(service):
    with TestClient(create_app(service), base_url="http://127.0.0.1") as test_client:
        yield test_client


def upload(client, *files: tuple[str, bytes], index: str = "qnorm"):
    return client.post(f"/api/documents?index={index}", headers=UPLOAD,
                       files=[("files", (name, content, "application/octet-stream")) for name, content in files])


def wait_for_job(client, job_id: str, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/api/documents/jobs/{job_id}").json()["job"]
        if job["state"] in ("done", "failed"):
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish within {timeout} s")


def listed(client) -> dict[str, dict]:
    return {entry["file"]: entry for entry in client.get("/api/documents?index=qnorm").json()["files"]}


def files_of(tmp_path: Path) -> tuple[bytes, bytes, bytes]:
    pdf = write_pdf(tmp_path / "src" / "manual.pdf").read_bytes()
    return (b"The lighthouse keeper is called Oskar. He has lived on the island since 1982.\n",
            b"# Rivers\n\nThe Danube flows through ten countries.\n", pdf)


# ------------------------------------------------------------------------------------------ the round trip
def test_upload_list_retrieve_and_delete(client, service, index_copy, tmp_path):
    keeper, river, pdf = files_of(tmp_path)
    response = upload(client, ("keeper.txt", keeper), ("river.md", river), ("manual.pdf", pdf))
    assert response.status_code == 202, response.text
    job = response.json()["job"]
    assert response.headers["location"] == f"/api/documents/jobs/{job['id']}"
    assert job["state"] in ("queued", "running", "done") and job["requests"] == [
        "upload keeper.txt, river.md, manual.pdf"]
    done = wait_for_job(client, job["id"])
    assert done["state"] == "done" and done["error"] is None, done
    assert done["summary"].startswith("files: 3 added, 0 changed, 0 removed, 0 unchanged, 0 skipped")
    assert done["files_done"] == done["files_total"] == 3 and done["chunks_encoded"] > 0
    uploads = uploads_dir(index_copy.index_dir)
    assert sorted(p.name for p in uploads.iterdir()) == ["keeper.txt", "manual.pdf", "river.md"]
    assert (uploads / "manual.pdf").read_bytes() == pdf
    files = listed(client)
    assert set(files) == {"keeper.txt", "river.md", "manual.pdf"}
    assert files["manual.pdf"]["chunks"] == 3 and files["keeper.txt"]["chunks"] >= 1  # one chunk per PDF page
    assert all(entry["uploaded"] and entry["indexed"] for entry in files.values())
    body = client.get("/api/documents?index=qnorm").json()
    assert body["documents"] == len(CORPUS) + body["chunks"] == len(CORPUS) + done["chunks_encoded"]
    assert body["job"]["id"] == job["id"] and body["uploads_dir"] == "index-qnorm.uploads"
    assert client.get("/api/indexes").json()["indexes"][0]["documents"] == body["documents"]
    # the served pipeline's own retriever finds the new chunks (no vLLM needed)
    loaded = service.indexes["qnorm"]
    retriever = loaded.pipeline.get_component(loaded.retrievers[0])
    store = retriever.document_store
    row = next(row for row in range(store.count_documents()) if store.document_at(row).meta.get("file") == "river.md")
    found = retriever.run(np.asarray(store.embedding_at(row)).tolist(), top_k=2,
                          filters={"field": "meta.file", "operator": "==", "value": "river.md"})["documents"]
    assert found and "Danube" in found[0].content
    # the same files again: nothing encoded
    again = wait_for_job(client, upload(client, ("keeper.txt", keeper)).json()["job"]["id"])
    assert again["result"]["chunks_encoded"] == 0 and again["result"]["unchanged"] == 3
    # delete one: it leaves the folder, the index and the served store
    response = client.delete("/api/documents?index=qnorm&file=river.md", headers=UPLOAD)
    assert response.status_code == 202, response.text
    gone = wait_for_job(client, response.json()["job"]["id"])
    assert gone["state"] == "done" and gone["result"]["removed"] == ["river.md"]
    assert set(listed(client)) == {"keeper.txt", "manual.pdf"} and not (uploads / "river.md").exists()
    assert "river.md" not in store.files() and store.count_documents() == body["documents"] - files["river.md"][
        "chunks"]
    assert "river.md" not in FAISSDocumentStore(path=str(index_copy.index_dir)).files()


def test_a_file_the_indexing_refuses_is_listed_as_skipped_and_can_be_deleted(client, index_copy):
    job = wait_for_job(client, upload(client, ("empty.txt", b"   \n"), ("ok.txt", b"The vault code is 4711.\n"))
                       .json()["job"]["id"])
    assert job["state"] == "done" and job["skipped"] == [{"file": "empty.txt", "reason": "empty file (only "
                                                                                         "whitespace)"}]
    assert str(index_copy.index_dir.parent) not in json.dumps(job)  # names, never paths on the server
    files = listed(client)
    assert files["empty.txt"] == {"file": "empty.txt", "chunks": 0, "uploaded": True, "indexed": False}
    assert files["ok.txt"]["indexed"] and files["ok.txt"]["chunks"] == 1
    response = client.delete("/api/documents?file=empty.txt", headers=UPLOAD)  # the default index
    assert response.status_code == 202 and wait_for_job(client, response.json()["job"]["id"])["state"] == "done"
    assert set(listed(client)) == {"ok.txt"}


# ------------------------------------------------------------------------------------------ jobs
def test_uploads_during_a_job_are_queued_into_one_job_and_the_demo_keeps_answering(client, monkeypatch):
    release, entered = threading.Event(), threading.Event()
    real = document_jobs.IndexDocuments._index

    def slow_index(self, job):
        entered.set()
        assert release.wait(60)
        return real(self, job)

    monkeypatch.setattr(document_jobs.IndexDocuments, "_index", slow_index)
    first = upload(client, ("a.txt", b"The first file is about apples.\n")).json()["job"]
    assert entered.wait(30)
    second = upload(client, ("b.txt", b"The second file is about plums.\n")).json()["job"]
    third = upload(client, ("c.txt", b"The third file is about pears.\n")).json()["job"]
    assert second["state"] == "queued" and third["id"] == second["id"] != first["id"]
    assert third["requests"] == ["upload b.txt", "upload c.txt"]
    assert client.get("/api/documents").json()["job"]["state"] == "running"
    # the demo answers meanwhile: the index list, and a question (503: vLLM is down in this test)
    assert client.get("/api/indexes").status_code == 200
    asked = client.post("/api/ask", json={"question": "What is the capital of France?"})
    assert asked.status_code == 503 and "vLLM" in asked.json()["error"]["message"]
    release.set()
    assert wait_for_job(client, first["id"])["state"] == "done"
    queued = wait_for_job(client, second["id"])
    assert queued["state"] == "done", queued
    assert set(listed(client)) == {"a.txt", "b.txt", "c.txt"}


def test_a_job_that_cannot_take_the_index_lock_fails_with_a_clear_message(client, index_copy):
    with durable.job_lock(durable.lock_path(index_copy.index_dir), "the index (held by this test)"):
        job = wait_for_job(client, upload(client, ("a.txt", b"Some text.\n")).json()["job"]["id"])
    assert job["state"] == "failed" and "index-qnorm is being written by process" in job["error"]
    assert str(index_copy.index_dir.parent) not in job["error"]
    assert client.get("/api/documents/jobs/nonesuch").status_code == 404
    # the file waits in the folder; the next job indexes it
    assert listed(client)["a.txt"]["indexed"] is False
    assert wait_for_job(client, upload(client, ("b.txt", b"More text.\n")).json()["job"]["id"])["state"] == "done"
    assert {name for name, entry in listed(client).items() if entry["indexed"]} == {"a.txt", "b.txt"}


# ------------------------------------------------------------------------------------------ the parts
def test_the_store_reads_its_folder_again_after_reload(built, tmp_path):
    shutil.copytree(built[0], tmp_path / "index")
    served, writer = (FAISSDocumentStore(path=str(tmp_path / "index")) for _ in range(2))
    assert served.count_documents() == writer.count_documents() == len(CORPUS)
    writer.delete_documents([writer.document_at(0).id])  # saved atomically
    assert served.count_documents() == len(CORPUS)  # still what it loaded
    served.reload()
    assert served.count_documents() == len(CORPUS) - 1


def test_index_files_reports_progress(built, tmp_path, monkeypatch):
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(3):
        (folder / f"f{i}.txt").write_text(f"File number {i} is about the river.\n")
    calls = []
    monkeypatch.setattr(file_indexing, "FILES_PER_RUN", 2)
    summary = file_indexing.index_files([str(folder)], tmp_path / "index", built[1], progress=False,
                                        on_progress=lambda *args: calls.append(args))
    assert calls == [(0, 3, 0), (2, 3, 2), (3, 3, 3)] and summary.chunks_encoded == 3


def test_serve_takes_a_max_upload_size(capsys):
    from rag_mag.cli import serve

    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers())
    assert parser.parse_args(["serve"]).max_upload_mb == 20.0
    assert parser.parse_args(["serve", "--max-upload-mb", "2.5"]).max_upload_mb == 2.5
    for bad in ("0", "-1", "lots", "inf"):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", "--max-upload-mb", bad])
    assert "--max-upload-mb" in capsys.readouterr().err
    with pytest.raises(ValueError, match="max_upload_mb"):
        DemoService([object()], "http://127.0.0.1:1/v1", max_upload_mb=0)
