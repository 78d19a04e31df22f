"""Who may use the demo's API: keys (``rag_mag.demo.keys``), their roles and indexes, and rate limits.

``Access`` is the demo's policy, one of three modes that ``rag-mag serve`` picks:
  * ``keys``: every ``/api/...`` and ``/v1/...`` route needs ``Authorization: Bearer KEY``;
  * ``local``: on loopback with no key in the key file, nothing is asked (the demo as it always was);
  * ``off``: ``--no-auth`` (a server others reach, deliberately open); ``/health`` and the log say so.

In ``keys`` mode ``authenticate`` (a dependency of every route) answers, before the route reads any body:
  401 (with ``WWW-Authenticate: Bearer``) without a key, or for a malformed, unknown or revoked one;
  429 (with ``Retry-After``) once a client address sent ``max_failures`` wrong keys within a minute (it is refused
  until that minute has passed, whatever it sends), or a key asks more than ``rate_per_minute`` times a minute.
The routes then ask ``check_write`` (403 for a read key on upload and delete) and ``check_index`` (403 for an index
the key is not granted). A key is never logged, nor put in an answer or a URL; only its name is.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from rag_mag.demo.keys import KeyRecord, KeyStore
from rag_mag.demo.messages import RequestError
from rag_mag.errors import ConfigError

logger = logging.getLogger(__name__)

MODES = ("keys", "local", "off")
DEFAULT_RATE_PER_MINUTE = 120
MAX_FAILURES_PER_MINUTE = 20
WINDOW_S = 60.0
MAX_TRACKED_CLIENTS = 10_000  # addresses whose failures are remembered; the oldest are forgotten beyond that
PROTECTED_PREFIXES = ("/api/", "/v1/")
OPEN_WARNING = ("authentication is off (--no-auth): anyone who can reach this server can ask, upload and delete "
                "documents")
KEYS_HINT = "make one with `rag-mag keys add NAME --role read` and send it as the header Authorization: Bearer KEY"


def unauthorized(message: str, code: str) -> RequestError:
    return RequestError(message, status=401, code=code,
                        headers={"WWW-Authenticate": 'Bearer realm="rag-mag"' + (
                            ', error="invalid_token"' if code == "invalid_key" else "")})


def too_many(message: str, code: str, retry_after_s: float) -> RequestError:
    seconds = max(1, math.ceil(retry_after_s))
    return RequestError(f"{message}; retry in {seconds} s", status=429, code=code,
                        headers={"Retry-After": str(seconds)})


class TokenBucket:
    """``rate_per_minute`` requests a minute per key, with bursts up to that many."""

    def __init__(self, rate_per_minute: int) -> None:
        self.capacity = float(rate_per_minute)
        self.per_second = rate_per_minute / WINDOW_S
        self._buckets: dict[str, tuple[float, float]] = {}  # key id -> (tokens, when)

    def take(self, key_id: str, now: float) -> float:
        """0 when a request may go now (and counts it), else the seconds until it may."""
        tokens, when = self._buckets.get(key_id, (self.capacity, now))
        tokens = min(self.capacity, tokens + (now - when) * self.per_second)
        if tokens < 1.0:
            self._buckets[key_id] = (tokens, now)
            return (1.0 - tokens) / self.per_second
        self._buckets[key_id] = (tokens - 1.0, now)
        return 0.0


class FailedKeys:
    """Wrong keys per client address in a sliding minute; ``max_failures`` of them shut the address out until the
    oldest leaves the window."""

    def __init__(self, max_failures: int) -> None:
        self.max_failures = max_failures
        self._failures: dict[str, deque[float]] = {}

    def _recent(self, client: str, now: float) -> deque[float]:
        failures = self._failures.get(client, deque())
        while failures and failures[0] <= now - WINDOW_S:
            failures.popleft()
        if not failures:
            self._failures.pop(client, None)
        return failures

    def blocked_for(self, client: str, now: float) -> float:
        """Seconds this client is still shut out (0: not)."""
        failures = self._recent(client, now)
        return failures[0] + WINDOW_S - now if len(failures) >= self.max_failures else 0.0

    def add(self, client: str, now: float) -> None:
        failures = self._recent(client, now)
        failures.append(now)
        self._failures[client] = failures
        if len(self._failures) > MAX_TRACKED_CLIENTS:  # dicts keep insertion order: drop the oldest client
            self._failures.pop(next(iter(self._failures)))
        if len(failures) == self.max_failures:
            logger.warning("client %s sent %d wrong keys within a minute: refused for a minute", client, len(failures))


@dataclass
class Access:
    """The demo's access policy (see the module's docstring); ``store`` is None unless ``mode`` is ``keys``."""

    mode: str = "local"
    store: KeyStore | None = None
    rate_per_minute: int = DEFAULT_RATE_PER_MINUTE
    max_failures: int = MAX_FAILURES_PER_MINUTE
    _rate: TokenBucket = field(init=False, repr=False)
    _failed: FailedKeys = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"access mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if (self.mode == "keys") != (self.store is not None):
            raise ValueError("a key store is needed in keys mode, and only there")
        for name in ("rate_per_minute", "max_failures"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        self._rate = TokenBucket(self.rate_per_minute)
        self._failed = FailedKeys(self.max_failures)

    @property
    def required(self) -> bool:
        return self.mode == "keys"

    def health(self) -> dict[str, Any]:
        """What ``/health`` says about access."""
        if self.mode == "off":
            return {"auth": "off", "warning": OPEN_WARNING}
        return {"auth": "keys" if self.required else "none (loopback, no keys)"}

    def authenticate(self, authorization: str | None, client: str, now: float | None = None) -> KeyRecord | None:
        """The key's record for a request's Authorization header, or the RequestError (401, 429) to answer."""
        if not self.required:
            return None
        now = time.monotonic() if now is None else now
        if blocked := self._failed.blocked_for(client, now):
            raise too_many(f"too many wrong keys from {client} within a minute", "too_many_failed_keys", blocked)
        scheme, _, key = (authorization or "").partition(" ")
        if not authorization:
            raise unauthorized(f"this demo needs a key: {KEYS_HINT}", "key_missing")
        try:
            record = self.store.verify(key.strip()) if scheme.lower() == "bearer" else None
        except ConfigError as error:  # the key file changed under the demo into one it refuses
            logger.error("%s", error)
            raise RequestError("the demo cannot read its key file; its log says why", status=503,
                               code="keys_unreadable") from None
        if record is None:
            self._failed.add(client, now)
            raise unauthorized("the key is not valid (unknown, revoked or malformed); send "
                               "Authorization: Bearer KEY with a key from `rag-mag keys add`", "invalid_key")
        if wait := self._rate.take(record.id, now):
            raise too_many(f"key {record.name!r} asked more than {self.rate_per_minute} times a minute "
                           "(rag-mag serve --rate-limit)", "rate_limited", wait)
        self.store.flush_used()
        return record

    def close(self) -> None:
        if self.store is not None:
            self.store.flush_used(force=True)


# ---------------------------------------------------------------------------------------------- in the routes
async def authenticate(request: Request) -> None:
    """The app's dependency: the key of an API request, kept in ``request.state.key`` (None: no key asked)."""
    request.state.key = None
    if not request.url.path.startswith(PROTECTED_PREFIXES):
        return
    access: Access = request.app.state.access
    client = request.client.host if request.client else "unknown"
    request.state.key = access.authenticate(request.headers.get("authorization"), client)


def _key(request: Request) -> KeyRecord | None:
    return getattr(request.state, "key", None)


def check_write(request: Request) -> None:
    """403 unless the request's key may upload and delete (any request, when no key is asked)."""
    key = _key(request)
    if key is not None and not key.may_write():
        raise RequestError(f"key {key.name!r} may ask but not upload or delete (role read); use a key made with "
                           "`rag-mag keys add NAME --role write`", status=403, code="key_read_only")


def check_index(request: Request, name: Any, default: str) -> None:
    """403 unless the request's key is granted the index ``name`` (``default`` when none is named)."""
    key = _key(request)
    name = default if name in (None, "") else name
    if key is not None and not (isinstance(name, str) and key.may_use(name)):
        raise RequestError(f"key {key.name!r} is not granted the index {name!r}; it may use: "
                           f"{', '.join(key.indexes or ())}", status=403, code="index_not_granted", param="index")


def granted(request: Request, names: Iterable[str]) -> list[str]:
    """The names among ``names`` that the request's key may use."""
    key = _key(request)
    return [name for name in names if key is None or key.may_use(name)]
