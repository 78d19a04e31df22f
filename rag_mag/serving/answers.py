"""A RAG pipeline's answer as plain data, shared by ``rag-mag ask``, the demo and the benchmark.

``first_answer`` takes the answer out of a run's declared outputs (``metadata.rag_mag.outputs.answers``) or
raises ``NoAnswerError``; ``answer_report`` turns it into the answer text and its ranked sources with the
parts of each score (cosine x query norm x document norm).
"""

from __future__ import annotations

from typing import Any

from rag_mag.errors import ConfigError


class NoAnswerError(ConfigError):
    """A pipeline run gave no answer: its declared ``answers`` output is missing or empty."""

    def __init__(self, source: str = "the pipeline") -> None:
        super().__init__(f"{source} returned no answer; metadata.rag_mag.outputs.answers must name the "
                         "AnswerBuilder output (see pipelines/rag.yaml)")


def first_answer(outputs: dict[str, Any], source: str = "the pipeline") -> Any:
    """The first answer among a run's named outputs (``named_outputs``); ``NoAnswerError`` when there is none."""
    answers = outputs.get("answers") or []
    if not answers:
        raise NoAnswerError(source)
    return answers[0]


def source_reports(documents: list | None) -> list[dict[str, Any]]:
    """Ranked sources with their score parts, as ``rag-mag ask --json`` prints them."""
    sources = []
    for rank, document in enumerate(documents or [], start=1):
        meta = document.meta or {}
        sources.append({
            "rank": rank, "id": document.id, "title": meta.get("title", ""), "text": document.content,
            "score": document.score, "cosine": meta.get("cosine"), "query_norm": meta.get("query_norm"),
            "document_norm": meta.get("document_norm"), "query_raw_norm": meta.get("query_raw_norm"),
            "document_raw_norm": meta.get("document_raw_norm"), "hop": meta.get("hop"),
        })
    return sources


def answer_report(question: str, answer: Any, queries: list[str] | None = None) -> dict[str, Any]:
    """The answer (a ``GeneratedAnswer``) and its sources as plain data."""
    return {"question": question, "answer": (answer.data or "").strip(), "queries": queries,
            "sources": source_reports(answer.documents)}
