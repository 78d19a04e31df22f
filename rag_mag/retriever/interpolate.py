"""Weight-space interpolation between a trained retriever and the encoder it started from (WiSE-FT).

Wortsman et al. (2022) found that fine-tuning moves a pretrained model toward its training distribution at the
cost of others, and that the straight line between the two sets of weights keeps much of both:
``theta(alpha) = (1 - alpha) * theta_base + alpha * theta_tuned``. ``alpha = 1`` is the trained checkpoint,
``alpha = 0`` the base encoder under the trained strategy and norm scales. For ``learnable`` the degrees move
on the same line from their starting value. The mixing weight is chosen on validation data from a domain the
run did not train on (``eval/bench_recipes.py``), never on test questions.
"""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path

import torch

from rag_mag.errors import CheckpointError, ConfigError
from rag_mag.retriever.encoder import MagnitudeEncoder, checkpoint_digest, resolve_checkpoint_dir
from rag_mag.retriever.strategies import initial_degrees


def check_alpha(alpha: float) -> float:
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha) \
            or not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"the mixing weight alpha must be a number in [0, 1], got {alpha!r}")
    return float(alpha)


def interpolate(tuned: MagnitudeEncoder, base_model: torch.nn.Module, alpha: float) -> MagnitudeEncoder:
    """A new encoder on the line between ``base_model``'s weights (alpha 0) and ``tuned``'s (alpha 1)."""
    alpha = check_alpha(alpha)
    base_state = base_model.state_dict()
    tuned_state = tuned.model.state_dict()
    if set(base_state) != set(tuned_state) or any(base_state[k].shape != tuned_state[k].shape for k in tuned_state):
        raise CheckpointError(f"the retriever {tuned.config.base_model!r} was not trained from this base model "
                              "(their weights differ in names or shapes)")
    model = copy.deepcopy(tuned.model)  # no fresh initialization: a WiSE-FT run builds this view at every step
    with torch.no_grad():
        for name, value in model.state_dict().items():  # the tuned weights, moved 1 - alpha of the way to the base
            if value.is_floating_point():
                value.lerp_(base_state[name].to(value.dtype), 1.0 - alpha)
    config = type(tuned.config)(**{**vars(tuned.config), "training": dict(tuned.config.training)})
    start_query, start_document = initial_degrees(config.strategy)
    query_degree, document_degree = tuned.degrees.as_floats()
    config.query_degree = (1.0 - alpha) * start_query + alpha * query_degree
    config.document_degree = (1.0 - alpha) * start_document + alpha * document_degree
    encoder = MagnitudeEncoder(model, tuned.tokenizer, config)  # its degrees are built from config
    encoder.eval()
    return encoder


def interpolate_checkpoint(path: str | os.PathLike, alpha: float, out: str | os.PathLike | None = None,
                           base_model: str | None = None) -> MagnitudeEncoder:
    """Interpolate a saved checkpoint with the base encoder it records (or ``base_model``); with ``out``, save
    the result there (atomically) with the source's digest and alpha in ``training["wise_ft"]``."""
    from transformers import AutoModel

    folder = resolve_checkpoint_dir(path)
    tuned = MagnitudeEncoder.load(folder)
    earlier = tuned.config.training.get("wise_ft")
    if earlier:  # best/ of a run under the default recipe: mixing it again would give alpha x its alpha
        raise ConfigError(f"{folder} is already WiSE-FT at alpha {earlier.get('alpha')} (its run trained with "
                          "--wise-alpha below 1). Interpolate the trained weights instead: the run's last/ "
                          "folder (its final step), or train with the --wise-alpha you want")
    source = base_model or tuned.config.base_model
    try:
        base = AutoModel.from_pretrained(source, use_safetensors=True)
    except OSError as error:
        raise ConfigError(f"cannot load the base encoder {source!r} of {folder}: {error}. Pass the base model "
                          "folder it was trained from") from None
    encoder = interpolate(tuned, base, alpha)
    encoder.config.training["wise_ft"] = {"alpha": float(alpha), "tuned": checkpoint_digest(folder),
                                          "base_model": source}
    if out is not None:
        encoder.save(Path(out))
    return encoder
