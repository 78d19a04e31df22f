"""Incremental indexing of a user's files (``rag-mag index PATH... --out DIR``) through pipelines/index_files.yaml.

The index folder is the plan's memory: every chunk's meta holds its ``file``, ``folder``, ``file_sha256`` and
``chunking`` (a digest of the splitter's and the boilerplate cleaner's settings, ``chunking_digest``), and the
manifest holds the retriever checkpoint. A run compares the files it finds with that and encodes only what differs:

* a file is *unchanged* when its sha256, the chunking settings and the checkpoint all match: it is not read
  twice, not converted and not encoded;
* a *changed* file's old chunks are deleted and its new ones written; a *removed* file (gone from a folder that
  this run walked) loses its chunks; a file given alone never removes anything else;
* another checkpoint means every file is encoded again, and the old vectors are dropped first, so an index never
  holds vectors of two checkpoints.

The pipeline runs on batches of files; each batch's chunks are written into the store in memory, and the folder
is saved (verified, swapped in atomically) every ``save_every_files`` files and at the end, so an interrupted run
keeps what it finished and the next run goes on from there. A file the checks refuse, or one that converts to
no text, is listed with its reason and the others go on.
"""

from __future__ import annotations

import contextlib
import fnmatch
import gc
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_mag import durable, stopping
from rag_mag.components.checkpoints import checkpoint_fingerprint
from rag_mag.errors import ConfigError, DataError
from rag_mag.ingestion.files import (
    DEFAULT_MAX_FILE_MB,
    FoundFile,
    Scan,
    content_problem,
    find_files,
    pdf_limits,
    read_file,
)

logger = logging.getLogger(__name__)

FILES_PIPELINE = "index_files"
FILES_PER_RUN = 32  # files converted and encoded in one pipeline run: enough chunks to fill encoder batches
SAVE_EVERY_FILES = 500
EXIT_SKIPPED = 3  # `rag-mag index` exit code when some files were skipped (the others are indexed)


@dataclass
class FilePlan:
    """What a run will do, file by file (names as in the index)."""

    added: list[FoundFile] = field(default_factory=list)
    changed: list[FoundFile] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    checkpoint_changed: tuple[str, str] | None = None  # (old, new)
    old_chunks: dict[str, list[str]] = field(default_factory=dict)  # file -> ids of its chunks in the index

    def chunks_of(self, names) -> int:
        return sum(len(self.old_chunks.get(name, [])) for name in names)


@dataclass
class FileIndexSummary:
    """The outcome, as the one summary line prints it."""

    plan: FilePlan
    chunks_encoded: int = 0
    chunks_removed: int = 0
    index_files: int = 0
    index_chunks: int = 0
    seconds: float = 0.0
    dry_run: bool = False

    @property
    def exit_code(self) -> int:
        return EXIT_SKIPPED if self.plan.skipped else 0

    def line(self) -> str:
        plan = self.plan
        files = (f"files: {len(plan.added)} added, {len(plan.changed)} changed, {len(plan.removed)} removed, "
                 f"{len(plan.unchanged)} unchanged, {len(plan.skipped)} skipped")
        if self.dry_run:
            going = plan.chunks_of(plan.removed + [found.name for found in plan.changed])
            return (f"dry run, nothing written. {files}; chunks: {going} would be removed, "
                    f"{plan.chunks_of(plan.unchanged)} unchanged")
        return (f"{files}; chunks: {self.chunks_encoded} encoded, {self.chunks_removed} removed, "
                f"{plan.chunks_of(plan.unchanged)} unchanged; the index holds {self.index_chunks} chunks of "
                f"{self.index_files} files ({self.seconds:.1f} s)")

    def to_dict(self) -> dict[str, Any]:
        plan = self.plan
        return {"added": [f.name for f in plan.added], "changed": [f.name for f in plan.changed],
                "removed": plan.removed, "unchanged": len(plan.unchanged),
                "skipped": [{"file": path, "reason": reason} for path, reason in plan.skipped],
                "chunks_encoded": self.chunks_encoded, "chunks_removed": self.chunks_removed,
                "index_files": self.index_files, "index_chunks": self.index_chunks, "seconds": round(self.seconds, 2),
                "dry_run": self.dry_run, "checkpoint_changed": plan.checkpoint_changed}


def load_files_pipeline(out: Path, retriever: Path, overrides: dict[str, Any] | None = None,
                        pipeline_path: str | os.PathLike | None = None, writer=None):
    """pipelines/index_files.yaml (or another with a writer), pointed at ``out`` and ``retriever``, with the
    ``writer`` instance given (the staging writer) instead of its own; and the dict of its own writer's store."""
    from rag_mag.serving.pipelines import apply_overrides, build_pipeline, default_pipeline, read_pipeline_dict

    path = pipeline_path or default_pipeline(FILES_PIPELINE)
    data = apply_overrides(read_pipeline_dict(path), {"out": str(out), "retriever": str(retriever),
                                                      **(overrides or {})})
    store = ((data["components"].get("writer") or {}).get("init_parameters") or {}).get("document_store")
    if not isinstance(store, dict) or not str(store.get("type", "")).endswith("FAISSDocumentStore"):
        raise ConfigError(f"{path} needs a component named 'writer' whose document_store is a rag-mag "
                          "FAISSDocumentStore (see pipelines/index_files.yaml)")
    return build_pipeline(data, source=str(path), components={"writer": writer} if writer else None), store


def chunking_digest(pipeline) -> str:
    """How the pipeline makes chunks, as the plan compares it with ``meta["chunking"]``: the splitter's digest, or,
    when a component named ``boilerplate`` removes lines before it, a digest of both their settings (other
    boilerplate settings make other chunks of the same file)."""
    chunking = pipeline.get_component("splitter").chunking
    boilerplate = dict(pipeline.walk()).get("boilerplate")
    if boilerplate is None:
        return chunking
    return hashlib.sha256(f"{chunking} {boilerplate.settings}".encode()).hexdigest()[:12]


def make_plan(target, scan: Scan, chunking: str, checkpoint: str, max_bytes: int) -> tuple[FilePlan, dict]:
    """Compare what ``scan`` found with the index: the plan, and the ByteStreams of the files to encode."""
    plan = FilePlan(skipped=list(scan.refused))
    indexed = target.files()
    plan.old_chunks = {name: [d.id for d in docs] for name, docs in indexed.items()}
    old_checkpoint = target.checkpoint if indexed else None
    if old_checkpoint and old_checkpoint != checkpoint:
        plan.checkpoint_changed = (old_checkpoint, checkpoint)
    streams, found_names = {}, set()
    for found in scan.files:
        found_names.add(found.name)
        stream, reason = read_file(found, max_bytes)
        before = (indexed.get(found.name) or [None])[0]
        meta = before.meta if before is not None else {}
        if stream is not None and before is not None and not plan.checkpoint_changed and (
                meta.get("file_sha256"), meta.get("chunking"), meta.get("folder")) == (
                stream.meta["file_sha256"], chunking, stream.meta["folder"]):
            plan.unchanged.append(found.name)  # its content was checked when it went in
            continue
        reason = reason or content_problem(stream)
        if reason:
            plan.skipped.append((str(found.path), reason))
            if before is not None:  # a file that went bad keeps nothing stale in the index
                plan.removed.append(found.name)
            continue
        (plan.changed if before is not None else plan.added).append(found)
        streams[found.name] = stream
    walked = {str(folder) for folder in scan.folders}
    for name, docs in indexed.items():
        gone = name not in found_names and str(docs[0].meta.get("folder")) in walked
        if gone or (plan.checkpoint_changed and name not in found_names):
            plan.removed.append(name)
    return plan, streams


def _batches(items: list, size: int) -> Iterator[list]:
    for first in range(0, len(items), size):
        yield items[first:first + size]


def _no_text(plan: FilePlan, found: FoundFile) -> None:
    """A file that converted to no text: skipped with its reason; if it was indexed, it leaves the index."""
    reason = ("no text: a scanned PDF has no text layer (run OCR on it first, e.g. ocrmypdf)"
              if found.path.suffix.lower() == ".pdf" else "no text after conversion")
    plan.skipped.append((str(found.path), reason))
    if found in plan.added:
        plan.added.remove(found)
    else:
        plan.changed.remove(found)
        plan.removed.append(found.name)


def encode_files(pipeline, writer, target, plan: FilePlan, streams: dict, progress: bool,
                 save_every_files: int = SAVE_EVERY_FILES,
                 on_progress: Callable[[int, int, int], None] | None = None) -> tuple[int, int]:
    """Remove what goes, run the pipeline on the files that come and hand each file's chunks to the target:
    (encoded, removed) chunks. ``on_progress(files_done, files_total, chunks_encoded)`` is called before the
    first batch and after each."""
    from tqdm.auto import tqdm

    removed = 0
    if plan.checkpoint_changed:  # no vector of the old checkpoint may stay beside the new ones
        every = [doc_id for ids in plan.old_chunks.values() for doc_id in ids]
        target.remove(every)
        removed, plan.old_chunks = len(every), {}
    for name in plan.removed:
        target.remove(plan.old_chunks.get(name, []))
        removed += len(plan.old_chunks.get(name, []))
    todo = plan.added + plan.changed
    bar = tqdm(total=len(todo), unit="file", desc="indexing files", disable=not progress)
    if on_progress:
        on_progress(0, len(todo), 0)
    with bar, stopping.graceful():  # a stop signal ends the run after the batch in flight, with the index saved
        return _encode_batches(pipeline, writer, target, plan, streams, todo, bar, removed, save_every_files,
                               on_progress)  # the bar is closed before an error's line is printed


def _encode_batches(pipeline, writer, target, plan: FilePlan, streams: dict, todo: list, bar, removed: int,
                    save_every_files: int, on_progress) -> tuple[int, int]:
    from rag_mag.components.passage_splitter import CHUNKING_KEY
    from rag_mag.ingestion.file_targets import take_staged

    chunking = chunking_digest(pipeline)
    encoded, since_save, done = 0, 0, 0
    for batch in _batches(todo, FILES_PER_RUN):
        with pdf_limits():  # the converter's pypdf, with the limits the file checks used
            pipeline.run({"router": {"sources": [streams[f.name] for f in batch]}})
        staged = take_staged(writer)
        for found in batch:
            old = plan.old_chunks.get(found.name, [])
            if not staged.get(found.name):
                _no_text(plan, found)
                target.remove(old)
            else:
                # the splitter stamps its own digest, which does not know the boilerplate settings; the plan of the
                # next run compares the pipeline's (chunking_digest), so that is what the chunks keep
                for chunk in staged[found.name]:
                    chunk.meta[CHUNKING_KEY] = chunking
                target.replace(old, staged[found.name])
                encoded += len(staged[found.name])
            removed += len(old)
        since_save += len(batch)
        if since_save >= save_every_files:
            target.checkpoint_save()
            since_save = 0
        done += len(batch)
        durable.fault_point("index:files")
        bar.update(len(batch))
        bar.set_postfix(chunks=encoded)
        if on_progress:
            on_progress(done, len(todo), encoded)
        if stopping.requested() and done < len(todo):
            target.checkpoint_save()
            bar.close()
            signum = stopping.requested()
            raise stopping.Stopped(signum, f"stopped after {done} of {len(todo)} files by "
                                           f"{stopping.signal_name(signum)}; the index holds them; run the same "
                                           "command again to index the rest")
    return encoded, removed


@contextlib.contextmanager
def _old_objects_frozen() -> Iterator[None]:
    """Inside the block the garbage collector leaves alone every object that existed before it (modules, the
    model, a server's state) and scans only the run's own: its full collections, each a walk over the whole heap
    of torch and Haystack, were 0.15 to 0.3 s of an incremental run of 1 s. They are handed back after, so that
    a long-lived process (``--watch``, the demo) still frees what a run left behind."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@_old_objects_frozen()
def index_files(paths: list[str], out: Path, retriever: Path, *, include: list[str] | None = None,
                exclude: list[str] | None = None, overrides: dict[str, Any] | None = None,
                max_file_mb: float = DEFAULT_MAX_FILE_MB, dry_run: bool = False, progress: bool = True,
                pipeline_path: str | None = None, table: str | None = None, pg_url: str | None = None,
                on_progress: Callable[[int, int, int], None] | None = None) -> FileIndexSummary:
    """Bring the index at ``out`` (or, with ``table``, that PostgreSQL table at ``pg_url``) up to date with the
    files under ``paths`` (the module doc says how).

    ``on_progress(files_done, files_total, chunks_encoded)``: called as the new and changed files are encoded."""
    from rag_mag.components.faiss_document_store import FAISSDocumentStore
    from rag_mag.ingestion.file_targets import FaissTarget, PgTarget, staging_writer

    if max_file_mb <= 0:
        raise ConfigError(f"--max-file-mb must be positive, got {max_file_mb}")
    started = time.perf_counter()
    scan = find_files(paths, include, exclude)
    writer = staging_writer()
    pipeline, store_dict = load_files_pipeline(out, retriever, overrides, pipeline_path, writer)
    target = PgTarget(pg_url, table) if table else FaissTarget(FAISSDocumentStore.from_dict(store_dict), out)
    checkpoint = checkpoint_fingerprint(retriever)
    with target.session():
        plan, streams = make_plan(target, scan, chunking_digest(pipeline), checkpoint, int(max_file_mb * 1e6))
        if plan.checkpoint_changed:
            logger.warning("the %s was built with retriever checkpoint %s, this run uses %s: every file is encoded "
                           "again and the old vectors are dropped", f"table {table}" if table else f"index {out}",
                           *plan.checkpoint_changed)
        summary = FileIndexSummary(plan=plan, dry_run=dry_run)
        if not dry_run and (plan.added or plan.changed or plan.removed):
            summary.chunks_encoded, summary.chunks_removed = encode_files(pipeline, writer, target, plan, streams,
                                                                          progress, on_progress=on_progress)
        if not dry_run:
            target.finish()
        summary.index_chunks = target.count()
        summary.index_files = len(target.files())
    summary.seconds = time.perf_counter() - started
    return summary


def watch_files(paths: list[str], out: Path, retriever: Path, *, interval: float, on_pass: Callable,
                stop: threading.Event | None = None, **kwargs: Any) -> None:
    """``index_files`` now and then every ``interval`` seconds until ``stop`` is set: an index that follows the
    folder. The encoder stays loaded between passes, so a pass costs what changed (a pass with no change encodes
    nothing); ``on_pass(summary)`` sees every pass."""
    if not interval > 0:
        raise ConfigError(f"--watch takes a positive number of seconds, got {interval}")
    stop = stop or threading.Event()
    while True:
        on_pass(index_files(paths, out, retriever, **kwargs))
        if stop.wait(interval):
            return


def remove_files(out: Path, patterns: list[str], table: str | None = None,
                 pg_url: str | None = None) -> tuple[list[str], int]:
    """Drop the files whose index name matches one of ``patterns`` (exact or glob) from the index at ``out`` (or
    the PostgreSQL ``table``): (files, chunks) removed."""
    from rag_mag.components.faiss_document_store import FAISSDocumentStore
    from rag_mag.components.faiss_index import is_index_folder
    from rag_mag.ingestion.file_targets import FaissTarget, PgTarget

    if table:
        target, where = PgTarget(pg_url, table), f"table {table}"
    else:
        if not is_index_folder(out):
            raise DataError(f"no index at {out}; build one with `rag-mag index FOLDER --out {out}`")
        target, where = FaissTarget(FAISSDocumentStore(path=str(out)), out), f"index {out}"
    with target.session():
        indexed = target.files()
        names = sorted(name for name in indexed if any(name == p or fnmatch.fnmatchcase(name, p) for p in patterns))
        if not names:
            listed = ", ".join(sorted(indexed)[:10]) or "none"
            raise ConfigError(f"no file in the {where} matches {' '.join(patterns)}; its files: {listed}"
                              f"{' ...' if len(indexed) > 10 else ''}")
        ids = [doc.id for name in names for doc in indexed[name]]
        target.remove(ids)
    return names, len(ids)
