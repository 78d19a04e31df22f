"""Durable, atomic writes: the one place where rag-mag puts files and folders on disk.

* ``atomic_write(path)`` / ``write_bytes`` / ``write_text``: a temporary file in the same folder, flushed and
  fsynced, renamed over ``path``, then the folder fsynced, so a crash or power loss leaves either the old
  file or the new one, never an empty or half-written one.
* ``staging_dir(target)`` + ``sync_tree(folder)`` + ``replace_dir(staging, target)`` (``copy_dir`` for a copy):
  a folder written complete beside its target, fsynced, then swapped in, on Linux by one
  ``renameat2(RENAME_EXCHANGE)``; elsewhere the old target is renamed aside first, and ``recover_dir(target)``
  (run before reading or writing a folder) puts it back, and removes staging folders left by a killed writer.
* ``ensure_free_space(path, needed, what)`` before a large write, ``allocate(path, size, what)`` for a memory-mapped
  file, ``disk_full_as_error(path, what)`` around a write: a full disk is one ``DiskFullError`` line (bytes needed
  and free, the path), never a SIGBUS or a traceback; ``atomic_write`` and ``append_line`` translate it themselves.
* ``job_lock(lock_path(target), what)``: "this output is mine". An advisory flock beside the output, holding
  the holder's PID and command line; a second writer is refused at once with them. The kernel drops a flock
  when its holder dies, so a killed run leaves no lock. ``file_lock(path)`` waits instead (the index merge).
* An output that cannot be written at all (read-only filesystem, permission denied, a file where a folder
  goes) is one ``OutputNotWritableError`` line (``writable.py``): ``job_lock`` checks before any model loads,
  ``atomic_write`` and ``staging_dir`` translate such an error met later.
* ``fault_point(name)``: with ``RAG_MAG_KILL_AT=name`` (``name#N``: the N-th time) set, the process sends itself
  SIGKILL (or ``$RAG_MAG_FAULT_SIGNAL``) there: the fault suite hits every phase of a save, racing no timer.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from rag_mag.errors import DiskFullError, JobLockedError
from rag_mag.writable import check_writable, not_writable_as_error

logger = logging.getLogger(__name__)

KILL_ENV = "RAG_MAG_KILL_AT"
SIGNAL_ENV = "RAG_MAG_FAULT_SIGNAL"  # the signal fault_point sends (default SIGKILL)
STAGING_MARK = "staging-"
_RENAME_EXCHANGE = 2
_fault_hits: dict[str, int] = {}
# What the C library says for a full disk or quota: libraries that wrap the OS error in their own type
# (safetensors raises a SafetensorError) still carry this text.
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_TEXTS = tuple(os.strerror(code) for code in _DISK_FULL_ERRNOS)


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
    if _fault_hits[name] == int(nth or 1):
        os.kill(os.getpid(), getattr(signal, os.environ.get(SIGNAL_ENV, "SIGKILL")))


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
    with not_writable_as_error(path, path.name), disk_full_as_error(path, path.name):
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
    """Append one line and fsync it (logs that a resumed run reads back; they drop a line torn by a full disk)."""
    with disk_full_as_error(path, Path(path).name), open(path, "a", encoding="utf-8") as handle:
        handle.write(line if line.endswith("\n") else line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def sha256_of(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


# ----------------------------------------------------------------------------- disk space
def free_bytes(path: str | os.PathLike) -> int:
    """Bytes this user may still write on the filesystem that holds ``path`` (or would hold it)."""
    folder = Path(path).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def ensure_free_space(path: str | os.PathLike, needed: int, what: str) -> None:
    """Refuse a write of ``needed`` bytes under ``path`` that cannot fit, before any of it is written."""
    free = free_bytes(path)
    if needed > free:
        raise DiskFullError(f"not enough disk space for {what}: {needed:,} bytes needed, {free:,} bytes free on the "
                            f"filesystem of {path}; free some space there or write to another disk")


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) is a full disk or an exceeded quota."""
    for _ in range(8):  # the chain of causes is short; the bound guards against a cycle
        if isinstance(error, OSError) and error.errno in _DISK_FULL_ERRNOS:
            return True
        if any(text in str(error) for text in _DISK_FULL_TEXTS):
            return True
        error = error.__cause__ or error.__context__
        if error is None:
            return False
    return False


@contextlib.contextmanager
def disk_full_as_error(path: str | os.PathLike, what: str, needed: int | None = None) -> Iterator[None]:
    """Turn a full disk met inside the block into one ``DiskFullError`` line naming ``what``, the path and the
    free space. The writes this module makes go to a temporary name first, so what was saved before stays;
    the caller's own cleanup (``finally``: staging folders) runs as the error passes."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as error:
        if not is_disk_full(error):
            raise
        wanted = f", {needed:,} bytes were needed" if needed is not None else ""
        raise DiskFullError(f"the disk filled up while writing {what}: {free_bytes(path):,} bytes free on the "
                            f"filesystem of {path}{wanted}; nothing saved before was replaced. Free some space "
                            "and run the same command again") from None


def allocate(path: str | os.PathLike, size: int, what: str) -> None:
    """Give ``path`` ``size`` bytes of real disk blocks before it is written through a memory map.

    A page of a map that the filesystem cannot back kills the process with SIGBUS, in the middle of a chunk;
    allocated up front (posix_fallocate) a full disk fails here, with ENOSPC, before any row is written. A new
    file that cannot be allocated is removed; an existing one keeps its data (only its holes are filled)."""
    path = Path(path)
    existed = path.exists()
    allocated = path.stat().st_blocks * 512 if existed else 0
    ensure_free_space(path.parent, max(0, size - allocated), what)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with disk_full_as_error(path, what, needed=size):
            preallocate = getattr(os, "posix_fallocate", None)
            if preallocate is None or size == 0:  # macOS has none; a length of 0 is EINVAL
                os.ftruncate(descriptor, size)
            else:
                preallocate(descriptor, 0, size)
    except BaseException:
        if not existed:
            path.unlink(missing_ok=True)
        raise
    finally:
        os.close(descriptor)


# ----------------------------------------------------------------------------- folders
def staging_dir(target: str | os.PathLike) -> Path:
    """A new empty folder beside ``target`` (``.NAME.staging-XXXX``) to write its next version into."""
    target = Path(target)
    with not_writable_as_error(target, target.name):
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


def copy_dir(source: str | os.PathLike, target: str | os.PathLike, what: str) -> None:
    """Replace ``target`` by a synced copy of ``source``, swapped in whole (a full disk: one line naming ``what``)."""
    staging = staging_dir(target)
    try:
        with disk_full_as_error(target, what):
            shutil.copytree(source, staging, dirs_exist_ok=True)
            sync_tree(staging)
            replace_dir(staging, Path(target))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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


# ----------------------------------------------------------------------------- locks
def lock_path(target: str | os.PathLike) -> Path:
    """The lock file of a job that writes ``target``: ``TARGET.lock`` beside it, never inside a folder that is
    swapped in whole (the swap would take the lock away with the old folder)."""
    target = Path(target)
    return target.with_name(target.name + ".lock")


def _acquire(path: Path, wait: bool) -> IO | None:
    """An open handle that holds an exclusive flock on ``path``; None if another process holds it and not
    ``wait``. A holder unlinks the file as it lets go, so a lock won on a file no longer at ``path`` is
    retried on the one that is."""
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            current = os.stat(path)
        except BlockingIOError:
            handle.close()
            return None
        except FileNotFoundError:  # unlinked by the holder we waited for
            handle.close()
            continue
        except BaseException:
            handle.close()
            raise
        if os.path.samestat(current, os.fstat(handle.fileno())):
            return handle
        handle.close()


def _release(handle: IO, path: Path) -> None:
    path.unlink(missing_ok=True)  # before the unlock, so that a waiter sees its file is gone
    handle.close()


def _holder(path: Path) -> str:
    """Who holds the lock at ``path``, as its holder wrote it (it writes right after winning the lock)."""
    for _ in range(10):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            return f"process {record['pid']} on {record['host']} ({record['command']})"
        except (OSError, ValueError, KeyError, TypeError):
            time.sleep(0.1)
    return "another process (its PID is not recorded yet)"


@contextlib.contextmanager
def job_lock(path: str | os.PathLike, what: str) -> Iterator[None]:
    """Hold the lock file ``path`` while the block runs, or refuse at once with one ``JobLockedError`` line
    naming ``what`` and the holder's PID and command line."""
    path = Path(path)
    check_writable(path.with_name(path.name.removesuffix(".lock")), what, folder=False)
    with not_writable_as_error(path, f"the lock file of {what}"):
        handle = _acquire(path, wait=False)
    if handle is None:
        raise JobLockedError(f"{what} is being written by {_holder(path)}; wait for it to finish or stop it, or "
                             f"write somewhere else (lock file {path})")
    try:
        with disk_full_as_error(path, f"the lock file of {what}"):
            handle.truncate(0)
            handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                     "command": shlex.join(sys.argv)}))
            handle.flush()
        yield
    finally:
        _release(handle, path)


@contextlib.contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold the lock file ``path`` while the block runs, waiting for any other holder to finish first."""
    path = Path(path)
    handle = _acquire(path, wait=True)
    try:
        yield
    finally:
        _release(handle, path)
