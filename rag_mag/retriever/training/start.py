"""The encoder a training run starts from: a new one with calibrated norm scales, or ``last/``'s when resuming."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import torch

from rag_mag.data import Triple
from rag_mag.errors import CheckpointError
from rag_mag.retriever.encoder import MagnitudeEncoder
from rag_mag.retriever.training.config import TrainConfig
from rag_mag.retriever.training.distributed import ProcessGroup

# training's messages keep the trainer's logger name, wherever in the family they are written
logger = logging.getLogger("rag_mag.retriever.training.trainer")


def starting_encoder(config: TrainConfig, last_dir: Path, resuming: bool, train: list[Triple], group: ProcessGroup,
                     device: torch.device) -> MagnitudeEncoder:
    """``last_dir``'s encoder when resuming, else a new one (its norm scales calibrated by rank 0 on ``train``
    when ``config.calibrate_norms``); on ``device``, the same on every process, and recording ``config``."""
    if resuming:
        encoder = MagnitudeEncoder.load(last_dir)
        if encoder.config.strategy != config.strategy:
            raise CheckpointError(f"{last_dir} holds a {encoder.config.strategy} run, not "
                                  f"{config.strategy}; use a new --out or pass --no-resume")
    else:
        encoder = MagnitudeEncoder.build(config.base_model or None, config.strategy, config.pooling,
                                         config.query_max_length, config.document_max_length,
                                         config.temperature)
        if config.calibrate_norms and group.is_main:
            calibrate_norm_scales(encoder.to(device), train, config)
    encoder.to(device)
    group.broadcast_module(encoder)  # every replica starts from rank 0's weights and norm scales
    encoder.config.query_norm_scale, encoder.config.document_norm_scale = group.broadcast_object(
        (encoder.config.query_norm_scale, encoder.config.document_norm_scale))
    encoder.config.training = config.to_dict()
    return encoder


def calibrate_norm_scales(encoder: MagnitudeEncoder, triples: list[Triple], config: TrainConfig) -> None:
    """Measure each side's mean raw norm at initialization (recorded in the checkpoint)."""
    sample = random.Random(config.seed).sample(triples, min(len(triples), config.calibration_samples))
    queries = encoder.encode([t.query for t in sample], "query", treated=False)
    documents = encoder.encode([t.positives[0].content for t in sample], "document", treated=False)
    encoder.config.query_norm_scale = float(np.linalg.norm(queries, axis=1).mean())
    encoder.config.document_norm_scale = float(np.linalg.norm(documents, axis=1).mean())
    logger.info("calibrated norm scales: query %.3f, document %.3f (raw sides are divided by them)",
                encoder.config.query_norm_scale, encoder.config.document_norm_scale)
