"""The chunks a corpus is adapted to: a folder of files split as ``rag-mag index`` splits them, or an index's.

A folder is indexed once under ``WORK/base_index`` with the untrained base retriever (``WORK/base_retriever``: the
packaged all-MiniLM-L6-v2 under cosine, saved as a rag-mag checkpoint), through the same files pipeline and the
same incremental indexer as ``rag-mag index``, so the chunks (ids, files, pages) are the ones a user's index holds.
An index folder (FAISS) is read as it is; where its chunks came from a JSONL corpus rather than files, a chunk's
title stands for its file (a Wikipedia article's passages stay together when pairs are split by file).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from rag_mag.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Chunk:
    id: str
    title: str
    text: str
    file: str
    page: int | None

    @property
    def content(self) -> str:
        """What an encoder reads, as the document embedder does: the title, then the text."""
        return f"{self.title}\n{self.text}" if self.title else self.text

    def record(self) -> dict:
        return asdict(self)


def base_retriever(work: Path, base_model: str = "") -> Path:
    """The untrained base as a rag-mag checkpoint (saved once): what the round-trip check ranks with.
    ``base_model`` is a Hugging Face encoder folder (empty: the packaged MiniLM) or a rag-mag checkpoint, used
    as it is."""
    from rag_mag.retriever.encoder import CONFIG_NAME, MagnitudeEncoder

    if base_model and (Path(base_model) / CONFIG_NAME).is_file():
        return Path(base_model)
    folder = work / "base_retriever"
    if not (folder / CONFIG_NAME).is_file():
        MagnitudeEncoder.build(base_model or None, strategy="cosine").save(folder)
    return folder


def load_chunks(source: str, work: Path, *, base_model: str = "", progress: bool = True) -> list[Chunk]:
    """Every chunk of ``source`` (a folder or file of documents, or a FAISS index folder), sorted by id."""
    from rag_mag.components.faiss_document_store import FAISSDocumentStore
    from rag_mag.components.faiss_index import is_index_folder

    path = Path(source)
    if not path.exists():
        raise ConfigError(f"{source} does not exist; pass a folder of documents or an index folder")
    if path.is_dir() and is_index_folder(path):
        folder = path
    else:
        from rag_mag.ingestion.file_indexing import index_files

        folder = work / "base_index"
        summary = index_files([str(path)], folder, base_retriever(work, base_model), progress=progress)
        logger.info("chunks of %s: %d in %s", source, summary.index_chunks, folder)
    documents = FAISSDocumentStore(path=str(folder)).filter_documents()
    if not documents:
        raise ConfigError(f"{source} holds no text to write questions about; add documents (.txt .md .html .pdf "
                          ".docx) and run again")
    # a corpus indexed from JSONL has no files: its titles (an article's passages) stand for them
    chunks = [Chunk(d.id, str(d.meta.get("title") or ""), d.content or "",
                    str(d.meta.get("file") or d.meta.get("title") or d.id), d.meta.get("page")) for d in documents]
    return sorted(chunks, key=lambda chunk: chunk.id)
