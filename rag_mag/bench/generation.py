"""Answer generation for the benchmark: the RAG pipeline's own prompt and vLLM generator, run
concurrently, with a cache of generations keyed by the exact prompt.

The prompt builder and the ``VLLMChatGenerator`` come from the pipeline YAML (``pipelines/rag.yaml``
by default), so the benchmark scores what ``rag-mag ask`` answers. Closed-book answers use the
same generator with a prompt that has no passages.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from haystack import Document
from haystack.components.builders import ChatPromptBuilder

from rag_mag.errors import ConfigError

logger = logging.getLogger(__name__)

CLOSED_BOOK_TEMPLATE = """{% message role="system" %}
You answer questions briefly from your own knowledge. Reply with the answer only, in a few words.
{% endmessage %}
{% message role="user" %}
Question: {{ question }}
Answer:
{% endmessage %}"""


def clean_answer(text: str) -> str:
    """First non-empty line, without a leading "Answer:" and trailing period."""
    for line in (text or "").splitlines():
        line = line.strip()
        if line:
            if line.lower().startswith("answer:"):
                line = line[len("answer:"):].strip()
            return line.rstrip(".").strip()
    return ""


class GenerationCache:
    """Append-only JSONL of {key, reply}: an interrupted benchmark does not ask twice."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._replies: dict[str, str] = {}
        if path.is_file():
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                try:
                    entry = json.loads(line)
                    self._replies[entry["key"]] = entry["reply"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    # a line cut short by an interruption: that generation is simply asked again
                    logger.warning("%s:%d: unreadable cache line skipped", path, number)

    def __len__(self) -> int:
        return len(self._replies)

    def get(self, key: str) -> str | None:
        return self._replies.get(key)

    def put(self, key: str, reply: str) -> None:
        with self._lock:
            self._replies[key] = reply
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps({"key": key, "reply": reply}, ensure_ascii=False) + "\n")


class BenchGenerator:
    """Builds prompts and asks the vLLM server, ``concurrency`` requests at a time."""

    def __init__(self, pipeline_path: str | Path, llm_url: str, cache: GenerationCache, max_tokens: int,
                 concurrency: int) -> None:
        from rag_mag.pipelines import load_pipeline

        pipeline = load_pipeline(pipeline_path, {"llm_url": llm_url})
        try:
            self.rag_prompt = pipeline.get_component("prompt_builder")
            self.llm = pipeline.get_component("llm")
        except ValueError:
            raise ConfigError(f"{pipeline_path} must have components named prompt_builder and llm for the "
                              "benchmark to reuse its prompt and generator") from None
        self.llm.generation_kwargs = {**(self.llm.generation_kwargs or {}), "max_tokens": max_tokens,
                                      "temperature": 0.0}
        self.closed_prompt = ChatPromptBuilder(template=CLOSED_BOOK_TEMPLATE, required_variables=["question"])
        self.cache = cache
        self.concurrency = concurrency
        self.model = self.llm.model

    def _key(self, messages) -> str:
        payload = json.dumps({"model": self.model, "kwargs": self.llm.generation_kwargs,
                              "messages": [m.to_dict() for m in messages]}, sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()

    def _answer(self, messages) -> str:
        key = self._key(messages)
        cached = self.cache.get(key)
        if cached is None:
            reply = self.llm.run(messages=messages)["replies"][0].text or ""
            self.cache.put(key, reply)
            cached = reply
        return clean_answer(cached)

    def answer_all(self, questions: Sequence[str], documents: Sequence[Sequence[Document]] | None,
                   progress: str = "") -> list[str]:
        """One answer per question; ``documents=None`` means closed book."""
        if documents is None:
            prompts = [self.closed_prompt.run(question=q)["prompt"] for q in questions]
        else:
            prompts = [self.rag_prompt.run(question=q, documents=list(docs))["prompt"]
                       for q, docs in zip(questions, documents, strict=True)]
        from tqdm.auto import tqdm

        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(tqdm(pool.map(self._answer, prompts), total=len(prompts), desc=progress or "generate",
                             unit="q", leave=False))

