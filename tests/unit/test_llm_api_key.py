"""The API key of the vLLM servers rag-mag starts: made once (random, mode 0600) beside the pid files, given to the
server in its environment (never on its command line), and put in this process's $VLLM_API_KEY, where the
pre-flight and every VLLMChatGenerator find it. A stand-in server asks for it like vLLM does (401 on /v1 without)."""

from __future__ import annotations

import json
import stat
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rag_mag.errors import ConfigError
from rag_mag.serving import processes
from rag_mag.serving.llm import preflight as llm_preflight
from rag_mag.serving.llm import records as llm_records
from rag_mag.serving.llm import server as llm_server
from rag_mag.serving.llm import settings as llm_settings

# vLLM's own check (vllm/entrypoints/serve/middleware/authenticate.py): /v1 wants "Bearer $VLLM_API_KEY", /health not.
STAND_IN = """
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[1:]
port, name, key = int(args[args.index("--port") + 1]), args[args.index("--served-model-name") + 1], \\
    os.environ.get("VLLM_API_KEY")
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        allowed = self.path == "/health" or not key or self.headers.get("Authorization") == f"Bearer {key}"
        body = json.dumps({"data": [{"id": name}]}).encode() if self.path == "/v1/models" and allowed else b""
        self.send_response(401 if not allowed else 200 if self.path in ("/health", "/v1/models") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@pytest.fixture(autouse=True)
def isolated_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAG_MAG_ARTIFACTS", str(tmp_path / "artifacts"))
    monkeypatch.delenv(llm_settings.URL_ENV, raising=False)
    monkeypatch.delenv(llm_settings.API_KEY_ENV, raising=False)
    return tmp_path / "artifacts"


def test_the_key_is_made_once_random_and_private(isolated_state: Path, monkeypatch: pytest.MonkeyPatch):
    assert llm_records.read_api_key() is None and llm_records.export_api_key() is None
    key = llm_records.api_key()
    assert len(key) >= 43 and llm_records.api_key() == key and llm_records.read_api_key() == key
    path = isolated_state / "vllm" / "api-key"
    assert llm_records.api_key_path() == path and stat.S_IMODE(path.stat().st_mode) == 0o600
    monkeypatch.setenv(llm_settings.API_KEY_ENV, "the-users-own")
    assert llm_records.api_key() == "the-users-own"  # an explicit $VLLM_API_KEY wins
    assert llm_records.export_api_key() == "the-users-own"
    monkeypatch.delenv(llm_settings.API_KEY_ENV)
    assert llm_records.export_api_key() == key and llm_records.export_api_key("other") == key


def test_a_key_file_others_may_read_is_refused_with_the_chmod(isolated_state: Path):
    llm_records.api_key()
    llm_records.api_key_path().chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        llm_records.read_api_key()


def test_the_key_goes_to_the_environment_never_the_command_line(tmp_path: Path):
    env = llm_server.build_env(str(tmp_path), "secret-key")
    assert env[llm_settings.API_KEY_ENV] == "secret-key"
    command = llm_server.build_command(str(tmp_path), host="127.0.0.1", port=8123, served_model_name="m")
    assert "--api-key" not in command and "secret-key" not in command


@pytest.fixture
def stand_in_python(tmp_path: Path) -> Path:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    python = tmp_path / "fake-python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    python.chmod(0o755)
    return python


def test_a_started_server_asks_for_the_key_that_this_process_then_sends(tmp_path, stand_in_python, monkeypatch):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    port = processes.find_free_port()
    record = llm_server.start_server(str(model), port=port, python=stand_in_python, served_model_name="m", timeout=30)
    try:
        key = llm_records.read_api_key()
        assert key and llm_server.os.environ[llm_settings.API_KEY_ENV] == key  # exported for the generators
        assert key not in Path(f"/proc/{record.pid}/cmdline").read_text()  # what every user of the machine sees
        assert key not in json.dumps(json.loads(llm_records.pid_path(port).read_text()))
        assert llm_preflight.check_server(record.api_base_url, model="m") == ["m"]
        with pytest.raises(ConfigError, match="wants an API key other than the one sent.*api-key"):
            llm_preflight.check_server(record.api_base_url, api_key="wrong")
        # another rag-mag process, which did not start it, finds the key beside the pid files
        monkeypatch.delenv(llm_settings.API_KEY_ENV)
        assert llm_preflight.check_server(record.api_base_url) == ["m"]
        assert llm_server.os.environ[llm_settings.API_KEY_ENV] == key
    finally:
        llm_server.stop_server(port, grace=5.0)


def test_a_server_that_asks_no_key_is_reached_with_one_all_the_same():
    class NoKey(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"data": [{"id": "external"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NoKey)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        llm_records.api_key()  # a kept key exists and is sent
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        assert llm_preflight.check_server(url, model="external") == ["external"]
    finally:
        server.shutdown()
        server.server_close()
