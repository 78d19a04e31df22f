"""Whether a run resumes from ``last/``: only from a complete checkpoint of the same settings and data."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

from rag_mag import durable
from rag_mag.errors import CheckpointError
from rag_mag.retriever.training.checkpoint import STATE_NAME, missing_parts
from rag_mag.retriever.training.config import TrainConfig
from rag_mag.retriever.training.distributed import ProcessGroup

# training's messages keep the trainer's logger name, wherever in the family they are written
logger = logging.getLogger("rag_mag.retriever.training.trainer")

# Settings that may change between a run and its resumption (how long and how it runs, not what it learns);
# the data files are compared by content (sha256), not by path.
RESUMABLE_CHANGES = frozenset({"out", "resume", "resume_anyway", "steps", "eval_every", "log_every", "save_every",
                               "threads", "device", "precision", "bf16", "train_data", "val_data",
                               "val_corpus"})
# Settings baked into the saved model: with --resume-anyway the checkpoint's values are kept (and recorded).
ENCODER_FIELDS = ("strategy", "base_model", "pooling", "query_max_length", "document_max_length")


def data_fingerprint(config: TrainConfig) -> dict[str, str | None]:
    """sha256 of the training (and validation) files: a resumed run must see the same data."""
    return {name: durable.sha256_of(path) if path else None
            for name, path in (("train_data", config.train_data), ("val_data", config.val_data),
                               ("val_corpus", config.val_corpus))}


def should_resume(config: TrainConfig, last_dir: Path, group: ProcessGroup, fingerprint: dict[str, str | None],
                  ) -> tuple[bool, TrainConfig]:
    """Whether to resume from ``last_dir``, and the settings to run with (with ``--resume-anyway``, the
    checkpoint's model settings). Recovers from an interrupted save, refuses an incomplete or incompatible
    checkpoint (CheckpointError) instead of silently starting over."""
    if group.is_main:
        durable.recover_dir(last_dir, is_complete=lambda folder: not missing_parts(folder))
    group.barrier()  # the other ranks read last/ once rank 0 has recovered it
    if not config.resume:
        if last_dir.exists():
            logger.warning("--no-resume: starting over; %s will be replaced at the first save", last_dir)
        return False, config
    if not last_dir.exists():
        return False, config
    missing = missing_parts(last_dir)
    if missing:
        raise CheckpointError(f"the checkpoint {last_dir} is incomplete (missing: {', '.join(missing)}); "
                              "it is not taken as a fresh start. Restore the folder from a backup, or pass "
                              "--no-resume to start over (that replaces it)")
    state = json.loads((last_dir / STATE_NAME).read_text())
    differences = settings_differences(config, fingerprint, state)
    if differences and not config.resume_anyway:
        raise CheckpointError(f"cannot resume {last_dir}: the settings differ from the run it holds "
                              f"({'; '.join(differences)}). Pass the same settings, use a new --out, pass "
                              "--no-resume to start over, or --resume-anyway to continue with the "
                              "checkpoint's model")
    if differences:
        saved = state.get("config", {})
        kept = {name: saved[name] for name in ENCODER_FIELDS if name in saved}
        logger.warning("--resume-anyway: resuming although %s; the checkpoint's %s are kept",
                       "; ".join(differences), ", ".join(f"{k}={v!r}" for k, v in kept.items()))
        config = replace(config, **kept)
    return True, config


def settings_differences(config: TrainConfig, fingerprint: dict[str, str | None], state: dict) -> list[str]:
    """The settings and data of this run that differ from those recorded in a checkpoint's state."""
    saved, current = state.get("config") or {}, config.to_dict()
    differences = [f"{name}={saved[name]!r} in the checkpoint, {current[name]!r} now"
                   for name in current if name in saved and name not in RESUMABLE_CHANGES
                   and saved[name] != current[name]]
    recorded = state.get("data_fingerprint") or {}
    for name, digest in fingerprint.items():
        if name in recorded and recorded[name] != digest:
            differences.append(f"{name}: the file's contents differ (sha256 {str(recorded[name])[:12]} in "
                               f"the checkpoint, {str(digest)[:12]} now)")
    return differences
