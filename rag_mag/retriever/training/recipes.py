"""Fine-tuning that keeps the base model: train only the top layers, pull every weight back toward its start, or
distil the starting encoder's rankings, or hand out the trained weights interpolated with the start (WiSE-FT).

They act on the transformer inside a ``MagnitudeEncoder`` and are switched on by ``TrainConfig`` fields
(``train_layers``, ``anchor_weight``, ``distill_weight``, ``wise_alpha``); the interpolation itself is
``interpolate.py``, also a command of its own for a finished checkpoint (``rag-mag interpolate``).
Which of them the default recipe uses is decided on validation from a domain the run did not train on
(``eval/bench_recipes.py``).
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F

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


def base_transformer(config) -> torch.nn.Module:
    """The base encoder's transformer, built the way a run's encoder starts (``MagnitudeEncoder.build`` from the
    base model itself: what L2-SP and WiSE-FT go back to), so a resumed run goes back to the same start as the
    run it continues."""
    from rag_mag.retriever.encoder import MagnitudeEncoder

    return MagnitudeEncoder.build(config.base_model or None, "cosine").model


def starting_weights(model: torch.nn.Module, base: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base transformer's (``base_transformer``) weights of every trainable parameter: where L2-SP pulls
    back to."""
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


def wise_view(encoder, base: torch.nn.Module, config):
    """What a WiSE-FT run (``wise_alpha`` below 1) validates, hands its step hook and saves: its trained weights
    interpolated with the base's at ``wise_alpha``, recorded in the view's training settings. Training itself
    goes on from the trained weights (``last/`` keeps them)."""
    from rag_mag.retriever.interpolate import interpolate

    view = interpolate(encoder, base, config.wise_alpha).to(next(encoder.parameters()).device)
    view.config.training["wise_ft"] = {"alpha": config.wise_alpha, "base_model": config.base_model or "packaged"}
    return view


def frozen_start(encoder, config):
    """A frozen copy of the encoder a run starts from (the base model, with the run's strategy and norm scales):
    the teacher of ``distill_weight``. Built from the base model, so a resumed run distils the same start."""
    from rag_mag.retriever.encoder import MagnitudeEncoder

    teacher = MagnitudeEncoder.build(config.base_model or None, encoder.config.strategy, encoder.config.pooling,
                                     encoder.config.query_max_length, encoder.config.document_max_length,
                                     encoder.config.temperature)
    teacher.config.query_norm_scale = encoder.config.query_norm_scale
    teacher.config.document_norm_scale = encoder.config.document_norm_scale
    teacher.eval()
    for parameter in teacher.parameters():
        parameter.requires_grad_(False)
    return teacher


def ranking_divergence(student: torch.Tensor, teacher: torch.Tensor, temperature: float,
                       excluded: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over queries of KL(teacher || student) between their softmax distributions over the same candidates.
    ``student``, ``teacher``: (queries, candidates) similarity scores; ``excluded``: (queries, candidates) bool,
    candidates left out of both distributions (other copies of a query's positive)."""
    if excluded is not None:
        student = student.masked_fill(excluded, float("-inf"))
        teacher = teacher.masked_fill(excluded, float("-inf"))
    student_log = F.log_softmax(student / temperature, dim=1)
    teacher_log = F.log_softmax(teacher / temperature, dim=1)
    terms = teacher_log.exp() * (teacher_log - student_log)
    if excluded is not None:
        terms = terms.masked_fill(excluded, 0.0)  # 0 x (-inf - -inf) would be NaN
    return terms.sum(dim=1).mean()
