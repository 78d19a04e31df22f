"""The background jobs of the documents panel: one served index's uploads folder, indexed in a worker thread.

A job runs ``index_files([UPLOADS_DIR], INDEX_DIR, RETRIEVER_DIR)`` (the incremental pipeline of
``rag-mag index``: only new and changed files are encoded, and files gone from the folder lose their chunks)
on a pipeline and store of its own, under the index's job lock, so a ``rag-mag index`` on the same folder is
refused instead of racing it. The demo goes on answering from its loaded store meanwhile; when the job ends,
that store reads the saved folder again (``FAISSDocumentStore.reload``).

One job runs at a time per index. A request that comes while one runs is queued: it joins the one queued job
(which indexes the whole folder, so it covers every request that joined it) and gets that job's id.

An index on a PostgreSQL table (``rag-mag serve --table``) lists the table's files and takes no uploads
(``rag_mag.demo.tables``): it is filled with ``rag-mag index PATH --store pgvector``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_mag import durable
from rag_mag.demo.loading import LoadedIndex
from rag_mag.errors import RagMagError

logger = logging.getLogger(__name__)

KEPT_JOBS = 50  # finished jobs remembered per index, for GET /api/documents/jobs/{id}
FINISHED = ("done", "failed")


def uploads_dir(index_dir: Path) -> Path:
    """Where the files uploaded into an index are kept: ``<index_dir>.uploads`` beside the index folder (never
    inside it: the index folder is replaced whole on every save)."""
    index_dir = Path(index_dir)
    return index_dir.with_name(index_dir.name + ".uploads")


@dataclass
class Job:
    """One run of the incremental indexing over an uploads folder; ``requests`` says what asked for it."""

    id: str
    index: str
    requests: list[str]
    state: str = "queued"  # queued -> running -> done | failed
    files_done: int = 0
    files_total: int = 0
    chunks_encoded: int = 0
    summary: str | None = None
    result: dict[str, Any] | None = None
    skipped: list[dict[str, str]] = field(default_factory=list)
    error: str | None = None
    created: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None

    def progress(self, files_done: int, files_total: int, chunks_encoded: int) -> None:
        self.files_done, self.files_total, self.chunks_encoded = files_done, files_total, chunks_encoded

    def to_dict(self) -> dict[str, Any]:
        end = self.finished or time.time()
        return {"id": self.id, "index": self.index, "state": self.state, "requests": list(self.requests),
                "files_done": self.files_done, "files_total": self.files_total,
                "chunks_encoded": self.chunks_encoded, "summary": self.summary, "result": self.result,
                "skipped": list(self.skipped), "error": self.error,
                "seconds": round(end - self.started, 2) if self.started else None}


def error_message(error: BaseException) -> str:
    if isinstance(error, RagMagError):
        return str(error)
    return f"internal error ({type(error).__name__}: {error}); see the demo server's log"


class IndexDocuments:
    """The documents of one served index: its uploads folder, its file list and its indexing jobs."""

    def __init__(self, loaded: LoadedIndex) -> None:
        self.loaded = loaded
        self.name = loaded.spec.name
        self.table = loaded.spec.table
        self.uploads = uploads_dir(loaded.spec.index_dir) if self.table is None else None
        self._lock = threading.Lock()
        self._running: Job | None = None
        self._queued: Job | None = None
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._files: list[dict[str, Any]] | None = None  # the served store's files, cached until it reloads

    # ------------------------------------------------------------------------------ what it holds
    def stores(self) -> list:
        """The served pipeline's document stores (one per retriever, usually the same one)."""
        unique = {}
        for name in self.loaded.retrievers:
            store = self.loaded.pipeline.get_component(name).document_store
            unique[id(store)] = store
        return list(unique.values())

    def indexed_files(self) -> list[dict[str, Any]]:
        """``[{file, chunks, uploaded}]`` of the served store (``uploaded``: it came from the uploads folder)."""
        if self.table is not None:  # read each time: `rag-mag index --store pgvector` may be writing the table
            from rag_mag.demo.tables import table_files

            return table_files(self.loaded)
        with self._lock:
            if self._files is not None:
                return self._files
        files = self._list_files(self.stores()[0])
        with self._lock:
            self._files = self._files if self._files is not None else files
            return self._files

    def _list_files(self, store) -> list[dict[str, Any]]:
        folder = str(self.uploads.resolve())
        return [{"file": name, "chunks": len(chunks), "uploaded": str(chunks[0].meta.get("folder")) == folder}
                for name, chunks in sorted(store.files("file").items())]

    def uploaded_names(self) -> list[str]:
        """The files in the uploads folder (dot names are partial writes, and the indexing skips them too)."""
        if self.uploads is None or not self.uploads.is_dir():
            return []
        return sorted(entry.name for entry in os.scandir(self.uploads)
                      if not entry.name.startswith(".") and entry.is_file(follow_symlinks=False))

    def check_writable(self) -> None:
        """409 for a table: the uploads and deletes of the panel write FAISS index folders only."""
        if self.table is not None:
            from rag_mag.demo.tables import refuse_uploads

            refuse_uploads(self.loaded)

    def public(self, text: str) -> str:
        """``text`` without the absolute folder the index lives in (the API shows folder names, never paths)."""
        if self.loaded.spec.index_dir is None:
            return text
        parent = self.loaded.spec.index_dir.parent
        for prefix in {str(parent.resolve()), str(parent.absolute()), str(parent)}:
            if prefix not in ("", "."):
                text = text.replace(prefix + os.sep, "")
        return text

    # ------------------------------------------------------------------------------ jobs
    def schedule(self, request: str) -> Job:
        """Start a job now, or queue one to run when the running one ends (joining the queued one if any)."""
        with self._lock:
            if self._queued is not None:
                self._queued.requests.append(request)
                return self._queued
            job = Job(id=uuid.uuid4().hex[:12], index=self.name, requests=[request])
            self._jobs[job.id] = job
            while len(self._jobs) > KEPT_JOBS:
                self._jobs.popitem(last=False)
            if self._running is None:
                self._running = job
                threading.Thread(target=self._work, args=(job,), name=f"rag-mag-documents-{self.name}",
                                 daemon=True).start()
            else:
                self._queued = job
            return job

    def job(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def current_job(self) -> Job | None:
        """The running job, else the queued one, else the last one."""
        with self._lock:
            if self._running or self._queued:
                return self._running or self._queued
            return next(reversed(self._jobs.values()), None)

    def busy(self) -> bool:
        with self._lock:
            return self._running is not None

    def _work(self, job: Job) -> None:
        """The worker thread: run the job, then the queued one, until none is left."""
        current: Job | None = job
        while current is not None:
            self._run(current)
            with self._lock:
                current, self._queued = self._queued, None
                self._running = current

    def _run(self, job: Job) -> None:
        job.state, job.started = "running", time.time()
        summary, error = None, None
        try:
            summary = self._index(job)
        except Exception as caught:  # the job's outcome: shown on the page and logged; the demo goes on answering
            error = caught
        try:
            self.refresh()  # also after a failure: an interrupted run saves what it finished
        except Exception as caught:  # a folder that cannot be read is the job's outcome too
            error = error or caught
        if error is not None:
            if not isinstance(error, RagMagError):
                logger.error("indexing the uploads of index %s failed", self.name, exc_info=error)
            else:
                logger.warning("indexing the uploads of index %s failed: %s", self.name, error)
            job.error = self.public(error_message(error))
        if summary is not None:
            job.summary = summary.line()
            job.skipped = [{"file": Path(path).name, "reason": reason} for path, reason in summary.plan.skipped]
            job.result = {**summary.to_dict(), "skipped": job.skipped}
            logger.info("index %s, uploads: %s", self.name, job.summary)
        job.finished = time.time()
        job.state = "failed" if error is not None else "done"

    def _index(self, job: Job):
        from rag_mag.ingestion.file_indexing import index_files

        spec = self.loaded.spec
        self.uploads.mkdir(parents=True, exist_ok=True)
        with durable.job_lock(durable.lock_path(spec.index_dir), f"the index {spec.index_dir.name}"):
            return index_files([str(self.uploads)], spec.index_dir, spec.retriever_dir, progress=False,
                               overrides={"index_type": self.stores()[0].index_type}, on_progress=job.progress)

    def refresh(self) -> None:
        """The served stores read the index folder again, here in the job's thread rather than in a question's."""
        stores = self.stores()
        for store in stores:
            store.reload()
        count = [store.count_documents() for store in stores][0]
        files = self._list_files(stores[0])
        with self._lock:
            self.loaded.documents = count
            self._files = files
