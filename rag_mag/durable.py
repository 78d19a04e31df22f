"""Durable, atomic writes: the one place where rag-mag puts files and folders on disk.

* ``atomic_write(path)`` / ``write_bytes`` / ``write_text``: a temporary file in the same folder, flushed and
  fsynced, renamed over ``path``, then the folder fsynced, so a crash or power loss leaves either the old
  file or the new one, never an empty or half-written one.
* ``staging_dir(target)`` + ``sync_tree(folder)`` + ``replace_dir(staging, target)``: a folder written
  complete beside its target, fsynced, then swapped in. On Linux the swap is one ``renameat2(RENAME_EXCHANGE)``,
  so there is no moment without a target; elsewhere the old target is renamed aside first and
  ``recover_dir`` puts it back if the process died between the two renames.
* ``recover_dir(target)``: run before reading or writing a folder; removes staging folders left by a killed
  writer and restores a target that was moved aside but not replaced.
* ``fault_point(name)``: with ``RAG_MAG_KILL_AT=name`` (or ``name#N`` for the N-th time) in the environment,
  the process kills itself with SIGKILL there. The fault suite uses it to kill a save in every phase
  deterministically instead of racing a timer.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import hashlib
import logging
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

logger = logging.getLogger(__name__)

KILL_ENV = "RAG_MAG_KILL_AT"
STAGING_MARK = "staging-"
_RENAME_EXCHANGE = 2
_fault_hits: dict[str, int] = {}


# ----------------------------------------------------------------------------- fault injection
def fault_point(name: str) -> None:
    """SIGKILL this process here when ``$RAG_MAG_KILL_AT`` names this point (``name`` or ``name#N``)."""
    wanted = os.environ.get(KILL_ENV)
    if not wanted:
        return
    point, _, nth = wanted.partition("#")
    if point != name:
        return
    _fault_hits[name] = _fault_hits.get(name, 0) + 1
    if _fault_hits[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


# ----------------------------------------------------------------------------- files
def fsync_dir(folder: str | os.PathLike) -> None:
    """Make a rename or a new entry in ``folder`` durable (a no-op where folders cannot be opened)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError as error:  # some filesystems refuse fsync on a folder; the data itself was synced
        if error.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Write ``path`` through a temporary file that replaces it only when the block ends without error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    binary = "b" in mode
    handle = tempfile.NamedTemporaryFile(mode, encoding=None if binary else encoding, dir=path.parent,
                                         prefix=f".{path.name}.", suffix=".tmp", delete=False)
    try:
        with handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_write(path, "wb") as handle:
        handle.write(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_write(path, "w") as handle:
        handle.write(text)


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append one line and fsync it (logs that a resumed run reads back)."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line if line.endswith("\n") else line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def sha256_of(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


# ----------------------------------------------------------------------------- folders
def staging_dir(target: str | os.PathLike) -> Path:
    """A new empty folder beside ``target`` (``.NAME.staging-XXXX``) to write its next version into."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.{STAGING_MARK}", dir=target.parent))


def sync_tree(folder: str | os.PathLike) -> None:
    """fsync every file under ``folder``, then the folders themselves (deepest first)."""
    folders = []
    for root, _, files in os.walk(folder):
        folders.append(root)
        for name in files:
            with open(os.path.join(root, name), "rb") as handle:
                os.fsync(handle.fileno())
    for root in reversed(folders):
        fsync_dir(root)


def backup_path(target: Path) -> Path:
    return target.with_name(f".{target.name}.old")


def _exchange(first: Path, second: Path) -> bool:
    """Atomically swap two existing paths (Linux renameat2); False where that is not available."""
    libc_name = ctypes.util.find_library("c")
    if not libc_name:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd = -100
    result = renameat2(at_fdcwd, os.fsencode(first), at_fdcwd, os.fsencode(second), _RENAME_EXCHANGE)
    if result == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(error, os.strerror(error), str(first), None, str(second))


def replace_dir(staging: Path, target: Path, fault_prefix: str = "replace") -> None:
    """Swap the complete, synced folder ``staging`` into ``target``; the old ``target`` stays until the new
    one is in place, and is deleted afterwards."""
    staging, target = Path(staging), Path(target)
    if target.exists() and _exchange(staging, target):
        fault_point(f"{fault_prefix}:swapped")
        fsync_dir(target.parent)
        shutil.rmtree(staging, ignore_errors=True)  # now the previous version
        return
    backup = backup_path(target)
    shutil.rmtree(backup, ignore_errors=True)
    if target.exists():
        os.replace(target, backup)
        fault_point(f"{fault_prefix}:moved-aside")
    os.replace(staging, target)
    fsync_dir(target.parent)
    shutil.rmtree(backup, ignore_errors=True)


def leftovers(target: Path) -> list[Path]:
    """Staging folders of ``target`` left by a killed writer (new ``.NAME.staging-*`` and old
    ``.NAME.XXXXXXXX`` names) and its moved-aside backup ``.NAME.old``."""
    target = Path(target)
    if not target.parent.is_dir():
        return []
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.({STAGING_MARK}[A-Za-z0-9_]+|[a-z0-9_]{{8}}|old)$")
    return sorted(path for path in target.parent.iterdir() if pattern.match(path.name) and path.is_dir())


def recover_dir(target: str | os.PathLike, is_complete=None) -> list[str]:
    """Clean up after a writer killed while replacing ``target``; returns what was done, one line each.

    A moved-aside backup is put back when ``target`` is missing (and, given ``is_complete``, when it is a
    complete folder); staging folders are never a committed version and are removed.
    """
    target = Path(target)
    actions = []
    for path in leftovers(target):
        if path == backup_path(target) and not target.exists():
            if is_complete is not None and not is_complete(path):
                actions.append(f"{path} (left by an interrupted save) is incomplete; it was left in place")
                continue
            os.replace(path, target)
            fsync_dir(target.parent)
            actions.append(f"restored {target} from {path.name}, left by an interrupted save")
        else:
            shutil.rmtree(path, ignore_errors=True)
            actions.append(f"removed {path}, left by an interrupted save")
    for action in actions:
        logger.warning("%s", action)
    return actions
