"""The pid files of detached vLLM servers and the check behind `status`: is a recorded process still vLLM."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from rag_mag import durable
from rag_mag.serving.llm.settings import DEFAULT_PORT, SERVER_MODULE, api_base_url_for, state_dir
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
