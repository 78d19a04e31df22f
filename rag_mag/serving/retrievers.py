"""Which retriever checkpoint goes with an index, found by the fingerprint the index records.

An index (a FAISS folder's ``manifest.json``, a PostgreSQL table's tag) names the checkpoint that embedded it by
fingerprint only. ``rag-mag ask`` and ``rag-mag index`` without ``--retriever`` look among the checkpoints under
``artifacts/`` (``retriever-*``) for the one with that fingerprint, so that an index is always queried and
updated with its own retriever, whichever strategy built it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from rag_mag.components.checkpoints import checkpoint_fingerprint
from rag_mag.errors import CheckpointError
from rag_mag.models import artifacts_dir
from rag_mag.retriever.encoder import CONFIG_NAME

logger = logging.getLogger(__name__)


def index_checkpoint(index: Path) -> str | None:
    """The checkpoint fingerprint a FAISS index folder records, or None (no index there, or none recorded)."""
    try:
        return json.loads((Path(index) / "manifest.json").read_text()).get("checkpoint")
    except (OSError, ValueError, AttributeError):
        return None


def retriever_for(checkpoint: str | None) -> Path | None:
    """The checkpoint folder under ``artifacts/`` (``retriever-*``) whose fingerprint is ``checkpoint``."""
    if not checkpoint:
        return None
    for folder in sorted(artifacts_dir().glob("retriever-*")):
        if not (folder / CONFIG_NAME).is_file():
            continue
        try:
            if checkpoint_fingerprint(folder) == checkpoint:
                return folder
        except CheckpointError:
            continue
    return None


def own_retriever(index: Path, fallback: Path) -> Path:
    """The retriever that built the FAISS index ``index`` where it is found under ``artifacts/``, else
    ``fallback``."""
    found = retriever_for(index_checkpoint(index))
    if found is not None and found != fallback:
        logger.info("the index %s was built with %s: using it", index, found)
    return found or fallback
