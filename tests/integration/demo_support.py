"""What the demo's integration tests share: two small real indexes and ``rag-mag serve`` run as a subprocess.

The indexes are the quickstart's (``artifacts/index-default`` = qnorm, ``artifacts/index-cosine``, which the
first ``rag-mag serve`` builds) when both are built; otherwise the packaged MiniLM (untrained, as
``MagnitudeEncoder.build`` gives it) indexes a slice of ``data/sample/corpus.jsonl`` under each strategy with
``pipelines/indexing.yaml``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from rag_mag.demo.indexes import IndexSpec, discover_indexes
from rag_mag.demo.keys import KEYS_FILE_ENV
from rag_mag.models import REPO_ROOT, artifacts_dir
from rag_mag.serving.processes import find_free_port, log_tail

logger = logging.getLogger(__name__)

SAMPLE = REPO_ROOT / "data" / "sample"
QUESTION = "Which English religious leader founded The Religious Society of Friends (Quakers) in the 17th Century?"
QUESTION_ID = "test_1405"
OTHER_PASSAGES = 60  # besides every sample question's own passages
START_TIMEOUT_S = 600.0


def supporting_ids(question_id: str = QUESTION_ID) -> set[str]:
    for line in (SAMPLE / "questions.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["id"] == question_id:
            return {context["id"] for context in record.get("contexts", [])
                    if context.get("is_supporting") or context.get("has_answer")}
    raise KeyError(question_id)


def _corpus_slice(path: Path) -> Path:
    wanted = {context["id"] for line in (SAMPLE / "questions.jsonl").read_text().splitlines()
              for context in json.loads(line).get("contexts", [])}
    lines = (SAMPLE / "corpus.jsonl").read_text().splitlines()
    kept = [line for line in lines if json.loads(line)["id"] in wanted]
    kept += [line for line in lines if json.loads(line)["id"] not in wanted][:OTHER_PASSAGES]
    path.write_text("\n".join(kept) + "\n")
    return path


def demo_indexes(root: Path) -> list[IndexSpec]:
    """qnorm and cosine index specs: the quickstart's when built, else small ones built under ``root``."""
    from rag_mag.retriever.encoder import MagnitudeEncoder
    from rag_mag.serving.pipelines import PIPELINES_DIR, load_pipeline, run_pipeline

    built = {spec.name: spec for spec in discover_indexes(artifacts_dir())}
    if {"qnorm", "cosine"} <= built.keys():
        return [built["qnorm"], built["cosine"]]
    root.mkdir(parents=True, exist_ok=True)
    corpus = _corpus_slice(root / "corpus.jsonl")
    specs = []
    for strategy in ("qnorm", "cosine"):
        retriever = MagnitudeEncoder.build(strategy=strategy).save(root / f"retriever-{strategy}")
        index = root / f"index-{strategy}"
        run_pipeline(load_pipeline(PIPELINES_DIR / "indexing.yaml", {
            "corpus": str(corpus), "retriever": str(retriever), "out": str(index), "embedder.progress_bar": False}),
            {})
        specs.append(IndexSpec(strategy, index, retriever))
    return specs


def index_flags(specs: list[IndexSpec]) -> list[str]:
    return [flag for spec in specs for flag in ("--index", f"{spec.name}={spec.index_dir}:{spec.retriever_dir}")]


def serve_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "rag_mag.cli.main", "serve", *args]


def serve_env(keys_file: Path | None = None) -> dict[str, str]:
    """The environment of ``rag-mag serve`` and ``rag-mag keys`` in tests; ``keys_file``: their key file (the
    default, artifacts/demo-keys.json, is the user's and stays out of tests that name another)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HAYSTACK_TELEMETRY_ENABLED": "False"}
    if keys_file is not None:
        env[KEYS_FILE_ENV] = str(keys_file)
    return env


class DemoProcess:
    """``rag-mag serve`` on a free port of 127.0.0.1, its output in ``log_path``; its key file is ``keys_file``
    (default: none beside the log, so the demo asks for no key)."""

    def __init__(self, specs: list[IndexSpec], llm_url: str, log_path: Path, *extra: str,
                 keys_file: Path | None = None) -> None:
        self.port = find_free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        command = serve_command("--port", str(self.port), "--llm-url", llm_url, *index_flags(specs), *extra)
        env = serve_env(keys_file or log_path.with_name("no-keys.json"))
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"rag-mag serve exited with {self.process.returncode}:\n{log_tail(self.log_path, 40)}")
            try:
                if httpx.get(f"{self.url}/health", timeout=5.0).status_code == 200:
                    return self.url
            except httpx.TransportError:
                pass  # still loading
            time.sleep(1.0)
        self.stop()
        pytest.fail(f"rag-mag serve was not ready within {timeout:.0f} s:\n{log_tail(self.log_path, 40)}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # uvicorn shuts down gracefully on Ctrl-C
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def app_without_llm(specs: list[IndexSpec]):
    """The demo app over the real pipelines, with the vLLM URL pointing at a closed port (vLLM "down")."""
    from rag_mag.demo.app import create_app
    from rag_mag.demo.loading import load_index
    from rag_mag.demo.service import DemoService
    from rag_mag.serving.pipelines import default_pipeline

    url = f"http://127.0.0.1:{find_free_port()}/v1"
    return create_app(DemoService([load_index(spec, default_pipeline("rag"), url) for spec in specs], url))


class InProcessDemo:
    """An app served by uvicorn in a thread of the test process (for states ``rag-mag serve`` refuses to start in)."""

    def __init__(self, app) -> None:
        import uvicorn

        self.port = find_free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_config=None,
                                                    access_log=False))
        self.thread = threading.Thread(target=self.server.run, name="demo-uvicorn", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                pytest.fail("the in-process demo server did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
