"""The resumable checkpoint ``last/``: written whole and swapped in, checked complete, read back into a run.

``last/`` holds the model, ``optimizer.safetensors`` (the optimizer's moments and every rank's generator
state) and ``trainer_state.json`` (the step, the selection's state, the settings and data the run was
started with, and every other file with its size). Nothing is pickled.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from rag_mag import durable
from rag_mag.errors import CheckpointError
from rag_mag.retriever.encoder import CONFIG_NAME, MagnitudeEncoder

# training's messages keep the trainer's logger name, wherever in the family they are written
logger = logging.getLogger("rag_mag.retriever.training.trainer")

STATE_NAME = "trainer_state.json"
RNG_KEY = "rng.torch"  # rank 0's generator; rank r > 0 of a multi-process run is saved as "rng.torch.r"
# Rank r seeds its generator with seed + r * RANK_SEED_STRIDE: every process draws its own dropout masks.
RANK_SEED_STRIDE = 1_000_003
OPTIMIZER_NAME = "optimizer.safetensors"


def rng_key(rank: int) -> str:
    """Where rank ``rank``'s generator state is saved (rank 0 under the key single-process runs use)."""
    return RNG_KEY if rank == 0 else f"{RNG_KEY}.{rank}"


def checkpoint_bytes(encoder: MagnitudeEncoder, optimizer: torch.optim.Optimizer) -> int:
    """At least what one ``last/`` takes on disk: the weights and the optimizer's state (the tokenizer and the
    JSON files add a little more)."""
    moments = [value for state in optimizer.state.values() for value in state.values() if torch.is_tensor(value)]
    return encoder.weight_bytes() + sum(value.numel() * value.element_size() for value in moments)


def save_last(last_dir: Path, encoder: MagnitudeEncoder, optimizer: torch.optim.Optimizer,
              rng_states: list[torch.Tensor], progress: dict, config: dict, data_fingerprint: dict) -> None:
    """Write model, optimizer, RNG and state complete into a staging folder, fsync it, swap it in.

    The previous ``last/`` stays in place until the new one replaces it in one rename, so a kill at any
    moment leaves one complete checkpoint (``trainer_state.json`` lists every other file and its size); a
    save that cannot fit on the disk is refused before the staging folder is made, and one that fills it ends
    in one ``DiskFullError``. ``rng_states`` holds each rank's generator state, in rank order (rank 0's alone
    when interrupted). ``progress`` is how far the run got: ``step``, ``step_finished`` (False when an
    interrupt came inside the step's hook or validation), ``world_size``, ``best_metrics`` and ``candidates``;
    ``config`` and ``data_fingerprint`` say which run this is (``resume.py`` compares them).
    """
    what = f"the checkpoint {last_dir}"
    needed = checkpoint_bytes(encoder, optimizer)
    durable.ensure_free_space(last_dir.parent, needed, what)  # refused before a byte is staged
    staging = durable.staging_dir(last_dir)
    try:
        with durable.disk_full_as_error(last_dir, what, needed):
            durable.fault_point("checkpoint:staging")
            encoder.write_files(staging)
            durable.fault_point("checkpoint:model")
            tensors, slots = {}, []
            for group_index, group in enumerate(optimizer.param_groups):
                for param_index, parameter in enumerate(group["params"]):
                    for key, value in optimizer.state.get(parameter, {}).items():
                        tensors[f"{group_index}.{param_index}.{key}"] = \
                            torch.as_tensor(value).detach().cpu().clone().contiguous()
                slots.append(len(group["params"]))
            for rank, rng_state in enumerate(rng_states):  # dropout masks: a resumed run replays the same ones
                tensors[rng_key(rank)] = rng_state
            save_file(tensors, str(staging / OPTIMIZER_NAME))
            durable.fault_point("checkpoint:optimizer")
            files = {path.name: path.stat().st_size for path in sorted(staging.iterdir()) if path.is_file()}
            state = {**progress, "param_group_sizes": slots, "config": config, "data_fingerprint": data_fingerprint,
                     "files": files}
            (staging / STATE_NAME).write_text(json.dumps(state, indent=2))
            durable.fault_point("checkpoint:state")
            durable.sync_tree(staging)
            durable.fault_point("checkpoint:synced")
            durable.replace_dir(staging, last_dir, fault_prefix="checkpoint")
            durable.fault_point("checkpoint:done")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def missing_parts(folder: Path) -> list[str]:
    """What a checkpoint folder lacks to be resumed from ([] when it is complete)."""
    state_file = folder / STATE_NAME
    if not state_file.is_file():
        present = {path.name for path in folder.iterdir()} if folder.is_dir() else set()
        return sorted({STATE_NAME, OPTIMIZER_NAME, CONFIG_NAME, "model.safetensors"} - present)
    try:
        state = json.loads(state_file.read_text())
        files = state.get("files")
        int(state["step"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError):
        return [f"{STATE_NAME} (unreadable)"]
    if not isinstance(files, dict):  # written before checkpoints listed their files
        files = {name: None for name in (OPTIMIZER_NAME, CONFIG_NAME)}
    missing = []
    for name, size in files.items():
        path = folder / name
        if not path.is_file():
            missing.append(name)
        elif size is not None and path.stat().st_size != size:
            missing.append(f"{name} (holds {path.stat().st_size} bytes, {size} were written)")
    return missing


def load_last(last_dir: Path, optimizer: torch.optim.Optimizer, rank: int, seed: int) -> dict:
    """Put ``last/``'s optimizer moments into ``optimizer`` and rank ``rank``'s generator state into torch;
    return its ``trainer_state.json``. A rank the checkpoint holds no state for draws from a new seed."""
    try:
        state = json.loads((last_dir / STATE_NAME).read_text())
        tensors = load_file(str(last_dir / OPTIMIZER_NAME))
    except (OSError, json.JSONDecodeError, ValueError, RuntimeError) as error:
        raise CheckpointError(f"cannot resume from {last_dir}: {error}. Delete that folder to start "
                              "over, or pass --no-resume") from None
    if state["param_group_sizes"] != [len(g["params"]) for g in optimizer.param_groups]:
        raise CheckpointError(f"{last_dir} was written for another model or strategy; use a new --out "
                              "or pass --no-resume")
    rng_states = {key: tensors.pop(key) for key in list(tensors) if key == RNG_KEY or key.startswith(RNG_KEY + ".")}
    step = int(state["step"])
    if rng_key(rank) in rng_states:
        torch.set_rng_state(rng_states[rng_key(rank)])
    elif rng_states:  # written by fewer processes, or saved on an interrupt: this rank's draws start afresh
        logger.info("rank %d: %s holds no generator state for this rank (written by %s processes); its "
                    "dropout masks are drawn from a new seed", rank, last_dir, state.get("world_size", 1))
        torch.manual_seed(seed + rank * RANK_SEED_STRIDE + step)
    for key, value in tensors.items():
        group_index, param_index, slot = key.split(".", 2)
        parameter = optimizer.param_groups[int(group_index)]["params"][int(param_index)]
        # moments live beside their parameter; AdamW's scalar step counter stays on the CPU
        optimizer.state[parameter][slot] = value.to(parameter.device) if value.ndim else value
    return state
