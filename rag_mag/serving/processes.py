"""What the vLLM and the PostgreSQL lifecycles share: a server's process, its port and its log.

``llm/server.py`` starts vLLM itself and ``db/postgres.py`` has ``pg_ctl`` start PostgreSQL; both then ask the same
questions: does the recorded process still run (status, a stale pid file), is the port free (a start refused before
it begins), and how does the log end (the message of a failed start).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


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


def port_in_use(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is no conflict
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def find_free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path | str, lines: int = 30) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return "(no log file)"
    return "\n".join(text.splitlines()[-lines:])
