"""The real vLLM server killed (SIGKILL, its whole process group) in the middle of a streamed answer, then
restarted: the stream ends with one clear error event, the demo answers 503 while vLLM is down, and answers
again once it is back, without being restarted itself."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest

from rag_mag.serving import processes
from rag_mag.serving.llm import gguf_convert
from rag_mag.serving.llm import records as llm_records
from rag_mag.serving.llm import server as llm_server
from tests.integration.demo_support import InProcessDemo

pytestmark = [pytest.mark.faults, pytest.mark.integration]

START_TIMEOUT_S = 900.0
CHAT = {"model": "qnorm", "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "stream": True, "max_tokens": 512, "temperature": 2.0}  # long and random: still streaming when killed


ATTEMPTS = 3  # a sampled answer can end within a token or two, before the kill reaches it


def stream_and_kill(demo_url: str, record) -> tuple[list[str], float | None]:
    """Ask through the demo's streaming endpoint and SIGKILL vLLM's process group at the first token."""
    lines, killed_at = [], None
    with httpx.stream("POST", f"{demo_url}/v1/chat/completions", json=CHAT, timeout=120.0) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            lines.append(line)
            if killed_at is None and '"content": "' in line and '"content": ""' not in line:
                os.killpg(record.pid, signal.SIGKILL)  # the server and its engine process, mid-answer
                killed_at = time.monotonic()
    return lines, killed_at


def wait_port_free(port: int, timeout: float = 60.0) -> None:
    """The killed server's sockets are closed by the kernel a moment after SIGKILL."""
    deadline = time.monotonic() + timeout
    while processes.port_in_use("127.0.0.1", port) and time.monotonic() < deadline:
        time.sleep(0.5)


@pytest.fixture
def own_server():
    """A vLLM server of this test alone (the session's server must survive the other tests)."""
    gguf_convert.convert_gguf()
    port = processes.find_free_port()
    record = llm_server.start_server(port=port, timeout=START_TIMEOUT_S, extra_args=llm_server.EAGER_ARGS)
    try:
        yield port, record
    finally:
        llm_server.stop_server(port)
        llm_records.log_path(port).unlink(missing_ok=True)


def test_vllm_killed_mid_stream_and_restarted(own_server, tmp_path, fault_case):
    from rag_mag.demo.app import create_app
    from rag_mag.demo.indexes import IndexSpec
    from rag_mag.demo.loading import load_index
    from rag_mag.demo.service import DemoService
    from rag_mag.serving.pipelines import PIPELINES_DIR, load_pipeline, run_pipeline
    from tests.tiny import tiny_encoder

    port, record = own_server
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "p0", "title": "Paris", "text": "paris is the capital of france"}) + "\n")
    checkpoint = tiny_encoder(tmp_path / "tok", "qnorm").save(tmp_path / "retriever")
    run_pipeline(load_pipeline(PIPELINES_DIR / "indexing.yaml", {"corpus": str(corpus), "retriever": str(checkpoint),
                                                                  "out": str(tmp_path / "index"),
                                                                  "embedder.progress_bar": False}), {})
    url = record.api_base_url
    service = DemoService([load_index(IndexSpec("qnorm", tmp_path / "index", checkpoint), PIPELINES_DIR / "rag.yaml",
                                      url)], url)
    demo = InProcessDemo(create_app(service))
    try:
        for _attempt in range(ATTEMPTS):
            lines, killed_at = stream_and_kill(demo.url, record)
            assert killed_at is not None, "the answer ended before a token was streamed"
            assert time.monotonic() - killed_at < 30
            errors = [json.loads(line[6:])["error"] for line in lines if line.startswith('data: {"error"')]
            if errors or not lines or lines[-1] != "data: [DONE]":
                break
            # the whole (short, sampled) answer was on its way before the kill: start the server again, retry
            wait_port_free(port)
            record = llm_server.start_server(port=port, timeout=START_TIMEOUT_S, extra_args=llm_server.EAGER_ARGS)
        assert len(errors) == 1 and "vLLM server" in errors[0]["message"], lines[-3:]
        assert "Traceback" not in errors[0]["message"]

        down = httpx.post(f"{demo.url}/api/ask", json={"question": "What is the capital of France?"}, timeout=60)
        assert down.status_code == 503 and "rag-mag serve-llm" in down.json()["error"]["message"]

        # the same port: the demo is not restarted
        wait_port_free(port)
        llm_server.start_server(port=port, timeout=START_TIMEOUT_S, extra_args=llm_server.EAGER_ARGS)
        back = httpx.post(f"{demo.url}/api/ask", json={"question": "What is the capital of France?"}, timeout=300)
        assert back.status_code == 200, back.text
        assert back.json()["sources"][0]["id"] == "p0"
    finally:
        demo.stop()
    fault_case.survived()
