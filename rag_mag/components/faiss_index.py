"""FAISS inner-product indexes and the folder they are saved in (used by FAISSDocumentStore).

An index folder holds four files, written together into a staging folder that is fsynced and then
replaces the target in one rename (so a crash never leaves half an index; see rag_mag.durable):

* ``index.faiss``: the FAISS index (inner product; absent when the store is empty);
* ``ids.json``: the id map, ``ids[row]`` is the Document id of FAISS row ``row``;
* ``documents.jsonl``: the Documents without embeddings, one JSON object per line, in row order;
* ``manifest.json``: count, dim, index type, metric, checkpoint fingerprint and strategy, the size and
  sha256 of every other file, and the sha256 of the id list (the count and order of the ids).

Reading checks that all four agree, the sizes of all files and the checksums of the two text files
(cheap: they are small next to the vectors); ``verify_folder`` (``rag-mag index --verify``) also checks
the checksum of ``index.faiss``. Any mismatch raises ``CheckpointError`` naming the file. Nothing is pickled.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np

from rag_mag import durable
from rag_mag.errors import CheckpointError, ConfigError

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: the manifest holds file checksums and the id digest
READABLE_VERSIONS = (1, 2)
MANIFEST = "manifest.json"
INDEX_FILE = "index.faiss"
IDS_FILE = "ids.json"
DOCUMENTS_FILE = "documents.jsonl"
INDEX_TYPES = ("flat", "hnsw", "ivf")


def _faiss():
    # faiss logs at INFO which CPU build it loaded and that the AVX2 one is missing: noise for users.
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    try:
        import faiss
    except ImportError:
        raise ConfigError("faiss is not installed; run `pip install faiss-cpu`") from None
    return faiss


# Below this many queries FAISS does not use BLAS, and its OpenMP threads mostly wait on each other: on
# 2 busy cores one 100k-vector query took 68-83 ms with 2 threads and 19-21 ms with one (same run).
BATCH_THRESHOLD = 20
_threads_lock = threading.Lock()


@contextlib.contextmanager
def single_thread():
    """Run FAISS on one OpenMP thread inside the block (the setting is process-wide, hence the lock)."""
    faiss = _faiss()
    with _threads_lock:
        previous = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)
        try:
            yield
        finally:
            faiss.omp_set_num_threads(previous)


def check_index_type(index_type: str) -> str:
    if index_type not in INDEX_TYPES:
        raise ValueError(f"unknown index_type {index_type!r}; valid index types are: {', '.join(INDEX_TYPES)} "
                         "(flat is exact, hnsw and ivf are approximate)")
    return index_type


def build_index(embeddings: np.ndarray, index_type: str, hnsw_m: int, ef_construction: int, nlist: int):
    """A FAISS inner-product index over ``embeddings`` (n, dim), rows numbered 0..n-1."""
    faiss = _faiss()
    count, dim = embeddings.shape
    if index_type == "flat":
        index = faiss.IndexFlatIP(dim)
    elif index_type == "hnsw":
        index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = ef_construction
    elif index_type == "ivf":
        if count < nlist:
            raise ConfigError(f"an ivf index with nlist={nlist} needs at least {nlist} documents, got {count}; "
                              "lower nlist or use index_type='flat'")
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(embeddings)
        index.make_direct_map()
    else:
        check_index_type(index_type)
    if count:
        index.add(embeddings)
    return index


def index_type_of(index) -> str:
    faiss = _faiss()
    if isinstance(index, faiss.IndexHNSWFlat):
        return "hnsw"
    if isinstance(index, faiss.IndexIVFFlat):
        return "ivf"
    if isinstance(index, faiss.IndexFlat):
        return "flat"
    return type(index).__name__


def configure_search(index, ef_search: int, nprobe: int) -> None:
    faiss = _faiss()
    if isinstance(index, faiss.IndexHNSWFlat):
        index.hnsw.efSearch = ef_search
    elif isinstance(index, faiss.IndexIVFFlat):
        index.nprobe = nprobe


def reconstruct_all(index) -> np.ndarray:
    """The vectors held by an index, in row order: (ntotal, dim) float32."""
    faiss = _faiss()
    if isinstance(index, faiss.IndexIVFFlat):
        index.make_direct_map()
    return index.reconstruct_n(0, index.ntotal).astype(np.float32, copy=False)


def is_index_folder(folder: Path) -> bool:
    return (folder / MANIFEST).is_file()


def ids_digest(ids: list[str]) -> str:
    """sha256 of the id list: it changes with the count, the order or any id."""
    return hashlib.sha256(json.dumps(ids, ensure_ascii=False).encode("utf-8")).hexdigest()


def write_folder(target: Path, index, ids: list[str], documents: list[dict[str, Any]],
                 manifest: dict[str, Any]) -> None:
    """Write the four files into a staging folder, fsync it, then swap it into ``target``."""
    if target.exists() and not (target.is_dir() and (is_index_folder(target) or not any(target.iterdir()))):
        raise CheckpointError(f"{target} exists and is not a rag-mag index folder; refusing to overwrite it. "
                              "Choose an empty or new folder")
    durable.recover_dir(target, is_complete=is_index_folder)
    staging = durable.staging_dir(target)
    try:
        durable.fault_point("index:staging")
        if index is not None:
            _faiss().write_index(index, str(staging / INDEX_FILE))
        durable.fault_point("index:faiss")
        (staging / IDS_FILE).write_text(json.dumps(ids, ensure_ascii=False), encoding="utf-8")
        durable.fault_point("index:ids")
        with open(staging / DOCUMENTS_FILE, "w", encoding="utf-8") as handle:
            for record in documents:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        durable.fault_point("index:documents")
        files = {path.name: {"bytes": path.stat().st_size, "sha256": durable.sha256_of(path)}
                 for path in sorted(staging.iterdir())}
        manifest = {**manifest, "format_version": FORMAT_VERSION, "files": files, "ids_sha256": ids_digest(ids)}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))
        durable.fault_point("index:manifest")
        durable.sync_tree(staging)
        durable.fault_point("index:synced")
        durable.replace_dir(staging, target, fault_prefix="index")
        durable.fault_point("index:done")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _check_files(folder: Path, manifest: dict[str, Any], ids: list, full: bool, fix: str) -> None:
    """Sizes of every file and the checksums of the text files (all of them with ``full``) against the manifest."""
    files = manifest.get("files")
    if not isinstance(files, dict) or not isinstance(manifest.get("ids_sha256"), str):
        raise CheckpointError(f"corrupt index manifest {folder / MANIFEST}: no file checksums; {fix}")
    expected = {IDS_FILE, DOCUMENTS_FILE} | ({INDEX_FILE} if manifest.get("count") else set())
    for name in sorted(expected - set(files)):
        raise CheckpointError(f"corrupt index manifest {folder / MANIFEST}: no checksum for {name}; {fix}")
    for name, recorded in sorted(files.items()):
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"index file {path} is missing; {fix}")
        if path.stat().st_size != recorded.get("bytes"):
            raise CheckpointError(f"index file {path} holds {path.stat().st_size} bytes, the manifest says "
                                  f"{recorded.get('bytes')}: it was changed or cut short after the index was "
                                  f"written; {fix}")
        if (full or name != INDEX_FILE) and durable.sha256_of(path) != recorded.get("sha256"):
            raise CheckpointError(f"index file {path} does not match its checksum in the manifest: it was changed "
                                  f"after the index was written (documents, ids and vectors may no longer belong "
                                  f"together); {fix}")
    if ids_digest(ids) != manifest["ids_sha256"]:
        raise CheckpointError(f"the ids of {folder / IDS_FILE} are not those the index was written with (count or "
                              f"order changed); {fix}")


def report_leftovers(folder: Path) -> list[Path]:
    """Warn about staging folders of ``folder`` left by a killed writer (the next write removes them)."""
    found = durable.leftovers(folder)
    for path in found:
        logger.warning("%s was left by an interrupted index write; the next write to %s removes it (or delete "
                       "it yourself)", path, folder)
    return found


def read_folder(folder: Path, full: bool = False) -> tuple[Any, list[str], list[dict[str, Any]], dict[str, Any]]:
    """Read and cross-check an index folder: ``(index or None, ids, document records, manifest)``.

    Checks sizes, the text files' checksums and the id digest; ``full`` also checks ``index.faiss``'s checksum.
    """
    fix = f"rebuild it with `rag-mag index ... --out {folder}`"
    report_leftovers(folder)
    manifest_file = folder / MANIFEST
    try:
        manifest = json.loads(manifest_file.read_text())
        count, dim = int(manifest["count"]), manifest["dim"]
        version = manifest["format_version"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"corrupt index manifest {manifest_file}: {error!r}; {fix}") from None
    if version not in READABLE_VERSIONS:
        raise CheckpointError(f"index {folder} has format version {version}, this rag-mag reads "
                              f"{', '.join(map(str, READABLE_VERSIONS))}; {fix}")
    try:
        ids = json.loads((folder / IDS_FILE).read_text(encoding="utf-8"))
        with open(folder / DOCUMENTS_FILE, encoding="utf-8") as handle:
            documents = [json.loads(line) for line in handle if line.strip()]
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"corrupt index folder {folder}: {error}; {fix}") from None
    index = None
    if count:
        index_file = folder / INDEX_FILE
        if not index_file.is_file():
            raise CheckpointError(f"index file {index_file} is missing; {fix}")
        try:
            index = _faiss().read_index(str(index_file))
        except RuntimeError as error:
            raise CheckpointError(f"corrupt FAISS index {index_file}: {str(error).splitlines()[0]}; {fix}") from None
    problems = []
    if not isinstance(ids, list) or len(ids) != count:
        problems.append(f"{IDS_FILE} holds {len(ids) if isinstance(ids, list) else 'no list of'} ids")
    if len(documents) != count:
        problems.append(f"{DOCUMENTS_FILE} holds {len(documents)} documents")
    if index is not None:
        if index.ntotal != count:
            problems.append(f"{INDEX_FILE} holds {index.ntotal} vectors")
        if index.d != dim:
            problems.append(f"{INDEX_FILE} has dimension {index.d} but the manifest says {dim}")
        if index.metric_type != _faiss().METRIC_INNER_PRODUCT:
            problems.append(f"{INDEX_FILE} does not use inner product")
        if index_type_of(index) != manifest.get("index_type"):
            problems.append(f"{INDEX_FILE} is a {index_type_of(index)} index, the manifest says "
                            f"{manifest.get('index_type')}")
    if not problems and [record.get("id") for record in documents] != ids:
        problems.append(f"the ids of {DOCUMENTS_FILE} are not those of {IDS_FILE} in the same order")
    if problems:
        raise CheckpointError(f"index folder {folder} is inconsistent: the manifest says {count} documents, but "
                              f"{'; '.join(problems)}; {fix}")
    if version >= 2:
        _check_files(folder, manifest, ids, full, fix)
    elif full:
        raise CheckpointError(f"index {folder} was written by an older rag-mag without checksums, so it cannot be "
                              f"verified; {fix}")
    else:
        logger.warning("index %s has no checksums (written by an older rag-mag); rebuild it to have it verified",
                       folder)
    return index, ids, documents, manifest


def verify_folder(folder: Path) -> dict[str, Any]:
    """Check everything of an index folder (every checksum too); a summary, or CheckpointError on a mismatch."""
    folder = Path(folder)
    if not is_index_folder(folder):
        raise CheckpointError(f"{folder} is not a rag-mag index folder (no {MANIFEST}); give the --out folder of "
                              "`rag-mag index`")
    index, ids, documents, manifest = read_folder(folder, full=True)
    return {"index": str(folder), "ok": True, "count": len(ids), "dim": manifest.get("dim"),
            "files": sorted(manifest.get("files", {})), "leftovers": [str(p) for p in durable.leftovers(folder)]}

