"""A lexical BM25 index over passages (bm25s), shared by mining and the benchmark's BM25 baseline."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rag_mag.data import Passage


class BM25Index:
    """BM25 over ``title + text`` with English stop words removed."""

    def __init__(self, passages: Sequence[Passage], show_progress: bool = False) -> None:
        import bm25s

        if not passages:
            raise ValueError("BM25Index needs at least one passage")
        self.passages = list(passages)
        self.show_progress = show_progress
        self._bm25 = bm25s.BM25()
        tokens = bm25s.tokenize([p.content for p in self.passages], stopwords="en", show_progress=show_progress)
        self._bm25.index(tokens, show_progress=show_progress)

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Indices into ``passages`` and scores, each (n_queries, k'), best first; k' = min(k, corpus size)."""
        import bm25s

        k = min(k, len(self.passages))
        tokens = bm25s.tokenize(list(queries), stopwords="en", show_progress=False)
        indices, scores = self._bm25.retrieve(tokens, k=k, show_progress=self.show_progress)
        return np.asarray(indices), np.asarray(scores)


class TextBM25:
    """BM25 scores of every text of a list for one query at a time (bm25s, English stop words removed): the
    keyword half of hybrid search in a FAISSDocumentStore, built once per state of the index (about a second for
    6,000 chunks)."""

    def __init__(self, texts: Sequence[str]) -> None:
        import bm25s

        self.size = len(texts)
        self._bm25 = bm25s.BM25()
        if texts:
            self._bm25.index(bm25s.tokenize(list(texts), stopwords="en", show_progress=False), show_progress=False)

    def scores(self, query: str) -> np.ndarray:
        """(n,) BM25 score of each text; all zero for a query of stop words only, or an empty list."""
        import bm25s

        tokens = bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)[0]
        if not tokens or not self.size:
            return np.zeros(self.size, dtype=np.float32)
        return np.asarray(self._bm25.get_scores(tokens), dtype=np.float32)
