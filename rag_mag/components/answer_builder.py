"""RagMagAnswerBuilder: Haystack's AnswerBuilder, and whether the documents answer the question at all.

The trained reader replies ``NO_ANSWER_REPLY`` ("unanswerable") when its passages do not hold the answer
(``rag-mag train-reader`` with ``no_answer_share``). This component builds the answers as Haystack's
``AnswerBuilder`` does and marks each one in its meta:

* ``answerable``: False when the reader abstained, or when ``min_score`` is set and the best passage scores
  under it (a retrieval-score floor; scores differ by strategy and corpus, so calibrate it on your own
  validation questions); the answer's ``data`` is then ``NO_ANSWER_REPLY``;
* ``abstained_by``: ``"reader"`` or ``"score"`` (absent on an answer);
* ``reply``: the reader's reply as it came.

``abstain: off`` marks every answer answerable and keeps the reader's reply as the answer, whatever it is
(YAML 1.1, which PyYAML and ``--set`` speak, reads a bare ``off`` as false: false is taken for ``off``).
``rag-mag ask`` prints an abstention as "The documents do not say." (``ABSTENTION_TEXT``) and still lists the
closest sources. ``may_be_no_answer`` tells a streaming client (the demo) whether the start of a reply may still
turn out to be the reader's abstention, so that it holds that text back instead of showing it as an answer.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict
from haystack.components.builders.answer_builder import AnswerBuilder
from haystack.dataclasses import ChatMessage, GeneratedAnswer

from rag_mag.metrics.answers import NO_ANSWER_REPLY, clean_answer, is_no_answer, normalize_answer

ABSTAIN_MODES = ("auto", "off")
ABSTENTION_TEXT = "The documents do not say."


@component
class RagMagAnswerBuilder:
    """Answers from the generator's replies (Haystack's ``AnswerBuilder``), each marked answerable or not."""

    def __init__(self, abstain: str = "auto", min_score: float | None = None) -> None:
        """
        :param abstain: ``auto``: an answer is unanswerable when the reader abstains (or scores fall under
            ``min_score``); ``off``: every reply is an answer.
        :param min_score: With ``abstain: auto``, the lowest score of the best passage that still lets the reader
            answer (the retriever's score: cosine, or cosine x norms); None: no floor.
        """
        if abstain is False:  # `abstain: off` in YAML, or --set abstain=off
            abstain = "off"
        if abstain not in ABSTAIN_MODES:
            raise ValueError(f"abstain must be one of {', '.join(ABSTAIN_MODES)}, got {abstain!r}")
        if min_score is not None and (isinstance(min_score, bool) or not isinstance(min_score, int | float)
                                      or not math.isfinite(min_score)):
            raise ValueError(f"min_score must be a finite number or null, got {min_score!r}")
        self.abstain = abstain
        self.min_score = None if min_score is None else float(min_score)
        self._builder = AnswerBuilder()

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, abstain=self.abstain, min_score=self.min_score)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RagMagAnswerBuilder:
        return default_from_dict(cls, data)

    @component.output_types(answers=list[GeneratedAnswer])
    def run(self, query: str, replies: list[ChatMessage] | list[str],
            documents: list[Document] | None = None) -> dict[str, list[GeneratedAnswer]]:
        """
        Build one answer per reply and mark whether the documents answer the question.

        :param query: The user's question.
        :param replies: The generator's replies.
        :param documents: The passages the reader saw, best first.
        :returns: `answers`: one `GeneratedAnswer` per reply, with `answerable` (and `abstained_by`) in its meta.
        """
        answers = self._builder.run(query=query, replies=replies, documents=documents)["answers"]
        return {"answers": [self._judge(answer, documents or []) for answer in answers]}

    def _judge(self, answer: GeneratedAnswer, documents: list[Document]) -> GeneratedAnswer:
        reply = answer.data or ""
        meta = {**answer.meta, "reply": reply, "answerable": True}
        by = None
        if self.abstain == "auto":
            if reader_abstains(reply):
                by = "reader"
            elif self.min_score is not None and (not documents or documents[0].score is None
                                                 or documents[0].score < self.min_score):
                by = "score"
        if by is None:
            return replace(answer, meta=meta)
        return replace(answer, data=NO_ANSWER_REPLY, meta={**meta, "answerable": False, "abstained_by": by})


def reader_abstains(reply: str) -> bool:
    """Whether a reader's whole reply is its abstention (or empty): no answer, whatever the passages."""
    return is_no_answer(clean_answer(reply))


def may_be_no_answer(start: str) -> bool:
    """Whether a reply that begins with ``start`` may still turn out to be the reader's abstention as
    ``reader_abstains`` reads it: while its first line is open, whether it cleans to a beginning of
    ``NO_ANSWER_REPLY`` (or of the "Answer:" that ``clean_answer`` drops); once that line is complete, the verdict."""
    text = start.lstrip()
    if "\n" in text:  # the first non-empty line is complete: nothing after it changes the verdict
        return reader_abstains(text)
    if "answer:".startswith(text.lower()):
        return True
    return NO_ANSWER_REPLY.startswith(normalize_answer(clean_answer(text)))
