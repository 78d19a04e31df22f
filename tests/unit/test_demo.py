"""The demo app without a model server: index discovery, request validation, error responses, thread safety.

A tiny random encoder and a real index built by pipelines/indexing.yaml; the vLLM URL points at a closed
port, so every path that would generate must fail with a clear 503 (the answering paths run in the
integration tier against the real vLLM server: tests/integration/test_demo_api.py).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from rag_mag.demo.app import create_app
from rag_mag.demo.indexes import IndexSpec, discover_indexes, parse_index_spec
from rag_mag.demo.loading import answer_generators, load_index
from rag_mag.demo.messages import RequestError
from rag_mag.demo.openai_api import question_of
from rag_mag.demo.service import MAX_QUESTION_CHARS, DemoService
from rag_mag.errors import ConfigError
from rag_mag.serving.pipelines import PIPELINES_DIR, load_pipeline, run_pipeline
from tests.local import closed_port_url
from tests.tiny import tiny_encoder

RAG = PIPELINES_DIR / "rag.yaml"




@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("demo")
    corpus = root / "corpus.jsonl"
    rows = [{"id": f"p{i}", "title": title, "text": text} for i, (title, text) in enumerate([
        ("Paris", "paris is the capital city of france"), ("Berlin", "berlin is the capital of germany"),
        ("Rome", "rome is the capital of italy"), ("Thames", "the thames is a river in london england"),
        ("Hamlet", "hamlet is a book the king wrote"), ("Ocean", "the ocean queen song"),
    ])]
    corpus.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    folders = {}
    for strategy in ("qnorm", "cosine"):
        checkpoint = tiny_encoder(root / f"tok-{strategy}", strategy, seed=1).save(root / f"retriever-{strategy}")
        index = root / f"index-{strategy}"
        run_pipeline(load_pipeline(PIPELINES_DIR / "indexing.yaml", {
            "corpus": str(corpus), "retriever": str(checkpoint), "out": str(index), "embedder.progress_bar": False}),
            {})
        folders[strategy] = (index, checkpoint)
    return {"root": root, **folders}


@pytest.fixture(scope="module")
def service(built) -> DemoService:
    url = closed_port_url()
    loaded = [load_index(IndexSpec(name, *built[name]), RAG, url) for name in ("qnorm", "cosine")]
    return DemoService(loaded, url, max_concurrency=2, max_top_k=4)


@pytest.fixture(scope="module")
def client(service):
    with TestClient(create_app(service), base_url="http://127.0.0.1") as test_client:
        yield test_client


# ------------------------------------------------------------------------------------------ indexes
def test_parse_index_spec():
    spec = parse_index_spec("qnorm=artifacts/index-default:artifacts/retriever-default")
    assert spec == IndexSpec("qnorm", Path("artifacts/index-default"), Path("artifacts/retriever-default"))
    for bad in ("qnorm", "qnorm=only-one-dir", "=a:b", "bad name=a:b"):
        with pytest.raises(ConfigError, match="--index|index name"):
            parse_index_spec(bad)


def test_discovery_names_pairs_by_strategy_default_first(tmp_path):
    def pair(suffix: str, strategy: str, retriever: bool = True) -> None:
        (tmp_path / f"index-{suffix}").mkdir()
        (tmp_path / f"index-{suffix}" / "manifest.json").write_text(json.dumps({"strategy": strategy}))
        if retriever:
            (tmp_path / f"retriever-{suffix}").mkdir()
            (tmp_path / f"retriever-{suffix}" / "rag_mag.json").write_text("{}")

    pair("cosine", "cosine")
    pair("default", "qnorm")
    pair("orphan", "dot", retriever=False)
    assert [(s.name, s.index_dir.name) for s in discover_indexes(tmp_path)] == [
        ("qnorm", "index-default"), ("cosine", "index-cosine")]
    pair("qnorm2", "qnorm")  # two qnorm indexes: named by their folder suffix instead
    assert [s.name for s in discover_indexes(tmp_path)] == ["default", "cosine", "qnorm2"]


def test_a_mismatched_retriever_is_refused_at_start(built):
    from rag_mag.errors import CheckpointError

    with pytest.raises(CheckpointError, match="pair the index with the retriever that built it"):
        load_index(IndexSpec("mixed", built["qnorm"][0], built["cosine"][1]), RAG, closed_port_url())


def test_the_answer_generator_is_the_one_feeding_the_answer_builder(service):
    assert service.indexes["qnorm"].answer_generators == ("llm",)
    multihop = load_pipeline(PIPELINES_DIR / "rag_multihop.yaml")
    assert answer_generators(multihop) == ("llm",)  # not followup_llm, which writes search queries


# ------------------------------------------------------------------------------------------ validation
@pytest.mark.parametrize(("question", "index", "top_k", "status", "code"), [
    ("", None, None, 400, "question_empty"),
    ("   \n ", None, None, 400, "question_empty"),
    (None, None, None, 400, "question_empty"),
    ("x" * (MAX_QUESTION_CHARS + 1), None, None, 400, "question_too_long"),
    ("who?", "nope", None, 404, "index_not_found"),
    ("who?", None, 0, 400, "invalid_request"),
    ("who?", None, 5, 400, "invalid_request"),
    ("who?", None, "3", 400, "invalid_request"),
])
def test_bad_requests_are_refused(service, question, index, top_k, status, code):
    with pytest.raises(RequestError) as caught:
        service.validate(question, index, top_k)
    assert (caught.value.status, caught.value.code) == (status, code)


def test_good_requests_pass(service):
    question, loaded, top_k = service.validate("  " + "x" * MAX_QUESTION_CHARS + " ")
    assert len(question) == MAX_QUESTION_CHARS and loaded.spec.name == "qnorm" and top_k == 4  # capped at max_top_k
    assert service.validate("who?", "cosine", 2)[1:] == (service.indexes["cosine"], 2)


def test_the_question_is_the_last_user_message():
    assert question_of({"messages": [{"role": "user", "content": "first"}, {"role": "assistant", "content": "a"},
                                     {"role": "user", "content": "second"}, {"role": "assistant", "content": ""}]}) \
        == "second"
    parts = [{"type": "text", "text": "who wrote"}, {"type": "image_url", "image_url": {}}, {"type": "text",
                                                                                           "text": "Hamlet?"}]
    assert question_of({"messages": [{"role": "user", "content": parts}]}) == "who wrote\nHamlet?"
    for body in ({}, {"messages": []}, {"messages": [{"role": "system", "content": "x"}]},
                 {"messages": [{"role": "user", "content": 3}]}):
        with pytest.raises(RequestError):
            question_of(body)


# ------------------------------------------------------------------------------------------ HTTP
def test_page_and_static_files_are_served(client):
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "/static/app.js" in page.text and "http" not in page.text.split("<body>")[1].replace("http-equiv", "")
    for name in ("app.js", "style.css"):
        assert client.get(f"/static/{name}").status_code == 200


def test_indexes_endpoint(client):
    body = client.get("/api/indexes").json()
    assert [i["name"] for i in body["indexes"]] == ["qnorm", "cosine"] and body["default"] == "qnorm"
    assert [i["strategy"] for i in body["indexes"]] == ["qnorm", "cosine"]
    assert body["indexes"][0]["documents"] == 6 and body["max_question_chars"] == MAX_QUESTION_CHARS
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["qnorm", "cosine"]


@pytest.mark.parametrize("path", ["/api/ask", "/api/ask/stream"])
def test_http_errors_are_clear_json(client, path):
    empty = client.post(path, json={"question": " "})
    assert empty.status_code == 400 and "the question is empty" in empty.json()["error"]["message"]
    long = client.post(path, json={"question": "x" * 1500})
    assert long.status_code == 400 and "1500 characters long; the limit is 1000" in long.json()["error"]["message"]
    unknown = client.post(path, json={"question": "who?", "index": "dot"})
    assert unknown.status_code == 404 and "unknown index 'dot'; this demo serves: qnorm, cosine" in \
        unknown.json()["error"]["message"]
    not_json = client.post(path, content=b"{", headers={"content-type": "application/json"})
    assert not_json.status_code == 400 and "not valid JSON" in not_json.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/api/ask", "/api/ask/stream"])
def test_vllm_down_is_a_clear_503(client, path):
    response = client.post(path, json={"question": "What is the capital of France?"})
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "llm_unavailable" and "no vLLM server at" in error["message"]
    assert "rag-mag serve-llm" in error["message"]
    health = client.get("/health")
    assert health.status_code == 503 and health.json()["llm"]["reachable"] is False


def test_openai_endpoint_errors(client):
    down = client.post("/v1/chat/completions", json={"model": "qnorm", "messages": [
        {"role": "user", "content": "Who wrote Hamlet?"}]})
    assert down.status_code == 503 and down.json()["error"]["type"] == "service_unavailable"
    unknown = client.post("/v1/chat/completions", json={"model": "gpt-4", "messages": [
        {"role": "user", "content": "hi"}]})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert "unknown model 'gpt-4'" in unknown.json()["error"]["message"]
    no_user = client.post("/v1/chat/completions", json={"model": "qnorm", "messages": [
        {"role": "system", "content": "be brief"}]})
    assert no_user.status_code == 400 and "no user message" in no_user.json()["error"]["message"]


# ------------------------------------------------------------------------------------------ threads
def test_shared_embedder_is_safe_from_many_threads(built):
    pipeline = load_pipeline(RAG, {"index": str(built["qnorm"][0]), "retriever": str(built["qnorm"][1])})
    pipeline.warm_up()
    embedder = pipeline.get_component("text_embedder")
    texts = [f"what is the capital of {word} city" * (1 + i % 3) for i, word in enumerate(
        ["france", "germany", "italy", "england"] * 6)]
    expected = [embedder.run(text)["embedding"] for text in texts]
    results: dict[int, list[float]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(texts))

    def work(i: int) -> None:
        barrier.wait()
        try:
            results[i] = embedder.run(texts[i])["embedding"]
        except BaseException as error:  # collected and re-raised by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(texts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for i, vector in enumerate(expected):
        np.testing.assert_allclose(results[i], vector, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------ a PostgreSQL table
def test_a_lost_database_in_a_run_is_one_line_without_the_password(monkeypatch):
    import psycopg
    from haystack.core.errors import PipelineRuntimeError
    from haystack.document_stores.errors import DocumentStoreError

    from rag_mag.demo.app import error_body, error_status
    from rag_mag.demo.tables import database_error

    url = "postgresql://ragmag:s3cret@127.0.0.1:5999/ragmag"
    monkeypatch.setenv("RAG_MAG_PG_URL", url)
    try:  # the chain Haystack raises: the pipeline's error <- the store's <- psycopg's
        try:
            try:
                raise psycopg.OperationalError(f"connection to {url} failed: Connection refused\n\tIs it running?")
            except psycopg.OperationalError as lost:
                raise DocumentStoreError("Could not retrieve documents") from lost
        except DocumentStoreError as store_error:
            raise PipelineRuntimeError("retriever", object, "failed") from store_error
    except PipelineRuntimeError as caught:
        error = database_error(caught)
    assert error is not None and error_status(error) == 503
    body = error_body(error)["error"]
    assert body["code"] == "database_unavailable" and len(body["message"].splitlines()) == 1
    assert "s3cret" not in body["message"] and "postgresql://ragmag:***@127.0.0.1:5999/ragmag" in body["message"]
    assert "`rag-mag db start`" in body["message"]
    assert database_error(ValueError("not the database")) is None


def test_serve_refuses_table_flags_for_a_faiss_pipeline_and_index_flags_for_a_table(capsys):
    from rag_mag.cli.main import main

    assert main(["serve", "--table", "rag_mag_docs"]) == 2
    assert "--table are for pipelines on PostgreSQL" in capsys.readouterr().err
    pgvector_pipeline = str(PIPELINES_DIR / "rag_pgvector.yaml")
    assert main(["serve", "--pipeline", pgvector_pipeline, "--index", "a=b:c"]) == 2
    assert "pass --table NAME" in capsys.readouterr().err
    assert main(["serve", "--pipeline", pgvector_pipeline, "--table", "Bad-Name"]) == 2
    assert "bad table name 'Bad-Name'" in capsys.readouterr().err
