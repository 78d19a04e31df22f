"""The linked-positives rule: a training row keeps the positives whose title its question names."""

from __future__ import annotations

import re

from rag_mag.metrics.answers import normalize_answer
from rag_mag.retriever.data.spec import SourceStats


def title_words(title: str) -> str:
    """A title as the question would name it: without a disambiguation such as "(album)", normalized."""
    return normalize_answer(re.sub(r"\s*\([^)]*\)", " ", title))


def linked_positives(query: str, positives: list[dict]) -> list[dict]:
    """The positives whose title the question names (as whole words), or all of them if it names none."""
    question = f" {normalize_answer(query)} "
    linked = [p for p in positives if (words := title_words(p["title"])) and f" {words} " in question]
    return linked or positives


def keep_linked_positives(rows: list[dict], stats: dict[str, SourceStats]) -> None:
    for row in rows:  # a lone positive is kept whether or not it is named (linked_positives never empties a row)
        kept = linked_positives(row["query"], row["positives"])
        stats[row["source"]].unlinked_positives_dropped += len(row["positives"]) - len(kept)
        row["positives"] = kept
