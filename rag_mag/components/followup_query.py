"""FollowUpQuery: turns an LLM reply into the next retrieval round's query (multi-hop RAG)."""

from __future__ import annotations

import logging
import re
from typing import Any

from haystack import component, default_from_dict, default_to_dict
from haystack.dataclasses import ChatMessage

logger = logging.getLogger(__name__)

# Labels small models like to put before the query ("Search query: ...", "Query - ...").
_LABEL = re.compile(r"^\s*(?:follow[- ]?up\s+)?(?:search\s+)?query\s*[:\-]\s*", re.IGNORECASE)
_QUOTES = "\"'`“”‘’"


@component
class FollowUpQuery:
    """Cleans the model's follow-up search query: the first non-empty line, without a leading
    "Query:" label or quotes, cut to `max_chars`. If the reply is empty, or just repeats the
    question, the question itself is used. With `include_question`, the query is
    `question + " " + follow-up` (dense retrievers often do better with the context kept).
    """

    def __init__(self, include_question: bool = False, max_chars: int = 200) -> None:
        """
        :param include_question: Prefix the follow-up with the original question.
        :param max_chars: Longest follow-up kept (characters).
        """
        if not isinstance(max_chars, int) or max_chars < 1:
            raise ValueError(f"max_chars must be a positive integer, got {max_chars!r}")
        self.include_question = include_question
        self.max_chars = max_chars

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, include_question=self.include_question, max_chars=self.max_chars)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FollowUpQuery:
        return default_from_dict(cls, data)

    def clean(self, reply: str) -> str:
        """The follow-up query in a raw reply ('' if there is none)."""
        for line in (reply or "").splitlines():
            line = _LABEL.sub("", line).strip().strip(_QUOTES).strip()
            if line:
                return line[: self.max_chars].strip()
        return ""

    @component.output_types(query=str)
    def run(self, replies: list[ChatMessage], question: str) -> dict[str, str]:
        """
        Build the next query.

        :param replies: The chat generator's replies (the first one is used).
        :param question: The user's question (fallback and optional prefix).
        :returns: `query`: the next round's query.
        """
        text = replies[0].text if replies and replies[0].text else ""
        followup = self.clean(text)
        if not followup or followup.casefold() == question.strip().casefold():
            logger.debug("no usable follow-up query in %r; reusing the question", text)
            return {"query": question}
        query = f"{question} {followup}" if self.include_question else followup
        logger.debug("follow-up query: %r", query)
        return {"query": query}
