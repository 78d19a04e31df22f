"""What a training run reports: ``train_log.jsonl`` and its log messages, and the warnings of a collapse."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from rag_mag import durable
from rag_mag.retriever.encoder import MagnitudeEncoder

# training's messages keep the trainer's logger name, wherever in the family they are written
logger = logging.getLogger("rag_mag.retriever.training.trainer")

# Below this coefficient of variation a raw side carries (almost) no magnitude signal.
COLLAPSE_CV = 1e-3
# Above this mean cosine between different passages of a batch, directions have collapsed together.
COLLAPSE_COSINE = 0.98


def mean_pairwise_cosine(raw: torch.Tensor) -> float:
    """The mean cosine between different rows of ``raw`` (n, dim): near 1 when their directions collapsed."""
    unit = torch.nn.functional.normalize(raw.detach().float(), dim=-1)
    cosines = unit @ unit.T
    n = cosines.shape[0]
    return float((cosines.sum() - cosines.diagonal().sum()) / max(n * (n - 1), 1))


def write_record(log_path: Path, record: dict) -> None:
    """Append one step's or one validation's record to ``train_log.jsonl`` and log it as a line of text."""
    durable.append_line(log_path, json.dumps(record))
    if "validation" in record:
        logger.info("step %d validation %s%s", record["step"],
                    " ".join(f"{k}={v:.2f}" for k, v in record["validation"].items()),
                    f" (best/ is step {record['chosen']}, within one standard error: steps "
                    f"{', '.join(map(str, record['band']))})" if "chosen" in record
                    else " (best so far)" if record.get("best") else "")
    else:
        logger.info("step %d loss %.4f acc %.3f |q| %.2f (cv %.3f) |d| %.2f (cv %.3f) g=(%.3f, %.3f)",
                    record["step"], record["loss"], record["accuracy"], record["query_norm_mean"],
                    record["query_norm_cv"], record["document_norm_mean"], record["document_norm_cv"],
                    record["g_query"], record["g_document"])


def rewind_log(log_path: Path, step: int) -> None:
    """Keep only the log records up to ``step``: a resumed run logs the later steps again."""
    if not log_path.is_file():
        return
    kept = []
    for line in log_path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line torn by a kill in the middle of a write
            continue
        if isinstance(record, dict) and record.get("step", 0) <= step:
            kept.append(line)
    durable.write_text(log_path, "".join(line + "\n" for line in kept))


def watch_collapse(record: dict, encoder: MagnitudeEncoder) -> None:
    """Warn when a logged step shows a raw side without magnitude signal, or passages losing their directions."""
    query_degree, document_degree = encoder.degrees.as_floats()
    if document_degree < 1 and record["document_norm_cv"] < COLLAPSE_CV:
        logger.warning("magnitude collapse: document norms have CV %.2g at step %d; the raw document side "
                       "carries no magnitude signal", record["document_norm_cv"], record["step"])
    if query_degree < 1 and record["query_norm_cv"] < COLLAPSE_CV:
        logger.warning("magnitude collapse: query norms have CV %.2g at step %d", record["query_norm_cv"],
                       record["step"])
    if record["document_cosine"] > COLLAPSE_COSINE:
        logger.warning("direction collapse: passages of a batch have mean cosine %.3f at step %d; direction "
                       "information is being lost", record["document_cosine"], record["step"])
