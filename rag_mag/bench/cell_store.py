"""Finished benchmark cells on disk (``<report>/cells/``): the key of everything a cell depends on, and the write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from rag_mag import durable
from rag_mag.bench.config import BenchConfig, file_digest, fingerprint
from rag_mag.bench.datasets import EvalDataset
from rag_mag.bench.generation import resolve_pipeline
from rag_mag.bench.systems import Row

CELL_FORMAT = 5  # bump when a cell's content changes, so that older cells are recomputed


def cell_path(cells_dir: Path, dataset: EvalDataset, row: Row) -> Path:
    return cells_dir / f"{dataset.name}__{row.label}.json"


def cell_key(config: BenchConfig, dataset: EvalDataset, row: Row, scorer, reader: dict[str, str]) -> str:
    """Everything a cell depends on: settings, the retriever's content, the reader that answers (``reader``: its
    name and checksum), the questions, the pipeline files."""
    used = [config.reader_pipeline] if row.pipeline is None else \
        [row.pipeline.path] + ([config.retrieval_pipeline] if row.system.checkpoint is not None else [])
    return fingerprint(CELL_FORMAT, config.encode_precision, config.retrieval_top_k,
                       config.rag_top_k, config.max_tokens, row.name, row.system.digest,
                       reader, config.answered_by(row.pipeline, row.base),
                       [r.id for r in dataset.records], len(dataset.corpus),
                       [file_digest(resolve_pipeline(path)) for path in used],
                       scorer.primary_pipeline(dataset.name))


def write_jsonl_atomic(path: Path, record: dict) -> None:
    durable.write_text(path, json.dumps(record, default=_json_default))


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot serialize {type(value).__name__}")
