"""The demo's HTTP API against ``rag-mag serve`` running with the real pipeline, MiniLM and the real vLLM server."""

from __future__ import annotations

import json
import math
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from rag_mag.serving.processes import find_free_port
from tests.integration.demo_support import (
    QUESTION,
    DemoProcess,
    demo_indexes,
    index_flags,
    serve_command,
    serve_env,
    supporting_ids,
)
from tests.local import closed_port_url

pytestmark = pytest.mark.integration

TIMEOUT = httpx.Timeout(300.0, connect=10.0)




@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    return demo_indexes(tmp_path_factory.mktemp("demo-indexes"))


@pytest.fixture(scope="module")
def demo(specs, vllm_server, tmp_path_factory):
    server = DemoProcess(specs, vllm_server, tmp_path_factory.mktemp("demo") / "serve.log", "--max-concurrency", "4")
    try:
        yield server.wait_ready()
    finally:
        assert server.stop() == 0, f"rag-mag serve did not stop cleanly; see {server.log_path}"


def check_sources(sources: list[dict], top_k: int, strategy: str) -> None:
    assert len(sources) == top_k
    assert [source["rank"] for source in sources] == list(range(1, top_k + 1))
    scores = [source["score"] for source in sources]
    assert scores == sorted(scores, reverse=True)
    for source in sources:
        assert source["id"] and source["title"] and source["text"]
        # The score is exactly its parts: cosine x query norm x document norm.
        product = source["cosine"] * source["query_norm"] * source["document_norm"]
        assert math.isclose(source["score"], product, rel_tol=1e-4, abs_tol=1e-6)
        assert -1.0 - 1e-5 <= source["cosine"] <= 1.0 + 1e-5
        assert math.isclose(source["query_norm"], 1.0, rel_tol=1e-4)  # cosine and qnorm normalize the query
        if strategy == "cosine":
            assert math.isclose(source["document_norm"], 1.0, rel_tol=1e-4)
        assert source["query_raw_norm"] > 0 and source["document_raw_norm"] > 0


@pytest.mark.parametrize("index", ["qnorm", "cosine"])
def test_a_question_is_answered_with_sources_and_score_parts(demo, index):
    response = httpx.post(f"{demo}/api/ask", json={"question": QUESTION, "index": index, "top_k": 5}, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["index"] == index and body["strategy"] == index and body["top_k"] == 5
    assert isinstance(body["answer"], str) and body["answer"].strip()
    check_sources(body["sources"], 5, index)
    assert supporting_ids() & {source["id"] for source in body["sources"]}, "no passage about the Quakers retrieved"
    assert 0 < body["retrieval_ms"] <= body["first_token_ms"] <= body["latency_ms"]
    assert body["model"] == "smollm2-135m-reader" and body["usage"]["completion_tokens"] > 0
    assert len(body["answer"].split()) <= 8, body["answer"]  # the trained reader answers with a span


def test_the_answer_streams_after_the_sources(demo):
    events = []
    with httpx.stream("POST", f"{demo}/api/ask/stream", json={"question": QUESTION, "index": "qnorm", "top_k": 3},
                      timeout=TIMEOUT) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        kind = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                kind = line[len("event: "):]
            elif line.startswith("data: "):
                events.append((kind, json.loads(line[len("data: "):])))
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "sources" and kinds[-1] == "done" and "error" not in kinds
    assert kinds.count("token") >= 2  # streamed piece by piece, not in one block
    check_sources(events[0][1]["sources"], 3, "qnorm")
    done = events[-1][1]
    assert "".join(data["text"] for kind, data in events if kind == "token").strip() == done["answer"]
    assert [s["id"] for s in done["sources"]] == [s["id"] for s in events[0][1]["sources"]]


@pytest.mark.parametrize("path", ["/api/ask", "/api/ask/stream"])
def test_bad_questions_and_unknown_indexes_are_4xx_with_a_clear_message(demo, path):
    cases = [({"question": ""}, 400, "the question is empty"),
             ({"question": "   "}, 400, "the question is empty"),
             ({"question": "why? " * 300}, 400, "the limit is 1000"),
             ({"question": QUESTION, "index": "learnable"}, 404, "unknown index 'learnable'; this demo serves: qnorm, "
                                                                  "cosine"),
             ({"question": QUESTION, "top_k": 99}, 400, "top_k must be a whole number from 1 to 8")]
    for body, status, message in cases:
        response = httpx.post(f"{demo}{path}", json=body, timeout=TIMEOUT)
        assert response.status_code == status, (body, response.text)
        assert message in response.json()["error"]["message"]


def test_indexes_and_health(demo):
    indexes = httpx.get(f"{demo}/api/indexes").json()
    assert [(i["name"], i["strategy"]) for i in indexes["indexes"]] == [("qnorm", "qnorm"), ("cosine", "cosine")]
    health = httpx.get(f"{demo}/health")
    assert health.status_code == 200 and health.json()["llm"]["reachable"] is True


def test_the_openai_compatible_endpoint_works_with_the_openai_client(demo):
    import openai

    client = openai.OpenAI(base_url=f"{demo}/v1", api_key="not-needed", max_retries=0, timeout=300.0)
    assert [model.id for model in client.models.list()] == ["qnorm", "cosine"]
    messages = [{"role": "system", "content": "ignored by the RAG pipeline"}, {"role": "user", "content": QUESTION}]
    completion = client.chat.completions.create(model="cosine", messages=messages)
    assert completion.model == "cosine" and completion.choices[0].message.role == "assistant"
    answer = completion.choices[0].message.content
    assert answer.strip() and completion.usage.completion_tokens > 0
    extras = completion.model_extra["rag_mag"]
    assert extras["strategy"] == "cosine" and len(extras["sources"]) == 5
    stream = client.chat.completions.create(model="cosine", messages=messages, stream=True)
    chunks = list(stream)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert len([chunk for chunk in chunks if chunk.choices and chunk.choices[0].delta.content]) >= 2
    assert streamed.strip() == answer  # greedy decoding: the same answer, streamed
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.NotFoundError, match="unknown model 'gpt-4'"):
        client.chat.completions.create(model="gpt-4", messages=messages)
    with pytest.raises(openai.BadRequestError, match="the question is empty"):
        client.chat.completions.create(model="qnorm", messages=[{"role": "user", "content": " "}])


def test_a_burst_of_simultaneous_questions_is_served(demo):
    questions = [f"{QUESTION} ({n})" if n % 2 else QUESTION for n in range(12)]

    def ask(n: int) -> httpx.Response:
        return httpx.post(f"{demo}/api/ask", json={"question": questions[n], "index": ("qnorm", "cosine")[n % 2],
                                                   "top_k": 2}, timeout=TIMEOUT)

    with ThreadPoolExecutor(max_workers=12) as pool:
        responses = list(pool.map(ask, range(12)))
    assert [r.status_code for r in responses] == [200] * 12, [r.text for r in responses if r.status_code != 200]
    assert all(r.json()["answer"].strip() for r in responses)
    # --max-concurrency 4: some questions waited for a slot instead of all reaching vLLM at once.
    assert max(r.json()["queue_ms"] for r in responses) > 0
    assert httpx.get(f"{demo}/health").json()["load"] == {"running": 0, "waiting": 0, "max_concurrency": 4}


def test_vllm_down_at_start_exits_with_a_clear_message(specs):
    result = subprocess.run(serve_command("--port", str(find_free_port()), "--llm-url", closed_port_url(),
                                          *index_flags(specs)), env=serve_env(), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 2
    assert "rag-mag serve: error: no vLLM server at" in result.stderr and "--start-llm" in result.stderr
    assert "Traceback" not in result.stderr


def test_vllm_down_while_serving_is_a_clear_503(specs, tmp_path: Path):
    from fastapi.testclient import TestClient

    from rag_mag.demo.app import create_app
    from rag_mag.demo.loading import load_index
    from rag_mag.demo.service import DemoService
    from rag_mag.serving.pipelines import default_pipeline

    url = closed_port_url()
    service = DemoService([load_index(spec, default_pipeline("rag"), url) for spec in specs], url)
    with TestClient(create_app(service), base_url="http://127.0.0.1") as client:
        for path in ("/api/ask", "/api/ask/stream"):
            response = client.post(path, json={"question": QUESTION})
            assert response.status_code == 503
            assert "no vLLM server at" in response.json()["error"]["message"]
        chat = client.post("/v1/chat/completions", json={"model": "qnorm", "messages": [
            {"role": "user", "content": QUESTION}], "stream": True})
        assert chat.status_code == 503 and chat.json()["error"]["type"] == "service_unavailable"
        assert client.get("/health").status_code == 503
