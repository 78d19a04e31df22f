"""The pid files of detached vLLM servers and the check behind `status`: is a recorded process still vLLM; and the
API key of the servers rag-mag starts.

The key keeps other users of the machine off a server rag-mag started (loopback is shared): ``$VLLM_API_KEY`` when
set, else a random one kept beside the pid files (``artifacts/vllm/api-key``, mode 0600), made at the first start.
vLLM reads it from its environment (never from its command line, which every user can read in /proc), and
``export_api_key`` puts it in this process's ``$VLLM_API_KEY``, where every ``VLLMChatGenerator`` (its default
``api_key``) and the pre-flight find it. A server that rag-mag did not start and that asks no key ignores it.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

from rag_mag import durable
from rag_mag.errors import ConfigError
from rag_mag.serving.llm.settings import API_KEY_ENV, DEFAULT_PORT, SERVER_MODULE, api_base_url_for, state_dir
from rag_mag.serving.processes import process_alive

logger = logging.getLogger(__name__)


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


def api_key_path() -> Path:
    return state_dir() / "api-key"


def read_api_key() -> str | None:
    """The key kept beside the pid files, or None before the first server start; refused if others may read it."""
    path = api_key_path()
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return None
    if mode & 0o077:
        raise ConfigError(f"the vLLM API key file {path} has mode {mode:04o}: other users can read it; fix it with "
                          f"`chmod 600 {path}`")
    return path.read_text(encoding="utf-8").strip() or None


def api_key() -> str:
    """The key of a server rag-mag starts: ``$VLLM_API_KEY``, else the kept one, made (random, 0600) if none is."""
    if given := os.environ.get(API_KEY_ENV):
        return given
    path = api_key_path()
    with durable.file_lock(durable.lock_path(path)):
        key = read_api_key()
        if key is None:
            key = secrets.token_urlsafe(32)
            with durable.atomic_write(path) as handle:  # a temporary file of mode 0600, renamed into place
                os.fchmod(handle.fileno(), 0o600)
                handle.write(key + "\n")
    return key


def export_api_key(key: str | None = None) -> str | None:
    """Put ``key`` (default: the kept one, if any) in ``$VLLM_API_KEY`` unless that is set; return the key there."""
    if not os.environ.get(API_KEY_ENV) and (key := key or read_api_key()):
        os.environ[API_KEY_ENV] = key
    return os.environ.get(API_KEY_ENV)


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
