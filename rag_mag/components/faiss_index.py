"""FAISS inner-product indexes and the folder they are saved in (used by FAISSDocumentStore).

An index folder holds four files, written together into a staging folder that is fsynced and then
replaces the target in one rename (so a crash never leaves half an index; see rag_mag.durable):

* ``index.faiss``: the FAISS index (inner product, or for ``hnsw_mips`` an L2 graph over the augmented
  vectors of rag_mag.components.mips_index; absent when the store is empty);
* ``ids.json``: the id map, ``ids[row]`` is the Document id of FAISS row ``row``;
* ``documents.jsonl``: the Documents without embeddings, one JSON object per line, in row order;
* ``manifest.json``: count, dim, index type, metric, checkpoint fingerprint and strategy (and for
  ``hnsw_mips`` the maximum norm M), the size and sha256 of every other file, and the sha256 of the id list
  (the count and order of the ids).

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
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rag_mag import durable
from rag_mag.components.mips_index import MipsHnswIndex
from rag_mag.errors import CheckpointError, ConfigError

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: the manifest holds file checksums and the id digest
READABLE_VERSIONS = (1, 2)
MANIFEST = "manifest.json"
INDEX_FILE = "index.faiss"
IDS_FILE = "ids.json"
DOCUMENTS_FILE = "documents.jsonl"
INDEX_TYPES = ("flat", "ivf", "hnsw_mips", "hnsw", "auto")
# "auto" picks by corpus size when the index is built: exact below this many documents, HNSW on inner
# product from it, the approximate type that kept recall best on cosine and qnorm vectors alike
# (eval/bench_ann.py; eval/README.md, "Approximate search").
AUTO_APPROXIMATE_FROM = 200_000
# Graph settings measured by eval/bench_ann.py (recall@10 about 0.96-0.97 at 1M vectors, cosine and qnorm).
HNSW_M = 32
EF_CONSTRUCTION = 100
EF_SEARCH = 512


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
                         "(flat is exact; ivf, hnsw_mips and hnsw are approximate; auto picks by corpus size)")
    return index_type


def resolve_index_type(index_type: str, count: int) -> str:
    """The concrete type for ``count`` documents: ``auto`` is flat below AUTO_APPROXIMATE_FROM, else hnsw."""
    check_index_type(index_type)
    if index_type != "auto":
        return index_type
    return "flat" if count < AUTO_APPROXIMATE_FROM else "hnsw"


def default_nlist(count: int) -> int:
    """IVF cells for ``count`` documents: about 4 sqrt(n), at least 1, and at most n / 39 (FAISS's k-means
    wants 39 training points per cell)."""
    return max(1, min(int(4 * count ** 0.5), count // 39))


def build_index(embeddings: np.ndarray, index_type: str, hnsw_m: int, ef_construction: int, nlist: int):
    """An inner-product index over ``embeddings`` (n, dim), rows numbered 0..n-1 (``auto`` resolved first)."""
    count, dim = embeddings.shape
    return build_index_from_chunks(lambda: iter([embeddings]), count, dim, index_type, hnsw_m, ef_construction,
                                   nlist)


def build_index_from_chunks(chunks: Callable[[], Iterator[np.ndarray]], count: int, dim: int, index_type: str,
                            hnsw_m: int, ef_construction: int, nlist: int | None, progress: bool = False):
    """The same index, built from vectors that arrive in row-order chunks (``chunks()`` may be called twice:
    hnsw_mips needs the largest norm and ivf a training sample before the first vector is added).

    Only the index itself is held in memory, never all vectors a second time."""
    faiss = _faiss()
    index_type = resolve_index_type(index_type, count)
    nlist = nlist or default_nlist(count)
    if index_type == "flat" or not count:
        index = faiss.IndexFlatIP(dim)  # an empty store's placeholder too: the first write rebuilds it
    elif index_type == "hnsw":
        index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = ef_construction
    elif index_type == "hnsw_mips":
        max_norm = max(float(np.linalg.norm(chunk, axis=1).max()) for chunk in chunks() if len(chunk))
        index = MipsHnswIndex.empty(dim, max_norm, hnsw_m, ef_construction)
    elif index_type == "ivf":
        if count < nlist:
            raise ConfigError(f"an ivf index with nlist={nlist} needs at least {nlist} documents, got {count}; "
                              "lower nlist or use index_type='flat'")
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(_training_sample(chunks(), count, IVF_TRAINING_POINTS_PER_CELL * nlist))
    else:
        check_index_type(index_type)
    added = chunks()
    if progress:
        from tqdm.auto import tqdm

        added = tqdm(added, desc=f"adding to the {index_type} index", unit="chunk")
    for chunk in added:
        if len(chunk):
            index.add(np.ascontiguousarray(chunk, dtype=np.float32))
    if index_type == "ivf" and count:
        index.make_direct_map()
    return index


IVF_TRAINING_POINTS_PER_CELL = 64  # k-means sample: FAISS warns below 39 points per cell


def _training_sample(chunks: Iterator[np.ndarray], count: int, wanted: int) -> np.ndarray:
    """Every ``count // wanted``-th row (all rows when there are fewer), read chunk by chunk."""
    stride, picked, seen = max(1, count // wanted), [], 0
    for chunk in chunks:
        first = (-seen) % stride  # the first row of this chunk whose global number is a multiple of stride
        picked.append(np.asarray(chunk[first::stride], np.float32))
        seen += len(chunk)
    return np.ascontiguousarray(np.concatenate(picked))


def index_type_of(index) -> str:
    faiss = _faiss()
    if isinstance(index, MipsHnswIndex):
        return "hnsw_mips"
    if isinstance(index, faiss.IndexHNSWFlat):
        return "hnsw"
    if isinstance(index, faiss.IndexIVFFlat):
        return "ivf"
    if isinstance(index, faiss.IndexFlat):
        return "flat"
    return type(index).__name__


def configure_search(index, ef_search: int, nprobe: int) -> None:
    faiss = _faiss()
    if isinstance(index, (faiss.IndexHNSWFlat, MipsHnswIndex)):
        index.hnsw.efSearch = ef_search
    elif isinstance(index, faiss.IndexIVFFlat):
        index.nprobe = nprobe


def reconstruct_all(index) -> np.ndarray:
    """The vectors held by an index, in row order: (ntotal, dim) float32."""
    faiss = _faiss()
    if isinstance(index, MipsHnswIndex):
        return index.graph.reconstruct_n(0, index.ntotal)[:, :-1].astype(np.float32)
    if isinstance(index, faiss.IndexIVFFlat):
        index.make_direct_map()
    return index.reconstruct_n(0, index.ntotal).astype(np.float32, copy=False)


def is_index_folder(folder: Path) -> bool:
    return (folder / MANIFEST).is_file()


def ids_digest(ids: list[str]) -> str:
    """sha256 of the id list: it changes with the count, the order or any id."""
    return hashlib.sha256(json.dumps(ids, ensure_ascii=False).encode("utf-8")).hexdigest()


def write_folder(target: Path, index, ids: list[str], documents: Iterable[dict[str, Any]],
                 manifest: dict[str, Any]) -> None:
    """Write the four files into a staging folder, fsync it, then swap it into ``target``.

    ``documents`` may be a generator (rag_mag.ingestion.indexing streams them from the corpus)."""
    if target.exists() and not (target.is_dir() and (is_index_folder(target) or not any(target.iterdir()))):
        raise CheckpointError(f"{target} exists and is not a rag-mag index folder; refusing to overwrite it. "
                              "Choose an empty or new folder")
    durable.recover_dir(target, is_complete=is_index_folder)
    vector_bytes = int(index.ntotal) * int(index.d) * 4 if hasattr(index, "ntotal") and hasattr(index, "d") else 0
    durable.ensure_free_space(target.parent, vector_bytes, f"the index {target}")  # a lower bound: the vectors
    staging = durable.staging_dir(target)
    try:
        _write_files(staging, target, index, ids, documents, manifest)
        durable.fault_point("index:synced")
        durable.replace_dir(staging, target, fault_prefix="index")
        durable.fault_point("index:done")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write_files(staging: Path, target: Path, index, ids: list[str], documents: Iterable[dict[str, Any]],
                 manifest: dict[str, Any]) -> None:
    """The index, ids, documents and manifest, complete and synced in ``staging``; a full disk is one line."""
    with durable.disk_full_as_error(target.parent, f"the index {target}"):
        durable.fault_point("index:staging")
        if isinstance(index, MipsHnswIndex):
            _faiss().write_index(index.graph, str(staging / INDEX_FILE))
            manifest = {**manifest, "mips_max_norm": index.max_norm}
        elif index is not None:
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
        if manifest.get("index_type") == "hnsw_mips":
            index = _restore_mips(index, manifest, dim, index_file, fix)
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
        metric = index.graph.metric_type if isinstance(index, MipsHnswIndex) else index.metric_type
        wanted = _faiss().METRIC_L2 if isinstance(index, MipsHnswIndex) else _faiss().METRIC_INNER_PRODUCT
        if metric != wanted:
            problems.append(f"{INDEX_FILE} does not use the metric of a {manifest.get('index_type')} index")
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


def _restore_mips(graph, manifest: dict[str, Any], dim: int, index_file: Path, fix: str) -> MipsHnswIndex:
    if not isinstance(graph, _faiss().IndexHNSWFlat) or graph.d != dim + 1:
        raise CheckpointError(f"{index_file} is not the HNSW graph over {dim}+1-dimensional vectors that a "
                              f"hnsw_mips index holds; {fix}")
    max_norm = manifest.get("mips_max_norm")
    if not isinstance(max_norm, (int, float)) or not max_norm > 0:
        raise CheckpointError(f"the manifest of {index_file.parent} has no valid mips_max_norm; {fix}")
    vectors = graph.reconstruct_n(0, graph.ntotal)[:, :-1]
    return MipsHnswIndex.restore(graph, float(max_norm), vectors)


def verify_folder(folder: Path) -> dict[str, Any]:
    """Check everything of an index folder (every checksum too); a summary, or CheckpointError on a mismatch."""
    folder = Path(folder)
    if not is_index_folder(folder):
        raise CheckpointError(f"{folder} is not a rag-mag index folder (no {MANIFEST}); give the --out folder of "
                              "`rag-mag index`")
    index, ids, documents, manifest = read_folder(folder, full=True)
    return {"index": str(folder), "ok": True, "count": len(ids), "dim": manifest.get("dim"),
            "files": sorted(manifest.get("files", {})), "leftovers": [str(p) for p in durable.leftovers(folder)]}

