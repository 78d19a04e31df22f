"""Sharded, resumable corpus indexing (``rag-mag index``): encode in chunks to memory-mapped files, then merge.

The corpus is split into N contiguous shards of rows (``--shard K/N``, or RANK/WORLD_SIZE under torchrun),
so N processes or machines can each encode one. Every shard writes its vectors chunk by chunk into
memory-mapped files in a work folder (default ``OUT.work``)::

    plan.json                 what is being built: corpus sha256 and row count, checkpoint fingerprint,
                              strategy, dim, chunk size, shard count, precision; a rerun must match it
    shard-K-of-N/vectors.f32  (rows, dim) float32: the treated document vectors, row order
    shard-K-of-N/norms.f32    (rows,) float32: the raw pooled norms (kept in each Document's meta)
    shard-K-of-N/progress.json  {"rows_done": r}: written (atomically) after the chunk's vectors are synced
    shard-K-of-N.lock         held by the process encoding shard K (durable.job_lock): a second one is refused

Both files of a shard are allocated in full on disk before its first chunk (durable.allocate), so a full disk
is one clear error before the chunk, not a SIGBUS inside the memory map; the merge checks the free space for
the index before building it.

A kill loses at most the chunk in flight: the rerun reads ``progress.json`` and goes on from there. When
the last shard finishes, that process merges (under a lock, so only one does): it adds the vectors to a
FAISS index chunk by chunk and streams ``documents.jsonl`` from the corpus, so memory holds the index and
the id list, never the corpus or all vectors a second time. The index folder is then written and verified
as any other (rag_mag.components.faiss_index), and the work folder is removed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rag_mag import durable, stopping
from rag_mag.components import faiss_index
from rag_mag.components.checkpoints import load_checkpoint
from rag_mag.components.document_embedder import RAW_NORM_KEY
from rag_mag.data import Passage, iter_corpus
from rag_mag.errors import ConfigError, DataError
from rag_mag.precision import use_bf16

logger = logging.getLogger(__name__)

PLAN_FILE = "plan.json"
PROGRESS_FILE = "progress.json"
VECTORS_FILE = "vectors.f32"
NORMS_FILE = "norms.f32"
DEFAULT_CHUNK_SIZE = 2048


@dataclass(frozen=True)
class IndexJob:
    """What ``rag-mag index`` was asked to do (everything but the shard and the work folder is in the plan)."""

    corpus: Path
    retriever: Path
    out: Path
    index_type: str = "flat"
    chunk_size: int = DEFAULT_CHUNK_SIZE
    batch_size: int = 32
    precision: str = "auto"
    hnsw_m: int = faiss_index.HNSW_M
    ef_construction: int = faiss_index.EF_CONSTRUCTION
    nlist: int | None = None

    def __post_init__(self) -> None:
        faiss_index.check_index_type(self.index_type)
        for name in ("chunk_size", "batch_size", "hnsw_m", "ef_construction"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.nlist is not None and (not isinstance(self.nlist, int) or self.nlist < 1):
            raise ConfigError(f"nlist must be a positive integer, got {self.nlist!r}")


def release_free_memory() -> None:
    """Give freed heap back to the system (glibc's malloc_trim; a no-op elsewhere).

    Without it the process's resident memory crept up by about 15 MB per 1,000 passages over a 33k-passage
    corpus (freed activation buffers of ever-new sizes kept by the allocator), as if it held the vectors."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def parse_shard(text: str | None, environ: dict[str, str] | None = None) -> tuple[int, int]:
    """``"K/N"`` -> (K, N) with 0 <= K < N; without it, RANK/WORLD_SIZE (torchrun), else (0, 1)."""
    environ = os.environ if environ is None else environ
    if text is None:
        if int(environ.get("WORLD_SIZE", "1") or 1) > 1:
            return int(environ.get("RANK", "0")), int(environ["WORLD_SIZE"])
        return 0, 1
    try:
        shard, shards = (int(part) for part in text.split("/"))
    except ValueError:
        raise ConfigError(f"bad --shard {text!r}: expected K/N, e.g. 0/4 for the first of 4 shards") from None
    if shards < 1 or not 0 <= shard < shards:
        raise ConfigError(f"bad --shard {text!r}: K must be in 0..N-1 and N at least 1")
    return shard, shards


def default_work_dir(out: Path) -> Path:
    return out.with_name(out.name + ".work")


def shard_lock(out: Path, shard: tuple[int, int], work_dir: Path | None = None) -> AbstractContextManager[None]:
    """The lock that makes shard K of N of the index ``out`` this process's job (other shards run on)."""
    work = Path(work_dir) if work_dir else default_work_dir(out)
    return durable.job_lock(work / f"shard-{shard[0]}-of-{shard[1]}.lock",
                            f"shard {shard[0]}/{shard[1]} of the index {out} (work folder {work})")


def shard_rows(count: int, shard: int, shards: int) -> tuple[int, int]:
    """The rows [start, stop) of shard ``shard`` of ``shards``: contiguous, sizes differing by at most one."""
    return count * shard // shards, count * (shard + 1) // shards


class ShardedIndexer:
    """Encode one shard of a corpus into a work folder and, when every shard is done, merge them into OUT."""

    def __init__(self, job: IndexJob, shard: int = 0, shards: int = 1, work_dir: Path | None = None) -> None:
        self.job = job
        self.shard, self.shards = shard, shards
        self.work = Path(work_dir) if work_dir else default_work_dir(job.out)
        self._checkpoint = None

    # ------------------------------------------------------------------ plan
    @property
    def checkpoint(self):
        if self._checkpoint is None:
            self._checkpoint = load_checkpoint(str(self.job.retriever))
        return self._checkpoint

    def make_plan(self) -> dict[str, Any]:
        """What this command builds; a work folder is only resumed when its plan is the same."""
        if not self.job.corpus.is_file():
            raise DataError(f"corpus {self.job.corpus} does not exist; check --corpus")
        count = sum(1 for _ in iter_corpus(self.job.corpus))  # also checks every line and the ids' uniqueness
        if not count:
            raise DataError(f"corpus {self.job.corpus} holds no passages")
        encoder = self.checkpoint.encoder
        return {"corpus": str(self.job.corpus.resolve()), "corpus_sha256": durable.sha256_of(self.job.corpus),
                "count": count, "checkpoint": self.checkpoint.fingerprint, "strategy": self.checkpoint.strategy,
                "dim": int(encoder.model.config.hidden_size), "chunk_size": self.job.chunk_size,
                "shards": self.shards, "bf16": use_bf16(self.job.precision, encoder.device)}

    def open_plan(self, restart: bool = False) -> dict[str, Any]:
        """Create the work folder's plan, or check that the one there is this command's (under a lock)."""
        plan = self.make_plan()
        self.work.mkdir(parents=True, exist_ok=True)
        with self._lock("plan.lock"):
            path = self.work / PLAN_FILE
            if path.is_file() and restart:
                logger.info("--restart: discarding the encoded shards in %s", self.work)
                for child in self.work.iterdir():
                    if child.name.startswith("shard-") and child.is_dir():  # not the shards' lock files
                        shutil.rmtree(child)
                path.unlink()
            if path.is_file():
                try:
                    saved = json.loads(path.read_text())
                except (OSError, json.JSONDecodeError) as error:
                    raise ConfigError(f"cannot read {path}: {error}; delete {self.work} or pass --restart") from None
                changed = sorted(key for key in plan if saved.get(key) != plan[key])
                if changed:
                    details = "; ".join(f"{key}: was {saved.get(key)!r}, now {plan[key]!r}" for key in changed)
                    raise ConfigError(f"the work folder {self.work} holds a different indexing run ({details}); "
                                      "pass --restart to discard it, or give another --work-dir")
            else:
                durable.write_text(path, json.dumps(plan, indent=2))
        return plan

    # ------------------------------------------------------------------ encoding
    def shard_dir(self, shard: int) -> Path:
        return self.work / f"shard-{shard}-of-{self.shards}"

    def rows_done(self, shard: int) -> int:
        path = self.shard_dir(shard) / PROGRESS_FILE
        if not path.is_file():
            return 0
        try:
            return int(json.loads(path.read_text())["rows_done"])
        except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            raise ConfigError(f"corrupt progress file {path}: {error!r}; pass --restart to encode again") from None

    def encode_shard(self, plan: dict[str, Any], progress: bool = True) -> dict[str, Any]:
        """Encode the rows of this shard not yet done, chunk by chunk; returns a summary with throughput."""
        start, stop = shard_rows(plan["count"], self.shard, self.shards)
        folder = self.shard_dir(self.shard)
        folder.mkdir(parents=True, exist_ok=True)
        done = self.rows_done(self.shard)
        if done > stop - start:
            raise ConfigError(f"{folder / PROGRESS_FILE} says {done} rows are done, but the shard holds "
                              f"{stop - start}; pass --restart to encode again")
        if done:
            logger.info("shard %d/%d: resuming after row %d of %d (from %s)", self.shard, self.shards, done,
                        stop - start, folder / PROGRESS_FILE)
        if done < stop - start:
            self._allocate(folder, stop - start, plan["dim"])
        encoder, treatment = self.checkpoint.encoder, self.checkpoint.encoder.document_treatment()
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=stop - start, initial=done, desc=f"encoding shard {self.shard}/{self.shards}",
                       unit="passage")
        started, encoded = time.perf_counter(), 0
        import torch

        with stopping.graceful():  # a stop signal ends the run after the chunk in flight is written
            for chunk_start, passages in self._chunks(start + done, stop):
                texts = [passage.content for passage in passages]
                raw = encoder.encode(texts, side="document", batch_size=self.job.batch_size, treated=False,
                                     bf16=plan["bf16"])
                treated = treatment.apply(torch.from_numpy(raw)).numpy().astype(np.float32)
                self._write_rows(folder, chunk_start - start, stop - start, plan["dim"], treated,
                                 np.linalg.norm(raw, axis=1).astype(np.float32))
                rows_done = chunk_start - start + len(texts)
                durable.write_text(folder / PROGRESS_FILE, json.dumps({"rows_done": rows_done}))
                durable.fault_point("index:chunk")
                encoded += len(texts)
                release_free_memory()
                if bar is not None:
                    bar.update(len(texts))
                if stopping.requested() and rows_done < stop - start:
                    signum = stopping.requested()
                    raise stopping.Stopped(signum, f"stopped after {rows_done} of {stop - start} passages of shard "
                                                   f"{self.shard}/{self.shards} by {stopping.signal_name(signum)}; "
                                                   f"saved in {folder}; run the same command again to resume")
        if bar is not None:
            bar.close()
        seconds = time.perf_counter() - started
        return {"shard": f"{self.shard}/{self.shards}", "rows": stop - start, "encoded_now": encoded,
                "resumed_after": done, "seconds": round(seconds, 1),
                "passages_per_s": round(encoded / seconds, 1) if encoded and seconds > 0 else None}

    def _chunks(self, first: int, stop: int) -> Iterator[tuple[int, list[Passage]]]:
        """(first row, passages) for rows [first, stop), ``chunk_size`` at a time, aligned to chunk boundaries."""
        chunk: list[Passage] = []
        chunk_start = first
        for row, passage in enumerate(iter_corpus(self.job.corpus)):
            if row < first:
                continue
            if row >= stop:
                break
            chunk.append(passage)
            if len(chunk) == self.job.chunk_size:
                yield chunk_start, chunk
                chunk_start, chunk = chunk_start + len(chunk), []
        if chunk:
            yield chunk_start, chunk

    def _allocate(self, folder: Path, rows: int, dim: int) -> None:
        """Both files of the shard at full size on disk before a row is written through their memory maps."""
        for name, width in ((VECTORS_FILE, dim), (NORMS_FILE, 1)):
            path = folder / name
            size = rows * width * 4
            if path.exists() and path.stat().st_size != size:
                raise ConfigError(f"{path} holds {path.stat().st_size} bytes, expected {size}; pass --restart")
            durable.allocate(path, size, f"the vectors of shard {self.shard}/{self.shards} ({path})")

    @staticmethod
    def _write_rows(folder: Path, offset: int, rows: int, dim: int, vectors: np.ndarray, norms: np.ndarray) -> None:
        """Write rows [offset, offset + len) of the shard's two files (allocated) through a memory map of that
        span only, then sync them (so progress.json never runs ahead of the vectors)."""
        for name, values, width in ((VECTORS_FILE, vectors, dim), (NORMS_FILE, norms, 1)):
            path = folder / name
            span = np.memmap(path, dtype=np.float32, mode="r+", offset=offset * width * 4,
                             shape=(len(values), width) if width > 1 else (len(values),))
            span[:] = values
            span.flush()  # msync: the vectors are on disk before progress.json says so
            del span

    # ------------------------------------------------------------------ merging
    def missing_shards(self, plan: dict[str, Any]) -> list[int]:
        """The shards whose rows are not all encoded yet."""
        missing = []
        for shard in range(self.shards):
            start, stop = shard_rows(plan["count"], shard, self.shards)
            if self.rows_done(shard) != stop - start:
                missing.append(shard)
        return missing

    def merge(self, plan: dict[str, Any], overwrite: bool, keep_work: bool = False,
              progress: bool = True) -> dict[str, Any] | None:
        """Build OUT from the finished shards (once, under a lock); None if another process already did."""
        digest = hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()
        with self._lock("merge.lock"):
            if faiss_index.is_index_folder(self.job.out):
                manifest = json.loads((self.job.out / faiss_index.MANIFEST).read_text())
                if manifest.get("plan_sha256") == digest:
                    logger.info("another process already merged the shards into %s", self.job.out)
                    return None
                if not overwrite:
                    raise ConfigError(f"an index already exists at {self.job.out}; pass --overwrite to replace it")
            started = time.perf_counter()
            what = f"the index {self.job.out}"
            # at least the vectors and the texts; checked before the (possibly long) build of the index
            durable.ensure_free_space(self.job.out.parent, plan["count"] * plan["dim"] * 4
                                      + self.job.corpus.stat().st_size, what)
            with durable.disk_full_as_error(self.job.out, what):
                index = faiss_index.build_index_from_chunks(
                    lambda: self._stored_chunks(plan), plan["count"], plan["dim"], self.job.index_type,
                    self.job.hnsw_m, self.job.ef_construction, self.job.nlist, progress=progress)
                ids = [passage.id for passage in iter_corpus(self.job.corpus)]
                manifest = {"count": plan["count"], "dim": plan["dim"],
                            "index_type": faiss_index.index_type_of(index), "metric": "inner_product",
                            "checkpoint": plan["checkpoint"], "strategy": plan["strategy"], "plan_sha256": digest,
                            "corpus_sha256": plan["corpus_sha256"]}
                faiss_index.write_folder(self.job.out, index, ids, self._records(plan), manifest)
            seconds = time.perf_counter() - started
        if not keep_work:
            shutil.rmtree(self.work, ignore_errors=True)
        return {"out": str(self.job.out), "count": plan["count"], "dim": plan["dim"],
                "index_type": manifest["index_type"], "strategy": plan["strategy"], "checkpoint": plan["checkpoint"],
                "merge_seconds": round(seconds, 1)}

    def _stored_chunks(self, plan: dict[str, Any]) -> Iterator[np.ndarray]:
        """Every shard's vectors in row order, ``chunk_size`` rows at a time (plain reads: nothing stays mapped)."""
        return self._stored(plan, VECTORS_FILE, plan["dim"])

    def _stored_norms(self, plan: dict[str, Any]) -> Iterator[float]:
        for norms in self._stored(plan, NORMS_FILE, 1):
            yield from norms[:, 0].tolist()

    def _stored(self, plan: dict[str, Any], name: str, width: int) -> Iterator[np.ndarray]:
        """File ``name`` of every shard, (rows, width) float32, ``chunk_size`` rows at a time, in row order."""
        for shard in range(self.shards):
            start, stop = shard_rows(plan["count"], shard, self.shards)
            if stop == start:
                continue
            with open(self.shard_dir(shard) / name, "rb") as handle:
                for first in range(0, stop - start, plan["chunk_size"]):
                    rows = min(plan["chunk_size"], stop - start - first)
                    yield np.fromfile(handle, dtype=np.float32, count=rows * width).reshape(rows, width)

    def _records(self, plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """documents.jsonl's records, as FAISSDocumentStore writes them, streamed from the corpus."""
        from haystack import Document

        for passage, norm in zip(iter_corpus(self.job.corpus), self._stored_norms(plan), strict=True):
            meta = {"title": passage.title} if passage.title else {}
            meta[RAW_NORM_KEY] = norm
            yield Document(id=passage.id, content=passage.text, meta=meta).to_dict(flatten=False)

    def _lock(self, name: str) -> AbstractContextManager[None]:
        """A lock in the work folder that the shards wait for in turn (on one machine or a shared filesystem)."""
        return durable.file_lock(self.work / name)


def run_index_job(job: IndexJob, shard: tuple[int, int] = (0, 1), work_dir: Path | None = None,
                  overwrite: bool = False, restart: bool = False, keep_work: bool = False,
                  progress: bool = True) -> dict[str, Any]:
    """Encode this process's shard and, if it was the last one missing, merge: what ``rag-mag index`` runs."""
    out = job.out
    if out.exists():
        if not out.is_dir() or (any(out.iterdir()) and not faiss_index.is_index_folder(out)):
            raise ConfigError(f"--out {out} exists and is not a rag-mag index folder; choose a new or empty folder")
        if faiss_index.is_index_folder(out) and not overwrite:
            raise ConfigError(f"an index already exists at {out}; pass --overwrite to replace it, or choose "
                              "another --out")
    indexer = ShardedIndexer(job, *shard, work_dir=work_dir)
    plan = indexer.open_plan(restart=restart)
    summary: dict[str, Any] = {"job": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(job).items()},
                               "work_dir": str(indexer.work), "encoding": indexer.encode_shard(plan, progress)}
    missing = indexer.missing_shards(plan)
    if missing:
        summary["merged"] = False
        summary["waiting_for_shards"] = missing
        logger.info("shard %d/%d done; the process that finishes the last shard (%s) merges the index",
                    shard[0], shard[1], ", ".join(map(str, missing)))
        return summary
    merged = indexer.merge(plan, overwrite=overwrite, keep_work=keep_work, progress=progress)
    summary["merged"] = merged is not None
    if merged:
        summary.update(merged)
    return summary
