"""What the demo's parts hand each other and the HTTP layer: the events of a streamed answer, and the
error of a request the demo refuses (with the HTTP status it maps to)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rag_mag.errors import RagMagError


class RequestError(RagMagError):
    """A request the demo refuses or cannot serve; ``status`` is the HTTP status it maps to, ``headers`` go with
    the answer (``WWW-Authenticate`` of a 401, ``Retry-After`` of a 429)."""

    def __init__(self, message: str, *, status: int = 400, code: str = "invalid_request",
                 param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.param = param
        self.headers = dict(headers or {})


@dataclass(frozen=True)
class Event:
    """One step of a streamed answer: ``sources`` (retrieved passages), ``token`` (text) or ``done`` (result)."""

    kind: str
    data: Any
