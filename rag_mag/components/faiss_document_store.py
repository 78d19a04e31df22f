"""FAISSDocumentStore: Documents with their embeddings in a FAISS inner-product index, saved in a folder.

faiss-haystack only ranks by L2 distance, which cannot serve the dot, qnorm and learnable strategies:
they need maximum inner-product search (MIPS) over *un-normalized* document vectors. This store always
ranks by inner product. Index types (``index_type``):

* ``"flat"`` (the default): exact.
* ``"hnsw"``: HNSW built directly on inner product (FAISS). ``ef_search`` trades speed for recall; with
  the defaults (M 32, ef_construction 100, ef_search 512) it kept recall@10 of about 0.96-0.97 on a million
  cosine or qnorm vectors (ef_search 1024: 0.97-0.98), at 40x exact speed for one query at a time.
* ``"ivf"``: IVF-Flat with inner product; ``nlist=None`` picks about 4 sqrt(n) cells; tune ``nprobe``.
  It lost recall where norms vary widely.
* ``"hnsw_mips"``: HNSW over the exact MIPS-to-L2 reduction (rag_mag.components.mips_index). Measured,
  and worst here: on qnorm vectors its graph search stayed below recall@10 0.6 at 1M where ``hnsw``
  reached 0.97; kept for comparison and for norm distributions where inner-product graphs fail.
* ``"auto"``: flat below ``AUTO_APPROXIMATE_FROM`` documents (200,000), hnsw from there.

eval/bench_ann.py measures recall@10 against exact search, speed, build time and memory for each
(eval/README.md, "Approximate search").
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from haystack import Document, default_from_dict, default_to_dict
from haystack.document_stores.errors import DuplicateDocumentError
from haystack.document_stores.types import DuplicatePolicy
from haystack.utils.filters import document_matches_filter

from rag_mag.components import faiss_index
from rag_mag.components.document_embedder import CHECKPOINT_KEY, STRATEGY_KEY
from rag_mag.components.keyword_index import KeywordIndex
from rag_mag.errors import CheckpointError, DataError

logger = logging.getLogger(__name__)


def document_record(document: Document) -> dict[str, Any]:
    """``document.to_dict(flatten=False)`` for a stored Document (no embedding, blob or sparse embedding), built
    directly: Haystack's deep copy took 0.44 s of a 3,316-chunk save, most of an incremental re-index's write."""
    if document.blob is not None or document.sparse_embedding is not None or document.embedding is not None:
        return document.to_dict(flatten=False)
    return {"id": document.id, "content": document.content, "blob": None, "meta": document.meta,
            "score": document.score, "embedding": None, "sparse_embedding": None}


class FAISSDocumentStore:
    """A Haystack DocumentStore (write, count, filter, delete) searched by FAISS inner product.

    With ``path`` set, the store reads the index folder on first use and saves it after every
    ``write_documents`` / ``delete_documents`` (atomically). The checkpoint fingerprint and strategy
    that the RagMagDocumentEmbedder put in each Document's meta are checked for agreement and kept
    once in the folder's manifest instead.
    """

    def __init__(self, path: str | None = None, index_type: str = "flat", recreate: bool = False,
                 hnsw_m: int = faiss_index.HNSW_M, ef_construction: int = faiss_index.EF_CONSTRUCTION,
                 ef_search: int = faiss_index.EF_SEARCH, nlist: int | None = None,
                 nprobe: int = 32) -> None:
        """
        :param path: Folder the index is read from and saved to; `None` keeps it in memory only.
        :param index_type: `"flat"` (exact, default), `"hnsw_mips"`, `"ivf"` or `"hnsw"` (approximate), or
            `"auto"` (by corpus size); see the module doc.
        :param recreate: Ignore an index already saved at `path` (it is replaced on the first write).
        :param hnsw_m: HNSW graph degree. :param ef_construction: HNSW build breadth.
        :param ef_search: HNSW search breadth. :param nlist: IVF cells (`None`: about 4 sqrt(n)).
        :param nprobe: IVF cells searched.
        """
        faiss_index.check_index_type(index_type)
        for name, value in (("hnsw_m", hnsw_m), ("ef_construction", ef_construction), ("ef_search", ef_search),
                            ("nlist", nlist), ("nprobe", nprobe)):
            if value is None and name == "nlist":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if index_type not in ("flat", "auto"):
            logger.warning("FAISSDocumentStore index_type=%r is approximate: results can miss the true top-k",
                           index_type)
        self.path = path
        self.index_type = index_type
        self.recreate = recreate
        self.hnsw_m = hnsw_m
        self.ef_construction = ef_construction
        self.ef_search = ef_search
        self.nlist = nlist
        self.nprobe = nprobe
        self._documents: list[Document] = []  # row order, without embeddings
        self._embeddings = np.zeros((0, 0), dtype=np.float32)  # (n, dim)
        self._rows: dict[str, int] = {}
        self._index = None  # built lazily from _embeddings
        self._checkpoint: str | None = None
        self._strategy: str | None = None
        self._loaded = False
        self._load_lock = threading.RLock()  # reload() and a search's snapshot take it too
        self._deferring = False
        self._unsaved = False
        self._state = 0  # counts the changes of _documents: the keyword index is built again after one
        self._keyword: tuple[int, KeywordIndex] | None = None  # (state, its keyword indexes)

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, path=self.path, index_type=self.index_type, recreate=self.recreate,
                               hnsw_m=self.hnsw_m, ef_construction=self.ef_construction, ef_search=self.ef_search,
                               nlist=self.nlist, nprobe=self.nprobe)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FAISSDocumentStore:
        return default_from_dict(cls, data)

    # ------------------------------------------------------------------ loading and saving
    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        with self._load_lock:  # a server may ask from several threads at once
            if self._loaded:
                return
            if self.path and not self.recreate and faiss_index.is_index_folder(Path(self.path)):
                self._load(Path(self.path))  # raises on a corrupt folder, and will again next time
            self._loaded = True

    def _load(self, folder: Path) -> None:
        index, ids, records, manifest = faiss_index.read_folder(folder)
        if index is not None and self.index_type != "auto" and manifest["index_type"] != self.index_type:
            raise CheckpointError(f"index {folder} is a {manifest['index_type']} index but the store is configured "
                                  f"with index_type={self.index_type!r}; set index_type={manifest['index_type']!r} "
                                  "or rebuild the index")
        self._documents = [Document.from_dict(record) for record in records]
        self._embeddings = faiss_index.reconstruct_all(index) if index is not None else np.zeros((0, 0), np.float32)
        self._rows = {doc_id: row for row, doc_id in enumerate(ids)}
        self._index = index
        self._checkpoint, self._strategy = manifest.get("checkpoint"), manifest.get("strategy")
        self._state += 1
        logger.info("loaded %d documents from index %s", len(self._documents), folder)

    def reload(self) -> None:
        """Read the index folder again on next use: another store instance (a re-index in a worker thread, another
        process) saved it. Changes this store made but did not save are dropped."""
        with self._load_lock:
            self._loaded = False

    def exists(self) -> bool:
        """Whether an index is saved at ``path``."""
        return bool(self.path) and faiss_index.is_index_folder(Path(self.path))

    @property
    def manifest(self) -> dict[str, Any]:
        self._ensure_loaded()
        index_type = faiss_index.resolve_index_type(self.index_type, len(self._documents))
        return {"format_version": faiss_index.FORMAT_VERSION, "count": len(self._documents),
                "dim": int(self._embeddings.shape[1]) if self._documents else None, "index_type": index_type,
                "metric": "inner_product", "checkpoint": self._checkpoint, "strategy": self._strategy}

    def save(self, path: str | None = None) -> Path:
        """Write the index folder atomically (to ``path``, default the store's own)."""
        target = path or self.path
        if not target:
            raise ValueError("FAISSDocumentStore.save needs a path: give one or construct the store with path=...")
        self._ensure_loaded()
        records = [document_record(document) for document in self._documents]
        faiss_index.write_folder(Path(target), self.faiss_index() if self._documents else None,
                                 [d.id for d in self._documents], records, self.manifest)
        self._unsaved = False
        logger.info("saved %d documents to index %s", len(self._documents), target)
        return Path(target)

    @contextlib.contextmanager
    def deferred_saves(self) -> Iterator[None]:
        """Writes and deletes inside the block change the store in memory; the folder is saved once, when the
        block ends without an error (the last saved index stays as it was if it raises)."""
        self._ensure_loaded()
        self._deferring = True
        try:
            yield
            self.flush()
        finally:
            self._deferring = False

    def flush(self) -> None:
        """Save the changes made since the last save (inside ``deferred_saves``: a checkpoint of the work)."""
        if self._unsaved and self.path:
            self.save()

    def files(self, key: str = "file") -> dict[str, list[Document]]:
        """The stored Documents (without embeddings) grouped by ``meta[key]``, in row order; others left out."""
        self._ensure_loaded()
        grouped: dict[str, list[Document]] = {}
        for document in self._documents:
            value = (document.meta or {}).get(key)
            if value is not None:
                grouped.setdefault(str(value), []).append(document)
        return grouped

    # ------------------------------------------------------------------ DocumentStore protocol
    def count_documents(self) -> int:
        self._ensure_loaded()
        return len(self._documents)

    def filter_documents(self, filters: dict[str, Any] | None = None) -> list[Document]:
        self._ensure_loaded()
        return [replace(self._documents[row], embedding=self._embeddings[row].tolist())
                for row in range(len(self._documents))
                if not filters or document_matches_filter(filters, self._documents[row])]

    def write_documents(self, documents: list[Document], policy: DuplicatePolicy = DuplicatePolicy.NONE) -> int:
        """Add documents (each must carry an embedding); ``NONE`` behaves as ``FAIL``."""
        self._ensure_loaded()
        if not isinstance(documents, list) or not all(isinstance(d, Document) for d in documents):
            raise ValueError("write_documents expects a list of Documents")
        policy = DuplicatePolicy.FAIL if policy == DuplicatePolicy.NONE else policy
        checkpoint, strategy = self._provenance(documents)
        dim = self._embeddings.shape[1] if self._documents else None
        new_rows: dict[str, tuple[Document, np.ndarray]] = {}
        for document in documents:
            if document.embedding is None:
                raise DataError(f"document {document.id!r} has no embedding; put a RagMagDocumentEmbedder "
                                "before the writer")
            vector = np.asarray(document.embedding, dtype=np.float32)
            dim = dim or vector.shape[0]
            if vector.ndim != 1 or vector.shape[0] != dim or not np.all(np.isfinite(vector)):
                raise DataError(f"document {document.id!r} has an embedding of shape {vector.shape} (finite: "
                                f"{bool(np.all(np.isfinite(vector)))}); expected {dim} finite values")
            if document.id in self._rows or document.id in new_rows:
                if policy == DuplicatePolicy.FAIL:
                    raise DuplicateDocumentError(f"document {document.id!r} is already in the store; use "
                                                 "policy OVERWRITE or SKIP")
                if policy == DuplicatePolicy.SKIP:
                    continue
            meta = {k: v for k, v in (document.meta or {}).items() if k not in (CHECKPOINT_KEY, STRATEGY_KEY)}
            new_rows[document.id] = (replace(document, embedding=None, meta=meta), vector)
        if documents:
            self._checkpoint, self._strategy = checkpoint, strategy
        self._apply(new_rows, deleted=set())
        return len(new_rows)

    def delete_documents(self, document_ids: list[str]) -> None:
        self._ensure_loaded()
        self._apply({}, deleted={doc_id for doc_id in document_ids if doc_id in self._rows})

    # ------------------------------------------------------------------ search
    def faiss_index(self):
        """The FAISS index over the stored embeddings (built on first use after a change)."""
        self._ensure_loaded()
        if self._index is None:
            count = len(self._embeddings)
            self._index = faiss_index.build_index(self._embeddings, self.index_type, self.hnsw_m,
                                                  self.ef_construction, self.nlist or faiss_index.default_nlist(count))
        faiss_index.configure_search(self._index, self.ef_search, self.nprobe)
        return self._index

    def _snapshot(self) -> tuple[list[Document], np.ndarray, Any]:
        """The documents, vectors and index as one consistent state: a ``reload()`` from another thread swaps
        them under the same lock, and a search in flight keeps reading the state it started with."""
        with self._load_lock:
            self._ensure_loaded()
            return self._documents, self._embeddings, self.faiss_index() if self._documents else None

    def search(self, query_embeddings: np.ndarray, top_k: int,
               filters: dict[str, Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Inner-product search: scores (m, k) and rows (m, k), best first; k = min(top_k, count).

        With Haystack ``filters`` only the matching Documents are ranked, exactly (a scan of their vectors),
        whatever the index type: a filter is for a user's files, not for a million passages."""
        return self._search(self._snapshot(), query_embeddings, top_k, filters)

    def hits(self, query_embeddings: np.ndarray, top_k: int,
             filters: dict[str, Any] | None = None) -> list[list[tuple[float, Document, np.ndarray]]]:
        """``search``, with each hit's score, Document and vector taken from the same state as the ranking."""
        snapshot = self._snapshot()
        scores, rows = self._search(snapshot, query_embeddings, top_k, filters)
        documents, embeddings, _ = snapshot
        return [[(float(score), documents[row], embeddings[row]) for score, row in zip(query_scores, query_rows,
                                                                                       strict=True) if row >= 0]
                for query_scores, query_rows in zip(scores, rows, strict=True)]

    def keyword_hits(self, queries: list[str], top_k: int,
                     filters: dict[str, Any] | None = None) -> list[list[tuple[float, Document, np.ndarray]]]:
        """BM25 over each Document's title, section heading and text (``keyword_text``): the ``top_k`` hits of each
        query with a positive score, as ``(bm25 score, Document, vector)``, best first. The keyword index is built
        on first use after a change of the documents (about a second for 6,000 chunks); ``filters`` as in
        ``search``."""
        with self._load_lock:
            keyword = self._keyword_index()
            documents, embeddings, chunks = keyword.documents, self._embeddings, keyword.chunks()
        rows = np.arange(len(documents))
        if filters:
            rows = np.asarray([row for row, document in enumerate(documents)
                               if document_matches_filter(filters, document)], dtype=np.int64)
        results = []
        for query in queries:
            scores = chunks.scores(query)[rows]  # (matching,)
            best = np.argsort(-scores, kind="stable")[:top_k]
            results.append([(float(scores[i]), documents[rows[i]], embeddings[rows[i]]) for i in best if scores[i] > 0])
        return results

    def file_keyword_scores(self, query: str) -> dict[str, float]:
        """BM25 of each file as a whole (``file_keyword_texts``) for ``query``: ``{file: score}`` of the files
        that score above zero; empty for an index without files. Built with the same rule as ``keyword_hits``: on
        first use after a change of the documents."""
        with self._load_lock:
            files, bm25 = self._keyword_index().files()
        return {file: float(score) for file, score in zip(files, bm25.scores(query), strict=True) if score > 0}

    def _keyword_index(self) -> KeywordIndex:
        """The keyword indexes of the Documents as they are now (the caller holds ``_load_lock``)."""
        self._ensure_loaded()
        if self._keyword is None or self._keyword[0] != self._state:
            self._keyword = (self._state, KeywordIndex(self._documents))
        return self._keyword[1]

    @staticmethod
    def _search(snapshot, query_embeddings: np.ndarray, top_k: int,
                filters: dict[str, Any] | None) -> tuple[np.ndarray, np.ndarray]:
        documents, embeddings, index = snapshot
        queries = np.ascontiguousarray(query_embeddings, dtype=np.float32)
        if not documents:
            return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
        if queries.ndim != 2 or queries.shape[1] != embeddings.shape[1]:
            raise DataError(f"query embeddings have shape {queries.shape}, the index holds vectors of dimension "
                            f"{embeddings.shape[1]}; embed queries with the checkpoint the index was built with")
        if filters:
            rows = np.asarray([row for row, document in enumerate(documents)
                               if document_matches_filter(filters, document)], dtype=np.int64)
            scores = queries @ embeddings[rows].T  # (m, matching)
            k = min(top_k, len(rows))
            best = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # (m, k)
            return np.take_along_axis(scores, best, axis=1), rows[best] if len(rows) else best
        k = min(top_k, len(documents))
        if len(queries) >= faiss_index.BATCH_THRESHOLD:
            return index.search(queries, k)
        with faiss_index.single_thread():
            return index.search(queries, k)

    def document_at(self, row: int) -> Document:
        self._ensure_loaded()
        return self._documents[row]

    def embedding_at(self, row: int) -> np.ndarray:
        self._ensure_loaded()
        return self._embeddings[row]

    # ------------------------------------------------------------------ internals
    def _provenance(self, documents: list[Document]) -> tuple[str | None, str | None]:
        """The one checkpoint fingerprint and strategy that all documents (new and stored) share."""
        found = []
        for key, current in ((CHECKPOINT_KEY, self._checkpoint), (STRATEGY_KEY, self._strategy)):
            seen = {(d.meta or {}).get(key) for d in documents}
            if self._documents:
                seen.add(current)
            if len(seen) > 1:
                raise CheckpointError(f"documents embedded with different retriever checkpoints or strategies "
                                      f"({key}: {sorted(map(str, seen))}) cannot share one index; re-embed them all "
                                      "with one checkpoint, or write to a new index (recreate=True)")
            found.append(seen.pop() if seen else current)
        return found[0], found[1]

    def _apply(self, written: dict[str, tuple[Document, np.ndarray]], deleted: set[str]) -> None:
        if not written and not deleted:
            return
        self._state += 1
        appended = [doc_id for doc_id in written if doc_id not in self._rows]
        if written and not self._documents:
            self._embeddings = np.zeros((0, len(next(iter(written.values()))[1])), np.float32)
        for doc_id, (document, vector) in written.items():
            if doc_id in self._rows:  # overwrite in place
                self._documents[self._rows[doc_id]] = document
                self._embeddings[self._rows[doc_id]] = vector
        new_vectors = np.stack([written[doc_id][1] for doc_id in appended]) if appended else None
        if new_vectors is not None:
            self._documents.extend(written[doc_id][0] for doc_id in appended)
            self._embeddings = np.concatenate([self._embeddings, new_vectors])
        if deleted:
            keep = [row for row, document in enumerate(self._documents) if document.id not in deleted]
            self._documents = [self._documents[row] for row in keep]
            self._embeddings = self._embeddings[keep]
        self._rows = {document.id: row for row, document in enumerate(self._documents)}
        extendable = (self._index is not None and self._index.ntotal > 0
                      and faiss_index.index_type_of(self._index) in ("flat", "hnsw", "hnsw_mips"))
        if extendable and not deleted and len(appended) == len(written):
            self._index.add(new_vectors)  # pure append: extend the index instead of rebuilding it
        else:
            self._index = None
        if not self._documents:
            self._checkpoint = self._strategy = None
        self._unsaved = True
        if self.path and not self._deferring:
            self.save()
