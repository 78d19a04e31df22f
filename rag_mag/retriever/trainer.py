"""Contrastive training of a MagnitudeEncoder under one similarity strategy.

The trainer knows the encoder, the loss and the data; it knows nothing of Haystack. Output folder:

* ``best/``  the validated checkpoint chosen by ``selection`` (what users index with): by default the
  earliest one within one standard error of the best validation nDCG@10, step 0 included (``selection.py``);
* ``validated/step-N/``  the validated checkpoints that rule may still choose (the others are deleted);
* ``last/``  the latest checkpoint plus ``trainer_state.json`` and ``optimizer.safetensors`` (for resuming),
  written whole into a staging folder and swapped in (a kill leaves the previous one; a save that cannot
  fit on the disk is refused before the staging folder is made, and one that fills it ends in one
  ``DiskFullError``); a run resumes from it only when it is complete and was written with the same data and
  settings (``_should_resume``);
* ``train_log.jsonl``  one JSON line per logged step and per validation.

Nothing here is pickled: optimizer state is saved as safetensors, the rest as JSON.

Under ``torchrun --nproc_per_node N`` the same run is spread over N processes (``distributed.py``):
``batch_size`` is the global batch, every process embeds its contiguous slice of it, the embeddings of all
processes are gathered with their gradients, and every process computes the loss of the whole global batch,
so in-batch negatives and gradients are those of one process with that batch. Rank 0 alone writes
checkpoints and logs and validates. A checkpoint counts global steps, so a run resumes with any number of
processes and continues the same schedule of global batches.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch.optim.lr_scheduler import LambdaLR

from rag_mag import durable
from rag_mag.data import Passage, Triple, read_triples
from rag_mag.errors import CheckpointError, ConfigError, DataError, TrainingError
from rag_mag.metrics.retrieval import judge_supporting, score_retrieval
from rag_mag.precision import autocast, describe, use_bf16
from rag_mag.retriever.config import TrainConfig
from rag_mag.retriever.diagnostics import norm_statistics
from rag_mag.retriever.distributed import ProcessGroup, shard_bounds
from rag_mag.retriever.encoder import CONFIG_NAME, MagnitudeEncoder
from rag_mag.retriever.loss import InfoNCELoss
from rag_mag.retriever.recipes import (
    freeze_below_top_layers,
    frozen_start,
    pull_toward_start,
    ranking_divergence,
    starting_weights,
)
from rag_mag.retriever.selection import within_one_standard_error

logger = logging.getLogger(__name__)

STATE_NAME = "trainer_state.json"
RNG_KEY = "rng.torch"  # rank 0's generator; rank r > 0 of a multi-process run is saved as "rng.torch.r"
# Rank r seeds its generator with seed + r * RANK_SEED_STRIDE: every process draws its own dropout masks.
RANK_SEED_STRIDE = 1_000_003
OPTIMIZER_NAME = "optimizer.safetensors"
# Below this coefficient of variation a raw side carries (almost) no magnitude signal.
COLLAPSE_CV = 1e-3
# Above this mean cosine between different passages of a batch, directions have collapsed together.
COLLAPSE_COSINE = 0.98
# Settings that may change between a run and its resumption (how long and how it runs, not what it learns);
# the data files are compared by content (sha256), not by path.
RESUMABLE_CHANGES = frozenset({"out", "resume", "resume_anyway", "steps", "eval_every", "log_every", "save_every",
                               "threads", "device", "precision", "bf16", "train_data", "val_data"})
# Settings baked into the saved model: with --resume-anyway the checkpoint's values are kept (and recorded).
ENCODER_FIELDS = ("strategy", "base_model", "pooling", "query_max_length", "document_max_length")


@dataclass
class TrainResult:
    best_dir: Path
    last_dir: Path
    step: int
    best_metrics: dict[str, float] = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)


# ----------------------------------------------------------------------------- data
def split_triples(triples: list[Triple], fraction: float, seed: int) -> tuple[list[Triple], list[Triple]]:
    """Hold out a seeded share of queries for validation (by query text, so duplicates stay together)."""
    if fraction <= 0:
        return triples, []
    queries = sorted({t.query for t in triples})
    random.Random(seed).shuffle(queries)
    held_out = set(queries[: max(1, int(len(queries) * fraction))])
    train = [t for t in triples if t.query not in held_out]
    if not train:
        raise DataError("validation split left no training queries; lower --val-fraction or add data")
    return train, [t for t in triples if t.query in held_out]


def make_batch(triples: list[Triple], step: int, config: TrainConfig) -> list[tuple[Triple, Passage, list[Passage]]]:
    """The examples of one step: a deterministic function of (seed, step), so resuming replays exactly."""
    per_epoch = max(1, len(triples) // config.batch_size)
    epoch, offset = divmod(step, per_epoch)
    order = list(range(len(triples)))
    random.Random(config.seed * 1_000_003 + epoch).shuffle(order)
    rng = random.Random(config.seed * 7_919 + step)
    batch = []
    for index in order[offset * config.batch_size:(offset + 1) * config.batch_size]:
        triple = triples[index]
        positive = rng.choice(triple.positives)
        pool = list(triple.hard_negatives)
        negatives = rng.sample(pool, min(config.hard_negatives, len(pool)))
        batch.append((triple, positive, negatives))
    return batch


def false_negative_mask(batch: list[tuple[Triple, Passage, list[Passage]]], documents: list[Passage]) -> torch.Tensor:
    """(batch, n_docs) True where a document other than the query's own positive is also one of its positives."""
    mask = torch.zeros(len(batch), len(documents), dtype=torch.bool)
    for row, (triple, _, _) in enumerate(batch):
        own = {p.id for p in triple.positives} | {p.text for p in triple.positives}
        for column, document in enumerate(documents):
            if column != row and (document.id in own or document.text in own):
                mask[row, column] = True
    return mask


def rng_key(rank: int) -> str:
    """Where rank ``rank``'s generator state is saved (rank 0 under the key single-process runs use)."""
    return RNG_KEY if rank == 0 else f"{RNG_KEY}.{rank}"


def checkpoint_bytes(encoder: MagnitudeEncoder, optimizer: torch.optim.Optimizer) -> int:
    """At least what one ``last/`` takes on disk: the weights and the optimizer's state (the tokenizer and the
    JSON files add a little more)."""
    moments = [value for state in optimizer.state.values() for value in state.values() if torch.is_tensor(value)]
    return encoder.weight_bytes() + sum(value.numel() * value.element_size() for value in moments)


# ----------------------------------------------------------------------------- statistics
def mean_pairwise_cosine(raw: torch.Tensor) -> float:
    unit = torch.nn.functional.normalize(raw.detach().float(), dim=-1)
    cosines = unit @ unit.T
    n = cosines.shape[0]
    return float((cosines.sum() - cosines.diagonal().sum()) / max(n * (n - 1), 1))


# ----------------------------------------------------------------------------- validation
@torch.inference_mode()
def validation_scores(encoder: MagnitudeEncoder, validation: list[Triple], distractors: Sequence[Passage] = (),
                      bf16: bool = False) -> tuple[dict[str, float], list[float]]:
    """Rank one pool for every validation query: recall@1/5/20 and nDCG@10 means, and each query's nDCG@10
    (in percent). The pool is every validation query's positives and hard negatives, plus ``distractors``
    (``eval/probe_validation.py`` widens it with the training passages); a query's positives are relevant."""
    pool: dict[str, Passage] = {}
    for passage in (*(p for triple in validation for p in (*triple.positives, *triple.hard_negatives)),
                    *distractors):
        pool.setdefault(passage.id, passage)
    ids = list(pool)
    documents = encoder.encode([pool[i].content for i in ids], "document", bf16=bf16)
    queries = encoder.encode([t.query for t in validation], "query", bf16=bf16)
    top = np.argsort(-(queries @ documents.T), axis=1)[:, :20]
    judgements = [judge_supporting([ids[j] for j in row], [p.id for p in triple.positives])
                  for row, triple in zip(top, validation, strict=True)]
    scores = score_retrieval(judgements, ks=(1, 5, 20))
    per_query = [round(100.0 * float(v), 2) for v in scores.per_example["ndcg@10"]]
    return {name: scores.means[name] for name in ("recall@1", "recall@5", "recall@20", "ndcg@10")}, per_query


# ----------------------------------------------------------------------------- trainer
class Trainer:
    """``on_step(step, encoder)``, when given, runs at step 0 (fresh runs) and after every optimizer step: the
    crossover study measures its curves there, from the checkpoints of one run."""

    def __init__(self, config: TrainConfig, on_step: Callable[[int, MagnitudeEncoder], None] | None = None) -> None:
        self.config = config
        self.on_step = on_step
        self.out = Path(config.out)
        self.best_dir, self.last_dir = self.out / "best", self.out / "last"
        self.log_path = self.out / "train_log.jsonl"
        self.validated_dir = self.out / "validated"
        # one_se: the checkpoints it may still choose, by step: {"metrics": {...}, "per_query": [nDCG@10 ...]}
        self.candidates: dict[str, dict] = {}
        self.step: int | None = None  # the step the weights are at, while train() runs
        # the last validation (step, queries) -> scores: an on_step hook and the trainer validate the same
        # weights at a checkpoint step, so the second asks for scores the first computed
        self._last_validation: tuple[tuple, tuple[dict[str, float], list[float]]] | None = None
        self.device = torch.device("cpu")
        self.bf16 = False  # decided in train() from config.precision and the device
        self.data_fingerprint: dict[str, str | None] = {}
        self.group = ProcessGroup()  # the processes of this run, joined in train()
        # the step whose hook or validation is running, or that last/ says did not finish them
        self._unfinished_step: int | None = None

    # ---- set-up
    def _load_data(self) -> tuple[list[Triple], list[Triple]]:
        triples = read_triples(self.config.train_data)
        if self.config.val_data:
            validation = read_triples(self.config.val_data)
            overlap = {t.query for t in triples} & {t.query for t in validation}
            if overlap:
                raise DataError(f"{len(overlap)} validation queries also appear in the training data "
                                f"(e.g. {sorted(overlap)[0]!r}); remove them from one of the files")
            train = triples
        else:
            train, validation = split_triples(triples, self.config.val_fraction, self.config.seed)
        if len(train) < self.config.batch_size:
            logger.warning("only %d training queries for a batch size of %d", len(train), self.config.batch_size)
        return train, validation[: self.config.val_max_queries]

    def _build_optimizer(self, encoder: MagnitudeEncoder) -> tuple[torch.optim.Optimizer, LambdaLR]:
        decay, no_decay = [], []
        for name, parameter in encoder.model.named_parameters():
            if not parameter.requires_grad:
                continue  # frozen by train_layers
            # no weight decay on biases and LayerNorm weights (1-d tensors)
            (no_decay if parameter.ndim < 2 or "norm" in name.lower() else decay).append(parameter)
        groups = [
            {"params": decay, "lr": self.config.learning_rate, "weight_decay": self.config.weight_decay},
            {"params": no_decay, "lr": self.config.learning_rate, "weight_decay": 0.0},
        ]
        if encoder.degrees.learnable:
            groups.append({"params": [encoder.degrees.query_logit, encoder.degrees.document_logit],
                           "lr": self.config.gamma_learning_rate, "weight_decay": 0.0})
        optimizer = torch.optim.AdamW(groups, betas=(0.9, 0.98))
        warmup = int(self.config.steps * self.config.warmup_ratio)

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / (warmup + 1)
            progress = (step - warmup) / max(1, self.config.steps - warmup)
            return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

        return optimizer, LambdaLR(optimizer, schedule)

    def _calibrate(self, encoder: MagnitudeEncoder, triples: list[Triple]) -> None:
        """Measure each side's mean raw norm at initialization (recorded in the checkpoint)."""
        sample = random.Random(self.config.seed).sample(triples, min(len(triples), self.config.calibration_samples))
        queries = encoder.encode([t.query for t in sample], "query", treated=False)
        documents = encoder.encode([t.positives[0].content for t in sample], "document", treated=False)
        encoder.config.query_norm_scale = float(np.linalg.norm(queries, axis=1).mean())
        encoder.config.document_norm_scale = float(np.linalg.norm(documents, axis=1).mean())
        logger.info("calibrated norm scales: query %.3f, document %.3f (raw sides are divided by them)",
                    encoder.config.query_norm_scale, encoder.config.document_norm_scale)

    # ---- checkpoints
    def _checkpoint(self, encoder: MagnitudeEncoder, optimizer: torch.optim.Optimizer, step: int,
                    best_metrics: dict) -> None:
        """Every rank: check the weights, hand rank 0 its generator state; rank 0 writes ``last/``."""
        if not all(torch.isfinite(p).all() for p in encoder.parameters()):
            raise TrainingError(f"non-finite weights at step {step}; the last good checkpoint in {self.last_dir} "
                                "was kept. Lower --learning-rate or raise --temperature")
        rng_states = self.group.all_gather_object(torch.get_rng_state())
        if self.group.is_main:
            self._save_last(encoder, optimizer, step, best_metrics, rng_states)
        self.group.barrier()  # when train() returns on any rank, the checkpoint is complete

    def _save_last(self, encoder: MagnitudeEncoder, optimizer: torch.optim.Optimizer, step: int,
                   best_metrics: dict, rng_states: list[torch.Tensor], finished: bool = True) -> None:
        """Write model, optimizer, RNG and state complete into a staging folder, fsync it, swap it in.

        The previous ``last/`` stays in place until the new one replaces it in one rename, so a kill at any
        moment leaves one complete checkpoint (``trainer_state.json`` lists every other file and its size).
        ``rng_states`` holds each rank's generator state, in rank order (rank 0's alone when interrupted).
        ``finished`` is False when an interrupt came inside the step's hook or validation (``_finish_step``).
        """
        what = f"the checkpoint {self.last_dir}"
        needed = checkpoint_bytes(encoder, optimizer)
        durable.ensure_free_space(self.last_dir.parent, needed, what)  # refused before a byte is staged
        staging = durable.staging_dir(self.last_dir)
        try:
            with durable.disk_full_as_error(self.last_dir, what, needed):
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
                state = {"step": step, "step_finished": finished, "world_size": self.group.world_size,
                         "best_metrics": best_metrics, "candidates": self.candidates, "param_group_sizes": slots,
                         "config": self.config.to_dict(), "data_fingerprint": self.data_fingerprint, "files": files}
                (staging / STATE_NAME).write_text(json.dumps(state, indent=2))
                durable.fault_point("checkpoint:state")
                durable.sync_tree(staging)
                durable.fault_point("checkpoint:synced")
                durable.replace_dir(staging, self.last_dir, fault_prefix="checkpoint")
                durable.fault_point("checkpoint:done")
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _data_fingerprint(self) -> dict[str, str | None]:
        """sha256 of the training (and validation) file: a resumed run must see the same data."""
        return {name: durable.sha256_of(path) if path else None
                for name, path in (("train_data", self.config.train_data), ("val_data", self.config.val_data))}

    def _missing_parts(self, folder: Path) -> list[str]:
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

    def _should_resume(self) -> bool:
        """Whether to resume from ``last/``; recovers from an interrupted save, refuses an incomplete or
        incompatible checkpoint (CheckpointError) instead of silently starting over."""
        if self.group.is_main:
            durable.recover_dir(self.last_dir, is_complete=lambda folder: not self._missing_parts(folder))
        self.group.barrier()  # the other ranks read last/ once rank 0 has recovered it
        if not self.config.resume:
            if self.last_dir.exists():
                logger.warning("--no-resume: starting over; %s will be replaced at the first save", self.last_dir)
            return False
        if not self.last_dir.exists():
            return False
        missing = self._missing_parts(self.last_dir)
        if missing:
            raise CheckpointError(f"the checkpoint {self.last_dir} is incomplete (missing: {', '.join(missing)}); "
                                  "it is not taken as a fresh start. Restore the folder from a backup, or pass "
                                  "--no-resume to start over (that replaces it)")
        state = json.loads((self.last_dir / STATE_NAME).read_text())
        differences = self._differences(state)
        if differences and not self.config.resume_anyway:
            raise CheckpointError(f"cannot resume {self.last_dir}: the settings differ from the run it holds "
                                  f"({'; '.join(differences)}). Pass the same settings, use a new --out, pass "
                                  "--no-resume to start over, or --resume-anyway to continue with the "
                                  "checkpoint's model")
        if differences:
            saved = state.get("config", {})
            kept = {name: saved[name] for name in ENCODER_FIELDS if name in saved}
            logger.warning("--resume-anyway: resuming although %s; the checkpoint's %s are kept",
                           "; ".join(differences), ", ".join(f"{k}={v!r}" for k, v in kept.items()))
            self.config = replace(self.config, **kept)
        return True

    def _differences(self, state: dict) -> list[str]:
        """The settings of this run that differ from those recorded in a checkpoint's state."""
        saved, current = state.get("config") or {}, self.config.to_dict()
        differences = [f"{name}={saved[name]!r} in the checkpoint, {current[name]!r} now"
                       for name in current if name in saved and name not in RESUMABLE_CHANGES
                       and saved[name] != current[name]]
        recorded = state.get("data_fingerprint") or {}
        for name, digest in self.data_fingerprint.items():
            if name in recorded and recorded[name] != digest:
                differences.append(f"{name}: the file's contents differ (sha256 {str(recorded[name])[:12]} in "
                                   f"the checkpoint, {str(digest)[:12]} now)")
        return differences

    def _rewind_log(self, step: int) -> None:
        """Keep only the log records up to ``step``: a resumed run logs the later steps again."""
        if not self.log_path.is_file():
            return
        kept = []
        for line in self.log_path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line torn by a kill in the middle of a write
                continue
            if isinstance(record, dict) and record.get("step", 0) <= step:
                kept.append(line)
        durable.write_text(self.log_path, "".join(line + "\n" for line in kept))

    def _resume(self, optimizer: torch.optim.Optimizer, scheduler) -> tuple[int, dict]:
        try:
            state = json.loads((self.last_dir / STATE_NAME).read_text())
            tensors = load_file(str(self.last_dir / OPTIMIZER_NAME))
        except (OSError, json.JSONDecodeError, ValueError, RuntimeError) as error:
            raise CheckpointError(f"cannot resume from {self.last_dir}: {error}. Delete that folder to start "
                                  "over, or pass --no-resume") from None
        if state["param_group_sizes"] != [len(g["params"]) for g in optimizer.param_groups]:
            raise CheckpointError(f"{self.last_dir} was written for another model or strategy; use a new --out "
                                  "or pass --no-resume")
        rng_states = {key: tensors.pop(key) for key in list(tensors) if key == RNG_KEY or key.startswith(RNG_KEY + ".")}
        step = int(state["step"])
        if rng_key(self.group.rank) in rng_states:
            torch.set_rng_state(rng_states[rng_key(self.group.rank)])
        elif rng_states:  # written by fewer processes, or saved on an interrupt: this rank's draws start afresh
            logger.info("rank %d: %s holds no generator state for this rank (written by %s processes); its "
                        "dropout masks are drawn from a new seed", self.group.rank, self.last_dir,
                        state.get("world_size", 1))
            torch.manual_seed(self.config.seed + self.group.rank * RANK_SEED_STRIDE + step)
        for key, value in tensors.items():
            group_index, param_index, slot = key.split(".", 2)
            parameter = optimizer.param_groups[int(group_index)]["params"][int(param_index)]
            # moments live beside their parameter; AdamW's scalar step counter stays on the CPU
            optimizer.state[parameter][slot] = value.to(parameter.device) if value.ndim else value
        scheduler.last_epoch = step
        for group, base_lr, factor in zip(optimizer.param_groups, scheduler.base_lrs,
                                          [fn(step) for fn in scheduler.lr_lambdas], strict=True):
            group["lr"] = base_lr * factor
        self.candidates = state.get("candidates", {})
        # checkpoints from before the flag count as finished
        self._unfinished_step = None if state.get("step_finished", True) else step
        return step, state.get("best_metrics", {})

    # ---- validation
    def validate(self, encoder: MagnitudeEncoder, validation: list[Triple]) -> dict[str, float]:
        """Rank the pool of all validation passages for each validation query (recall@k, nDCG@10)."""
        return self.validation_scores(encoder, validation)[0]

    def validation_scores(self, encoder: MagnitudeEncoder, validation: list[Triple],
                          ) -> tuple[dict[str, float], list[float]]:
        """``validate``'s means, and each query's nDCG@10 (in percent)."""
        key = (self.step, tuple(triple.query for triple in validation))
        if self.step is not None and self._last_validation and self._last_validation[0] == key:
            return self._last_validation[1]
        result = validation_scores(encoder, validation, bf16=self.bf16)
        self._last_validation = (key, result)
        return result

    # ---- the loop
    def train(self) -> TrainResult:
        """Train in this process, or as one of the processes torchrun started (see the module docstring)."""
        self.group = ProcessGroup.join(self.config.device)
        try:
            return self._train()
        finally:
            self.step = None
            self.group.leave()

    def _train(self) -> TrainResult:
        config = self.config
        main = self.group.is_main
        torch.manual_seed(config.seed + self.group.rank * RANK_SEED_STRIDE)
        if config.threads:
            torch.set_num_threads(config.threads)
        train, validation = self._load_data()
        if min(len(train), config.batch_size) < self.group.world_size:
            raise ConfigError(f"a global batch of {min(len(train), config.batch_size)} queries cannot be shared "
                              f"by {self.group.world_size} processes; raise --batch-size or start fewer")
        self.data_fingerprint = self._data_fingerprint()
        resuming = self._should_resume()
        config = self.config  # --resume-anyway keeps the checkpoint's model settings
        self.device = self.group.device
        self.bf16 = use_bf16(config.precision, self.device)
        logger.info("training on %s%s", describe(config.precision, self.device),
                    f" (process {self.group.rank} of {self.group.world_size})" if self.group.enabled else "")
        if resuming:
            encoder = MagnitudeEncoder.load(self.last_dir)
            if encoder.config.strategy != config.strategy:
                raise CheckpointError(f"{self.last_dir} holds a {encoder.config.strategy} run, not "
                                      f"{config.strategy}; use a new --out or pass --no-resume")
        else:
            encoder = MagnitudeEncoder.build(config.base_model or None, config.strategy, config.pooling,
                                             config.query_max_length, config.document_max_length,
                                             config.temperature)
            if config.calibrate_norms and main:
                self._calibrate(encoder.to(self.device), train)
        encoder.to(self.device)
        self.group.broadcast_module(encoder)  # every replica starts from rank 0's weights and norm scales
        encoder.config.query_norm_scale, encoder.config.document_norm_scale = self.group.broadcast_object(
            (encoder.config.query_norm_scale, encoder.config.document_norm_scale))
        encoder.config.training = config.to_dict()
        freeze_below_top_layers(encoder.model, config.train_layers)
        self._anchor = starting_weights(encoder.model, config) if config.anchor_weight else None
        self._teacher = frozen_start(encoder, config).to(self.device) if config.distill_weight else None
        optimizer, scheduler = self._build_optimizer(encoder)
        step, best_metrics = self._resume(optimizer, scheduler) if resuming else (0, {})
        self.step = step
        if resuming and main:
            logger.info("resuming %s from step %d of %d", self.last_dir, step, config.steps)
        self.out.mkdir(parents=True, exist_ok=True)
        if main:
            self._rewind_log(step)
        loss_fn = InfoNCELoss(config.temperature)
        history: list[dict] = []
        from tqdm.auto import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        progress = tqdm(total=config.steps, initial=step, desc=f"train {config.strategy}", unit="step",
                        disable=not main)
        if self.on_step is not None and main and step == 0:
            self.on_step(0, encoder)
        if validation and step == 0 and config.selection == "one_se":  # the starting model is a candidate
            if main:
                best_metrics = self._validate_and_keep_best(encoder, validation, 0, best_metrics, history)
            best_metrics = self.group.broadcast_object(best_metrics)
        if self._unfinished_step is not None:
            # interrupted inside the step's own work (its hook or validation): last/ holds exactly that step's
            # weights, so finish that work now instead of losing that step's curve point and best/ candidate
            logger.info("finishing step %d's measurements, which the interrupted run did not complete", step)
            best_metrics = self._finish_step(encoder, optimizer, step, None, validation, best_metrics, history)
        encoder.train()
        started = time.perf_counter()
        with logging_redirect_tqdm():
            try:
                while step < config.steps:
                    record = self._step(encoder, loss_fn, optimizer, scheduler, train, step)
                    step += 1
                    self.step = step
                    progress.update(1)
                    progress.set_postfix(loss=f"{record['loss']:.3f}", acc=f"{record['accuracy']:.2f}")
                    record.update(step=step, seconds=round(time.perf_counter() - started, 1))
                    best_metrics = self._finish_step(encoder, optimizer, step, record, validation, best_metrics,
                                                     history)
            except KeyboardInterrupt:
                progress.close()
                if step > 0 and main:  # no collective here: the other processes may be gone already
                    self._save_last(encoder, optimizer, step, best_metrics, [torch.get_rng_state()],
                                    finished=self._unfinished_step != step)
                logger.warning("interrupted at step %d; run the same command again to resume", step)
                raise
            finally:
                progress.close()  # also on an error: its line would otherwise run into the error's line
        if not validation and main:
            encoder.save(self.best_dir)  # nothing to select on: the final model is the best we know
        self.group.barrier()
        return TrainResult(self.best_dir, self.last_dir, step, best_metrics, history)

    def _finish_step(self, encoder, optimizer, step: int, record: dict | None, validation: list[Triple],
                     best_metrics: dict, history: list[dict]) -> dict:
        """What follows an optimizer step: the hook, the log, validation, and the checkpoint.

        ``_unfinished_step`` marks the step while its hook and validation run: an interrupt there saves
        ``last/`` flagged unfinished, and the resumed run calls this again for that step (``record`` None: the
        step's loss is not replayed) before training on."""
        config, main = self.config, self.group.is_main
        self._unfinished_step = step
        if self.on_step is not None and main:
            self.on_step(step, encoder)
            encoder.train()
        if record is not None and (step % config.log_every == 0 or step == config.steps):
            self._log(record, history)
            if main:
                self._watch_collapse(record, encoder)
        evaluate_now = config.eval_every and step % config.eval_every == 0
        if validation and (evaluate_now or step == config.steps):
            if main:
                best_metrics = self._validate_and_keep_best(encoder, validation, step, best_metrics, history)
            best_metrics = self.group.broadcast_object(best_metrics)
        self._unfinished_step = None
        if step % config.save_every == 0 or step == config.steps:
            self._checkpoint(encoder, optimizer, step, best_metrics)
        return best_metrics

    def _step(self, encoder, loss_fn, optimizer, scheduler, train, step: int) -> dict:
        batch = make_batch(train, step, self.config)  # the global batch; this process embeds its shard
        documents = [positive for _, positive, _ in batch] + [n for _, _, negatives in batch for n in negatives]
        start, end = self.group.my_shard(len(batch))
        with autocast(self.device, self.bf16):
            bucket = self.config.length_bucket_size
            shard = batch[start:end]
            raw_queries = encoder.embed_queries([triple.query for triple, _, _ in shard], bucket)  # (shard, dim)
            raw_documents = encoder.embed_documents(  # (shard docs, dim): positives, then hard negatives
                [p.content for _, p, _ in shard] + [n.content for _, _, negatives in shard for n in negatives],
                bucket)
        raw_queries, raw_documents = self._gather_batch(batch, raw_queries.float(), raw_documents.float())
        # from here on every process holds the whole batch: (batch, dim) and (n_docs, dim)
        queries = encoder.treat_queries(raw_queries)
        treated_documents = encoder.treat_documents(raw_documents)
        hard_negatives = treated_documents[len(batch):]
        excluded = false_negative_mask(batch, documents).to(self.device)
        output = loss_fn(queries, treated_documents[: len(batch)],
                         hard_negatives if hard_negatives.shape[0] else None, false_negatives=excluded)
        loss = output["loss"]
        divergence = None
        if self._teacher is not None:
            divergence = self._divergence_from_start(batch, queries @ treated_documents.T, excluded)
            loss = loss + self.config.distill_weight * divergence
        if not torch.isfinite(loss):
            raise TrainingError(f"loss became {loss.item()} at step {step + 1}; nothing was saved over the last "
                                f"good checkpoint in {self.last_dir}. Lower --learning-rate, raise --temperature "
                                "or pass --precision fp32")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.group.average_gradients(encoder.parameters())  # the gradient of the global batch's loss
        gradient_norm = torch.nn.utils.clip_grad_norm_(encoder.parameters(), self.config.max_grad_norm)
        if not torch.isfinite(gradient_norm):
            raise TrainingError(f"gradient norm became {gradient_norm.item()} at step {step + 1}; lower "
                                "--learning-rate or raise --temperature")
        optimizer.step()
        if self._anchor is not None:
            pull_toward_start(encoder.model, self._anchor, scheduler.get_last_lr()[0] * self.config.anchor_weight)
        scheduler.step()
        norms = norm_statistics(raw_queries.detach().float().cpu().numpy(),
                                raw_documents.detach().float().cpu().numpy())
        query_degree, document_degree = encoder.degrees.as_floats()
        return {"loss": loss.item(), "accuracy": float(output["accuracy"]), "grad_norm": float(gradient_norm),
                **({"divergence": divergence.item()} if divergence is not None else {}), **norms.to_dict(),
                "document_cosine": mean_pairwise_cosine(raw_documents),
                "g_query": query_degree, "g_document": document_degree, "lr": scheduler.get_last_lr()[0]}

    def _divergence_from_start(self, batch, scores: torch.Tensor, excluded: torch.Tensor) -> torch.Tensor:
        """KL from the starting encoder's in-batch ranking of each query to the trained one's (``scores``:
        (batch, n_docs), the trained encoder's scores of the loss's candidates, in its order)."""
        teacher = self._teacher
        start, end = self.group.my_shard(len(batch))
        shard, bucket = batch[start:end], self.config.length_bucket_size
        with torch.no_grad(), autocast(self.device, self.bf16):
            raw_queries = teacher.embed_queries([triple.query for triple, _, _ in shard], bucket)
            raw_documents = teacher.embed_documents(
                [p.content for _, p, _ in shard] + [n.content for _, _, negatives in shard for n in negatives],
                bucket)
        raw_queries, raw_documents = self._gather_batch(batch, raw_queries.float(), raw_documents.float())
        reference = teacher.treat_queries(raw_queries) @ teacher.treat_documents(raw_documents).T
        return ranking_divergence(scores, reference, self.config.temperature, excluded)

    def _gather_batch(self, batch, raw_queries: torch.Tensor, raw_documents: torch.Tensor,
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every process's embeddings of the global batch, differentiable, laid out as one process lays them
        out: queries (batch, dim) and documents (n_docs, dim), all positives first, then every hard negative
        in batch order. This process holds its shard's queries (shard, dim) and documents (shard docs, dim)."""
        if not self.group.enabled:
            return raw_queries, raw_documents
        shards = [batch[start:end] for start, end in shard_bounds(len(batch), self.group.world_size)]
        counts = [2 * len(shard) + sum(len(negatives) for _, _, negatives in shard) for shard in shards]
        pieces = self.group.gather_rows(torch.cat([raw_queries, raw_documents]), counts)
        queries = torch.cat([piece[: len(shard)] for piece, shard in zip(pieces, shards, strict=True)])
        positives = [piece[len(shard): 2 * len(shard)] for piece, shard in zip(pieces, shards, strict=True)]
        negatives = [piece[2 * len(shard):] for piece, shard in zip(pieces, shards, strict=True)]
        return queries, torch.cat(positives + negatives)

    def _watch_collapse(self, record: dict, encoder: MagnitudeEncoder) -> None:
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

    def _validate_and_keep_best(self, encoder, validation, step, best_metrics, history) -> dict:
        metrics, per_query = self.validation_scores(encoder, validation)
        encoder.train()
        if self.config.selection == "max":
            improved = metrics["ndcg@10"] > best_metrics.get("ndcg@10", -1.0)
            self._log({"step": step, "validation": metrics, "best": improved}, history)
            if improved:
                encoder.save(self.best_dir)
                return {**metrics, "step": step}
            return best_metrics
        return self._keep_within_one_standard_error(encoder, step, metrics, per_query, history)

    def _keep_within_one_standard_error(self, encoder, step, metrics, per_query, history) -> dict:
        """The one_se rule (``selection.py``): keep this checkpoint while the rule may still choose it, drop
        those it no longer may, and copy the chosen one to ``best/`` (every time, so a kill between the copy
        and the next ``last/`` cannot leave ``best/`` out of step with the resumed state)."""
        candidates = {**self.candidates, str(step): {"metrics": metrics, "per_query": per_query}}
        chosen, band = within_one_standard_error({int(s): c["per_query"] for s, c in candidates.items()})
        if step in band:
            encoder.save(self.validated_dir / f"step-{step}")
        self.candidates = {str(s): candidates[str(s)] for s in band}
        for folder in self.validated_dir.glob("step-*") if self.validated_dir.is_dir() else ():
            if folder.name.removeprefix("step-") not in self.candidates:
                shutil.rmtree(folder, ignore_errors=True)
        chosen_dir = self.validated_dir / f"step-{chosen}"
        if not chosen_dir.is_dir():  # resumed from a checkpoint written before validated/ existed
            raise CheckpointError(f"{chosen_dir} is missing, so best/ cannot be set to step {chosen}; pass "
                                  "--no-resume to start over, or --selection max")
        staging = durable.staging_dir(self.best_dir)
        try:
            with durable.disk_full_as_error(self.best_dir, f"the checkpoint {self.best_dir}"):
                shutil.copytree(chosen_dir, staging, dirs_exist_ok=True)
                durable.sync_tree(staging)
                durable.replace_dir(staging, self.best_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self._log({"step": step, "validation": metrics, "best": chosen == step, "chosen": chosen,
                   "band": band}, history)
        return {**candidates[str(chosen)]["metrics"], "step": chosen}

    def _log(self, record: dict, history: list[dict]) -> None:
        history.append(record)
        if not self.group.is_main:
            return
        durable.append_line(self.log_path, json.dumps(record))
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
