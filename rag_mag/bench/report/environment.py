"""Where a report was made: the exact command, git commit, package versions and machine (``collect_environment``)."""

from __future__ import annotations

import datetime as _datetime
import os
import platform
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from rag_mag.models import REPO_ROOT

PACKAGES = ("rag-mag", "torch", "transformers", "haystack-ai", "vllm-haystack", "faiss-cpu", "datasets",
            "evaluate", "bm25s", "numpy", "matplotlib", "sentence-transformers")


def collect_environment(command: Sequence[str] | str | None = None, extra: Mapping[str, Any] | None = None) -> dict:
    """The exact command, git commit, package versions and machine, for the report's setup section."""
    if command is None:
        import sys

        command = sys.argv
    command_text = command if isinstance(command, str) else shlex.join(str(part) for part in command)
    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    environment = {
        "command": command_text,
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "timestamp": _datetime.datetime.now(_datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "packages": packages,
        "machine": _machine(),
    }
    environment.update(extra or {})
    return environment


def _git(*args: str) -> str | None:
    try:
        result = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip()


def _machine() -> dict:
    machine = {"platform": platform.platform(), "cpu_count": os.cpu_count(), "cpu": platform.processor() or None}
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                machine["cpu"] = line.split(":", 1)[1].strip()
                break
    try:
        machine["memory_gb"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        machine["memory_gb"] = None
    try:
        gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=True)
        machine["gpus"] = [line for line in gpus.stdout.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError):
        machine["gpus"] = []
    return machine
