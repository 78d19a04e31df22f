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


EXCERPT_CHARS = 240


def excerpt(text: str, answer: str | None = None, width: int = EXCERPT_CHARS) -> tuple[str, list[int] | None]:
    """About ``width`` characters of ``text`` (whitespace collapsed) around the first place the answer occurs
    in it (case-insensitive), and the answer's ``[start, end)`` in that excerpt; the passage's start and
    ``None`` when the answer is not in the passage."""
    flat = " ".join((text or "").split())
    needle = " ".join((answer or "").split()).lower()
    found = flat.lower().find(needle) if len(needle) >= 1 else -1
    if found < 0:
        return (flat if len(flat) <= width else flat[:width].rsplit(" ", 1)[0] + " ..."), None
    start = max(0, found - (width - len(needle)) // 2)
    if start:
        start = flat.find(" ", start) + 1 or start  # begin at a word
    end = min(len(flat), max(start + width, found + len(needle)))
    if end < len(flat):
        end = max(found + len(needle), flat.rfind(" ", 0, end))
    prefix, suffix = ("... " if start else ""), (" ..." if end < len(flat) else "")
    snippet = prefix + flat[start:end] + suffix
    offset = len(prefix) + found - start
    return snippet, [offset, offset + len(needle)]


def source_reports(documents: list | None, answer: str | None = None) -> list[dict[str, Any]]:
    """Ranked sources with their score parts and citation (file, page, heading, an excerpt with the answer's
    span where the passage holds it), as ``rag-mag ask --json`` prints them."""
    sources = []
    for rank, document in enumerate(documents or [], start=1):
        meta = document.meta or {}
        snippet, span = excerpt(document.content or "", answer)
        sources.append({
            "rank": rank, "id": document.id, "title": meta.get("title", ""), "text": document.content,
            "file": meta.get("file"), "page": meta.get("page"), "heading": meta.get("heading"),
            "also_in": [{"file": c.get("file"), "page": c.get("page")} for c in meta.get("also_in") or []],
            "excerpt": snippet, "answer_span": span,
            "score": document.score, "cosine": meta.get("cosine"), "query_norm": meta.get("query_norm"),
            "document_norm": meta.get("document_norm"), "query_raw_norm": meta.get("query_raw_norm"),
            "document_raw_norm": meta.get("document_raw_norm"), "hop": meta.get("hop"),
        })
    return sources


def citation(source: dict[str, Any]) -> str:
    """``notes/a.pdf, page 2`` for a file's chunk (``; also in b.pdf, page 5`` for each file that holds the same
    text); the title (or id) for a corpus passage."""
    if not source.get("file"):
        return str(source.get("title") or source.get("id"))
    cited = [_where(source)] + [_where(copy) for copy in source.get("also_in") or []]
    return cited[0] + (f"; also in {', '.join(dict.fromkeys(cited[1:]))}" if len(cited) > 1 else "")


def _where(source: dict[str, Any]) -> str:
    return f"{source['file']}, page {source['page']}" if source.get("page") else str(source["file"])


def answer_report(question: str, answer: Any, queries: list[str] | None = None) -> dict[str, Any]:
    """The answer (a ``GeneratedAnswer``) and its sources as plain data. ``answerable`` is False when the
    answer builder found that the documents do not answer (``RagMagAnswerBuilder``): ``answer`` is then
    ``ABSTENTION_TEXT`` and the sources are the closest ones, with no answer span."""
    from rag_mag.components.answer_builder import ABSTENTION_TEXT

    meta = answer.meta or {}
    answerable = meta.get("answerable", True) is not False
    text = (answer.data or "").strip() if answerable else ABSTENTION_TEXT
    report = {"question": question, "answer": text, "answerable": answerable, "queries": queries,
              "sources": source_reports(answer.documents, text if answerable else None)}
    if not answerable:
        report["abstained_by"] = meta.get("abstained_by")
    return report
