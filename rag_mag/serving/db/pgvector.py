"""PostgreSQL tables of rag-mag passages, read and written through Haystack's ``PgvectorDocumentStore``.

* ``connect_url`` gives the URL every pgvector pipeline reads from ``RAG_MAG_PG_URL``: the one the user set, or the
  server of ``rag-mag db start`` (started here when none runs); an unreachable server or a wrong password is one
  line naming the URL without its password.
* One table per index, tagged (its comment) with the retriever checkpoint and strategy of its vectors; every row
  also keeps them in its meta, so ScoreExplainer refuses rows of another retriever. ``check_table`` refuses a
  retriever that does not match the table before a pipeline runs, naming both.
* ``copy_index`` copies a FAISS index folder into a table with ``COPY`` in one transaction (readers see the old
  rows until it commits); ``table_store`` opens the Haystack store of a table (created with Haystack's schema).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from rag_mag import durable
from rag_mag.components.document_embedder import CHECKPOINT_KEY, STRATEGY_KEY
from rag_mag.errors import CheckpointError, ConfigError, DiskFullError, ServerNotRunningError
from rag_mag.serving.db import postgres

logger = logging.getLogger(__name__)

DEFAULT_TABLE = "rag_mag_default"
STORE_TYPE = "haystack_integrations.document_stores.pgvector.document_store.PgvectorDocumentStore"
CONNECT_TIMEOUT_S = 2
# A write is refused before it starts when it would leave less than this free on a local server's data disk:
# four WAL segments of 16 MB. Rows cost about 3x their bytes there (heap, WAL, HNSW or btree index).
WAL_RESERVE_BYTES = 64 << 20
WRITE_AMPLIFICATION = 3
ROW_OVERHEAD_BYTES = 64
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
_TABLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,50}$")


def error_reason(error: BaseException, url: str, limit: int = 200) -> str:
    """A PostgreSQL error as one short line, with ``url``'s password masked wherever the message repeats it."""
    return " ".join(str(error).split()).replace(url, postgres.redact(url))[:limit]


def check_table_name(table: str) -> str:
    if not isinstance(table, str) or not _TABLE_NAME.match(table):
        raise ConfigError(f"bad table name {table!r}: use lower-case letters, digits and _ (at most 51, not "
                          "starting with a digit), e.g. rag_mag_docs")
    return table


def table_for(folder: str | os.PathLike) -> str:
    """A table name for an index folder: ``artifacts/index-docs`` -> ``index_docs``."""
    name = re.sub(r"[^a-z0-9_]", "_", Path(folder).name.lower()).strip("_") or DEFAULT_TABLE
    return check_table_name(("t_" + name if name[0].isdigit() else name)[:51])


def store_settings(table: str) -> dict[str, Any]:
    """The store parameters that name a table and its indexes (index names are global in a schema)."""
    check_table_name(table)
    return {"table_name": table, "hnsw_index_name": f"{table}_hnsw", "keyword_index_name": f"{table}_keyword"}


def pipeline_stores(data: dict[str, Any]) -> list[str]:
    """The components of a pipeline dict whose ``document_store`` is a PgvectorDocumentStore."""
    names = []
    for name, component in (data.get("components") or {}).items():
        store = ((component or {}).get("init_parameters") or {}).get("document_store")
        if isinstance(store, dict) and store.get("type") == STORE_TYPE:
            names.append(name)
    return names


def table_overrides(data: dict[str, Any], table: str) -> dict[str, Any]:
    """Overrides that point every pgvector store of a pipeline dict at ``table``."""
    return {f"{name}.document_store.{key}": value for name in pipeline_stores(data)
            for key, value in store_settings(table).items()}


# ------------------------------------------------------------------------------------------ the server
def connect_url(url: str | None = None, start: bool = True) -> tuple[str, bool]:
    """``(url, started)``: ``url``, else ``$RAG_MAG_PG_URL``, else the managed server (started if ``start`` and
    none runs). The URL is checked by connecting, and exported as ``$RAG_MAG_PG_URL`` for the pipelines."""
    url = url or os.environ.get(postgres.URL_ENV)
    started = False
    if not url:
        folder = postgres.default_folder()
        port = postgres.running_port(folder)
        if port is None and not start:
            raise ServerNotRunningError(f"no PostgreSQL server runs on {folder.data}; start it with `rag-mag db "
                                        f"start`, or set {postgres.URL_ENV}")
        if port is None:
            logger.info("starting PostgreSQL for this command (stopped again when it ends)")
            url, started = postgres.start(folder), True
        else:
            url = postgres.server_url(folder, port)
    check_connection(url)
    os.environ[postgres.URL_ENV] = url
    return url, started


def check_connection(url: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """One line naming the URL (without its password) when the server cannot be reached or refuses the login."""
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=max(1, int(timeout)), autocommit=True) as connection:
            connection.execute("SELECT 1")
    except psycopg.Error as error:
        raise ServerNotRunningError(f"cannot use PostgreSQL at {postgres.redact(url)}: {error_reason(error, url, 300)};"
                                    f" start it with `rag-mag db start`, or fix {postgres.URL_ENV}") from None


@contextlib.contextmanager
def using_server(url: str | None = None) -> Iterator[str]:
    """The URL for a command's pipelines; a server started here is stopped when the block ends, and
    ``$RAG_MAG_PG_URL`` is put back as it was, so that a later command of the same process does not take the
    stopped server's URL for a running one."""
    before = os.environ.get(postgres.URL_ENV)
    url, started = connect_url(url)
    try:
        yield url
    finally:
        if started:
            postgres.stop()
            if before is None:
                os.environ.pop(postgres.URL_ENV, None)
            else:
                os.environ[postgres.URL_ENV] = before


@contextlib.contextmanager
def connection_errors(url: str, what: str) -> Iterator[None]:
    """A lost or refused connection inside the block becomes one line (``ServerNotRunningError``) naming the URL
    without its password; what was committed before stays committed."""
    import psycopg

    try:
        yield
    except psycopg.OperationalError as error:
        reason = error_reason(error, url)
        if not (error.sqlstate or "").startswith("53"):  # 53xxx: disk full, out of memory, too many connections
            raise ServerNotRunningError(f"lost PostgreSQL at {postgres.redact(url)} while {what} ({reason}); what "
                                        "was committed is kept: run the same command again once the server is back "
                                        "(`rag-mag db start`)") from None
        raise DiskFullError(f"PostgreSQL at {postgres.redact(url)} ran out of resources while {what} ({reason}); the "
                            "transaction in flight was rolled back and what was committed is kept: free space on "
                            "the server's data disk, then run the same command again") from None


def row_bytes(content: str | None, meta: dict, dim: int) -> int:
    """About what one row costs a table: its vector, text and meta, and the tuple's overhead."""
    return 4 * dim + len((content or "").encode()) + len(json.dumps(meta)) + ROW_OVERHEAD_BYTES


def ensure_room(connection, url: str, needed: int, what: str) -> None:
    """Refuse a write of about ``needed`` bytes before it starts when the server runs on this machine and its data
    disk would keep less than ``WAL_RESERVE_BYTES`` free: PostgreSQL stops (PANIC) when it cannot write its WAL,
    and then reads stop too. A remote server is not checked here; a full disk there is one line all the same
    (``connection_errors``)."""
    import psycopg

    if (urlsplit(url).hostname or "localhost") not in LOCAL_HOSTS:
        return
    try:
        data_dir = Path(connection.execute("SHOW data_directory").fetchone()[0])
    except psycopg.Error:  # a role without pg_read_all_settings may not read it
        return
    if data_dir.is_dir():
        durable.ensure_free_space(data_dir, WRITE_AMPLIFICATION * needed + WAL_RESERVE_BYTES,
                                  f"{what} (with PostgreSQL's WAL and indexes, and {WAL_RESERVE_BYTES >> 20} MB kept "
                                  "free so that the server never stops for a full disk)")


@contextlib.contextmanager
def table_lock(url: str, table: str) -> Iterator[None]:
    """Hold PostgreSQL's advisory lock of ``table`` while the block writes it; a second writer is refused at once
    (the lock lives in the server, so it holds across processes and machines, and dies with its connection)."""
    import psycopg

    from rag_mag.errors import JobLockedError

    with psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as connection:
        key = f"rag-mag table {table}"
        if not connection.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (key,)).fetchone()[0]:
            holder = connection.execute(
                "SELECT a.pid, a.application_name, a.client_addr FROM pg_locks l JOIN pg_stat_activity a "
                "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.objid = hashtext(%s)::oid", (key,)).fetchone()
            raise JobLockedError(f"table {table} is being written by another process (server pid "
                                 f"{holder[0] if holder else '?'}); wait for it to finish, or write another --table")
        try:
            yield
        finally:
            with contextlib.suppress(psycopg.Error):  # a lost connection took the lock with it
                connection.execute("SELECT pg_advisory_unlock(hashtext(%s))", (key,))


# ------------------------------------------------------------------------------------------ tables
def table_store(table: str, dim: int, search: str = "exact_nearest_neighbor", recreate: bool = False):
    """Haystack's PgvectorDocumentStore of ``table`` on ``$RAG_MAG_PG_URL`` (inner product)."""
    from haystack.utils import Secret
    from haystack_integrations.document_stores.pgvector import PgvectorDocumentStore

    return PgvectorDocumentStore(connection_string=Secret.from_env_var(postgres.URL_ENV), embedding_dimension=dim,
                                 vector_function="inner_product", search_strategy=search, recreate_table=recreate,
                                 **store_settings(table))


def check_table(url: str, table: str, checkpoint: str | None) -> dict[str, Any]:
    """The table's tag; ``CheckpointError`` when the table is missing or holds another retriever's vectors (any
    retriever's, with ``checkpoint`` None)."""
    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as connection:
        exists = connection.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0]
        tag = postgres.table_tag(connection, table) if exists else {}
    if not exists:
        raise CheckpointError(f"PostgreSQL at {postgres.redact(url)} has no table {table}; fill it with `rag-mag "
                              f"index FOLDER --store pgvector --table {table}` or `rag-mag export-index INDEX_DIR "
                              f"--pgvector {table}`")
    if checkpoint is not None and tag.get("checkpoint") and tag["checkpoint"] != checkpoint:
        raise CheckpointError(f"table {table} holds vectors of retriever checkpoint {tag['checkpoint']} (strategy "
                              f"{tag.get('strategy')}), but the pipeline's retriever is {checkpoint}; use the same "
                              "retriever, or re-index into the table with this one")
    return tag


def copy_rows(connection, table: str, rows) -> None:
    """COPY ``(id, vector, content, meta)`` rows into ``table`` (Haystack's schema) inside the caller's transaction."""
    from psycopg import sql

    statement = sql.SQL("COPY {} (id, embedding, content, meta) FROM STDIN").format(sql.Identifier(table))
    with connection.cursor().copy(statement) as copy:
        for doc_id, vector, content, meta in rows:
            copy.write_row((doc_id, "[" + ",".join(repr(float(x)) for x in vector) + "]",
                            (content or "").replace("\x00", ""), json.dumps(meta)))


def copy_index(index_dir: Path, table: str, progress: bool = True) -> dict[str, Any]:
    """Copy a FAISS index folder into ``table`` (created or emptied) with COPY, in one transaction."""
    import psycopg
    from psycopg import sql
    from tqdm.auto import tqdm

    from rag_mag.components import faiss_index

    started = time.perf_counter()
    index, ids, records, manifest = faiss_index.read_folder(index_dir)
    vectors = faiss_index.reconstruct_all(index) if index is not None else np.zeros((0, 0), np.float32)
    table_store(table, int(manifest["dim"] or 384)).count_documents()  # Haystack creates the table and its indexes
    url = os.environ[postgres.URL_ENV]
    dim = vectors.shape[1] if vectors.size else int(manifest["dim"] or 384)
    with psycopg.connect(url) as connection:
        ensure_room(connection, url, sum(row_bytes(record.get("content"), record.get("meta") or {}, dim)
                                         for record in records), f"copying {len(ids):,} rows into {table}")
    with connection_errors(url, f"copying {index_dir} into {table}"), psycopg.connect(url) as connection, \
            connection.transaction():
        connection.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(table)))
        provenance = {CHECKPOINT_KEY: manifest["checkpoint"], STRATEGY_KEY: manifest["strategy"]}
        copy_rows(connection, table, ((record["id"], vectors[row], record.get("content"),
                                       {**(record.get("meta") or {}), **provenance})
                                      for row, record in enumerate(tqdm(records, total=len(ids), unit="row",
                                                                        desc=f"COPY into {table}",
                                                                        disable=not progress))))
        postgres.tag_table(connection, table, manifest["checkpoint"], manifest["strategy"])
    seconds = time.perf_counter() - started
    return {"table": table, "rows": len(ids), "checkpoint": manifest["checkpoint"], "strategy": manifest["strategy"],
            "seconds": round(seconds, 1), "rows_per_s": round(len(ids) / seconds, 1) if seconds else None}


def table_files(table: str, url: str | None = None) -> list[str]:
    """The distinct ``file`` names in ``table`` (on ``url``, default ``$RAG_MAG_PG_URL``)."""
    import psycopg
    from psycopg import sql

    url = url or os.environ[postgres.URL_ENV]
    with psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as connection:
        rows = connection.execute(sql.SQL("SELECT DISTINCT meta->>'file' FROM {} WHERE meta ? 'file'").format(
            sql.Identifier(check_table_name(table)))).fetchall()
    return sorted(row[0] for row in rows)
