"""FollowUpPromptBuilder: the one home of the multi-hop follow-up prompt, for rag_multihop.yaml and for the
reader's training (the trained reader writes the follow-up query too, so one model serves both steps)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict
from haystack.components.builders.chat_prompt_builder import ChatPromptBuilder
from haystack.dataclasses import ChatMessage

FOLLOWUP_TEMPLATE = """\
{% message role="system" %}
You help a search engine answer a question that needs several facts. Read the passages found so far and
write one short search query for the fact that is still missing. Reply with the query only.
{% endmessage %}
{% message role="user" %}
Passages found so far:
{%- for document in documents %}
[{{ loop.index }}] {{ document.meta.get("title", "") }}: {{ document.content | truncate(max_passage_chars) }}
{%- endfor %}

Question: {{ question }}
Search query for the missing fact:
{% endmessage %}
"""
DEFAULT_MAX_PASSAGE_CHARS = 500


@component
class FollowUpPromptBuilder:
    """Chat messages that ask for one search query for the fact the passages found so far still miss."""

    def __init__(self, max_passage_chars: int = DEFAULT_MAX_PASSAGE_CHARS) -> None:
        """
        :param max_passage_chars: Longest passage text shown (characters, Jinja's `truncate`).
        """
        if not isinstance(max_passage_chars, int) or isinstance(max_passage_chars, bool) or max_passage_chars < 20:
            raise ValueError(f"max_passage_chars must be an integer of at least 20, got {max_passage_chars!r}")
        self.max_passage_chars = max_passage_chars
        self._builder = ChatPromptBuilder(template=FOLLOWUP_TEMPLATE,
                                          required_variables=["question", "documents", "max_passage_chars"])

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, max_passage_chars=self.max_passage_chars)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FollowUpPromptBuilder:
        return default_from_dict(cls, data)

    @component.output_types(prompt=list[ChatMessage])
    def run(self, question: str, documents: list[Document]) -> dict[str, list[ChatMessage]]:
        """
        Build the follow-up prompt.

        :param question: The user's question.
        :param documents: The passages found so far.
        :returns: `prompt`: the system and user messages for a chat generator.
        """
        return self._builder.run(question=question, documents=documents, max_passage_chars=self.max_passage_chars)


def followup_messages(question: str, passages: Sequence[tuple[str, str]],
                      max_passage_chars: int = DEFAULT_MAX_PASSAGE_CHARS) -> list[dict[str, str]]:
    """The follow-up prompt for ``(title, text)`` passages as ``{role, content}`` dicts (training prompts)."""
    documents = [Document(content=text, meta={"title": title}) for title, text in passages]
    messages = FollowUpPromptBuilder(max_passage_chars).run(question=question, documents=documents)["prompt"]
    return [{"role": message.role.value, "content": message.text or ""} for message in messages]
