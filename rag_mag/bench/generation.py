"""Running a YAML pipeline over many benchmark questions: concurrently, cached, and patient with vLLM.

``BenchPipeline`` loads a pipeline file with the benchmark's overrides (applied through the pipeline's
own ``metadata.rag_mag.parameters`` names: ``index``, ``retriever``, ``top_k``, ``max_tokens``) and runs
``Pipeline.run`` once per question, ``concurrency`` questions at a time (the vLLM server batches
concurrent requests). Every ``VLLMChatGenerator`` of the pipeline gets the benchmark's server URL,
``timeout`` and ``max_retries``. When a run still fails on a slow or restarting server, the question
is asked again after each of ``retry_waits`` seconds; after that the cell fails with ``CellFailed``
(the runner reports it and goes on).

Results are cached per question in an append-only JSONL keyed by the pipeline file's content, the
overrides and the inputs, so an interrupted benchmark does not ask twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rag_mag.bench.config import resolve_path
from rag_mag.errors import ConfigError, RagMagError

logger = logging.getLogger(__name__)


class CellFailed(RagMagError):
    """A benchmark cell could not be computed (the generator kept failing); the run goes on without it."""


class GenerationCache:
    """Append-only JSONL of {key, result}: an interrupted benchmark does not ask twice."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._results: dict[str, Any] = {}
        older = 0
        if path.is_file():
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                try:
                    entry = json.loads(line)
                    if "reply" in entry and "result" not in entry:
                        older += 1  # a generation cached by prompt before the benchmark ran whole pipelines
                        continue
                    self._results[entry["key"]] = entry["result"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    # a line cut short by an interruption: that question is simply asked again
                    logger.warning("%s:%d: unreadable cache line skipped", path, number)
        if older:
            logger.info("%s: %d generations of an older benchmark version are not reused", path, older)

    def __len__(self) -> int:
        return len(self._results)

    def get(self, key: str) -> Any:
        return self._results.get(key)

    def put(self, key: str, result: Any) -> None:
        with self._lock:
            self._results[key] = result
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps({"key": key, "result": result}, ensure_ascii=False) + "\n")


class TruncatedAnswers(logging.Filter):
    """Counts, instead of logging one warning each, the answers the OpenAI-compatible generator reports as cut
    at ``max_tokens``: the benchmark asks for short answers on purpose (16 tokens), so most stop there."""

    LOGGER = "haystack.components.generators.chat.openai"
    MESSAGE = "truncated before reaching a natural stopping point"

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.MESSAGE not in record.getMessage():
            return True
        with self._lock:
            self.count += 1
        return False

    def __enter__(self) -> TruncatedAnswers:
        logging.getLogger(self.LOGGER).addFilter(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger(self.LOGGER).removeFilter(self)


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _retryable(error: BaseException | None) -> bool:
    """A slow, overloaded or restarting server (worth waiting for), not a request it rejects."""
    try:
        import openai
    except ImportError:  # pragma: no cover - vllm-haystack depends on openai
        return False
    return isinstance(error, (openai.APIConnectionError, openai.InternalServerError, openai.RateLimitError))


def _api_error(error: BaseException | None) -> bool:
    try:
        import openai
    except ImportError:  # pragma: no cover
        return False
    return isinstance(error, openai.APIError)


class BenchPipeline:
    """One pipeline file, loaded once with the benchmark's overrides, run over many questions."""

    def __init__(self, path: Path, overrides: dict[str, Any], cache: GenerationCache, *, concurrency: int = 16,
                 retry_waits: Sequence[float] = (), components: dict[str, Any] | None = None) -> None:
        from rag_mag.serving.pipelines import load_pipeline

        self.path = path
        self.overrides = dict(overrides)
        self.digest = file_sha256(path)
        self.pipeline = load_pipeline(path, self.overrides, components=components)
        self.pipeline.warm_up()  # once, before the threads share it
        self.cache = cache
        self.concurrency = concurrency
        self.retry_waits = list(retry_waits)

    def key(self, inputs: dict[str, Any]) -> str:
        # The server URL does not change the answer; everything else (file content, settings, inputs) may.
        settings = {k: v for k, v in self.overrides.items() if not k.endswith("api_base_url")}
        payload = json.dumps({"pipeline": self.digest, "overrides": settings, "inputs": inputs}, sort_keys=True,
                             default=_document_key)
        return hashlib.sha256(payload.encode()).hexdigest()

    def run_one(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """``Pipeline.run`` on one question (top-level names spread by the pipeline's metadata), retried while
        the server is slow or down; returns the outputs named in ``metadata.rag_mag.outputs``. Raises
        ``CellFailed`` when the generator keeps failing or rejects the request."""
        from haystack.core.errors import PipelineRuntimeError

        from rag_mag.serving.pipelines import expand_inputs, named_outputs, outputs_to_report

        keep = outputs_to_report(self.pipeline) or None
        for attempt in range(len(self.retry_waits) + 1):
            try:
                result = self.pipeline.run(expand_inputs(self.pipeline, inputs), include_outputs_from=keep)
                return named_outputs(self.pipeline, result)
            except PipelineRuntimeError as error:
                cause = error.__cause__
                if isinstance(cause, RagMagError):
                    raise cause from None
                if not _api_error(cause):
                    raise
                if not _retryable(cause) or attempt == len(self.retry_waits):
                    tries = attempt + 1
                    raise CellFailed(f"{self.path.name}: the generator failed on {inputs.get('question')!r} after "
                                     f"{tries} tr{'y' if tries == 1 else 'ies'}: {type(cause).__name__}: "
                                     f"{cause}") from None
                wait = self.retry_waits[attempt]
                logger.warning("%s: %s from the generator; asking again in %.0f s (retry %d of %d)", self.path.name,
                               type(cause).__name__, wait, attempt + 1, len(self.retry_waits))
                time.sleep(wait)
        raise AssertionError("unreachable")

    def run_many(self, inputs: Sequence[dict[str, Any]], extract: Callable[[dict[str, Any]], Any],
                 progress: str = "") -> list[Any]:
        """``extract(named outputs)`` (a JSON value, cached) for each question's inputs, in order."""
        from tqdm.auto import tqdm

        def one(item: dict[str, Any]) -> Any:
            key = self.key(item)
            cached = self.cache.get(key)
            if cached is None:
                cached = extract(self.run_one(item))
                self.cache.put(key, cached)
            return cached

        pool = ThreadPoolExecutor(max_workers=self.concurrency)
        truncated = TruncatedAnswers()
        try:
            with truncated:
                return list(tqdm(pool.map(one, inputs), total=len(inputs), desc=progress or self.path.stem,
                                 unit="q", leave=False))
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # a failed question stops the questions not started
            if truncated.count:
                logger.info("%s: %d generations stopped at the max_tokens limit", progress or self.path.stem,
                            truncated.count)


def _document_key(value: Any) -> Any:
    """Documents given as inputs (reader baselines) enter the cache key by id and content."""
    if hasattr(value, "content") and hasattr(value, "id"):
        return {"id": value.id, "content": value.content, "title": (value.meta or {}).get("title")}
    return str(value)


def resolve_pipeline(path: str) -> Path:
    """A pipeline file of the config (relative: to the working directory, then the repository)."""
    resolved = resolve_path(path)
    if not resolved.is_file():
        raise ConfigError(f"pipeline file {path} does not exist (looked at {resolved}); the benchmark config's "
                          "pipelines, retrieval_pipeline and reader_pipeline name YAML files such as "
                          "pipelines/rag.yaml")
    return resolved


def generator_overrides(path: Path, url: str, timeout: float, max_retries: int,
                        model: str | None = None) -> dict[str, Any]:
    """``name.param`` overrides that point every VLLMChatGenerator of a pipeline file at the benchmark's
    server, with its timeout and retries, asking for ``model`` when given (found by type, so a user's pipeline
    needs no particular names)."""
    from rag_mag.serving.pipelines import VLLM_GENERATOR_TYPE, read_pipeline_dict

    overrides: dict[str, Any] = {}
    for name, definition in read_pipeline_dict(path)["components"].items():
        if isinstance(definition, dict) and definition.get("type") == VLLM_GENERATOR_TYPE:
            overrides.update({f"{name}.api_base_url": url, f"{name}.timeout": float(timeout),
                              f"{name}.max_retries": int(max_retries)})
            if model is not None:
                overrides[f"{name}.model"] = model
    return overrides


def parameter_overrides(path: Path, values: dict[str, Any], required: Sequence[str]) -> dict[str, Any]:
    """``{alias: value}`` for the pipeline's declared short names; a required one it lacks is a ConfigError,
    an optional one (value None) is left to the pipeline."""
    from rag_mag.serving.pipelines import read_pipeline_dict

    declared = ((read_pipeline_dict(path).get("metadata") or {}).get("rag_mag") or {}).get("parameters") or {}
    overrides = {}
    for alias, value in values.items():
        if value is None:
            continue
        if alias not in declared:
            need = "the benchmark needs it" if alias in required else \
                f"set {alias}: null in the benchmark config to keep the pipeline's own setting, or declare it"
            raise ConfigError(f"{path}: metadata.rag_mag.parameters has no {alias!r} entry; {need} (see "
                              "pipelines/rag.yaml for the form)")
        overrides[alias] = value
    return overrides
