"""Restricting retrieval to some files: ``ask --source GLOB`` and the API's Haystack ``filters``.

Haystack's filter language has no glob, so a glob is resolved against the files that the index holds, into the
standard ``{"field": "meta.file", "operator": "in", "value": [...]}``; any store that speaks Haystack filters
(FAISS here, a database elsewhere) applies it the same way. Every retriever of a pipeline that takes
``filters`` gets them.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from rag_mag.errors import ConfigError

# Haystack's filters nest through the "conditions" of AND / OR / NOT. Real filters are a few levels deep; Haystack
# evaluates them recursively, so a filter nested hundreds of levels deep would end in a RecursionError.
MAX_FILTER_DEPTH = 32


def filter_depth(filters: Any) -> int:
    """How deeply ``filters`` nest: 1 for one comparison, one more for each logical level around it. Counted
    without recursion, so that no depth can exhaust the stack here."""
    deepest, pending = 0, [(filters, 1)]
    while pending:
        node, depth = pending.pop()
        deepest = max(deepest, depth)
        conditions = node.get("conditions") if isinstance(node, dict) else None
        if isinstance(conditions, list):
            pending.extend((condition, depth + 1) for condition in conditions)
    return deepest


def retriever_names(pipeline) -> list[str]:
    """The components of ``pipeline`` whose ``run`` takes ``filters`` (the retrievers)."""
    names = []
    for name, instance in pipeline.walk():
        sockets = getattr(instance, "__haystack_input__", None)
        if sockets is not None and "filters" in sockets._sockets_dict:
            names.append(name)
    return names


def indexed_files(pipeline) -> list[str]:
    """The ``file`` names that the first retriever's store holds (empty for a corpus of passages)."""
    for name in retriever_names(pipeline):
        store = getattr(pipeline.get_component(name), "document_store", None)
        if store is not None and hasattr(store, "files"):
            return sorted(store.files("file"))
        if store is not None and hasattr(store, "table_name"):  # a PostgreSQL table
            from rag_mag.serving.db.pgvector import table_files

            return table_files(store.table_name)
    return []


def source_filter(patterns: list[str], files: list[str]) -> dict[str, Any]:
    """The filter that keeps the files matching any of ``patterns`` (exact names or globs)."""
    if not files:
        raise ConfigError("--source needs an index of files (built by `rag-mag index FOLDER`); this index holds "
                          "passages of a corpus, which have no file")
    chosen = [name for name in files if any(name == p or fnmatch.fnmatchcase(name, p) for p in patterns)]
    if not chosen:
        shown = ", ".join(files[:10]) + (" ..." if len(files) > 10 else "")
        raise ConfigError(f"no indexed file matches --source {' '.join(patterns)}; the index holds: {shown}")
    return {"field": "meta.file", "operator": "in", "value": chosen}


def with_filters(pipeline, inputs: dict[str, Any], filters: dict[str, Any] | None) -> dict[str, Any]:
    """``inputs`` with ``filters`` given to every retriever of ``pipeline`` (unchanged when there are none)."""
    if not filters:
        return inputs
    if not isinstance(filters, dict):
        raise ConfigError(f"filters must be a Haystack filter object, got {type(filters).__name__}; e.g. "
                          '{"field": "meta.file", "operator": "==", "value": "notes.pdf"}')
    names = retriever_names(pipeline)
    if not names:
        raise ConfigError("this pipeline has no retriever that takes filters")
    inputs = dict(inputs)
    for name in names:
        inputs[name] = {**inputs.get(name, {}), "filters": filters}
    return inputs
