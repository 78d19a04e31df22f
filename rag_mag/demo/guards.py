"""What the demo checks before a request reaches it: who may ask (Host, Origin) and what a POST body may be.

* ``HostGuard``: 403 unless the Host header, and the Origin header when a browser sends one, name an
  allowed host (localhost, 127.0.0.1 and ::1 by default). That shuts out DNS rebinding (a foreign name
  resolving to 127.0.0.1) and other web pages posting to the local demo.
* ``json_body``: 415 unless the body is declared JSON (a page can send ``text/plain`` or a form to any
  origin without a CORS preflight, but not ``application/json``), 413 beyond ``max_bytes``, 400 when it is
  not a JSON object.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import JSONResponse

from rag_mag.demo.messages import RequestError

MAX_BODY_BYTES = 64 * 1024  # a question of 1,000 characters and an OpenAI request around it fit many times over
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


def host_name(value: str) -> str:
    """The host of a Host header or an Origin (no port, no brackets, lower case)."""
    if "://" in value:
        return (urlsplit(value).hostname or "").lower()
    host = value.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


class HostGuard:
    """ASGI middleware: 403 unless Host (and Origin, when sent) names an allowed host; ``*`` allows any."""

    def __init__(self, app, allowed_hosts: Iterable[str]) -> None:
        self.app = app
        self.allowed = {host_name(host) if host != "*" else "*" for host in allowed_hosts}

    def allows(self, value: str | None) -> bool:
        return "*" in self.allowed or host_name(value or "") in self.allowed

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            headers = {key.decode("latin-1"): value.decode("latin-1") for key, value in scope["headers"]}
            origin = headers.get("origin")
            problem = None
            if not self.allows(headers.get("host")):
                problem = (f"Host {headers.get('host')!r} is not one this demo answers to", "host_not_allowed")
            elif origin is not None and not self.allows(origin):
                problem = (f"requests from the web page at {origin!r} are not allowed", "origin_not_allowed")
            if problem:
                message = (f"{problem[0]}; allowed hosts: {', '.join(sorted(self.allowed))}. When serving under "
                           "another name, start the demo with --allowed-host NAME")
                response = JSONResponse({"error": {"message": message, "type": "invalid_request_error",
                                                   "code": problem[1], "param": None}}, status_code=403)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def json_body(request: Request, max_bytes: int = MAX_BODY_BYTES) -> dict[str, Any]:
    """The JSON object of a POST body: 415 unless it is declared JSON, 413 beyond ``max_bytes``."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json" and not media_type.endswith("+json"):
        raise RequestError(f"the request body must be JSON sent with Content-Type: application/json, got "
                           f"{media_type or 'no content type'!r}", status=415, code="unsupported_media_type")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise RequestError(f"the request body is {int(declared)} bytes; the limit is {max_bytes}",
                           status=413, code="body_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise RequestError(f"the request body is over {max_bytes} bytes, the limit", status=413,
                               code="body_too_large")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except RecursionError:  # nested deeper than the parser's stack (e.g. 30,000 levels): malformed for us too
        raise RequestError("the request body is nested too deeply; send a flat JSON object, e.g. "
                           "{\"question\": \"Who wrote Hamlet?\"}", code="invalid_json") from None
    except (ValueError, UnicodeDecodeError):
        raise RequestError("the request body is not valid JSON; send e.g. {\"question\": \"Who wrote Hamlet?\"}",
                           code="invalid_json") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object, e.g. {\"question\": \"Who wrote Hamlet?\"}")
    return body
