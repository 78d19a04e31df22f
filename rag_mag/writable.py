"""Outputs that cannot be written: a read-only filesystem, a folder without write permission, a file where a
folder should be. Every command that writes refuses them before it loads a model (``check_writable``, which
``durable.job_lock`` calls for the folder beside every lock), and a write that meets one later ends in the
same one ``OutputNotWritableError`` line (``not_writable_as_error``; ``cli/main.py`` maps any other such
``OSError`` that reaches it), never in a traceback. Nothing saved before is touched.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rag_mag.errors import OutputNotWritableError

PROBE_PREFIX = ".rag-mag-probe-"
_NOT_WRITABLE = {errno.EROFS: ("it is on a read-only filesystem", "remount it read-write"),
                 errno.EACCES: ("permission denied", "give this user write permission there"),
                 errno.EPERM: ("permission denied", "give this user write permission there"),
                 errno.ENOTDIR: ("a file is where a folder should be", "move that file away")}


def not_writable(error: OSError, path: str | os.PathLike, what: str) -> OutputNotWritableError | None:
    """The one-line error for ``error`` met writing ``what`` at ``path``; None when it is not of that kind."""
    if not isinstance(error, OSError) or error.errno not in _NOT_WRITABLE:
        return None
    reason, fix = _NOT_WRITABLE[error.errno]
    where = Path(error.filename or path)
    where = where.parent if where.name.startswith(PROBE_PREFIX) else where  # the folder, not check_writable's probe
    subject = what if str(path) in what else f"{what} at {path}"
    return OutputNotWritableError(f"cannot write {subject}: {reason} ({where}); {fix}, or write somewhere else. "
                                  "Nothing saved before was changed")


@contextlib.contextmanager
def not_writable_as_error(path: str | os.PathLike, what: str) -> Iterator[None]:
    """Turn a read-only filesystem, a denied permission or a file in a folder's place into one line."""
    try:
        yield
    except OSError as error:
        refused = not_writable(error, path, what)
        if refused is None:
            raise
        raise refused from None


def check_writable(target: str | os.PathLike, what: str, folder: bool = True) -> None:
    """Refuse now, before any model loads, an output ``target`` (a ``folder``, or a file) that cannot be
    created: a probe file is made and removed where ``target`` and its lock would go, and inside ``target``
    when it is already a folder. Nothing is left behind."""
    target = Path(target).absolute()
    place = target.parent
    while not place.exists() and place != place.parent:
        place = place.parent
    with not_writable_as_error(target, what):
        for blocked in [place] + ([target] if folder and target.exists() else []):
            if not blocked.is_dir():
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(blocked))
        for inside in [place] + ([target] if target.is_dir() else []):
            descriptor, probe = tempfile.mkstemp(prefix=PROBE_PREFIX, dir=inside)
            os.close(descriptor)
            os.unlink(probe)
