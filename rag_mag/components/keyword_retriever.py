"""Keyword search of a PgvectorDocumentStore's table that matches passages sharing any term with the question.

Haystack's ``PgvectorKeywordRetriever`` asks PostgreSQL for ``plainto_tsquery(question)``: every word of the
question must be in the passage. A question is a sentence, so that almost never holds: on the cpu benchmark's
sets 0 to 24% of the questions got any keyword hit at all, and the hybrid pipeline ranked as the dense one alone
(eval/README.md). ``AnyTermKeywordRetriever`` is the same component with one change: the question's lexemes
(PostgreSQL's own parser, stemmer and stop words for the store's language) are joined by OR, and passages are
ranked by ``ts_rank_cd`` over them, so a passage that shares more and rarer-placed terms ranks higher. Filters,
top_k, serialization and the store's connection are the stock retriever's.
"""

from __future__ import annotations

import threading
from typing import Any

from haystack import Document, component
from haystack.document_stores.types.filter_policy import apply_filter_policy
from haystack_integrations.components.retrievers.pgvector import PgvectorKeywordRetriever

ANY_TERM_QUERY = """
SELECT {table_name}.*, ts_rank_cd(to_tsvector({language}, content), terms.query) AS score
FROM {schema_name}.{table_name},
     (SELECT string_agg(quote_literal(lexeme), ' | ')::tsquery AS query
      FROM unnest(tsvector_to_array(to_tsvector({language}, %s))) AS lexeme) AS terms
WHERE to_tsvector({language}, content) @@ terms.query
"""
_LOCKS_GUARD = threading.Lock()


def search_lock(store) -> threading.Lock:
    """One lock per store: its searches share one cursor (``execute`` then ``fetchall``), unsafe across threads."""
    with _LOCKS_GUARD:
        if getattr(store, "_rag_mag_search_lock", None) is None:
            store._rag_mag_search_lock = threading.Lock()
        return store._rag_mag_search_lock


def any_term_search(store, query: str, filters: dict[str, Any] | None, top_k: int) -> list[Document]:
    """The ``top_k`` passages of ``store``'s table that share a term with ``query``, best ``ts_rank_cd`` first."""
    from haystack_integrations.document_stores.pgvector.converters import _from_pg_to_haystack_documents
    from haystack_integrations.document_stores.pgvector.filters import _convert_filters_to_where_clause_and_params
    from psycopg.sql import SQL, Identifier
    from psycopg.sql import Literal as SQLLiteral

    if not query or not query.strip():
        raise ValueError("query must be a non-empty string")
    sql_query = SQL(ANY_TERM_QUERY).format(schema_name=Identifier(store.schema_name),
                                           table_name=Identifier(store.table_name),
                                           language=SQLLiteral(store.language))
    where_params: tuple = ()
    if filters:
        where, where_params = _convert_filters_to_where_clause_and_params(filters=filters, operator="AND")
        sql_query += where
    sql_query += SQL(" ORDER BY score DESC, id LIMIT {top_k}").format(top_k=SQLLiteral(int(top_k)))
    with search_lock(store):
        store._ensure_db_setup()
        result = store._execute_sql(cursor=store._dict_cursor, sql_query=sql_query, params=(query, *where_params),
                                    error_msg="Could not retrieve documents from PgvectorDocumentStore.")
        return _from_pg_to_haystack_documents(result.fetchall())


@component
class AnyTermKeywordRetriever(PgvectorKeywordRetriever):
    """``PgvectorKeywordRetriever`` whose passages need to share only one term with the query, not all of them."""

    @component.output_types(documents=list[Document])
    def run(self, query: str, filters: dict[str, Any] | None = None, top_k: int | None = None
            ) -> dict[str, list[Document]]:
        filters = apply_filter_policy(self.filter_policy, self.filters, filters)
        return {"documents": any_term_search(self.document_store, query, filters, top_k or self.top_k)}

    @component.output_types(documents=list[Document])
    async def run_async(self, query: str, filters: dict[str, Any] | None = None, top_k: int | None = None
                        ) -> dict[str, list[Document]]:
        return self.run(query, filters, top_k)  # milliseconds, under the store's lock
