"""Answers on real documents: the reader answers every question from the first ``RAG_TOP_K`` chunks that a system
ranked for it, through ``pipelines/reader.yaml`` on the vLLM server (started if none runs), so that every system,
rag-mag's and Haystack's, is read by the same reader from the same number of chunks.

Scored on answerable questions: with a short reference answer, SQuAD EM and F1 and accuracy (a reference alias
occurs in the answer); with a long one (sentences drafted by people or a model), ``fact_recall``: the share of the
reference's facts, its numbers and its capitalised names, that the answer states.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np

from rag_mag.metrics.answers import clean_answer, contains_answer, exact_match, f1, is_no_answer

logger = logging.getLogger(__name__)

RAG_TOP_K = 3
MAX_TOKENS = 32
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
_NAME = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][A-Za-z0-9&\-]+")


def fact_terms(text: str) -> set[str]:
    """The facts of a long answer: its numbers (``$81.8 billion`` -> ``81.8``; ``1,234`` -> ``1234``) and its
    capitalised words that do not open a sentence, lower-cased."""
    numbers = {match.group().replace(",", "").rstrip(".") for match in _NUMBER.finditer(text)}
    names = {match.group().lower() for match in _NAME.finditer(text)}
    return numbers | names


def fact_recall(prediction: str, reference: str) -> float | None:
    """Share of ``fact_terms(reference)`` found in the prediction's facts and words; None if it has none."""
    facts = fact_terms(reference)
    if not facts:
        return None
    said = fact_terms(prediction) | {word.lower().strip(".,;:()") for word in prediction.split()}
    return len(facts & said) / len(facts)


def score_answers(questions, predictions: dict[str, str]) -> dict[str, list[float]]:
    """Per-question values (0-1) of the questions that have a prediction: on answerable ones the answer's scores
    (an abstention scores 0) and ``false_abstain``; on unanswerable ones ``abstain`` (the reader's
    "unanswerable", which the answer builder gives as its answer)."""
    per: dict[str, list[float]] = {"em": [], "f1": [], "accuracy": [], "fact_recall": [], "abstain": [],
                                   "false_abstain": []}
    for question in questions:
        if question.id not in predictions:
            continue
        answer = predictions[question.id]
        if not question.answerable:
            per["abstain"].append(float(is_no_answer(answer)))
            continue
        per["false_abstain"].append(float(is_no_answer(answer)))
        if is_no_answer(answer):
            answer = ""
        if question.answer_type == "short":
            per["em"].append(exact_match(answer, question.answers))
            per["f1"].append(f1(answer, question.answers))
            per["accuracy"].append(float(contains_answer(answer, question.answers)))
        else:
            recall = fact_recall(answer, question.answers[0])
            if recall is not None:
                per["fact_recall"].append(recall)
    return per


def answer_cell(cell: dict[str, Any], questions, url: str, model: str, cache_path: Path) -> dict[str, str]:
    """The reader's answer to every question of the cell, from the cell's first ``RAG_TOP_K`` passages."""
    from haystack import Document

    from rag_mag.bench.generation import BenchPipeline, GenerationCache, generator_overrides
    from rag_mag.serving.answers import first_answer
    from rag_mag.serving.pipelines import default_pipeline

    path = default_pipeline("reader")
    overrides = {**generator_overrides(path, url, timeout=900.0, max_retries=2, model=model),
                 "max_tokens": MAX_TOKENS}
    pipeline = BenchPipeline(path, overrides, GenerationCache(cache_path), retry_waits=(10, 30, 60))
    inputs = [{"question": q.question,
               "documents": [Document(content=text) for text in cell["passages"][q.id][:RAG_TOP_K]]}
              for q in questions]
    replies = pipeline.run_many(inputs, lambda outputs: clean_answer(first_answer(outputs).data or ""),
                                progress=f"{cell['collection']}:{cell['system']}")
    return {q.id: reply for q, reply in zip(questions, replies, strict=True)}


def mean_or_none(values: list[float]) -> float | None:
    return 100 * float(np.mean(values)) if values else None
