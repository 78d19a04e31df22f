"""Fine-tuning that keeps the base model: train only the top layers, or pull every weight back toward its start.

Both act on the transformer inside a ``MagnitudeEncoder`` and are switched on by ``TrainConfig`` fields
(``train_layers``, ``anchor_weight``); weight-space interpolation after training is ``interpolate.py``.
Which of them the default recipe uses is decided on validation from a domain the run did not train on
(``eval/bench_recipes.py``).
"""

from __future__ import annotations

import re

import torch

from rag_mag.errors import ConfigError

_LAYER = re.compile(r"(?:^|\.)layers?\.(\d+)\.")


def layer_index(name: str) -> int | None:
    """The transformer layer a parameter belongs to (``encoder.layer.3.attention...`` -> 3), or None."""
    match = _LAYER.search(name)
    return int(match.group(1)) if match else None


def freeze_below_top_layers(model: torch.nn.Module, top: int) -> int:
    """Freeze every parameter outside the top ``top`` layers (embeddings included); 0 leaves all trainable.
    Returns the number of trainable parameters."""
    if top:
        layers = {index for name, _ in model.named_parameters() if (index := layer_index(name)) is not None}
        if not layers:
            raise ConfigError("train_layers needs a model whose parameters are named by layer (layer.N or "
                              "layers.N); this one has none: use train_layers 0")
        if top > len(layers):
            raise ConfigError(f"train_layers is {top}, but the model has {len(layers)} layers")
        first = max(layers) + 1 - top
        for name, parameter in model.named_parameters():
            index = layer_index(name)
            parameter.requires_grad_(index is not None and index >= first)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def starting_weights(model: torch.nn.Module, config) -> dict[str, torch.Tensor]:
    """The base encoder's weights of every trainable parameter: where L2-SP pulls back to. Read from the base
    model itself, so a resumed run anchors to the same start as the run it continues."""
    from transformers import AutoModel

    from rag_mag.models import default_retriever_base

    base = AutoModel.from_pretrained(config.base_model or default_retriever_base(), use_safetensors=True)
    start = dict(base.named_parameters())
    device = next(model.parameters()).device
    return {name: start[name].detach().to(device) for name, parameter in model.named_parameters()
            if parameter.requires_grad}


@torch.no_grad()
def pull_toward_start(model: torch.nn.Module, start: dict[str, torch.Tensor], fraction: float) -> None:
    """Move every anchored weight ``fraction`` of its distance back toward its start."""
    for name, parameter in model.named_parameters():
        if name in start:
            parameter.sub_(fraction * (parameter - start[name]))
