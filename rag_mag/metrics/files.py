"""Metrics of retrieval over a folder of files: is the right file (page) among the first k chunks, how much a few
chunks dominate every ranking (hubness), and how chunk magnitude follows chunk length.

Contract
--------
* ``file_at_k(ranked_files, gold_files, k)``: 1.0 when one of the first ``k`` ranked chunks comes from a file of
  ``gold_files``, else 0.0. ``gold_files`` must not be empty (an unanswerable question has no file to find).
* ``page_at_k(ranked, gold_files, gold_pages, k)``: the same for a (file, page) pair; a ranked chunk is
  ``(file, first_page, last_page)`` and hits when its file is a gold file and its pages cover a gold page.
* ``hubness(rankings, n_chunks, k=5, share=0.01)``: the share of rankings (one per question) whose first ``k``
  hold one of the ``ceil(share * n_chunks)`` chunks retrieved most often in those first ``k`` over all
  rankings; with ``hub_counts`` the most retrieved chunks and their counts. 0 to 1.
* ``norm_by_length(norms, words)``: how document magnitude follows chunk length: Spearman's correlation of norm
  and word count, and the median norm of chunks in each length band relative to the median of all.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

# Word-count bands of the norm-by-length table (the 5-15 and 15-40 words, then longer).
LENGTH_BANDS = ((1, 5), (5, 15), (15, 40), (40, 80), (80, 10**9))


def file_at_k(ranked_files: Sequence[str | Sequence[str]], gold_files: Iterable[str], k: int) -> float:
    """1.0 if a gold file is cited by one of the first ``k`` results; a result cites one file, or several (a chunk
    whose text several files hold, merged by the retriever)."""
    gold = set(gold_files)
    if not gold:
        raise ValueError("file_at_k needs at least one gold file (an unanswerable question has none)")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    return float(any(({cited} if isinstance(cited, str) else set(cited)) & gold for cited in ranked_files[:k]))


def page_at_k(ranked: Sequence[tuple[str, int | None, int | None]], gold_files: Iterable[str],
              gold_pages: Iterable[int], k: int) -> float:
    gold, pages = set(gold_files), set(gold_pages)
    if not gold or not pages:
        raise ValueError("page_at_k needs gold files and gold pages")
    for name, first, last in ranked[:k]:
        if name in gold and first is not None and any(first <= page <= (last or first) for page in pages):
            return 1.0
    return 0.0


def hub_counts(rankings: Sequence[Sequence[str]], k: int = 5) -> Counter:
    """How often each chunk id appears in the first ``k`` of the rankings."""
    counts: Counter = Counter()
    for ranking in rankings:
        counts.update(set(ranking[:k]))
    return counts


def hubness(rankings: Sequence[Sequence[str]], n_chunks: int, k: int = 5, share: float = 0.01) -> float:
    if n_chunks < 1 or not rankings:
        raise ValueError("hubness needs at least one chunk and one ranking")
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    counts = hub_counts(rankings, k)
    # ties broken by id, so that the figure does not depend on the order of the questions
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    hubs = {chunk for chunk, _ in ordered[:math.ceil(share * n_chunks)]}
    return float(np.mean([any(chunk in hubs for chunk in ranking[:k]) for ranking in rankings]))


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    def ranks(values: np.ndarray) -> np.ndarray:  # average ranks of ties
        order = np.argsort(values, kind="mergesort")
        ranked = np.empty(len(values))
        ranked[order] = np.arange(len(values), dtype=float)
        for value in np.unique(values):
            tied = values == value
            ranked[tied] = ranked[tied].mean()
        return ranked

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def norm_by_length(norms: Sequence[float], words: Sequence[int]) -> dict:
    """``{"spearman": rho, "median_norm": m, "bands": [{"words": "5-15", "chunks": n, "relative_norm": r}]}``."""
    norms_array, words_array = np.asarray(norms, dtype=float), np.asarray(words, dtype=float)
    if len(norms_array) != len(words_array) or len(norms_array) < 2:
        raise ValueError("norm_by_length needs as many norms as word counts, at least two")
    median = float(np.median(norms_array))
    bands = []
    for low, high in LENGTH_BANDS:
        inside = (words_array >= low) & (words_array < high)
        label = f"{low}+" if high > 10**8 else f"{low}-{high}"
        relative = float(np.median(norms_array[inside]) / median) if inside.any() and median else None
        bands.append({"words": label, "chunks": int(inside.sum()), "relative_norm": relative})
    return {"spearman": _spearman(norms_array, words_array), "median_norm": median, "bands": bands}
