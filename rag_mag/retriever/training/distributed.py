"""Training on several processes: torch.distributed as ``torchrun`` launches it.

``ProcessGroup.join(device)`` reads torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``) and joins the group with gloo on the CPU and NCCL on CUDA
(``RAG_MAG_DIST_BACKEND`` overrides); a group the caller initialized is used as it is. Without
``WORLD_SIZE`` > 1 it is a group of one, and every method below is a no-op, so the trainer has a single
code path.

Why gradients are all-reduced here and not by ``DistributedDataParallel``: the transformer runs several
times per step outside any ``forward()`` (the query side, the document side, one pass per length bucket),
and the learnable normalization degrees are applied after the embeddings are gathered; DDP expects one
forward of the module it wraps per backward. Instead every process computes the loss of the whole global
batch from gathered embeddings (``gather_rows``, whose backward sums the gradient every process sends to a
row), so the objective of N processes is N times the single-process loss, and ``average_gradients``
divides the summed gradients by N: the update is the one a single process would make with the global
batch. The price is one flat all-reduce after the backward instead of buckets overlapped with it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from rag_mag.errors import ConfigError
from rag_mag.precision import resolve_device

logger = logging.getLogger(__name__)

BACKEND_VARIABLE = "RAG_MAG_DIST_BACKEND"
BACKENDS = ("gloo", "nccl", "mpi")


def launched_rank(environ: dict[str, str] | None = None) -> int:
    """This process's rank as torchrun's environment gives it, before any group is joined (0 outside torchrun):
    what the CLI needs to let rank 0 alone hold the output's lock."""
    environ = os.environ if environ is None else environ
    return int(environ.get("RANK", "0") or 0) if int(environ.get("WORLD_SIZE", "1") or 1) > 1 else 0


def shard_bounds(size: int, world_size: int) -> list[tuple[int, int]]:
    """Contiguous, near-equal ``[start, end)`` slices of ``size`` items, one per rank, in rank order."""
    return [(size * rank // world_size, size * (rank + 1) // world_size) for rank in range(world_size)]


class _GatherRows(torch.autograd.Function):
    """All-gather with gradients: forward gathers every rank's rows, backward sums the gradients all ranks
    computed for this rank's rows (the adjoint of the gather). Ranks may hold different numbers of rows."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, counts: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
        # rows: (counts[rank], dim) -> one (counts[r], dim) tensor per rank r
        ctx.counts, ctx.rank = counts, dist.get_rank()
        padded = rows.new_zeros((max(counts), *rows.shape[1:]))  # all_gather needs equal shapes
        padded[: rows.shape[0]] = rows
        pieces = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(pieces, padded)
        return tuple(piece[:count] for piece, count in zip(pieces, counts, strict=True))

    @staticmethod
    def backward(ctx, *gradients: torch.Tensor) -> tuple[torch.Tensor, None]:
        # gradients: one (counts[r], dim) per rank, this rank's loss only; summed over ranks in one all-reduce
        padded = gradients[0].new_zeros((len(ctx.counts), max(ctx.counts), *gradients[0].shape[1:]))
        for rank, gradient in enumerate(gradients):
            padded[rank, : gradient.shape[0]] = gradient
        dist.all_reduce(padded)
        return padded[ctx.rank, : ctx.counts[ctx.rank]], None


@dataclass
class ProcessGroup:
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    owned: bool = False  # initialized here, so destroyed here

    @classmethod
    def join(cls, device_setting: str = "auto") -> ProcessGroup:
        """The group torchrun's environment describes (or the caller initialized), on this rank's device."""
        initialized = dist.is_available() and dist.is_initialized()
        world_size = dist.get_world_size() if initialized else int(os.environ.get("WORLD_SIZE", "1"))
        device = resolve_device(device_setting)
        if world_size <= 1:
            return cls(device=device)
        if device.type == "cuda":  # one GPU per process: torchrun numbers them with LOCAL_RANK
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        if not initialized:
            backend = os.environ.get(BACKEND_VARIABLE, "").strip().lower() or \
                ("nccl" if device.type == "cuda" else "gloo")
            if backend not in BACKENDS:
                raise ConfigError(f"{BACKEND_VARIABLE}={backend!r} is not a backend; valid backends are: "
                                  f"{', '.join(BACKENDS)}")
            if not dist.is_available():
                raise ConfigError("WORLD_SIZE > 1 asks for several processes, but this torch build has no "
                                  "torch.distributed")
            dist.init_process_group(backend)  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
        group = cls(rank=dist.get_rank(), world_size=dist.get_world_size(), device=device, owned=not initialized)
        logger.info("process %d of %d (%s backend) on %s", group.rank, group.world_size, dist.get_backend(),
                    device)
        return group

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 writes checkpoints and logs, validates and calls the step hook."""
        return self.rank == 0

    def leave(self) -> None:
        if self.owned and dist.is_initialized():
            dist.destroy_process_group()

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def my_shard(self, size: int) -> tuple[int, int]:
        return shard_bounds(size, self.world_size)[self.rank]

    def gather_rows(self, rows: torch.Tensor, counts: list[int]) -> list[torch.Tensor]:
        """Every rank's rows, rank by rank, differentiable; ``counts[r]`` is how many rows rank r holds."""
        if not self.enabled:
            return [rows]
        return list(_GatherRows.apply(rows.contiguous(), tuple(counts)))

    def average_gradients(self, parameters) -> None:
        """Mean of every rank's gradients, in one all-reduce (parameters without a gradient are skipped; the
        model is the same on every rank, so they are the same ones)."""
        if not self.enabled:
            return
        gradients = [parameter.grad for parameter in parameters if parameter.grad is not None]
        flat = torch.cat([gradient.reshape(-1) for gradient in gradients])
        dist.all_reduce(flat)
        flat /= self.world_size
        offset = 0
        for gradient in gradients:
            gradient.copy_(flat[offset: offset + gradient.numel()].view_as(gradient))
            offset += gradient.numel()

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Rank 0's weights and buffers on every rank (so all replicas start equal)."""
        if self.enabled:
            with torch.no_grad():
                for tensor in module.state_dict().values():
                    dist.broadcast(tensor, src=0)

    def broadcast_object(self, value: Any) -> Any:
        """Rank 0's ``value`` (picklable) on every rank."""
        if not self.enabled:
            return value
        holder = [value]
        dist.broadcast_object_list(holder, src=0)
        return holder[0]

    def all_gather_object(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order."""
        if not self.enabled:
            return [value]
        values: list[Any] = [None] * self.world_size
        dist.all_gather_object(values, value)
        return values

    def any_true(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank (one all-reduce): every rank takes the same branch, e.g. all
        stop at the step where one of them got a stop signal."""
        if not self.enabled:
            return flag
        value = torch.tensor([1 if flag else 0], device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())
