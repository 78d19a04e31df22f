"""Keyword search over a FAISSDocumentStore's Documents (the keyword half of hybrid search): what BM25 reads of a
chunk and of a file, and the BM25 indexes of one state of the store's Documents."""

from __future__ import annotations

from typing import Any

from haystack import Document

# How many times keyword search reads a Document's title (a file's name) for once its text: a name is a field that
# few words say much in ("2023 Q2 AMZN.pdf"), as BM25F weights a title. Chosen on the real documents' validation
# split: with the cosine retriever, mean file@5 94.1 / 94.4 / 95.4 / 96.0 at weights 1 / 2 / 3 / 5, all of it on the
# 10-Q filings; 5 cost the web pages' file@1 (eval/README.md, "Real documents").
KEYWORD_TITLE_WEIGHT = 3


def keyword_text(document: Document) -> str:
    """What keyword search reads of a Document: its title (a file's name) ``KEYWORD_TITLE_WEIGHT`` times, its
    section heading and its text."""
    meta = document.meta or {}
    title = meta.get("title")
    parts = [str(title)] * KEYWORD_TITLE_WEIGHT if title else []
    return " ".join(parts + [str(part) for part in (meta.get("heading"), document.content) if part])


def file_keyword_texts(documents: list[Document]) -> dict[str, str]:
    """What keyword search reads of each file (the Documents with a ``file`` in their meta): its title
    ``KEYWORD_TITLE_WEIGHT`` times, then every chunk's heading and text, in row order. A file is ranked as a whole
    because what it is about is often said once in it ("Apple Inc." on a filing's cover, "the Company" after)."""
    titles: dict[str, str] = {}
    parts: dict[str, list[str]] = {}
    for document in documents:
        meta = document.meta or {}
        file = meta.get("file")
        if not file:
            continue
        if file not in parts:
            titles[file], parts[file] = str(meta.get("title") or ""), []
        parts[file].extend(str(part) for part in (meta.get("heading"), document.content) if part)
    return {file: " ".join(([titles[file]] * KEYWORD_TITLE_WEIGHT if titles[file] else []) + parts[file])
            for file in parts}


class KeywordIndex:
    """BM25 over one state of a store's Documents, each index built on first use: over the chunks
    (``keyword_text``, about a second for 6,000 chunks) and over the files (``file_keyword_texts``). The store
    makes a new one after any change of its Documents and calls ``chunks`` and ``files`` under its lock."""

    def __init__(self, documents: list[Document]) -> None:
        self.documents = documents
        self._chunks: Any = None
        self._files: tuple[list[str], Any] | None = None

    def chunks(self):
        """The ``TextBM25`` of the chunks, in row order."""
        from rag_mag.retriever.bm25 import TextBM25

        if self._chunks is None:
            self._chunks = TextBM25([keyword_text(document) for document in self.documents])
        return self._chunks

    def files(self) -> tuple[list[str], Any]:
        """The files and the ``TextBM25`` of their texts, in the same order."""
        from rag_mag.retriever.bm25 import TextBM25

        if self._files is None:
            texts = file_keyword_texts(self.documents)
            self._files = (list(texts), TextBM25(list(texts.values())))
        return self._files
