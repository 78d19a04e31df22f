"""The OpenAI chat-completions shape of a demo answer: the RAG pipeline as an OpenAI-compatible "model".

``model`` names an index; the last user message is the question (earlier turns are not used: each
question is answered from the passages retrieved for it). Non-standard extras: ``top_k`` in the
request, and a ``rag_mag`` object (sources with score parts, latency, strategy, ``answerable`` and, for no
answer, ``abstained_by``) in the response and in the last chunk of a stream; OpenAI clients ignore both.
When the documents do not answer, the message's content is "The documents do not say." (streamed the same).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from rag_mag.demo.messages import Event, RequestError
from rag_mag.demo.service import DemoService


def question_of(body: dict[str, Any]) -> str:
    """The text of the last user message of a chat-completions request."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects", param="messages")
    for message in reversed(messages):
        if not isinstance(message, dict):
            raise RequestError("every message must be an object with role and content", param="messages")
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "\n".join(part.get("text", "") for part in content
                                if isinstance(part, dict) and part.get("type") == "text")
        if content is None or isinstance(content, str):
            return content or ""
        raise RequestError("the user message's content must be text or a list of text parts", param="messages")
    raise RequestError("there is no user message: the last message with role 'user' is the question",
                       param="messages")


def open_stream(service: DemoService, body: dict[str, Any]) -> AsyncIterator[Event]:
    """The service's event stream for a chat-completions request (validated on first iteration)."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return service.stream(question_of(body), body.get("model"), body.get("top_k"),
                          max_tokens=body.get("max_completion_tokens", body.get("max_tokens")),
                          temperature=body.get("temperature"), filters=body.get("filters"))


def as_model_error(error: RequestError) -> RequestError:
    """An unknown index, reported as an unknown model (the name OpenAI clients gave it)."""
    if error.code != "index_not_found":
        return error
    return RequestError(str(error).replace("unknown index", "unknown model").replace(
        "this demo serves", "the models (indexes) of this demo are"), status=404, code="model_not_found",
        param="model")


def _extras(result: dict[str, Any]) -> dict[str, Any]:
    keys = ("index", "strategy", "top_k", "answerable", "sources", "queries", "latency_ms", "first_token_ms",
            "retrieval_ms", "queue_ms")
    extras = {key: result.get(key) for key in keys}
    if result.get("answerable") is False:
        extras["abstained_by"] = result.get("abstained_by")
    return extras


def _usage(result: dict[str, Any]) -> dict[str, int] | None:
    usage = result.get("usage") or {}
    if not isinstance(usage, dict) or "prompt_tokens" not in usage:
        return None
    return {key: int(usage.get(key) or 0) for key in ("prompt_tokens", "completion_tokens", "total_tokens")}


def completion(result: dict[str, Any]) -> dict[str, Any]:
    """A ``chat.completion`` object from the service's result."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
        "model": result["index"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": result["answer"]},
                     "finish_reason": result.get("finish_reason") or "stop", "logprobs": None}],
        "usage": _usage(result), "rag_mag": _extras(result),
    }


def _chunk(completion_id: str, created: int, model: str, delta: dict[str, Any], finish_reason: str | None = None,
           **extra: Any) -> str:
    chunk = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}], **extra}
    return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"


async def completion_chunks(events: AsyncIterator[Event], model: str, include_usage: bool) -> AsyncIterator[str]:
    """Server-sent ``chat.completion.chunk`` lines, then ``data: [DONE]``. Errors end the stream with an
    ``{"error": ...}`` line (raised by OpenAI clients), formatted by the caller's ``on_error``."""
    completion_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    yield _chunk(completion_id, created, model, {"role": "assistant", "content": ""})
    async for event in events:
        if event.kind == "token":
            yield _chunk(completion_id, created, model, {"content": event.data})
        elif event.kind == "done":
            result = event.data
            yield _chunk(completion_id, created, model, {}, result.get("finish_reason") or "stop",
                         rag_mag=_extras(result))
            if include_usage:
                usage_chunk = {"id": completion_id, "object": "chat.completion.chunk", "created": created,
                               "model": model, "choices": [], "usage": _usage(result)}
                yield f"data: {json.dumps(usage_chunk)}\n\n"
    yield "data: [DONE]\n\n"


def models(service: DemoService) -> dict[str, Any]:
    """``GET /v1/models``: every index, as a model."""
    created = int(time.time())
    return {"object": "list", "data": [
        {"id": info["name"], "object": "model", "created": created, "owned_by": "rag-mag",
         "strategy": info["strategy"], "documents": info["documents"]} for info in service.index_info()]}
