"""Benchmark rows on PostgreSQL: a dense cell's FAISS index copied into a pgvector table, reused across runs.

A scored pipeline whose document store is ``PgvectorDocumentStore`` (``pipelines/rag_hybrid.yaml``,
``rag_pgvector.yaml``) reads one table per index the benchmark builds, that is per (retriever checkpoint,
corpus): ``bench_<dataset>_<index key>``, the index key being the name of the index folder under
``artifacts/bench/indexes/`` (a fingerprint of the checkpoint, the encoding precision and the corpus). The table is
filled with ``COPY`` from that folder (``pgvector.copy_index``, which tags it with the checkpoint and strategy as
``export-index`` does), and reused when its tag and row count still match the folder's manifest; otherwise it is
copied again, under the table's advisory lock so that two benchmarks never write it at once.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rag_mag.serving.db import pgvector, postgres

logger = logging.getLogger(__name__)
TABLE_PREFIX = "bench_"
_KEY_CHARS = 12  # of the index folder's key; enough to tell a config's indexes apart
_DATASET_CHARS = 51 - len(TABLE_PREFIX) - 1 - _KEY_CHARS


def uses_pgvector(path: Path) -> bool:
    """Whether a pipeline file reads a PgvectorDocumentStore (its rows then need a table and the server)."""
    from rag_mag.serving.pipelines import read_pipeline_dict

    return bool(pgvector.pipeline_stores(read_pipeline_dict(path)))


def bench_table(dataset: str, index_folder: Path) -> str:
    """The table of an index folder of the benchmark: ``bench_<dataset>_<folder key>`` (deterministic, at most 51
    characters): ``("2wikimultihopqa", indexes/1b38cb7ae3be)`` -> ``bench_2wikimultihopqa_1b38cb7ae3be``."""
    key = re.sub(r"[^a-z0-9]", "", Path(index_folder).name.lower())[:_KEY_CHARS]
    if not key:
        raise ValueError(f"index folder {index_folder} has no name to key a table by")
    slug = re.sub(r"[^a-z0-9_]+", "_", dataset.lower()).strip("_")[:_DATASET_CHARS].strip("_") or "corpus"
    return pgvector.check_table_name(f"{TABLE_PREFIX}{slug}_{key}")


def mismatch(manifest: Mapping[str, Any], tag: Mapping[str, Any], rows: int | None) -> str | None:
    """Why a table cannot stand for an index folder (``None``: it can be reused): missing, untagged, another
    checkpoint or strategy, or another number of rows than the index holds."""
    if rows is None:
        return "no such table"
    for key in ("checkpoint", "strategy"):
        if tag.get(key) != manifest.get(key):
            return f"its {key} is {tag.get(key)}, the index's {manifest.get(key)}"
    if rows != int(manifest["count"]):
        return f"it has {rows} rows, the index {manifest['count']}"
    return None


def table_state(url: str, table: str) -> tuple[dict[str, Any], int | None]:
    """``(tag, rows)`` of ``table`` on ``url``; ``({}, None)`` when there is no such table."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True, connect_timeout=pgvector.CONNECT_TIMEOUT_S) as connection:
        if connection.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0] is None:
            return {}, None
        rows = connection.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()[0]
        return postgres.table_tag(connection, table), int(rows)


def ensure_table(url: str, dataset: str, index_folder: Path) -> str:
    """The table holding ``index_folder``'s vectors on ``url``: reused when it matches the folder's manifest, else
    (re)filled by COPY under the table's lock. Returns its name."""
    table = bench_table(dataset, index_folder)
    manifest = json.loads((Path(index_folder) / "manifest.json").read_text())
    with pgvector.connection_errors(url, f"preparing the table {table}"):
        why = mismatch(manifest, *table_state(url, table))
        if why is None:
            logger.info("%s: table %s holds this index (%s rows), reused", dataset, table, manifest["count"])
            return table
        with pgvector.table_lock(url, table):
            why = mismatch(manifest, *table_state(url, table))  # another benchmark may have filled it meanwhile
            if why is not None:
                logger.info("%s: copying index %s into table %s (%s)", dataset, index_folder, table, why)
                summary = pgvector.copy_index(Path(index_folder), table)
                logger.info("%s: %d rows into %s in %.1f s", dataset, summary["rows"], table, summary["seconds"])
            why = mismatch(manifest, *table_state(url, table))
    if why is not None:
        raise RuntimeError(f"table {table} does not match index {index_folder} after the copy: {why}")
    return table


def serialize_queries(pipeline) -> int:
    """Let one search at a time use each PgvectorDocumentStore of ``pipeline``; returns how many stores.

    pgvector-haystack runs every search of a store on one shared cursor (``execute``, then ``fetchall``), which is
    not safe across threads, and the benchmark runs ``concurrency`` questions at once through one pipeline: two
    searches could read each other's rows. A search takes milliseconds; the concurrency is for the generator.
    """
    from haystack_integrations.document_stores.pgvector import PgvectorDocumentStore

    stores = {id(instance.document_store): instance.document_store for _, instance in pipeline.walk()
              if isinstance(getattr(instance, "document_store", None), PgvectorDocumentStore)}
    for store in stores.values():
        if getattr(store, "_rag_mag_search_lock", None) is None:
            store._rag_mag_search_lock = threading.Lock()
            for method in ("_embedding_retrieval", "_keyword_retrieval"):
                setattr(store, method, _holding(store._rag_mag_search_lock, getattr(store, method)))
    return len(stores)


def _holding(lock: threading.Lock, search: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(search)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return search(*args, **kwargs)

    return locked
