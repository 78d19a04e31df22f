"""The demo on a PostgreSQL table: ``rag-mag serve --pipeline pipelines/rag_pgvector.yaml [--table T]``.

* ``table_spec`` checks the table's retriever tag against the retriever before anything loads (refused with both
  ids, as ``rag-mag ask`` refuses it) and names the index by the table's strategy;
* ``load_table`` warms the pipeline up on the table (``PgvectorEmbeddingRetriever``, and
  ``PgvectorKeywordRetriever`` fused by a ``DocumentJoiner`` in pipelines/rag_hybrid.yaml);
* ``database_error`` turns a lost or refused connection during a question into one line (HTTP 503) that names
  the URL without its password and ``rag-mag db start``. Nothing has to be reopened by hand: Haystack's
  PgvectorDocumentStore checks its connection before every query and opens a new one when the old one is dead,
  so the first question after the server is back is answered, without restarting the demo. Questions in flight at
  once share a store's connection and cursor safely: the retrievers run in the event loop (``run_async``), and a
  search's ``execute`` and ``fetchall`` follow each other without yielding to another question (40 concurrent
  searches on one store return what 40 serial ones return: tests/integration/test_demo_pgvector.py);
* ``table_files`` lists the table's files for the documents panel. The panel's uploads write FAISS index folders,
  so for a table they are refused with the command that fills it (``rag-mag index PATH --store pgvector``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rag_mag.demo.indexes import IndexSpec, check_name
from rag_mag.demo.loading import LoadedIndex, components_of, loaded_index, warm_pipeline
from rag_mag.errors import ConfigError, ServerNotRunningError

logger = logging.getLogger(__name__)

TABLE_RETRIEVERS = ("PgvectorEmbeddingRetriever", "PgvectorKeywordRetriever")
# A server that does not answer (a dead host, a dropped route) must not hold a question longer than this: libpq's
# smallest connect timeout, read by psycopg from the environment for every connection the stores open.
CONNECT_TIMEOUT_ENV = "PGCONNECT_TIMEOUT"
CONNECT_TIMEOUT_S = 2


class DatabaseUnavailableError(ServerNotRunningError):
    """PostgreSQL cannot be reached (or refused the login) while the demo answers; HTTP 503."""

    code = "database_unavailable"


def table_spec(table: str, retriever_dir: str | Path, url: str) -> IndexSpec:
    """The index a table is served as, named by its strategy (else the table); ``CheckpointError`` when the table
    is missing or holds another retriever's vectors."""
    from rag_mag.components.checkpoints import checkpoint_fingerprint
    from rag_mag.serving.db import pgvector

    tag = pgvector.check_table(url, pgvector.check_table_name(table), checkpoint_fingerprint(retriever_dir))
    name = tag.get("strategy") or table.strip("_") or "table"
    return IndexSpec(check_name(name, f"--table {table}"), None, Path(retriever_dir), table=table)


def load_table(spec: IndexSpec, pipeline_path: str | Path, llm_url: str) -> LoadedIndex:
    """Build and warm up a pgvector pipeline on ``spec.table`` (``$RAG_MAG_PG_URL`` names the server)."""
    from rag_mag.serving.db import pgvector
    from rag_mag.serving.pipelines import read_pipeline_dict

    data = read_pipeline_dict(pipeline_path)
    if not pgvector.pipeline_stores(data):
        raise ConfigError(f"{pipeline_path} reads no PostgreSQL table (no PgvectorDocumentStore); --table and "
                          "--pg-url are for pipelines on pgvector, e.g. pipelines/rag_pgvector.yaml")
    os.environ.setdefault(CONNECT_TIMEOUT_ENV, str(CONNECT_TIMEOUT_S))
    overrides: dict[str, Any] = {"retriever": str(spec.retriever_dir),
                                 **pgvector.table_overrides(data, spec.table)}
    pipeline = warm_pipeline(pipeline_path, overrides, llm_url)
    retrievers = tuple(name for kind in TABLE_RETRIEVERS for name in components_of(pipeline, kind))
    if not components_of(pipeline, "RagMagTextEmbedder") or not components_of(pipeline, TABLE_RETRIEVERS[0]):
        raise ConfigError(f"{pipeline_path} needs a RagMagTextEmbedder and a PgvectorEmbeddingRetriever for the demo")
    joiners = tuple(components_of(pipeline, "DocumentJoiner"))
    # The sources shown before the answer: the fused list, else the dense hits with their score parts.
    sources = joiners or tuple(components_of(pipeline, "ScoreExplainer")) or retrievers
    store = pipeline.get_component(retrievers[0]).document_store
    with translated(f"counting the rows of the table {spec.table}"):
        documents = store.count_documents()
    return loaded_index(spec, pipeline, pipeline_path, retrievers, documents, source_components=sources,
                        joiners=joiners)


def database_error(error: BaseException) -> DatabaseUnavailableError | None:
    """The one line a user sees when ``error`` (or what caused it) is PostgreSQL's connection failing."""
    import psycopg

    from rag_mag.serving.db import pgvector, postgres

    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, psycopg.OperationalError):
            url = os.environ.get(postgres.URL_ENV) or "(no URL)"
            reason = pgvector.error_reason(cause, url)
            return DatabaseUnavailableError(
                f"lost PostgreSQL at {postgres.redact(url)} ({reason}); start it again with `rag-mag db start` (or "
                f"fix {postgres.URL_ENV}): the demo reconnects by itself on the next question")
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


@contextlib.contextmanager
def translated(what: str) -> Iterator[None]:
    """A failing PostgreSQL connection inside the block becomes ``DatabaseUnavailableError``, logged as one line
    naming ``what`` was being done; other errors pass unchanged."""
    try:
        yield
    except Exception as error:
        explained = database_error(error)
        if explained is None:
            raise
        logger.warning("%s: %s", what, explained)
        raise explained from None


def check_database(indexes: list[LoadedIndex]) -> None:
    """``DatabaseUnavailableError`` when an index of the demo is a table and its server does not answer within
    ``CONNECT_TIMEOUT_S`` (for GET /health); nothing to check for FAISS folders."""
    from rag_mag.serving.db import pgvector, postgres

    if any(loaded.spec.table is not None for loaded in indexes):
        url = os.environ[postgres.URL_ENV]
        try:
            pgvector.check_connection(url, timeout=CONNECT_TIMEOUT_S)
        except ServerNotRunningError as error:
            raise DatabaseUnavailableError(str(error)) from None


def table_files(loaded: LoadedIndex) -> list[dict[str, Any]]:
    """``[{file, chunks, uploaded: False}]`` of the served table (files indexed with ``rag-mag index``)."""
    import psycopg
    from psycopg import sql

    from rag_mag.serving.db import postgres

    query = sql.SQL("SELECT meta->>'file', count(*) FROM {} WHERE meta ? 'file' GROUP BY 1 ORDER BY 1").format(
        sql.Identifier(loaded.spec.table))
    with translated(f"listing the files of the table {loaded.spec.table}"), \
            psycopg.connect(os.environ[postgres.URL_ENV], autocommit=True) as connection:
        rows = connection.execute(query).fetchall()
    return [{"file": name, "chunks": chunks, "uploaded": False} for name, chunks in rows]


def refuse_uploads(loaded: LoadedIndex) -> None:
    """409: the documents panel writes FAISS index folders; a table is filled from the command line."""
    from rag_mag.demo.messages import RequestError

    table = loaded.spec.table
    raise RequestError(f"the index {loaded.spec.name} is the PostgreSQL table {table}; the page uploads into FAISS "
                       f"index folders only: add files with `rag-mag index PATH --store pgvector --table {table}` "
                       f"(remove one with `rag-mag index --remove FILE --store pgvector --table {table}`)",
                       status=409, code="table_read_only")
