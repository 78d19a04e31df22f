"""Incremental indexing of a user's files (``rag-mag index PATH... --out DIR``) through pipelines/index_files.yaml.

The index folder is the plan's memory: every chunk's meta holds its ``file``, ``folder``, ``file_sha256`` and
``chunking`` (the splitter's settings digest), and the manifest holds the retriever checkpoint. A run compares the
files it finds with that and encodes only what differs:

* a file is *unchanged* when its sha256, the splitter settings and the checkpoint all match: it is not read
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

import fnmatch
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_mag import durable
from rag_mag.components.checkpoints import checkpoint_fingerprint
from rag_mag.errors import ConfigError, DataError
from rag_mag.serving.files import DEFAULT_MAX_FILE_MB, FoundFile, Scan, content_problem, find_files, read_file

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
                        pipeline_path: str | os.PathLike | None = None):
    """pipelines/index_files.yaml (or another with the same writer), pointed at ``out`` and ``retriever``."""
    from rag_mag.serving.pipelines import default_pipeline, load_pipeline

    settings = {"out": str(out), "retriever": str(retriever), **(overrides or {})}
    return load_pipeline(pipeline_path or default_pipeline(FILES_PIPELINE), settings)


def _store_of(pipeline):
    writer = pipeline.get_component("writer") if "writer" in pipeline.graph.nodes else None
    store = getattr(writer, "document_store", None)
    if store is None or not hasattr(store, "files"):
        raise ConfigError("the indexing pipeline needs a component named 'writer' whose document_store is a "
                          "rag-mag FAISSDocumentStore (see pipelines/index_files.yaml)")
    return store


def make_plan(store, scan: Scan, chunking: str, checkpoint: str, max_bytes: int) -> tuple[FilePlan, dict]:
    """Compare what ``scan`` found with the index: the plan, and the ByteStreams of the files to encode."""
    plan = FilePlan(skipped=list(scan.refused))
    indexed = store.files("file")
    plan.old_chunks = {name: [d.id for d in docs] for name, docs in indexed.items()}
    old_checkpoint = store.manifest.get("checkpoint") if indexed else None
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


def encode_files(pipeline, store, plan: FilePlan, streams: dict, progress: bool,
                 save_every_files: int = SAVE_EVERY_FILES) -> tuple[int, int]:
    """Delete what goes, run the pipeline on the files that come, save periodically: (encoded, removed) chunks."""
    from tqdm.auto import tqdm

    removed = 0
    if plan.checkpoint_changed:  # no vector of the old checkpoint may stay beside the new ones
        every = [doc_id for ids in plan.old_chunks.values() for doc_id in ids]
        store.delete_documents(every)
        removed = len(every)
    else:
        going = [doc_id for name in plan.removed + [f.name for f in plan.changed]
                 for doc_id in plan.old_chunks.get(name, [])]
        store.delete_documents(going)
        removed = len(going)
    todo = plan.added + plan.changed
    bar = tqdm(total=len(todo), unit="file", desc="indexing files", disable=not progress)
    encoded, since_save = 0, 0
    for batch in _batches(todo, FILES_PER_RUN):
        result = pipeline.run({"router": {"sources": [streams[f.name] for f in batch]}})
        encoded += result["writer"]["documents_written"]
        written = {name for name in store.files("file")}
        for found in batch:
            if found.name not in written:
                reason = ("no text: a scanned PDF has no text layer (run OCR on it first, e.g. ocrmypdf)"
                          if found.path.suffix.lower() == ".pdf" else "no text after conversion")
                plan.skipped.append((str(found.path), reason))
                if found in plan.added:
                    plan.added.remove(found)
                else:  # its old chunks were deleted above: it left the index
                    plan.changed.remove(found)
                    plan.removed.append(found.name)
        since_save += len(batch)
        if since_save >= save_every_files:
            store.flush()
            since_save = 0
        bar.update(len(batch))
        bar.set_postfix(chunks=encoded)
    bar.close()
    for path, reason in plan.skipped:
        logger.debug("skipped %s: %s", path, reason)
    return encoded, removed


def index_files(paths: list[str], out: Path, retriever: Path, *, include: list[str] | None = None,
                exclude: list[str] | None = None, overrides: dict[str, Any] | None = None,
                max_file_mb: float = DEFAULT_MAX_FILE_MB, dry_run: bool = False, progress: bool = True,
                pipeline_path: str | None = None) -> FileIndexSummary:
    """Bring the index at ``out`` up to date with the files under ``paths`` (the module doc says how)."""
    if max_file_mb <= 0:
        raise ConfigError(f"--max-file-mb must be positive, got {max_file_mb}")
    started = time.perf_counter()
    scan = find_files(paths, include, exclude)
    pipeline = load_files_pipeline(out, retriever, overrides, pipeline_path)
    store, splitter = _store_of(pipeline), pipeline.get_component("splitter")
    checkpoint = checkpoint_fingerprint(retriever)
    plan, streams = make_plan(store, scan, splitter.chunking, checkpoint, int(max_file_mb * 1e6))
    if plan.checkpoint_changed:
        logger.warning("the index %s was built with retriever checkpoint %s, this run uses %s: every file is "
                       "encoded again and the old vectors are dropped", out, *plan.checkpoint_changed)
    summary = FileIndexSummary(plan=plan, dry_run=dry_run)
    if not dry_run and (plan.added or plan.changed or plan.removed):
        with durable.disk_full_as_error(out, f"the index {out}"), store.deferred_saves():
            summary.chunks_encoded, summary.chunks_removed = encode_files(pipeline, store, plan, streams, progress)
    if not dry_run and not store.exists():
        store.save()  # an index of no files yet is still an index: `ask` says it is empty instead of missing
    summary.index_chunks = store.count_documents()
    summary.index_files = len(store.files("file"))
    summary.seconds = time.perf_counter() - started
    return summary


def remove_files(out: Path, patterns: list[str]) -> tuple[list[str], int]:
    """Drop the files whose index name matches one of ``patterns`` (exact or glob): (files, chunks) removed."""
    from rag_mag.components.faiss_document_store import FAISSDocumentStore
    from rag_mag.components.faiss_index import is_index_folder

    if not is_index_folder(out):
        raise DataError(f"no index at {out}; build one with `rag-mag index FOLDER --out {out}`")
    store = FAISSDocumentStore(path=str(out))
    indexed = store.files("file")
    names = sorted(name for name in indexed if any(name == p or fnmatch.fnmatchcase(name, p) for p in patterns))
    if not names:
        listed = ", ".join(sorted(indexed)[:10]) or "none"
        raise ConfigError(f"no file in the index {out} matches {' '.join(patterns)}; its files: {listed}"
                          f"{' ...' if len(indexed) > 10 else ''}")
    ids = [doc.id for name in names for doc in indexed[name]]
    store.delete_documents(ids)  # saved atomically
    return names, len(ids)
