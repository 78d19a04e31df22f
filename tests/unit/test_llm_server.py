"""The vLLM server management that needs no model: URLs, pre-flight checks, pid files, start failures, CLI."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from haystack import Pipeline
from haystack.components.generators.chat import FallbackChatGenerator
from haystack_integrations.components.generators.vllm import VLLMChatGenerator

from rag_mag.cli.main import main
from rag_mag.errors import ConfigError, ServerNotRunningError
from rag_mag.serving import processes
from rag_mag.serving.llm import gguf_convert
from rag_mag.serving.llm import preflight as llm_preflight
from rag_mag.serving.llm import readers as llm_readers
from rag_mag.serving.llm import records as llm_records
from rag_mag.serving.llm import server as llm_server
from rag_mag.serving.llm import settings as llm_settings


@pytest.fixture(autouse=True)
def isolated_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Pid and log files go to a temporary artifacts folder; no env override leaks in, nor out (a server started
    here puts its API key in $VLLM_API_KEY)."""
    monkeypatch.setenv("RAG_MAG_ARTIFACTS", str(tmp_path / "artifacts"))
    monkeypatch.delenv(llm_settings.URL_ENV, raising=False)
    monkeypatch.delenv(llm_settings.API_KEY_ENV, raising=False)
    monkeypatch.delenv(llm_settings.PYTHON_ENV, raising=False)
    return tmp_path / "artifacts"


def closed_port() -> int:
    return processes.find_free_port()  # nothing listens there once the probe socket is closed


# ---------------------------------------------------------------------------------------------- URLs
@pytest.mark.parametrize(("url", "expected"), [
    ("http://127.0.0.1:8000/v1", ("http", "127.0.0.1", 8000, "/v1")),
    ("http://127.0.0.1:8000/v1/", ("http", "127.0.0.1", 8000, "/v1")),
    ("http://localhost:9001", ("http", "localhost", 9001, "/v1")),
    ("https://llm.example.org/openai/v1", ("https", "llm.example.org", 443, "/openai/v1")),
    ("http://[::1]:8000/v1", ("http", "::1", 8000, "/v1")),
])
def test_parse_api_base_url(url: str, expected: tuple) -> None:
    parsed = llm_settings.parse_api_base_url(url)
    assert (parsed.scheme, parsed.host, parsed.port, parsed.path) == expected
    assert llm_settings.parse_api_base_url(parsed.url) == parsed  # normalizing twice changes nothing


def test_root_drops_the_api_path_and_brackets_ipv6() -> None:
    assert llm_settings.parse_api_base_url("http://127.0.0.1:8000/v1").root == "http://127.0.0.1:8000"
    assert llm_settings.parse_api_base_url("http://[::1]:8000/v1").root == "http://[::1]:8000"


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "ftp://host/v1", "http:///v1", "http://host:99999/v1", ""])
def test_parse_api_base_url_rejects_bad_urls(url: str) -> None:
    with pytest.raises(ConfigError, match="api_base_url"):
        llm_settings.parse_api_base_url(url)


def test_default_url_and_python_follow_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert llm_settings.default_api_base_url() == "http://127.0.0.1:8000/v1"
    assert llm_settings.vllm_python() == llm_settings.REPO_ROOT / ".venv-vllm" / "bin" / "python"
    monkeypatch.setenv(llm_settings.URL_ENV, "http://127.0.0.1:8123/v1/")
    monkeypatch.setenv(llm_settings.PYTHON_ENV, "/opt/vllm/bin/python")
    assert llm_settings.default_api_base_url() == "http://127.0.0.1:8123/v1"
    assert llm_settings.vllm_python() == Path("/opt/vllm/bin/python")


# ------------------------------------------------------------------------------------ pre-flight checks
class _FakeOpenAIHandler(BaseHTTPRequestHandler):
    status = 200
    body = {"object": "list", "data": [{"id": "smollm2-135m-instruct", "object": "model"}]}

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        payload = json.dumps(self.body).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


def _serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def models_endpoint() -> Iterator[str]:
    """A minimal HTTP server answering GET /v1/models like vLLM (the pre-flight only reads that)."""
    yield from _serve(_FakeOpenAIHandler)


def test_check_server_on_a_closed_port_fails_fast_with_the_fix() -> None:
    started = time.monotonic()
    with pytest.raises(ServerNotRunningError, match="rag-mag serve-llm") as caught:
        llm_preflight.check_server(f"http://127.0.0.1:{closed_port()}/v1")
    assert time.monotonic() - started < 5.0
    assert "--port" in str(caught.value)  # a non-default port is named in the hint


def test_check_server_that_never_answers_times_out() -> None:
    with socket.socket() as listener:  # accepts connections, never replies
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        started = time.monotonic()
        with pytest.raises(ServerNotRunningError, match="did not answer within 0.5 s"):
            llm_preflight.check_server(f"http://127.0.0.1:{listener.getsockname()[1]}/v1", timeout=0.5)
        assert time.monotonic() - started < 3.0


def test_check_server_returns_the_served_models(models_endpoint: str) -> None:
    assert llm_preflight.check_server(models_endpoint) == ["smollm2-135m-instruct"]
    assert llm_preflight.check_server(models_endpoint, model="smollm2-135m-instruct") == ["smollm2-135m-instruct"]


def test_check_server_names_a_model_it_does_not_serve(models_endpoint: str) -> None:
    with pytest.raises(ConfigError, match=r"serves \['smollm2-135m-instruct'\], not 'qwen'"):
        llm_preflight.check_server(models_endpoint, model="qwen")


def test_check_server_reports_a_server_that_is_not_ready() -> None:
    class Starting(_FakeOpenAIHandler):
        status = 503

    for url in _serve(Starting):
        with pytest.raises(ServerNotRunningError, match="HTTP 503"):
            llm_preflight.check_server(url)


def _vllm_pipeline(url: str, model: str = "smollm2-135m-instruct") -> Pipeline:
    pipeline = Pipeline()
    pipeline.add_component("llm", VLLMChatGenerator(model=model, api_base_url=url))
    pipeline.add_component("fallback", FallbackChatGenerator(
        chat_generators=[VLLMChatGenerator(model=model, api_base_url=url)]))
    return pipeline


def test_check_pipeline_servers_finds_nested_generators(models_endpoint: str) -> None:
    pipeline = _vllm_pipeline(models_endpoint)
    names = [name for name, _ in llm_preflight.iter_vllm_generators(pipeline)]
    assert sorted(names) == ["fallback.chat_generators[0]", "llm"]
    assert llm_preflight.check_pipeline_servers(pipeline) == {models_endpoint: ["smollm2-135m-instruct"]}


def test_check_pipeline_servers_names_the_component() -> None:
    pipeline = Pipeline()
    pipeline.add_component("answerer", VLLMChatGenerator(model="m", api_base_url=f"http://127.0.0.1:{closed_port()}/v1"))
    with pytest.raises(ServerNotRunningError, match="pipeline component 'answerer': no vLLM server"):
        llm_preflight.check_pipeline_servers(pipeline)


def test_check_pipeline_servers_catches_a_wrong_model_name(models_endpoint: str) -> None:
    with pytest.raises(ConfigError, match="pipeline component 'llm'.*not 'other-model'"):
        llm_preflight.check_pipeline_servers(_vllm_pipeline(models_endpoint, model="other-model"))


# ---------------------------------------------------------------------------------------- pid files
def _record(pid: int, port: int = 8123) -> llm_records.ServerRecord:
    return llm_records.ServerRecord(pid=pid, host="127.0.0.1", port=port, model="/m", served_model_name="m",
                                    log_path="/tmp/x.log", started_at=time.time())


def test_pid_file_round_trip(isolated_state: Path) -> None:
    record = _record(pid=12345)
    llm_records.write_record(record)
    assert llm_records.pid_path(8123) == isolated_state / "vllm" / "server-8123.json"
    assert llm_records.read_record(8123) == record
    assert record.api_base_url == "http://127.0.0.1:8123/v1"
    assert not list((isolated_state / "vllm").glob(".*tmp*"))  # written atomically, no temp file left


def test_stale_pid_file_of_a_dead_process_is_removed() -> None:
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    llm_records.write_record(_record(pid=finished.pid))
    assert llm_records.server_status(8123) is None
    assert not llm_records.pid_path(8123).exists()
    assert llm_server.stop_server(8123) is None


def test_pid_file_of_a_recycled_pid_is_not_trusted() -> None:
    llm_records.write_record(_record(pid=os.getpid()))  # alive, but not a vLLM server: must never be killed
    assert llm_records.server_status(8123) is None
    assert llm_server.stop_server(8123) is None
    assert not llm_records.pid_path(8123).exists()


def test_unreadable_pid_file_is_removed() -> None:
    path = llm_records.pid_path(8123)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert llm_records.read_record(8123) is None
    assert not path.exists()


def test_stop_ends_the_whole_process_group(tmp_path: Path) -> None:
    """A stand-in for a detached server (its argv names the vLLM module) with a child process, like vLLM's engine."""
    child_pid_file = tmp_path / "child.pid"
    script = ("import subprocess, sys, time; "
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
              f"open({str(child_pid_file)!r}, 'w').write(str(child.pid)); time.sleep(120)")
    process = subprocess.Popen([sys.executable, "-c", script, llm_settings.SERVER_MODULE], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not child_pid_file.exists() or not child_pid_file.read_text():
            assert time.monotonic() < deadline, "the stand-in server did not start its child"
            time.sleep(0.05)
        child_pid = int(child_pid_file.read_text())
        llm_records.write_record(_record(pid=process.pid))
        assert llm_records.server_status(8123) is not None
        stopped = llm_server.stop_server(8123, grace=5.0)
        assert stopped is not None and stopped.pid == process.pid
        assert process.poll() is not None
        assert not processes.process_alive(child_pid)
        assert not llm_records.pid_path(8123).exists()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# ------------------------------------------------------------------------------------- starting
@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def _fake_python(tmp_path: Path, body: str) -> Path:
    """An executable that stands in for the vLLM python: receives the same argv, does ``body``."""
    path = tmp_path / "fake-python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_resolve_model() -> None:
    with pytest.raises(ConfigError, match="serve-llm --convert-only"):
        llm_readers.resolve_model(None)  # the temporary artifacts folder holds no converted model
    with pytest.raises(ConfigError, match="does not exist"):
        llm_readers.resolve_model("./no/such/model")
    hub_id = "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert llm_readers.resolve_model(hub_id) == (hub_id, hub_id)  # passed to vLLM as is


def test_resolve_model_wants_a_model_folder(tmp_path: Path, model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="no config.json"):
        llm_readers.resolve_model(str(tmp_path))
    assert llm_readers.resolve_model(str(model_dir)) == (str(model_dir), str(model_dir))


def test_command_and_environment(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    command = llm_server.build_command(str(model_dir), host="127.0.0.1", port=8123, served_model_name="m",
                                       python=Path("/py"), precision="bf16")
    assert command[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    flags = dict(zip(command[3::2], command[4::2], strict=False))
    assert flags["--model"] == str(model_dir) and flags["--served-model-name"] == "m"
    assert flags["--dtype"] == "bfloat16" and flags["--max-model-len"] == "2048" and flags["--port"] == "8123"
    assert llm_server.build_env(str(model_dir))["VLLM_CPU_KVCACHE_SPACE"] == "2"
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "8")
    assert llm_server.build_env(str(model_dir))["VLLM_CPU_KVCACHE_SPACE"] == "8"


@pytest.mark.parametrize(("cores", "reserved"), [(1, "0"), (2, "0"), (4, None), (16, None)])
def test_on_few_cores_the_vllm_worker_computes_on_all_of_them(model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                              cores: int, reserved: str | None) -> None:
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    monkeypatch.setattr(llm_server.os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert llm_server.build_env(str(model_dir)).get("VLLM_CPU_NUM_OF_RESERVED_CPU") == reserved
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")  # the user's own choice is kept
    assert llm_server.build_env(str(model_dir))["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"


def test_start_without_the_vllm_environment_says_to_run_setup(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="scripts/setup.sh"):
        llm_server.start_server(str(model_dir), port=closed_port(), python=tmp_path / "missing" / "python")


def test_start_on_a_busy_port_says_so(model_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port} on 127.0.0.1 is already in use"):
            llm_server.start_server(str(model_dir), port=port, python=_fake_python(tmp_path, "exit 0"))


def test_a_server_that_dies_at_start_up_raises_with_its_log(model_dir: Path, tmp_path: Path) -> None:
    python = _fake_python(tmp_path, 'echo "loading $4"; echo "ValueError: no such architecture" >&2; exit 3')
    port = closed_port()
    with pytest.raises(ServerNotRunningError, match="exit code 3") as caught:
        llm_server.start_server(str(model_dir), port=port, python=python, timeout=30)
    assert "ValueError: no such architecture" in str(caught.value)
    assert f"loading {model_dir}" in str(caught.value)  # argv reached the process: --model is the 4th argument
    assert not llm_records.pid_path(port).exists()


def test_a_server_that_never_gets_ready_is_stopped(model_dir: Path, tmp_path: Path) -> None:
    python = _fake_python(tmp_path, 'echo "still loading"; exec sleep 60')
    port = closed_port()
    with pytest.raises(ServerNotRunningError, match="not ready within 2 s") as caught:
        llm_server.start_server(str(model_dir), port=port, python=python, timeout=2)
    assert "still loading" in str(caught.value)
    assert not llm_records.pid_path(port).exists()


_STAND_IN_SERVER = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[1:]
port, name = int(args[args.index("--port") + 1]), args[args.index("--served-model-name") + 1]
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": name}]}).encode() if self.path == "/v1/models" else b""
        self.send_response(200 if self.path in ("/health", "/v1/models") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
print("stand-in server up", flush=True)
HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def test_detached_start_reuse_and_stop(model_dir: Path, tmp_path: Path) -> None:
    """The whole detached life cycle, with a small HTTP server standing in for vLLM (same argv, /health)."""
    script = tmp_path / "stand_in.py"
    script.write_text(_STAND_IN_SERVER)
    python = _fake_python(tmp_path, f'exec {sys.executable} {script} "$@"')
    port = closed_port()
    record = llm_server.start_server(str(model_dir), port=port, python=python, served_model_name="m", timeout=30)
    try:
        assert llm_records.read_record(port) == record
        assert llm_preflight.check_server(record.api_base_url, model="m") == ["m"]
        assert "stand-in server up" in Path(record.log_path).read_text()
        again = llm_server.start_server(str(model_dir), port=port, python=python, served_model_name="m")
        assert again.pid == record.pid  # already running: reused, not started twice
        with pytest.raises(ConfigError, match="already serves"):
            llm_server.start_server(str(model_dir), port=port, python=python, served_model_name="other")
    finally:
        stopped = llm_server.stop_server(port, grace=5.0)
    assert stopped is not None and stopped.pid == record.pid
    assert not processes.process_alive(record.pid)
    with pytest.raises(ServerNotRunningError):
        llm_preflight.check_server(record.api_base_url, timeout=1.0)


def test_foreground_run_keeps_a_pid_file_while_it_runs(model_dir: Path, tmp_path: Path,
                                                        isolated_state: Path) -> None:
    port = closed_port()
    pid_file = isolated_state / "vllm" / f"server-{port}.json"
    python = _fake_python(tmp_path, f"for i in $(seq 50); do [ -f {pid_file} ] && exit 7; sleep 0.1; done; exit 1")
    assert llm_server.run_foreground(str(model_dir), port=port, python=python) == 7
    assert not pid_file.exists()


# ------------------------------------------------------------------------------------------- CLI
def test_cli_status_and_stop_without_a_server(capsys: pytest.CaptureFixture[str]) -> None:
    port = str(closed_port())
    assert main(["serve-llm", "--status", "--port", port]) == 1
    assert main(["serve-llm", "--stop", "--port", port]) == 0
    assert capsys.readouterr().out.count(f"no rag-mag vLLM server runs on port {port}") == 2


def test_cli_errors_are_one_line_with_the_fix(model_dir: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(llm_settings.PYTHON_ENV, str(tmp_path / "missing" / "python"))
    assert main(["serve-llm", "--model", str(model_dir), "--port", str(closed_port())]) == 2
    assert "run scripts/setup.sh" in capsys.readouterr().err
    assert main(["serve-llm", "--convert-only", "--model", str(model_dir)]) == 2
    assert "takes no --model" in capsys.readouterr().err
    assert main(["serve-llm", "--timeout", "0"]) == 2
    assert "invalid --timeout 0.0" in capsys.readouterr().err


def test_cli_default_port_follows_the_url_variable(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    port = closed_port()
    monkeypatch.setenv(llm_settings.URL_ENV, f"http://127.0.0.1:{port}/v1")
    assert main(["serve-llm", "--status"]) == 1
    assert f"port {port}" in capsys.readouterr().out


def test_conversion_of_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        gguf_convert.convert_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_folder_without_the_marker_is_not_converted(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")  # e.g. an interrupted conversion by an older version
    assert not gguf_convert.is_converted(tmp_path)
    (tmp_path / gguf_convert.CONVERSION_MARKER).write_text("{}")
    assert gguf_convert.is_converted(tmp_path)
