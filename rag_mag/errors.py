"""Errors a user can cause. The CLI prints their message alone (no traceback) and exits with 2."""


class RagMagError(Exception):
    """Base class: the message names the problem and how to fix it."""


class DataError(RagMagError):
    """A data file is missing or malformed (the message names the file and line)."""


class CheckpointError(RagMagError):
    """A retriever checkpoint or index is missing, corrupt or inconsistent."""


class ConfigError(RagMagError, ValueError):
    """A configuration value, YAML file or flag is invalid (also a ValueError, for library callers)."""


class ServerNotRunningError(RagMagError):
    """The vLLM server cannot be reached."""


class TrainingError(RagMagError):
    """Training diverged (NaN or infinite values)."""


class DiskFullError(RagMagError):
    """A write does not fit on its disk (refused beforehand, or ENOSPC/EDQUOT on the way); nothing saved before
    was replaced."""


class JobLockedError(RagMagError):
    """Another process is writing the same output (its lock file names its PID and command line)."""


class OutputNotWritableError(RagMagError):
    """An output folder, lock file or work folder cannot be created or written (read-only filesystem, permission
    denied, a file where a folder should be); nothing saved before was changed."""
