"""CorpusReader: reads a corpus JSONL file (``{id, title, text}``) into Haystack Documents."""

from __future__ import annotations

import logging
from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict

from rag_mag.data import read_corpus
from rag_mag.errors import ConfigError

logger = logging.getLogger(__name__)


@component
class CorpusReader:
    """Turns each passage of a corpus file into a Document: `id` = passage id, `content` = text,
    `meta["title"]` = title. Reads `.jsonl` and `.jsonl.gz`; a malformed line fails with file and line.

    ```python
    reader = CorpusReader(path="data/sample/corpus.jsonl")
    documents = reader.run()["documents"]
    ```
    """

    def __init__(self, path: str | None = None, limit: int | None = None) -> None:
        """
        :param path: The corpus file; can also be given to `run`.
        :param limit: Read only the first `limit` passages (for quick trials); `None` reads all.
        """
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ValueError(f"limit must be a positive integer or None, got {limit!r}")
        self.path = path
        self.limit = limit

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, path=self.path, limit=self.limit)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CorpusReader:
        return default_from_dict(cls, data)

    @component.output_types(documents=list[Document])
    def run(self, path: str | None = None, limit: int | None = None) -> dict[str, list[Document]]:
        """
        Read the corpus.

        :param path: Overrides the constructor's `path`.
        :param limit: Overrides the constructor's `limit`.
        :returns: `documents`: one Document per passage, in file order.
        """
        path = path or self.path
        limit = limit or self.limit
        if not path:
            raise ConfigError("CorpusReader has no corpus file; set its `path` (e.g. `--set reader.path=FILE`)")
        passages = read_corpus(path)
        if limit:
            passages = passages[:limit]
        documents = [Document(id=p.id, content=p.text, meta={"title": p.title} if p.title else {}) for p in passages]
        logger.info("read %d passages from %s", len(documents), path)
        return {"documents": documents}
