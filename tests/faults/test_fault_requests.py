"""Requests the demo must refuse (oversized, wrong type, foreign Host or Origin, bad fields), a bounded concurrent
load, a prompt too long for the model, a template the sandbox blocks, and Haystack's allowlist overrides."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from rag_mag.cli.main import main
from rag_mag.demo.app import create_app
from rag_mag.demo.indexes import IndexSpec
from rag_mag.demo.loading import load_index
from rag_mag.demo.messages import Event
from rag_mag.demo.service import DemoService
from rag_mag.serving.pipelines import PIPELINES_DIR, load_pipeline, run_pipeline
from tests.local import closed_port_url
from tests.tiny import tiny_encoder

pytestmark = pytest.mark.faults

RAG = PIPELINES_DIR / "rag.yaml"
ASK = {"question": "What is the capital of France?"}




@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("request-faults")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"p{i}", "title": t, "text": f"{t.lower()} is the capital of {c}"})
                              + "\n" for i, (t, c) in enumerate([("Paris", "france"), ("Rome", "italy"),
                                                                 ("Berlin", "germany")])))
    checkpoint = tiny_encoder(root / "tok", "qnorm", seed=1).save(root / "retriever-qnorm")
    run_pipeline(load_pipeline(RAG.with_name("indexing.yaml"), {
        "corpus": str(corpus), "retriever": str(checkpoint), "out": str(root / "index-qnorm"),
        "embedder.progress_bar": False}), {})
    return root / "index-qnorm", checkpoint


def make_service(built, **limits) -> DemoService:
    url = closed_port_url()
    return DemoService([load_index(IndexSpec("qnorm", *built), RAG, url)], url, **limits)


@pytest.fixture(scope="module")
def client(built):
    with TestClient(create_app(make_service(built)), base_url="http://127.0.0.1") as test_client:
        yield test_client


def refused(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"]
    return error["message"]


# ------------------------------------------------------------------------------ bodies
@pytest.mark.parametrize("path", ["/api/ask", "/api/ask/stream", "/v1/chat/completions"])
def test_an_oversized_body_is_413(client, path, fault_case):
    body = json.dumps({**ASK, "padding": "x" * (1 << 20)})
    message = refused(client.post(path, content=body, headers={"content-type": "application/json"}), 413,
                      "body_too_large")
    assert "limit" in message
    fault_case.clear_error()


def test_an_oversized_body_without_a_length_is_413_too(client, fault_case):
    def chunks():
        for _ in range(100):
            yield b"x" * 4096

    refused(client.post("/api/ask", content=chunks(), headers={"content-type": "application/json"}), 413,
            "body_too_large")
    fault_case.clear_error()


@pytest.mark.parametrize("path", ["/api/ask", "/v1/chat/completions"])
def test_a_body_nested_too_deeply_is_400(client, path, fault_case):
    body = "[" * 30_000 + "]" * 30_000  # 60 kB, under the size limit; deeper than the JSON parser's stack
    message = refused(client.post(path, content=body, headers={"content-type": "application/json"}), 400,
                      "invalid_json")
    assert "nested too deeply" in message
    fault_case.clear_error()


@pytest.mark.parametrize("path", ["/api/ask", "/api/ask/stream", "/v1/chat/completions"])
def test_filters_nested_too_deeply_are_400_not_a_recursion_error(client, path, fault_case):
    filters = {"field": "meta.file", "operator": "==", "value": "notes.md"}
    for _ in range(400):  # 13.7 kB, under the size limit; Haystack's evaluation would recurse 400 levels deep
        filters = {"operator": "NOT", "conditions": [filters]}
    body = ({"model": "qnorm", "messages": [{"role": "user", "content": ASK["question"]}], "filters": filters}
            if path.startswith("/v1") else {**ASK, "filters": filters})
    message = refused(client.post(path, json=body), 400, "invalid_request")
    assert "nested 401 levels deep" in message and "at most 32" in message
    fault_case.clear_error()


def test_filters_at_the_depth_limit_are_evaluated(client, fault_case):
    filters = {"field": "meta.file", "operator": "==", "value": "notes.md"}
    for _ in range(31):
        filters = {"operator": "NOT", "conditions": [filters]}
    response = client.post("/api/ask", json={**ASK, "filters": filters})
    assert response.status_code != 400 or "nested" not in response.text  # checked and passed on to the retriever
    fault_case.clear_error()


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          None])
def test_a_body_that_is_not_declared_json_is_415(client, content_type, fault_case):
    headers = {"content-type": content_type} if content_type else {}
    message = refused(client.post("/api/ask", content=json.dumps(ASK), headers=headers), 415,
                      "unsupported_media_type")
    assert "application/json" in message
    fault_case.clear_error()


# ------------------------------------------------------------------------------ hosts and origins
@pytest.mark.parametrize("headers", [{"host": "evil.example"}, {"host": "attacker.test:7860"},
                                     {"origin": "http://evil.example"}, {"origin": "null"},
                                     {"origin": "http://127.0.0.1.evil.example:7860"}])
def test_foreign_hosts_and_origins_are_403(client, headers, fault_case):
    for method, path in (("POST", "/api/ask"), ("GET", "/api/indexes"), ("GET", "/")):
        response = client.request(method, path, json=ASK if method == "POST" else None, headers=headers)
        assert response.status_code == 403, (path, response.text)
        assert response.json()["error"]["code"] in ("host_not_allowed", "origin_not_allowed")
        assert "--allowed-host" in response.json()["error"]["message"]
    fault_case.clear_error()


def test_local_hosts_and_origins_are_served(client, fault_case):
    for host in ("localhost:7860", "127.0.0.1", "[::1]:7860"):
        assert client.get("/api/indexes", headers={"host": host}).status_code == 200
    assert client.get("/api/indexes", headers={"origin": "http://localhost:7860"}).status_code == 200
    fault_case.survived()


def test_another_host_can_be_allowed(built, fault_case):
    app = create_app(make_service(built), allowed_hosts=["localhost", "demo.lan"])
    with TestClient(app, base_url="http://demo.lan") as lan:
        assert lan.get("/api/indexes").status_code == 200
        assert lan.get("/api/indexes", headers={"host": "other.lan"}).status_code == 403
    fault_case.survived()


# ------------------------------------------------------------------------------ fields and answers
def test_no_absolute_paths_in_api_answers(client, built, fault_case):
    text = client.get("/api/indexes").text + client.get("/v1/models").text + client.get("/health").text
    assert str(built[0].parent) not in text and "/tmp" not in text
    assert client.get("/api/indexes").json()["indexes"][0]["index_dir"] == "index-qnorm"
    fault_case.survived()


@pytest.mark.parametrize("stream", ["no", "false", 0, 1, [], {}])
def test_stream_must_be_a_boolean(client, stream, fault_case):
    message = refused(client.post("/v1/chat/completions", json={
        "model": "qnorm", "messages": [{"role": "user", "content": "hi"}], "stream": stream}), 400, "invalid_request")
    assert "stream must be true or false" in message
    fault_case.clear_error()


def _context_error(status: int = 400, message: str = "This model's maximum context length is 2048 tokens. "
                                                     "However, your request has 5210 input tokens."):
    import openai
    from haystack.core.errors import PipelineRuntimeError

    request = httpx.Request("POST", "http://127.0.0.1:8000/v1/chat/completions")
    cause = openai.APIStatusError(message, response=httpx.Response(status, request=request), body=None)
    error = PipelineRuntimeError.from_exception("llm", object, cause)
    error.__cause__ = cause
    return error


@pytest.mark.parametrize("status, message, expected, code", [
    (400, None, 400, "context_length_exceeded"),
    (500, "EngineCore died", 502, "llm_error"),
    (400, "temperature must be non-negative", 502, "llm_error"),
])
def test_vllm_error_statuses_are_clear(built, status, message, expected, code, fault_case):
    service = make_service(built)

    async def reachable():
        return []

    service.check_llm = reachable
    pipeline = service.indexes["qnorm"].pipeline

    async def failing(*args, **kwargs):
        raise _context_error(status, message) if message else _context_error(status)
        yield  # an async generator

    pipeline.run_async_generator = failing
    with TestClient(create_app(service), base_url="http://127.0.0.1") as client:
        text = refused(client.post("/api/ask", json=ASK), expected, code)
        if code == "context_length_exceeded":
            assert "do not fit the model's context" in text and "top-k" in text
        else:
            assert f"HTTP {status}" in text and message in text and "127.0.0.1:" in text
        assert client.post("/api/ask/stream", json=ASK).status_code == expected
    fault_case.clear_error()


def test_a_prompt_too_long_from_the_cli_is_one_line(monkeypatch, capsys, fault_case):
    from haystack import Pipeline

    from rag_mag.serving.pipelines import PromptTooLongError

    def run(self, *args, **kwargs):
        raise _context_error()

    monkeypatch.setattr(Pipeline, "run", run)
    with pytest.raises(PromptTooLongError, match="do not fit the model's context"):
        run_pipeline(Pipeline(), {}, preflight=False)
    fault_case.clear_error()


def test_a_template_the_sandbox_blocks_is_one_line(tmp_path, capsys, fault_case):
    pipeline = {"components": {"prompt_builder": {
        "type": "haystack.components.builders.chat_prompt_builder.ChatPromptBuilder",
        "init_parameters": {"template": "{% message role=\"user\" %}{{ question.__class__.__mro__ }}{% endmessage %}",
                            "required_variables": ["question"]}}}, "connections": []}
    (tmp_path / "p.yaml").write_text(json.dumps(pipeline))
    code = main(["run", str(tmp_path / "p.yaml"), "--no-preflight", "--input",
                 json.dumps({"prompt_builder": {"question": "hi"}})])
    err = capsys.readouterr().err
    assert code == 2 and "sandbox blocks" in err and "prompt_builder" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    fault_case.clear_error()


# ------------------------------------------------------------------------------ the allowlist
@pytest.mark.parametrize("name, value", [("HAYSTACK_UNSAFE_DESERIALIZATION", "1"),
                                         ("HAYSTACK_UNSAFE_DESERIALIZATION", "true"),
                                         ("HAYSTACK_DESERIALIZATION_ALLOWLIST", "os"),
                                         ("HAYSTACK_DESERIALIZATION_ALLOWLIST", "rag_mag.*,subprocess.*"),
                                         ("HAYSTACK_DESERIALIZATION_ALLOWLIST", "*")])
def test_haystack_overrides_that_widen_the_allowlist_are_refused(monkeypatch, capsys, name, value, fault_case):
    monkeypatch.setenv(name, value)
    code = main(["run", str(RAG), "--no-preflight", "--input", json.dumps({"question": "hi"})])
    err = capsys.readouterr().err
    assert code == 2 and name in err and "unset" in err
    for advert in ("unsafe=True", "allow_deserialization_module", "bypass", "If you trust"):
        assert advert not in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    fault_case.clear_error()


def test_an_allowlist_within_ours_is_accepted(monkeypatch, fault_case):
    monkeypatch.setenv("HAYSTACK_DESERIALIZATION_ALLOWLIST", "rag_mag.*,haystack_integrations")
    monkeypatch.setenv("HAYSTACK_UNSAFE_DESERIALIZATION", "0")
    assert load_pipeline(RAG) is not None
    fault_case.survived()


# ------------------------------------------------------------------------------ load
def test_a_bounded_concurrent_load(built, monkeypatch, fault_case):
    """60 questions at once against 2 slots and 8 waiting places: each is answered or told the demo is busy;
    never more than 2 run, nothing errs, and the demo is idle and answering afterwards."""
    import rag_mag.demo.runs as runs

    service = make_service(built, max_concurrency=2, max_waiting=8)
    peak = {"running": 0}

    async def reachable():
        return []

    class SlowRun:
        def __init__(self, loaded, question, top_k, generation_kwargs, **kwargs):
            self.question = question

        async def events(self):
            peak["running"] = max(peak["running"], service.load()["running"])
            await asyncio.sleep(0.05)
            yield Event("done", {"answer": "paris", "index": "qnorm", "sources": []})

    service.check_llm = reachable
    monkeypatch.setattr(runs, "PipelineRun", SlowRun)
    app = create_app(service)

    async def burst() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            responses = await asyncio.gather(*(client.post("/api/ask", json=ASK) for _ in range(60)))
            after = await client.post("/api/ask", json=ASK)
        return [r.status_code for r in responses] + [after.status_code]

    statuses = asyncio.run(burst())
    assert set(statuses) <= {200, 503} and statuses[-1] == 200
    assert statuses.count(200) >= 10 and peak["running"] <= 2
    assert service.load() == {"running": 0, "waiting": 0, "max_concurrency": 2}
    fault_case.survived()
