"""AnswerPromptBuilder: the one home of the answer prompt, for every pipeline and for the reader's training.

The trained reader learns to answer exactly these messages, so no pipeline writes its own answer template:
``rag.yaml``, ``reader.yaml``, ``rag_qdrant.yaml`` and the answer step of ``rag_multihop.yaml`` all use this
component, and ``rag-mag train-reader`` renders its training prompts with ``answer_messages`` (the same code).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict
from haystack.components.builders.chat_prompt_builder import ChatPromptBuilder
from haystack.dataclasses import ChatMessage

# With passages: the reader answers from them. Without: from its own knowledge (the closed-book baseline).
# `truncate(N)` is Jinja's: it cuts at a word boundary and appends "...".
PASSAGES_TEMPLATE = """\
{% message role="system" %}
You answer questions briefly from these passages. Reply with the answer only, in a few words.
{% endmessage %}
{% message role="user" %}
Passages:
{%- for document in documents %}
[{{ loop.index }}] {{ document.meta.get("title", "") }}: {{ document.content | truncate(max_passage_chars) }}
{%- endfor %}

Question: {{ question }}
Answer:
{% endmessage %}
"""
CLOSED_BOOK_TEMPLATE = """\
{% message role="system" %}
You answer questions briefly from your own knowledge. Reply with the answer only, in a few words.
{% endmessage %}
{% message role="user" %}
Question: {{ question }}
Answer:
{% endmessage %}
"""
DEFAULT_MAX_PASSAGE_CHARS = 700


@component
class AnswerPromptBuilder:
    """Chat messages that ask the reader for a short answer to `question` from `documents` (each shown as
    ``[i] title: text``, the text cut at `max_passage_chars`); with no documents, a closed-book prompt."""

    def __init__(self, max_passage_chars: int = DEFAULT_MAX_PASSAGE_CHARS) -> None:
        """
        :param max_passage_chars: Longest passage text shown to the reader (characters, Jinja's `truncate`).
        """
        if not isinstance(max_passage_chars, int) or isinstance(max_passage_chars, bool) or max_passage_chars < 20:
            raise ValueError(f"max_passage_chars must be an integer of at least 20, got {max_passage_chars!r}")
        self.max_passage_chars = max_passage_chars
        self._with_passages = ChatPromptBuilder(template=PASSAGES_TEMPLATE,
                                                required_variables=["question", "documents", "max_passage_chars"])
        self._closed_book = ChatPromptBuilder(template=CLOSED_BOOK_TEMPLATE, required_variables=["question"])

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, max_passage_chars=self.max_passage_chars)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AnswerPromptBuilder:
        return default_from_dict(cls, data)

    @component.output_types(prompt=list[ChatMessage])
    def run(self, question: str, documents: list[Document]) -> dict[str, list[ChatMessage]]:
        """
        Build the answer prompt. Both inputs are required, so that in a loop (rag_multihop.yaml) the prompt waits
        for the final passages.

        :param question: The user's question.
        :param documents: The passages to answer from, best first; an empty list: closed book.
        :returns: `prompt`: the system and user messages for a chat generator.
        """
        if documents:
            return self._with_passages.run(question=question, documents=documents,
                                           max_passage_chars=self.max_passage_chars)
        return self._closed_book.run(question=question)


def answer_messages(question: str, passages: Sequence[tuple[str, str]],
                    max_passage_chars: int = DEFAULT_MAX_PASSAGE_CHARS) -> list[dict[str, str]]:
    """The answer prompt for ``(title, text)`` passages as OpenAI-style ``{role, content}`` dicts, which is
    what a tokenizer's chat template reads (the reader's training prompts)."""
    documents = [Document(content=text, meta={"title": title}) for title, text in passages]
    messages = AnswerPromptBuilder(max_passage_chars).run(question=question, documents=documents)["prompt"]
    return [{"role": message.role.value, "content": message.text or ""} for message in messages]
