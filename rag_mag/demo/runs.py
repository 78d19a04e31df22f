"""One question through one index's pipeline, as a stream of events (sources, tokens, the final answer).

The pipeline runs in a task of its own (``Pipeline.run_async_generator``); the answer generator's async
streaming callback and the partial outputs of the retrievers both feed one queue, which ``events`` reads.
If the reader stops early (the browser went away), the task is cancelled, and with it the vLLM request.

The answer builder decides only at the end whether the reply is an answer (``RagMagAnswerBuilder``), so the
tokens pass through a ``ReplyGate``: text that may still become the reader's abstention ("unanswerable") is held
back, and an abstention streams as "The documents do not say." (``ABSTENTION_TEXT``), the final answer's text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from rag_mag.components.answer_builder import ABSTENTION_TEXT, RagMagAnswerBuilder, may_be_no_answer
from rag_mag.demo.loading import LoadedIndex, answer_builder_name
from rag_mag.demo.messages import Event, RequestError
from rag_mag.errors import ServerNotRunningError
from rag_mag.serving.answers import answer_report, first_answer, source_reports

logger = logging.getLogger(__name__)


def _milliseconds(since: float, until: float | None = None) -> float:
    return round(((until if until is not None else time.perf_counter()) - since) * 1000.0, 1)


class ReplyGate:
    """What of the reader's streamed reply may be shown yet. Text is held while it may still turn out to be the
    reader's abstention (``may_be_no_answer``); once some is shown, the rest passes at once. ``hold_all``: hold the
    whole reply to the end (a score floor may turn any reply into no answer)."""

    def __init__(self, hold_all: bool = False) -> None:
        self.hold_all = hold_all
        self.held = ""
        self.passing = False

    def pass_on(self, text: str) -> str:
        """The text to show now for a new piece of the reply: the held text with it, or nothing yet."""
        if self.passing:
            return text
        self.held += text
        if self.hold_all or may_be_no_answer(self.held):
            return ""
        self.passing, shown, self.held = True, self.held, ""
        return shown

    def rest(self, result: dict[str, Any]) -> str:
        """The text still to show once the answer is known: the held text of an answer; for no answer,
        ``ABSTENTION_TEXT``, unless part of the reply is already shown (it cannot be taken back; the final
        answer then says it)."""
        if result.get("answerable", True):
            return self.held
        return "" if self.passing else ABSTENTION_TEXT


def holds_whole_reply(pipeline) -> bool:
    """Whether the pipeline's answer builder may turn any reply into no answer (``abstain: auto`` with a
    ``min_score`` floor), so that nothing of a reply may be shown before the end."""
    builder = pipeline.get_component(answer_builder_name(pipeline))
    return isinstance(builder, RagMagAnswerBuilder) and builder.abstain == "auto" and builder.min_score is not None


class PipelineRun:
    """Runs ``question`` once on ``loaded``; ``started`` is when the request arrived (for the latency) and
    ``queued`` when it began to wait for a free slot (for the time it waited)."""

    def __init__(self, loaded: LoadedIndex, question: str, top_k: int, generation_kwargs: dict[str, Any],
                 *, started: float | None = None, queued: float | None = None,
                 filters: dict[str, Any] | None = None) -> None:
        self.loaded = loaded
        self.filters = filters
        self.question = question
        self.top_k = top_k
        self.generation_kwargs = generation_kwargs
        self.admitted = time.perf_counter()
        self.started = self.admitted if started is None else started
        self.queued = self.started if queued is None else queued
        self.retrieved_at: float | None = None
        self.first_token_at: float | None = None

    def inputs(self, on_chunk) -> dict[str, dict[str, Any]]:
        from rag_mag.serving.pipelines import question_inputs

        inputs = question_inputs(self.loaded.pipeline, self.question)
        for name in self.loaded.retrievers:
            inputs.setdefault(name, {})["top_k"] = self.top_k
            if self.filters:
                inputs[name]["filters"] = self.filters
        for name in self.loaded.joiners:
            inputs.setdefault(name, {})["top_k"] = self.top_k
        for name in self.loaded.answer_generators:
            inputs.setdefault(name, {}).update(streaming_callback=on_chunk, generation_kwargs=self.generation_kwargs)
        return inputs

    async def events(self) -> AsyncIterator[Event]:
        from rag_mag.serving.pipelines import outputs_to_report

        pipeline = self.loaded.pipeline
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        async def on_chunk(chunk) -> None:
            if chunk.content:
                queue.put_nowait(("token", chunk.content))

        source_components = self.loaded.source_components or self.loaded.retrievers
        keep = set(source_components) | set(self.loaded.answer_generators) | outputs_to_report(pipeline)

        async def drive() -> None:
            final: dict[str, Any] = {}
            sent: list[str] | None = None
            try:
                async for partial in pipeline.run_async_generator(self.inputs(on_chunk), include_outputs_from=keep):
                    final = partial
                    for name in source_components:
                        documents = (partial.get(name) or {}).get("documents")
                        ids = None if documents is None else [document.id for document in documents]
                        if ids is not None and ids != sent:  # the last yield (all outputs) repeats them
                            sent = ids
                            queue.put_nowait(("sources", documents))
                queue.put_nowait(("end", final))
            except Exception as error:  # handed to the reader, which raises it in the request's context
                queue.put_nowait(("error", error))

        gate = ReplyGate(hold_all=holds_whole_reply(pipeline))
        task = asyncio.create_task(drive())
        try:
            while True:
                kind, data = await queue.get()
                if kind == "token":
                    self.first_token_at = self.first_token_at or time.perf_counter()
                    shown = gate.pass_on(data)
                    if shown:
                        yield Event("token", shown)
                elif kind == "sources":
                    self.retrieved_at = self.retrieved_at or time.perf_counter()
                    yield Event("sources", {"index": self.loaded.spec.name, "strategy": self.loaded.strategy,
                                            "sources": source_reports(data),
                                            "retrieval_ms": _milliseconds(self.started, self.retrieved_at)})
                elif kind == "error":
                    translated = self.translate(data)
                    if translated is data:
                        raise data
                    raise translated from data
                else:
                    result = self.result(data)
                    rest = gate.rest(result)
                    if rest:
                        yield Event("token", rest)
                    yield Event("done", result)
                    return
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def translate(self, error: Exception) -> Exception:
        """The error a user should see: ours unwrapped, vLLM trouble as ServerNotRunningError or a 4xx/502."""
        from rag_mag.serving.pipelines import LLMRequestError, PromptTooLongError, explain_run_error

        if self.loaded.spec.table is not None:
            from rag_mag.demo.tables import database_error

            lost = database_error(error)
            if lost is not None:
                logger.warning("index %s: %s", self.loaded.spec.name, lost)
                return lost
        explained = explain_run_error(error)
        if explained is None:
            return error
        url = self.loaded.pipeline.get_component(self.loaded.answer_generators[0]).api_base_url
        if isinstance(explained, ServerNotRunningError):
            return ServerNotRunningError(f"lost the connection to the vLLM server at {url}; check it with "
                                         "`rag-mag serve-llm --status`, or start it with `rag-mag serve-llm`")
        if isinstance(explained, PromptTooLongError):
            return RequestError(f"{explained}", status=400, code="context_length_exceeded", param="question")
        if isinstance(explained, LLMRequestError):
            return RequestError(str(explained).replace("the vLLM server", f"the vLLM server at {url}", 1),
                                status=502, code="llm_error")
        return explained

    def result(self, final: dict[str, Any]) -> dict[str, Any]:
        from rag_mag.serving.pipelines import named_outputs

        finished = time.perf_counter()
        pipeline = self.loaded.pipeline
        outputs = named_outputs(pipeline, final)
        report = answer_report(self.question, first_answer(outputs), outputs.get("queries"))
        replies = (final.get(self.loaded.answer_generators[0]) or {}).get("replies") or []
        reply_meta = replies[0].meta if replies else {}
        report.update(
            index=self.loaded.spec.name, strategy=self.loaded.strategy, top_k=self.top_k,
            model=reply_meta.get("model") or self.loaded.llm_model, finish_reason=reply_meta.get("finish_reason"),
            usage=reply_meta.get("usage") or None, latency_ms=_milliseconds(self.started, finished),
            queue_ms=_milliseconds(self.queued, self.admitted),
            retrieval_ms=_milliseconds(self.started, self.retrieved_at) if self.retrieved_at else None,
            first_token_ms=_milliseconds(self.started, self.first_token_at) if self.first_token_at else None)
        return report
