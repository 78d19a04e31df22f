"""The demo's question answering: validation, bounded concurrency, and answers streamed token by token.

A question runs through Haystack's ``Pipeline.run_async_generator``: synchronous components (embedder,
retriever, prompt builder) run in the event loop's thread pool, and the generator that writes the answer
talks to the vLLM server with its async client and a streaming callback, so tokens reach the page as vLLM
produces them (except text that may still be the reader's abstention, held back: ``runs.ReplyGate``). The
retrieved sources are sent as soon as the retriever is done, before the first token.
At most ``max_concurrency`` questions run at once (so at most that many requests reach vLLM); up to
``max_waiting`` more wait for a slot, and beyond that the demo answers "busy" instead of piling up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from rag_mag.demo import runs
from rag_mag.demo.loading import LoadedIndex
from rag_mag.demo.messages import Event, RequestError
from rag_mag.errors import ServerNotRunningError
from rag_mag.serving.answers import NoAnswerError
from rag_mag.serving.source_filters import MAX_FILTER_DEPTH, filter_depth

logger = logging.getLogger(__name__)

MAX_QUESTION_CHARS = 1000
DEFAULT_MAX_TOP_K = 8  # 8 passages of <= 700 characters, a long question and the answer fit SmolLM2's 2048 tokens
MAX_ANSWER_TOKENS = 512
LLM_CHECK_TTL_S = 2.0  # a successful reachability check of vLLM is trusted this long
DEFAULT_MAX_UPLOAD_MB = 20.0  # per uploaded file (the documents panel)


class DemoService:
    """Answers questions on any of its indexes; safe to call from many concurrent requests of one event loop."""

    def __init__(self, indexes: list[LoadedIndex], llm_url: str, *, max_concurrency: int = 8,
                 max_waiting: int = 256, max_top_k: int = DEFAULT_MAX_TOP_K,
                 max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB) -> None:
        if not indexes:
            raise ValueError("DemoService needs at least one index")
        if isinstance(max_upload_mb, bool) or not isinstance(max_upload_mb, (int, float)) or not max_upload_mb > 0:
            raise ValueError(f"max_upload_mb must be a positive number, got {max_upload_mb!r}")
        for name, value in (("max_concurrency", max_concurrency), ("max_waiting", max_waiting),
                            ("max_top_k", max_top_k)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.indexes = {loaded.spec.name: loaded for loaded in indexes}
        self.default_index = indexes[0].spec.name
        self.llm_url = llm_url
        self.max_concurrency = max_concurrency
        self.max_waiting = max_waiting
        self.max_top_k = max_top_k
        self.max_upload_mb = max_upload_mb
        self._slots = asyncio.Semaphore(max_concurrency)
        self._waiting = 0
        self._running = 0
        self._llm_ok_until = 0.0

    # ------------------------------------------------------------------------------ what it serves
    def index_info(self) -> list[dict[str, Any]]:
        """What the API shows of each index: folder names only, never paths on the server's disk (``table``: the
        PostgreSQL table of an index on pgvector, else None)."""
        return [{"name": name, "strategy": loaded.strategy, "documents": loaded.documents,
                 "default_top_k": min(loaded.top_k, self.max_top_k), "default": name == self.default_index,
                 "index_dir": loaded.spec.index_dir.name if loaded.spec.index_dir else None,
                 "table": loaded.spec.table, "retriever_dir": loaded.spec.retriever_dir.name}
                for name, loaded in self.indexes.items()]

    def load(self) -> dict[str, int]:
        return {"running": self._running, "waiting": self._waiting, "max_concurrency": self.max_concurrency}

    # ------------------------------------------------------------------------------ validation
    def validate(self, question: Any, index: Any = None, top_k: Any = None) -> tuple[str, LoadedIndex, int]:
        """The stripped question, the index and top_k of a request; RequestError (4xx) when one is bad."""
        if question is None or (isinstance(question, str) and not question.strip()):
            raise RequestError("the question is empty; type a question, e.g. \"Who wrote Hamlet?\"",
                               code="question_empty", param="question")
        if not isinstance(question, str):
            raise RequestError(f"the question must be text, got {type(question).__name__}", param="question")
        question = question.strip()
        if len(question) > MAX_QUESTION_CHARS:
            raise RequestError(f"the question is {len(question)} characters long; the limit is "
                               f"{MAX_QUESTION_CHARS}; shorten it", code="question_too_long", param="question")
        name = self.default_index if index in (None, "") else index
        if name not in self.indexes:
            raise RequestError(f"unknown index {name!r}; this demo serves: {', '.join(self.indexes)}",
                               status=404, code="index_not_found", param="index")
        loaded = self.indexes[name]
        top_k = min(loaded.top_k, self.max_top_k) if top_k is None else top_k
        if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= self.max_top_k:
            raise RequestError(f"top_k must be a whole number from 1 to {self.max_top_k}, got {top_k!r}",
                               param="top_k")
        return question, loaded, top_k

    @staticmethod
    def check_filters(filters: Any) -> dict[str, Any] | None:
        """Haystack metadata filters of a request (e.g. on ``meta.file``), checked before the pipeline runs."""
        if filters is None:
            return None
        from haystack import Document
        from haystack.errors import FilterError
        from haystack.utils.filters import document_matches_filter

        if not isinstance(filters, dict):
            raise RequestError(f"filters must be a Haystack filter object, got {type(filters).__name__}; e.g. "
                               '{"field": "meta.file", "operator": "==", "value": "notes.pdf"}', param="filters")
        depth = filter_depth(filters)
        if depth > MAX_FILTER_DEPTH:  # Haystack evaluates filters recursively: a deep one is a RecursionError
            raise RequestError(f"filters are nested {depth} levels deep; at most {MAX_FILTER_DEPTH} are accepted",
                               param="filters")
        try:
            document_matches_filter(filters, Document(content=""))
        except (FilterError, TypeError, ValueError, KeyError, AttributeError) as error:
            raise RequestError(f"bad filters: {error}; e.g. {{\"field\": \"meta.file\", \"operator\": \"in\", "
                               f"\"value\": [\"notes.pdf\"]}}", param="filters") from None
        return filters

    @staticmethod
    def generation_kwargs(max_tokens: Any = None, temperature: Any = None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"stream_options": {"include_usage": True}}
        if max_tokens is not None:
            if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= \
                    MAX_ANSWER_TOKENS:
                raise RequestError(f"max_tokens must be a whole number from 1 to {MAX_ANSWER_TOKENS}, got "
                                   f"{max_tokens!r}", param="max_tokens")
            kwargs["max_tokens"] = max_tokens
        if temperature is not None:
            if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or \
                    not 0.0 <= temperature <= 2.0:
                raise RequestError(f"temperature must be a number from 0 to 2, got {temperature!r}",
                                   param="temperature")
            kwargs["temperature"] = float(temperature)
        return kwargs

    # ------------------------------------------------------------------------------ the vLLM server
    async def check_llm(self) -> list[str]:
        """Raise ServerNotRunningError at once when vLLM does not answer (a success is trusted briefly)."""
        from rag_mag.serving.llm.preflight import check_server

        if time.monotonic() < self._llm_ok_until:
            return []
        served = await asyncio.to_thread(check_server, self.llm_url, timeout=3.0)
        self._llm_ok_until = time.monotonic() + LLM_CHECK_TTL_S
        return served

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        if self._slots.locked() and self._waiting >= self.max_waiting:
            raise RequestError(f"the demo is busy ({self._running} questions running, {self._waiting} waiting); "
                               "try again in a moment", status=503, code="busy")
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        self._running += 1
        try:
            yield
        finally:
            self._running -= 1
            self._slots.release()

    # ------------------------------------------------------------------------------ answering
    async def stream(self, question: Any, index: Any = None, top_k: Any = None, *, max_tokens: Any = None,
                     temperature: Any = None, filters: Any = None) -> AsyncIterator[Event]:
        """Validate, then yield ``sources`` (each retrieval round), ``token``s, and one final ``done`` event.

        Raises RequestError (bad request, busy), ServerNotRunningError (vLLM down) or another RagMagError.
        """
        question, loaded, top_k = self.validate(question, index, top_k)
        filters = self.check_filters(filters)
        generation_kwargs = self.generation_kwargs(max_tokens, temperature)
        started = time.perf_counter()
        await self.check_llm()
        queued = time.perf_counter()
        async with self._slot():
            run = runs.PipelineRun(loaded, question, top_k, generation_kwargs, started=started, queued=queued,
                                   filters=filters)
            try:
                async for event in run.events():
                    yield event
            except ServerNotRunningError:
                self._llm_ok_until = 0.0  # check again next time
                raise

    async def ask(self, question: Any, index: Any = None, top_k: Any = None, **kwargs: Any) -> dict[str, Any]:
        """The whole answer at once (the ``done`` event of :meth:`stream`)."""
        result: dict[str, Any] | None = None
        async for event in self.stream(question, index, top_k, **kwargs):
            if event.kind == "done":
                result = event.data
        if result is None:
            raise NoAnswerError()
        return result
