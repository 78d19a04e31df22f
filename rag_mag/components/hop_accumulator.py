"""HopAccumulator: merges the Documents of successive retrieval rounds and counts the rounds (multi-hop RAG)."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict

logger = logging.getLogger(__name__)


@component
class HopAccumulator:
    """The state of a multi-hop retrieval loop, carried around the loop by the pipeline itself.

    Each round, it receives that round's `query` and retrieved `documents`, and (from the second
    round on) what the previous rounds gathered, routed back to it by a ConditionalRouter as
    `previous_documents` and `previous_queries`. It outputs everything gathered so far: earlier
    Documents first, then this round's Documents not seen before (at most `max_new_per_hop` of them
    after the first round), each tagged with `meta["hop"]` (1 for the first round) and
    `meta["hop_query"]`; the list of `queries`; the number of rounds done (`hop`) and how many
    remain (`remaining_hops`), for the router to decide whether to loop again.

    Nothing is kept on the instance, so one pipeline can answer many questions in turn.
    """

    def __init__(self, max_hops: int = 2, max_new_per_hop: int | None = None) -> None:
        """
        :param max_hops: Number of retrieval rounds in all (at least 1).
        :param max_new_per_hop: Cap on the Documents a later round adds; `None` keeps all unseen ones.
        """
        if not isinstance(max_hops, int) or isinstance(max_hops, bool) or max_hops < 1:
            raise ValueError(f"max_hops must be a positive integer, got {max_hops!r}")
        if max_new_per_hop is not None and (not isinstance(max_new_per_hop, int) or max_new_per_hop < 0):
            raise ValueError(f"max_new_per_hop must be a non-negative integer or None, got {max_new_per_hop!r}")
        self.max_hops = max_hops
        self.max_new_per_hop = max_new_per_hop

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, max_hops=self.max_hops, max_new_per_hop=self.max_new_per_hop)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HopAccumulator:
        return default_from_dict(cls, data)

    @component.output_types(documents=list[Document], queries=list[str], hop=int, remaining_hops=int)
    def run(self, documents: list[Document], query: str, previous_documents: list[Document] | None = None,
            previous_queries: list[str] | None = None) -> dict[str, Any]:
        """
        Add one round.

        :param documents: This round's retrieved Documents, best first.
        :param query: This round's query.
        :param previous_documents: Documents gathered by earlier rounds (routed back by the loop).
        :param previous_queries: Queries of earlier rounds.
        :returns: `documents`, `queries`, `hop`, `remaining_hops` (see the class doc).
        """
        queries = [*(previous_queries or []), query]
        hop = len(queries)
        merged = list(previous_documents or [])
        seen = {document.id for document in merged}
        added = 0
        for document in documents:
            if document.id in seen:
                continue
            if hop > 1 and self.max_new_per_hop is not None and added >= self.max_new_per_hop:
                break
            merged.append(replace(document, meta={**(document.meta or {}), "hop": hop, "hop_query": query}))
            seen.add(document.id)
            added += 1
        logger.debug("hop %d (%r): %d new documents, %d in all", hop, query, added, len(merged))
        return {"documents": merged, "queries": queries, "hop": hop, "remaining_hops": max(self.max_hops - hop, 0)}
