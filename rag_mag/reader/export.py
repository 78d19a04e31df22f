"""Full fine-tuning of the reader's linear weights, shipped as a LoRA adapter cut from the weight change.

Full weights (about 270 MB) cannot be committed, and a LoRA adapter trained as such learns less per step than
training the weights themselves. ``method: full`` trains every linear weight of the decoder layers (embeddings
and norms stay frozen, so nothing outside those matrices changes), and the adapter the product ships is the
truncated SVD of each weight's change ``W - W0 = U S V^T``: ``lora_B = U_r S_r``, ``lora_A = V_r^T``, with
``lora_alpha = r`` so that PEFT's scaling is 1 and merging gives ``W0 + U_r S_r V_r^T``. The best rank-r
approximation of a change is what the adapter holds; what it loses is measured by validating the cut weights
(``low_rank_weights``), never assumed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch


def decoder_linear_names(model) -> list[str]:
    """The names of the ``nn.Linear`` modules inside the decoder layers (not the LM head)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return [name for name, module in base.named_modules()
            if isinstance(module, torch.nn.Linear) and ".layers." in f".{name}"]


def train_decoder_linears(model) -> list[str]:
    """Freeze everything but the decoder layers' linear weights; return their module names."""
    names = decoder_linear_names(model)
    trained = {f"{name}.weight" for name in names}
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name in trained)
    return names


def snapshot(model, names: list[str]) -> dict[str, torch.Tensor]:
    """A float32 copy of the named modules' weights (the starting point the change is measured from)."""
    modules = dict(model.named_modules())
    return {name: modules[name].weight.detach().float().clone() for name in names}


def low_rank_factors(delta: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A, B)`` with ``B @ A`` the best rank-``rank`` approximation of ``delta`` (out x in); a matrix of
    smaller rank is padded with zero rows and columns, so every module has the same ``r``."""
    u, s, vh = torch.linalg.svd(delta.float(), full_matrices=False)
    kept = min(rank, s.shape[0])
    a = torch.zeros(rank, delta.shape[1])
    b = torch.zeros(delta.shape[0], rank)
    a[:kept] = vh[:kept]
    b[:, :kept] = u[:, :kept] * s[:kept]
    return a, b


def adapter_tensors(model, base: dict[str, torch.Tensor], rank: int) -> tuple[dict[str, torch.Tensor], float]:
    """PEFT's state-dict keys and factors for every changed module, and the share of the change's squared
    Frobenius norm that the rank-``rank`` cut keeps (1.0: nothing lost)."""
    modules = dict(model.named_modules())
    tensors: dict[str, torch.Tensor] = {}
    kept = total = 0.0
    for name, start in base.items():
        delta = modules[name].weight.detach().float() - start
        a, b = low_rank_factors(delta, rank)
        tensors[f"base_model.model.{name}.lora_A.weight"] = a.contiguous()
        tensors[f"base_model.model.{name}.lora_B.weight"] = b.contiguous()
        total += float(delta.pow(2).sum())
        kept += float((b @ a).pow(2).sum())
    return tensors, (kept / total if total else 1.0)


def write_adapter(model, base: dict[str, torch.Tensor], rank: int, folder: Path, base_model: str) -> float:
    """Write ``adapter_model.safetensors`` and ``adapter_config.json`` (PEFT's format) into ``folder``; return
    the share of the weight change kept."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    tensors, kept = adapter_tensors(model, base, rank)
    save_file(tensors, str(Path(folder) / "adapter_model.safetensors"))
    targets = sorted({name.rsplit(".", 1)[-1] for name in base})
    LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM",
               base_model_name_or_path=base_model).save_pretrained(str(folder))
    return kept


@contextlib.contextmanager
def low_rank_weights(model, base: dict[str, torch.Tensor], rank: int) -> Iterator[None]:
    """Within the block the model's trained weights are ``W0 + B A`` (what the exported adapter merges to);
    the trained weights are restored after it."""
    modules = dict(model.named_modules())
    saved = {}
    try:
        with torch.no_grad():
            for name, start in base.items():
                weight = modules[name].weight
                saved[name] = weight.detach().clone()
                a, b = low_rank_factors(weight.float() - start, rank)
                weight.copy_((start + b @ a).to(weight.dtype))
        yield
    finally:
        with torch.no_grad():
            for name, weight in saved.items():
                modules[name].weight.copy_(weight)
