"""How the report writes its figures: numbers, signed changes, p-values, intervals, tables, JSON-safe values."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rag_mag.bench.report.model import Cell

LABELS = {"em": "EM", "f1": "F1", "accuracy": "accuracy", "ndcg@10": "nDCG@10", "mrr@10": "MRR@10",
          "recall@budget": "recall@budget"}


def format_number(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def format_signed(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1f}"


def format_p(value: float | None) -> str:
    if value is None:
        return "n/a"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def with_ci(cell: Cell | None, metric: str) -> str:
    """A cell's mean with its 95% interval, or with the spread over seeds where it has no interval."""
    if cell is None or metric not in cell.means:
        return "–"
    text = format_number(cell.means[metric])
    if metric in cell.cis:
        low, high = cell.cis[metric]
        text += f" [{low:.1f}, {high:.1f}]"
    elif metric in cell.seed_sd:
        text += f" ± {cell.seed_sd[metric]:.1f} sd"
    return text


def delta_text(entry: Mapping | None) -> str:
    """A comparison's change with its interval and p-value."""
    if entry is None:
        return "–"
    text = format_signed(entry["delta"])
    if entry.get("delta_ci"):
        text += f" [{entry['delta_ci'][0]:+.1f}, {entry['delta_ci'][1]:+.1f}]"
    return text + f" (p {format_p(entry.get('p_value'))})"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The lines of a markdown table, and an empty line after it."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(value) for value in row) + " |" for row in rows]
    return lines + [""]


def json_safe(value: Any) -> Any:
    """``value`` with numpy types, tuples and paths made plain JSON; a non-finite float becomes None."""
    if isinstance(value, Mapping):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if isinstance(value, np.ndarray):
        return json_safe(value.tolist())
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer, int)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Path):
        return str(value)
    return value
