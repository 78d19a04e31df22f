"""The demo's web app (FastAPI): the page, a JSON API and an OpenAI-compatible chat endpoint.

Routes:
  GET  /                      the page (plain HTML/CSS/JS from rag_mag/demo/static, no build step, no CDN)
  GET  /health                200 when the vLLM server (and PostgreSQL, for a table) answers, 503 (with the
                               reason) when not
  GET  /api/indexes           the indexes (strategies) served, and the request limits
  POST /api/ask               {question, index?, top_k?} -> {answer, answerable, sources[...], latency_ms, index,
                               strategy, ...}; answerable false: "The documents do not say." (and abstained_by)
  POST /api/ask/stream        the same as server-sent events: sources, token..., done (or error)
  GET  /v1/models             the indexes as OpenAI "models"
  POST /v1/chat/completions   OpenAI chat completions (model = index; stream: true for SSE chunks)
  GET    /api/documents?index=NAME            the index's files with their chunk counts, and the upload job
  POST   /api/documents?index=NAME            multipart upload of files -> 202 {job}, indexed in the background
  DELETE /api/documents?index=NAME&file=NAME  an uploaded file and its chunks -> 202 {job}
  GET    /api/documents/jobs/{id}             an upload job's state and progress (rag_mag/demo/documents.py)

Every error is JSON in OpenAI's shape, ``{"error": {"message", "type", "code", "param"}}``: 400/404 for a bad
question, top_k or index, 503 when vLLM is down or the demo is busy, 502 when vLLM refuses a request; the
documents routes add 403 (no X-RagMag-Upload header), 409, 413 and 415 (rag_mag/demo/documents.py).

Requests are checked before anything else: a Host (and, when sent, Origin) that is not one of the allowed
host names is refused with 403 (DNS rebinding, other web pages posting to the local demo); a POST body must be
JSON (``Content-Type: application/json``, else 415, so no page can send it without a CORS preflight) and at
most ``max_body_bytes`` long (else 413); see rag_mag/demo/guards.py. The upload route is the exception: a
multipart body, which any page can send, so it also needs the header ``X-RagMag-Upload: 1`` (else 403), which
no page can send to another origin without a preflight.

Who may call the API is ``Access``'s business (rag_mag/demo/access.py): with keys, every /api/... and /v1/... route
needs ``Authorization: Bearer KEY`` (401 without or with a wrong one, 429 beyond the rate or after repeated wrong
keys), a read key gets 403 on upload and delete, and any key 403 for an index it is not granted; /api/indexes and
/v1/models list only the granted ones, and /health answers without a key but says nothing about the indexes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles

from rag_mag.demo import access as access_checks
from rag_mag.demo import openai_api
from rag_mag.demo.access import Access
from rag_mag.demo.documents import Documents, check_upload_header
from rag_mag.demo.guards import LOCAL_HOSTS, MAX_BODY_BYTES, HostGuard, json_body
from rag_mag.demo.messages import Event, RequestError
from rag_mag.demo.service import MAX_QUESTION_CHARS, DemoService
from rag_mag.demo.tables import check_database
from rag_mag.errors import RagMagError, ServerNotRunningError
from rag_mag.serving.answers import NoAnswerError

logger = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def error_status(error: BaseException) -> int:
    if isinstance(error, RequestError):
        return error.status
    if isinstance(error, ServerNotRunningError):
        return 503
    return 500


def error_body(error: BaseException) -> dict[str, Any]:
    """OpenAI's error shape; unexpected errors say what happened and that the server log has the rest."""
    status = error_status(error)
    if isinstance(error, RagMagError):
        message = str(error)
    else:
        message = f"internal error ({type(error).__name__}: {error}); see the demo server's log"
    kind = "invalid_request_error" if status < 500 else "service_unavailable" if status == 503 else "server_error"
    code = getattr(error, "code", None) or ("llm_unavailable" if isinstance(error, ServerNotRunningError)
                                           else "internal_error")
    return {"error": {"message": message, "type": kind, "code": code, "param": getattr(error, "param", None)}}


def error_response(error: BaseException) -> JSONResponse:
    if error_status(error) >= 500 and not isinstance(error, RagMagError):
        logger.error("request failed", exc_info=error)
    return JSONResponse(error_body(error), status_code=error_status(error), headers=getattr(error, "headers", None))


async def primed(events: AsyncIterator[Event]) -> AsyncIterator[Event]:
    """Run a stream up to its first event now, so bad requests, a busy demo and a down vLLM become plain
    HTTP errors before any byte of the stream is sent."""
    first = await anext(events)

    async def rest() -> AsyncIterator[Event]:
        yield first
        async for event in events:
            yield event

    return rest()


def sse(kind: str, data: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


async def event_lines(events: AsyncIterator[Event]) -> AsyncIterator[str]:
    try:
        async for event in events:
            yield sse(event.kind, {"text": event.data} if event.kind == "token" else event.data)
    except Exception as error:  # the stream has started: the error becomes its last event
        if error_status(error) >= 500 and not isinstance(error, RagMagError):
            logger.error("streamed request failed", exc_info=error)
        yield sse("error", {**error_body(error), "status": error_status(error)})


async def chunk_lines(events: AsyncIterator[Event], model: str, include_usage: bool) -> AsyncIterator[str]:
    try:
        async for line in openai_api.completion_chunks(events, model, include_usage):
            yield line
    except Exception as error:
        if error_status(error) >= 500 and not isinstance(error, RagMagError):
            logger.error("streamed chat completion failed", exc_info=error)
        yield f"data: {json.dumps(error_body(error))}\n\n"


def create_app(service: DemoService, allowed_hosts: Iterable[str] = LOCAL_HOSTS,
               max_body_bytes: int = MAX_BODY_BYTES, access: Access | None = None) -> FastAPI:
    """The app around a loaded DemoService; blocking pipeline steps run in a pool of max_concurrency + 4 threads.

    ``allowed_hosts``: the names the demo answers to in Host and Origin headers (``*``: any). ``access``: who may
    call the API (default: anyone, the demo on loopback without keys).
    """
    access = access or Access()
    # No /docs: Swagger UI loads from a CDN, which this demo must not need. The schema is at /openapi.json.
    app = FastAPI(title="rag-mag demo", lifespan=_lifespan(service, access), docs_url=None, redoc_url=None,
                  dependencies=[Depends(access_checks.authenticate)])
    app.state.service = service
    app.state.access = access
    app.add_middleware(HostGuard, allowed_hosts=list(allowed_hosts))
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.exception_handler(RagMagError)
    async def on_rag_mag_error(request: Request, error: RagMagError) -> JSONResponse:
        return error_response(error)

    @app.exception_handler(Exception)
    async def on_error(request: Request, error: Exception) -> JSONResponse:
        return error_response(error)

    _add_page_routes(app, service)
    _add_ask_routes(app, service, max_body_bytes)
    _add_openai_routes(app, service, max_body_bytes)
    _add_document_routes(app, Documents(service))
    return app


def _lifespan(service: DemoService, access: Access) -> Callable[[FastAPI],
                                                                 contextlib.AbstractAsyncContextManager[None]]:
    """Start: the thread pool for blocking pipeline steps. End: close every index's pipeline, then the pool, and
    write when each key was last used."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        executor = ThreadPoolExecutor(max_workers=service.max_concurrency + 4, thread_name_prefix="rag-mag-demo")
        asyncio.get_running_loop().set_default_executor(executor)
        try:
            yield
        finally:
            for loaded in service.indexes.values():
                await loaded.pipeline.close_async()
            executor.shutdown(wait=False, cancel_futures=True)
            access.close()

    return lifespan


def _add_page_routes(app: FastAPI, service: DemoService) -> None:
    """GET /, /health and /api/indexes."""

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    @app.get("/health")
    async def health() -> JSONResponse:
        body: dict[str, Any] = {"status": "ok", "indexes": list(service.indexes), "load": service.load(),
                                "llm": {"url": service.llm_url, "reachable": True}, **app.state.access.health()}
        if any(loaded.spec.table is not None for loaded in service.indexes.values()):
            body["database"] = {"reachable": True}
            try:
                await asyncio.to_thread(check_database, list(service.indexes.values()))
            except RagMagError as error:
                body["status"] = "degraded"
                body["database"].update(reachable=False, error=str(error))
        try:
            await service.check_llm()
        except RagMagError as error:
            body["status"] = "degraded"
            body["llm"].update(reachable=False, error=str(error))
        if app.state.access.required:  # no key asked here: nothing about the indexes, paths or the vLLM URL
            body = {key: body[key] for key in ("status", "auth")} | {
                part: {"reachable": body[part]["reachable"]} for part in ("llm", "database") if part in body}
        return JSONResponse(body, status_code=503 if body["status"] == "degraded" else 200)

    @app.get("/api/indexes")
    async def indexes(request: Request) -> dict[str, Any]:
        names = access_checks.granted(request, service.indexes)
        default = service.default_index if service.default_index in names else next(iter(names), None)
        return {"indexes": [info for info in service.index_info() if info["name"] in names], "default": default,
                "max_question_chars": MAX_QUESTION_CHARS, "max_top_k": service.max_top_k}


def _add_ask_routes(app: FastAPI, service: DemoService, max_body_bytes: int) -> None:
    """POST /api/ask and /api/ask/stream (server-sent events)."""

    @app.post("/api/ask")
    async def ask(request: Request) -> dict[str, Any]:
        body = await json_body(request, max_body_bytes)
        access_checks.check_index(request, body.get("index"), service.default_index)
        return await service.ask(body.get("question"), body.get("index"), body.get("top_k"),
                                 filters=body.get("filters"))

    @app.post("/api/ask/stream")
    async def ask_stream(request: Request) -> StreamingResponse:
        body = await json_body(request, max_body_bytes)
        access_checks.check_index(request, body.get("index"), service.default_index)
        events = await primed(service.stream(body.get("question"), body.get("index"), body.get("top_k"),
                                             filters=body.get("filters")))
        return StreamingResponse(event_lines(events), media_type="text/event-stream", headers=SSE_HEADERS)


def _add_openai_routes(app: FastAPI, service: DemoService, max_body_bytes: int) -> None:
    """GET /v1/models and POST /v1/chat/completions (OpenAI's shapes; stream: true for SSE chunks)."""

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        listed = openai_api.models(service)
        names = access_checks.granted(request, [model["id"] for model in listed["data"]])
        return {**listed, "data": [model for model in listed["data"] if model["id"] in names]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> JSONResponse | StreamingResponse:
        body = await json_body(request, max_body_bytes)
        if body.get("stream") is not None and not isinstance(body.get("stream"), bool):
            raise RequestError(f"stream must be true or false, got {body.get('stream')!r}", param="stream")
        access_checks.check_index(request, body.get("model"), service.default_index)
        try:
            events = await primed(openai_api.open_stream(service, body))
        except RequestError as error:
            raise openai_api.as_model_error(error) from None
        model = body.get("model") or service.default_index
        if not body.get("stream"):
            async for event in events:
                if event.kind == "done":
                    return JSONResponse(openai_api.completion(event.data))
            raise NoAnswerError()
        stream_options = body.get("stream_options")
        include_usage = isinstance(stream_options, dict) and bool(stream_options.get("include_usage"))
        return StreamingResponse(chunk_lines(events, model, include_usage), media_type="text/event-stream",
                                 headers=SSE_HEADERS)


def _add_document_routes(app: FastAPI, documents: Documents) -> None:
    """The documents panel: GET, POST and DELETE /api/documents, GET /api/documents/jobs/{id}."""
    app.state.documents = documents

    def accepted(job) -> JSONResponse:
        return JSONResponse({"job": job.to_dict()}, status_code=202,
                            headers={"Location": f"/api/documents/jobs/{job.id}"})

    default = documents.service.default_index

    @app.get("/api/documents")
    async def list_documents(request: Request, index: str | None = None) -> dict[str, Any]:
        access_checks.check_index(request, index, default)
        return await asyncio.to_thread(documents.listing, index)

    @app.post("/api/documents", status_code=202)
    async def upload_documents(request: Request, index: str | None = None) -> JSONResponse:
        access_checks.check_write(request)
        access_checks.check_index(request, index, default)
        return accepted(await documents.upload(request, index))

    @app.delete("/api/documents", status_code=202)
    async def delete_document(request: Request, index: str | None = None, file: str | None = None) -> JSONResponse:
        access_checks.check_write(request)
        access_checks.check_index(request, index, default)
        check_upload_header(request)
        return accepted(await asyncio.to_thread(documents.delete, index, file))

    @app.get("/api/documents/jobs/{job_id}")
    async def document_job(request: Request, job_id: str) -> dict[str, Any]:
        job = documents.job(job_id)
        access_checks.check_index(request, job.index, default)
        return {"job": job.to_dict()}
