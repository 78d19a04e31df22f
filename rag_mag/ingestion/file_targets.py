"""Where ``rag-mag index PATH...`` keeps a folder's chunks: a FAISS index folder, or a PostgreSQL table.

Both answer the same questions for the incremental plan (which files, with which hash, settings and checkpoint)
and take the same changes, file by file:

* ``FaissTarget`` changes the store in memory and saves the folder (verified, swapped in atomically) every so
  often and at the end: a kill loses at most the files since the last save, and the next run redoes them;
* ``PgTarget`` replaces each file's chunks in one transaction (its old rows deleted, its new rows copied in), so
  a file is in the table whole or not at all, whatever happens to the server; an advisory lock keeps a second
  writer out of the table.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from haystack import Document

from rag_mag import durable
from rag_mag.components.document_embedder import CHECKPOINT_KEY, STRATEGY_KEY


class FaissTarget:
    """The FAISS index folder of the pipeline's writer."""

    def __init__(self, store, out: Path) -> None:
        self.store, self.out = store, out

    def files(self) -> dict[str, list[Document]]:
        return self.store.files("file")

    @property
    def checkpoint(self) -> str | None:
        return self.store.manifest.get("checkpoint")

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        with durable.disk_full_as_error(self.out, f"the index {self.out}"), self.store.deferred_saves():
            yield

    def remove(self, ids: list[str]) -> None:
        self.store.delete_documents(ids)

    def replace(self, old_ids: list[str], documents: list[Document]) -> None:
        from haystack.document_stores.types import DuplicatePolicy

        self.store.delete_documents(old_ids)
        self.store.write_documents(documents, policy=DuplicatePolicy.OVERWRITE)

    def checkpoint_save(self) -> None:
        self.store.flush()

    def finish(self) -> None:
        if not self.store.exists():
            self.store.save()  # an index of no files yet is still an index: `ask` says it is empty, not missing

    def count(self) -> int:
        return self.store.count_documents()


class PgTarget:
    """A PostgreSQL table, through Haystack's PgvectorDocumentStore schema (created on the first write)."""

    def __init__(self, url: str, table: str) -> None:
        from rag_mag.serving.db.pgvector import check_table_name

        self.url, self.table = url, check_table_name(table)
        self._connection = None
        self._created = False

    def _sql(self, query: str):
        from psycopg import sql

        return sql.SQL(query).format(table=sql.Identifier(self.table))

    @property
    def connection(self):
        if self._connection is None:
            import psycopg

            self._connection = psycopg.connect(self.url, autocommit=True, connect_timeout=5)
        return self._connection

    def _exists(self) -> bool:
        return self.connection.execute("SELECT to_regclass(%s)", (self.table,)).fetchone()[0] is not None

    def files(self) -> dict[str, list[Document]]:
        if not self._exists():
            return {}
        grouped: dict[str, list[Document]] = {}
        rows = self.connection.execute(self._sql(
            "SELECT id, meta FROM {table} WHERE meta ? 'file' ORDER BY meta->>'file', (meta->>'chunk_index')::int"))
        for doc_id, meta in rows:
            grouped.setdefault(meta["file"], []).append(Document(id=doc_id, content=None, meta=meta))
        return grouped

    @property
    def checkpoint(self) -> str | None:
        from rag_mag.serving.db.postgres import table_tag

        return table_tag(self.connection, self.table).get("checkpoint") if self._exists() else None

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        from rag_mag.serving.db.pgvector import connection_errors, table_lock

        with connection_errors(self.url, f"writing the table {self.table}"), table_lock(self.url, self.table):
            try:
                yield
            finally:
                if self._connection is not None:
                    self._connection.close()
                    self._connection = None

    def remove(self, ids: list[str]) -> None:
        if ids and self._exists():
            self.connection.execute(self._sql("DELETE FROM {table} WHERE id = ANY(%s)"), (ids,))

    def replace(self, old_ids: list[str], documents: list[Document]) -> None:
        """One transaction: the file's old rows out, its new rows in (COPY)."""
        from rag_mag.serving.db.pgvector import copy_rows, ensure_room, row_bytes, table_store
        from rag_mag.serving.db.postgres import tag_table

        if not self._created and documents:
            table_store(self.table, len(documents[0].embedding)).count_documents()  # Haystack's schema
            self._created = True
        if documents:
            needed = sum(row_bytes(d.content, d.meta, len(d.embedding)) for d in documents)
            name = documents[0].meta.get("file", "a file")
            ensure_room(self.connection, self.url, needed, f"writing {name} into {self.table}")
        with self.connection.transaction():
            if old_ids:
                self.connection.execute(self._sql("DELETE FROM {table} WHERE id = ANY(%s)"), (old_ids,))
            copy_rows(self.connection, self.table, ((d.id, d.embedding, d.content, d.meta) for d in documents))
            if documents:
                tag_table(self.connection, self.table, documents[0].meta[CHECKPOINT_KEY],
                          documents[0].meta[STRATEGY_KEY])
        durable.fault_point("pgvector:file")

    def checkpoint_save(self) -> None:
        """Nothing to do: every file was committed on its own."""

    def finish(self) -> None:
        """Nothing to do: the table is created with the first file's chunks."""

    def count(self) -> int:
        if not self._exists():
            return 0
        return self.connection.execute(self._sql("SELECT count(*) FROM {table}")).fetchone()[0]


def staging_writer():
    """A DocumentWriter into memory: the pipeline's output, which the target then takes file by file."""
    from haystack.components.writers import DocumentWriter
    from haystack.document_stores.in_memory import InMemoryDocumentStore
    from haystack.document_stores.types import DuplicatePolicy

    return DocumentWriter(document_store=InMemoryDocumentStore(), policy=DuplicatePolicy.OVERWRITE)


def take_staged(writer) -> dict[str, list[Document]]:
    """The documents the staging writer holds, grouped by file in chunk order; the staging store is emptied."""
    store = writer.document_store
    documents = store.filter_documents()
    store.delete_documents([document.id for document in documents])
    grouped: dict[str, list[Document]] = {}
    for document in sorted(documents, key=lambda d: (d.meta.get("file", ""), d.meta.get("chunk_index", 0))):
        grouped.setdefault(document.meta.get("file", ""), []).append(document)
    return grouped
