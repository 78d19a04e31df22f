"""QuestionPromptBuilder: the one home of the question writer's prompt, for ``rag-mag synth`` and for the writer's
training (``rag-mag train-reader --task question`` renders its prompts with ``question_messages``, the same code).

The writer reads one passage and replies in two lines, ``Question: ...`` and ``Answer: ...``, the answer a short
span of the passage; ``parse_question`` reads that reply back and ``question_target`` writes it for training.
"""

from __future__ import annotations

import re
from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict
from haystack.components.builders.chat_prompt_builder import ChatPromptBuilder
from haystack.dataclasses import ChatMessage

QUESTION_TEMPLATE = """\
{% message role="system" %}
You write questions for a search engine. Read the passage and write one question that the passage answers,
and its answer: a short span copied from the passage. Reply in two lines, "Question:" then "Answer:".
{% endmessage %}
{% message role="user" %}
Passage: {{ document.meta.get("title", "") }}: {{ document.content | truncate(max_passage_chars) }}
{% endmessage %}
"""
DEFAULT_MAX_PASSAGE_CHARS = 700
_LINE = re.compile(r"^\s*(question|answer)\s*:\s*(.*?)\s*$", re.IGNORECASE)


@component
class QuestionPromptBuilder:
    """Chat messages that ask the question writer for one question that `document` answers, with its answer."""

    def __init__(self, max_passage_chars: int = DEFAULT_MAX_PASSAGE_CHARS) -> None:
        """
        :param max_passage_chars: Longest passage text shown (characters, Jinja's `truncate`).
        """
        if not isinstance(max_passage_chars, int) or isinstance(max_passage_chars, bool) or max_passage_chars < 20:
            raise ValueError(f"max_passage_chars must be an integer of at least 20, got {max_passage_chars!r}")
        self.max_passage_chars = max_passage_chars
        self._builder = ChatPromptBuilder(template=QUESTION_TEMPLATE,
                                          required_variables=["document", "max_passage_chars"])

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, max_passage_chars=self.max_passage_chars)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QuestionPromptBuilder:
        return default_from_dict(cls, data)

    @component.output_types(prompt=list[ChatMessage])
    def run(self, document: Document) -> dict[str, list[ChatMessage]]:
        """
        Build the question writer's prompt.

        :param document: The passage to write a question for (its `meta["title"]` is shown before it).
        :returns: `prompt`: the system and user messages for a chat generator.
        """
        return self._builder.run(document=document, max_passage_chars=self.max_passage_chars)


def question_messages(title: str, text: str,
                      max_passage_chars: int = DEFAULT_MAX_PASSAGE_CHARS) -> list[dict[str, str]]:
    """The writer's prompt for one ``(title, text)`` passage as ``{role, content}`` dicts (training prompts)."""
    document = Document(content=text, meta={"title": title})
    messages = QuestionPromptBuilder(max_passage_chars).run(document=document)["prompt"]
    return [{"role": message.role.value, "content": message.text or ""} for message in messages]


def question_target(question: str, answer: str) -> str:
    """The reply the writer is trained to give (a question mark added where the question has none, as NQ's
    search queries do not)."""
    question = question.strip().rstrip("?").rstrip()
    return f"Question: {question}?\nAnswer: {answer.strip()}"


def parse_question(reply: str) -> tuple[str, str] | None:
    """``(question, answer)`` from a writer's reply, or None when it is not one question line (ending in "?")
    followed by one non-empty answer line."""
    fields: dict[str, str] = {}
    for line in (reply or "").splitlines():
        match = _LINE.match(line)
        if match and match.group(1).lower() not in fields:
            fields[match.group(1).lower()] = match.group(2)
    question, answer = fields.get("question", ""), fields.get("answer", "").rstrip(".").strip()
    if not question.endswith("?") or len(question) < 8 or not answer:
        return None
    return question, answer
