"""The optimizer and learning-rate schedule of a training run: AdamW groups, warm-up then cosine decay."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR

from rag_mag.retriever.encoder import MagnitudeEncoder
from rag_mag.retriever.training.config import TrainConfig


def build_optimizer(encoder: MagnitudeEncoder, config: TrainConfig) -> tuple[torch.optim.Optimizer, LambdaLR]:
    """AdamW over the trainable weights (no weight decay on biases and LayerNorm weights; the learnable degrees
    at their own learning rate) and its schedule: linear warm-up, then cosine decay to 0 at ``config.steps``."""
    decay, no_decay = [], []
    for name, parameter in encoder.model.named_parameters():
        if not parameter.requires_grad:
            continue  # frozen by train_layers
        # no weight decay on biases and LayerNorm weights (1-d tensors)
        (no_decay if parameter.ndim < 2 or "norm" in name.lower() else decay).append(parameter)
    groups = [
        {"params": decay, "lr": config.learning_rate, "weight_decay": config.weight_decay},
        {"params": no_decay, "lr": config.learning_rate, "weight_decay": 0.0},
    ]
    if encoder.degrees.learnable:
        groups.append({"params": [encoder.degrees.query_logit, encoder.degrees.document_logit],
                       "lr": config.gamma_learning_rate, "weight_decay": 0.0})
    optimizer = torch.optim.AdamW(groups, betas=(0.9, 0.98))
    warmup = int(config.steps * config.warmup_ratio)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = (step - warmup) / max(1, config.steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return optimizer, LambdaLR(optimizer, schedule)


def resume_schedule(optimizer: torch.optim.Optimizer, scheduler: LambdaLR, step: int) -> None:
    """Set the schedule, and the learning rate of every group, to where they are after ``step`` steps."""
    scheduler.last_epoch = step
    for group, base_lr, factor in zip(optimizer.param_groups, scheduler.base_lrs,
                                      [fn(step) for fn in scheduler.lr_lambdas], strict=True):
        group["lr"] = base_lr * factor
