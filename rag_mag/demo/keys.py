"""The demo's API keys: who may ask (role ``read``) and who may also upload and delete (role ``write``), on which
indexes. ``rag-mag keys add | list | revoke`` writes them; ``rag-mag serve`` checks them (``rag_mag.demo.access``).

A key is ``rmk_<id>_<secret>``: ``id`` is 8 random hex digits, not secret, that find the key's record; ``secret``
is 32 random bytes in URL-safe base64. The file keeps the SHA-256 of the whole key, never the key itself, and a
presented key is compared with ``hmac.compare_digest``. The key file (default ``artifacts/demo-keys.json``,
``--keys-file`` or ``$RAG_MAG_KEYS_FILE``) is written atomically with mode 0600 under a lock; one that other users
may read or write is refused with the ``chmod 600`` that fixes it. When each key was last used lives in a small file
of its own beside it (``demo-keys.json.used``), so that ``serve`` writing it never races a revoke.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import stat
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rag_mag import durable
from rag_mag.errors import ConfigError
from rag_mag.models import artifacts_dir

logger = logging.getLogger(__name__)

KEYS_FILE_ENV = "RAG_MAG_KEYS_FILE"
ROLES = ("read", "write")
KEY_PREFIX = "rmk_"
KEY_PATTERN = re.compile(r"^rmk_([0-9a-f]{8})_([A-Za-z0-9_-]{43})$")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
FILE_VERSION = 1
USED_WRITE_EVERY_S = 60.0  # how often serve writes "last used" back, at most


def default_keys_file() -> Path:
    """``$RAG_MAG_KEYS_FILE``, else ``artifacts/demo-keys.json``."""
    given = os.environ.get(KEYS_FILE_ENV)
    return Path(given).expanduser().resolve() if given else artifacts_dir() / "demo-keys.json"


def used_path(keys_file: Path) -> Path:
    return keys_file.with_name(keys_file.name + ".used")


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class KeyRecord:
    """One key as the file keeps it: no key, only its id and its SHA-256. ``indexes``: None for every index."""

    name: str
    id: str
    sha256: str
    role: str
    indexes: tuple[str, ...] | None
    created: float

    def may_write(self) -> bool:
        return self.role == "write"

    def may_use(self, index: str) -> bool:
        return self.indexes is None or index in self.indexes

    def to_dict(self) -> dict:
        return {**asdict(self), "indexes": list(self.indexes) if self.indexes is not None else None}

    @classmethod
    def from_dict(cls, data: dict) -> KeyRecord:
        indexes = data.get("indexes")
        record = cls(name=str(data["name"]), id=str(data["id"]), sha256=str(data["sha256"]), role=str(data["role"]),
                     indexes=tuple(str(name) for name in indexes) if indexes is not None else None,
                     created=float(data["created"]))
        if record.role not in ROLES or not re.fullmatch(r"[0-9a-f]{64}", record.sha256):
            raise ValueError(f"key {record.name!r}: role or sha256 is malformed")
        return record


def check_name(name: str) -> str:
    if not NAME_PATTERN.fullmatch(name or ""):
        raise ConfigError(f"invalid key name {name!r}: use 1 to 64 letters, digits, '.', '_' or '-', starting with a "
                          "letter or digit (e.g. alice or ci-bot)")
    return name


def check_permissions(path: Path) -> None:
    """Refuse a key file that group or others may read or write, with the command that fixes it."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise ConfigError(f"the key file {path} has mode {mode:04o}: other users can read or change it; fix it with "
                          f"`chmod 600 {path}`")


def read_records(path: Path) -> list[KeyRecord]:
    """The keys of ``path`` ([] when it does not exist); a file others may read, or a malformed one, is refused."""
    try:
        check_permissions(path)
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except PermissionError:
        raise ConfigError(f"cannot read the key file {path} (permission denied); run as its owner") from None
    try:
        data = json.loads(text)
        if data.get("version") != FILE_VERSION:
            raise ValueError(f"version {data.get('version')!r}, expected {FILE_VERSION}")
        return [KeyRecord.from_dict(entry) for entry in data["keys"]]
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ConfigError(f"the key file {path} is malformed ({error}); restore it, or move it away and make new "
                          "keys with `rag-mag keys add`") from None


def _write_private(path: Path, text: str) -> None:
    """Atomically, with mode 0600 from the first byte (the temporary file is created 0600, then renamed)."""
    with durable.atomic_write(path) as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(text)


def _write_records(path: Path, records: list[KeyRecord]) -> None:
    _write_private(path, json.dumps({"version": FILE_VERSION, "keys": [record.to_dict() for record in records]},
                                    indent=2) + "\n")


def new_key() -> tuple[str, str]:
    """``(id, key)`` of a new random key."""
    key_id = secrets.token_hex(4)
    return key_id, f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"


def add_key(path: Path, name: str, role: str, indexes: list[str] | None = None) -> tuple[KeyRecord, str]:
    """Add a key to ``path`` (created 0600 if missing); return its record and the key, which is not kept."""
    check_name(name)
    if role not in ROLES:
        raise ConfigError(f"invalid role {role!r}; choose one of: {', '.join(ROLES)}")
    for index in indexes or ():
        if not index or any(char.isspace() or char in "/\\" for char in index):
            raise ConfigError(f"invalid index name {index!r}: give a name as the demo serves it (e.g. qnorm, cosine, "
                              "or the NAME of serve --index NAME=...)")
    with durable.file_lock(durable.lock_path(path)):
        records = read_records(path)
        if any(record.name == name for record in records):
            raise ConfigError(f"a key named {name!r} exists in {path}; revoke it first (`rag-mag keys revoke {name}`) "
                              "or choose another name")
        taken = {record.id for record in records}
        key_id, key = new_key()
        while key_id in taken:
            key_id, key = new_key()
        record = KeyRecord(name=name, id=key_id, sha256=digest(key), role=role,
                           indexes=tuple(dict.fromkeys(indexes)) if indexes else None, created=time.time())
        _write_records(path, [*records, record])
    return record, key


def revoke_key(path: Path, name: str) -> KeyRecord:
    """Remove the key ``name`` from ``path``; a running demo refuses it from its next request on."""
    with durable.file_lock(durable.lock_path(path)):
        records = read_records(path)
        found = [record for record in records if record.name == name]
        if not found:
            names = ", ".join(record.name for record in records) or "none"
            raise ConfigError(f"no key named {name!r} in {path} (keys: {names}); see `rag-mag keys list`")
        _write_records(path, [record for record in records if record.name != name])
    return found[0]


def read_last_used(path: Path) -> dict[str, float]:
    """``{key id: time last used}``; a missing or unreadable file is no information, not an error."""
    try:
        data = json.loads(used_path(path).read_text(encoding="utf-8"))
        return {str(key): float(value) for key, value in data.items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError, AttributeError) as error:
        logger.warning("ignoring unreadable %s (%s)", used_path(path), error)
        return {}


def write_last_used(path: Path, used: dict[str, float]) -> None:
    """Merge ``used`` into the last-used file (the later time wins, ids of revoked keys dropped), atomically."""
    with durable.file_lock(durable.lock_path(used_path(path))):
        known = {record.id for record in read_records(path)}
        merged = read_last_used(path)
        for key_id, when in used.items():
            merged[key_id] = max(when, merged.get(key_id, 0.0))
        _write_private(used_path(path), json.dumps({key: value for key, value in merged.items() if key in known},
                                                   indent=2) + "\n")


class KeyStore:
    """The keys of one file as a running demo sees them: read again whenever the file changes (a revoke applies
    from the next request on), and each key's last use written back at most every ``USED_WRITE_EVERY_S``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._signature: tuple | None = None
        self._records: dict[str, KeyRecord] = {}
        self._used: dict[str, float] = {}
        self._used_written = time.monotonic()
        self.reload()

    def _stat_signature(self) -> tuple | None:
        try:
            status = self.path.stat()
        except FileNotFoundError:
            return None
        return status.st_ino, status.st_mtime_ns, status.st_size, status.st_mode

    def reload(self) -> None:
        """Read the file again if it changed; raises ConfigError when it became readable by others or malformed."""
        signature = self._stat_signature()
        if signature == self._signature and self._signature is not None:
            return
        records = read_records(self.path) if signature is not None else []
        self._records = {record.id: record for record in records}
        self._signature = signature

    def __len__(self) -> int:
        return len(self._records)

    def names(self) -> list[str]:
        return [record.name for record in self._records.values()]

    def records(self) -> list[KeyRecord]:
        return list(self._records.values())

    def verify(self, key: str) -> KeyRecord | None:
        """The record of ``key``, or None for a malformed, unknown or revoked key (compared in constant time)."""
        self.reload()
        match = KEY_PATTERN.fullmatch(key)
        record = self._records.get(match.group(1)) if match else None
        expected = record.sha256 if record is not None else "0" * 64
        if not hmac.compare_digest(digest(key), expected) or record is None:
            return None
        self._used[record.id] = time.time()
        return record

    def flush_used(self, force: bool = False) -> None:
        """Write the last-use times back when a minute has passed since the last write (``force``: now)."""
        if not self._used or (not force and time.monotonic() - self._used_written < USED_WRITE_EVERY_S):
            return
        used, self._used = self._used, {}
        self._used_written = time.monotonic()
        try:
            write_last_used(self.path, used)
        except (OSError, ConfigError) as error:  # bookkeeping only: the demo goes on answering
            logger.warning("could not record when keys were last used in %s: %s", used_path(self.path), error)
