"""The training loop: contrastive training of a MagnitudeEncoder under one similarity strategy.

The trainer knows the encoder, the loss and the data; it knows nothing of Haystack. Output folder:

* ``best/``  the validated checkpoint the ``selection`` rule chooses (what users index with; ``validation.py``);
* ``validated/step-N/``  the validated checkpoints that rule may still choose (the others are deleted);
* ``last/``  the latest checkpoint plus ``trainer_state.json`` and ``optimizer.safetensors`` (for resuming),
  written whole into a staging folder and swapped in (``checkpoint.py``); a run resumes from it only
  when it is complete and was written with the same data and settings (``resume.py``);
* ``train_log.jsonl``  one JSON line per logged step and per validation (``log.py``).

Under ``torchrun --nproc_per_node N`` the same run is spread over N processes (``distributed.py``):
``batch_size`` is the global batch, every process embeds its contiguous slice of it, the embeddings of all
processes are gathered with their gradients (``batches.py``), and every process computes the loss of the whole
global batch, so in-batch negatives and gradients are those of one process with that batch. Rank 0 alone writes
checkpoints and logs and validates. A checkpoint counts global steps, so a run resumes with any number of
processes and continues the same schedule of global batches.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rag_mag import stopping
from rag_mag.data import Triple, read_corpus
from rag_mag.errors import ConfigError, TrainingError
from rag_mag.precision import autocast, describe, use_bf16
from rag_mag.retriever.diagnostics import norm_statistics
from rag_mag.retriever.encoder import MagnitudeEncoder
from rag_mag.retriever.loss import InfoNCELoss
from rag_mag.retriever.training.batches import (
    embed_shard,
    false_negative_mask,
    gather_batch,
    load_training_data,
    make_batch,
)
from rag_mag.retriever.training.checkpoint import RANK_SEED_STRIDE, load_last, save_last
from rag_mag.retriever.training.config import TrainConfig
from rag_mag.retriever.training.distributed import ProcessGroup
from rag_mag.retriever.training.log import mean_pairwise_cosine, rewind_log, watch_collapse, write_record
from rag_mag.retriever.training.optimizer import build_optimizer, resume_schedule
from rag_mag.retriever.training.recipes import (
    base_transformer,
    freeze_below_top_layers,
    frozen_start,
    pull_toward_start,
    ranking_divergence,
    starting_weights,
    wise_view,
)
from rag_mag.retriever.training.resume import data_fingerprint, should_resume
from rag_mag.retriever.training.start import starting_encoder
from rag_mag.retriever.training.validation import keep_highest, keep_within_one_standard_error, validation_scores

logger = logging.getLogger(__name__)


@dataclass
class TrainResult:
    best_dir: Path
    last_dir: Path
    step: int
    best_metrics: dict[str, float] = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)


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
        self._val_distractors: list | None = None  # val_corpus's passages, read at the first validation
        self.device = torch.device("cpu")
        self.bf16 = False  # decided in train() from config.precision and the device
        self.data_fingerprint: dict[str, str | None] = {}
        self.group = ProcessGroup()  # the processes of this run, joined in train()
        # the step whose hook or validation is running, or that last/ says did not finish them
        self._unfinished_step: int | None = None
        # the recipes' starting weights (L2-SP) and frozen starting encoder (distillation), set in train(); None
        # until then, so that a step runs outside train() too (eval/bench_training.py times _step alone)
        self._anchor: dict[str, torch.Tensor] | None = None
        self._teacher: MagnitudeEncoder | None = None
        self._wise_base: torch.nn.Module | None = None  # the base transformer of WiSE-FT (wise_alpha below 1)

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
        if self._val_distractors is None:  # read once: the pool widened by val_corpus, if any
            self._val_distractors = read_corpus(self.config.val_corpus) if self.config.val_corpus else []
        result = validation_scores(encoder, validation, self._val_distractors, bf16=self.bf16)
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
        main = self.group.is_main
        train, validation, resuming = self._set_up()
        config = self.config  # --resume-anyway keeps the checkpoint's model settings
        encoder = starting_encoder(config, self.last_dir, resuming, train, self.group, self.device)
        freeze_below_top_layers(encoder.model, config.train_layers)
        base = base_transformer(config) if config.anchor_weight or config.wise_alpha < 1 else None  # loaded once
        self._anchor = starting_weights(encoder.model, base) if config.anchor_weight else None
        self._teacher = frozen_start(encoder, config).to(self.device) if config.distill_weight else None
        self._wise_base = base.to(self.device) if config.wise_alpha < 1 else None
        optimizer, scheduler = build_optimizer(encoder, config)
        step, best_metrics = self._resume(optimizer, scheduler) if resuming else (0, {})
        self.step = step
        if resuming and main:
            logger.info("resuming %s from step %d of %d", self.last_dir, step, config.steps)
        self.out.mkdir(parents=True, exist_ok=True)
        if main:
            rewind_log(self.log_path, step)
        loss_fn = InfoNCELoss(config.temperature)
        history: list[dict] = []
        from tqdm.auto import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        progress = tqdm(total=config.steps, initial=step, desc=f"train {config.strategy}", unit="step",
                        disable=not main)
        best_metrics = self._measure_start(encoder, optimizer, step, validation, best_metrics, history)
        encoder.train()
        started = time.perf_counter()
        with logging_redirect_tqdm(), stopping.graceful():  # a stop signal is acted on between two steps
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
                    if self.group.any_true(stopping.requested() is not None):  # every rank stops at this step
                        self._stop(encoder, optimizer, step, best_metrics)
            except stopping.Stopped:
                raise
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
            self._published(encoder).save(self.best_dir)  # nothing to select on: the final model is the best
        self.group.barrier()
        return TrainResult(self.best_dir, self.last_dir, step, best_metrics, history)

    # ---- set-up
    def _set_up(self) -> tuple[list[Triple], list[Triple], bool]:
        """Seed this process, read the data, decide whether to resume, and choose the device and precision:
        the training and validation triples, and whether the run resumes from ``last/``."""
        config = self.config
        torch.manual_seed(config.seed + self.group.rank * RANK_SEED_STRIDE)
        if config.threads:
            torch.set_num_threads(config.threads)
        train, validation = load_training_data(config)
        if min(len(train), config.batch_size) < self.group.world_size:
            raise ConfigError(f"a global batch of {min(len(train), config.batch_size)} queries cannot be shared "
                              f"by {self.group.world_size} processes; raise --batch-size or start fewer")
        self.data_fingerprint = data_fingerprint(config)
        resuming, self.config = should_resume(config, self.last_dir, self.group, self.data_fingerprint)
        self.device = self.group.device
        self.bf16 = use_bf16(self.config.precision, self.device)
        logger.info("training on %s%s", describe(self.config.precision, self.device),
                    f" (process {self.group.rank} of {self.group.world_size})" if self.group.enabled else "")
        return train, validation, resuming

    def _resume(self, optimizer: torch.optim.Optimizer, scheduler) -> tuple[int, dict]:
        """Restore ``last/``'s optimizer, generator, schedule and selection state: its step and best metrics."""
        state = load_last(self.last_dir, optimizer, self.group.rank, self.config.seed)
        step = int(state["step"])
        resume_schedule(optimizer, scheduler, step)
        self.candidates = state.get("candidates", {})
        # checkpoints from before the flag count as finished
        self._unfinished_step = None if state.get("step_finished", True) else step
        return step, state.get("best_metrics", {})

    def _measure_start(self, encoder, optimizer, step: int, validation: list[Triple], best_metrics: dict,
                       history: list[dict]) -> dict:
        """Before the first step of this process: a fresh run's step 0 (the hook, and its validation as a
        candidate of one_se), or the measurements of the step an interrupt cut short."""
        main = self.group.is_main
        if self.on_step is not None and main and step == 0:
            self.on_step(0, self._published(encoder))
        if validation and step == 0 and self.config.selection == "one_se":  # the starting model is a candidate
            if main:
                best_metrics = self._validate_and_keep_best(encoder, validation, 0, best_metrics, history)
            best_metrics = self.group.broadcast_object(best_metrics)
        if self._unfinished_step is not None:
            # interrupted inside the step's own work (its hook or validation): last/ holds exactly that step's
            # weights, so finish that work now instead of losing that step's curve point and best/ candidate
            logger.info("finishing step %d's measurements, which the interrupted run did not complete", step)
            best_metrics = self._finish_step(encoder, optimizer, step, None, validation, best_metrics, history)
        return best_metrics

    # ---- one step
    def _step(self, encoder, loss_fn, optimizer, scheduler, train, step: int) -> dict:
        batch = make_batch(train, step, self.config)  # the global batch; this process embeds its shard
        documents = [positive for _, positive, _ in batch] + [n for _, _, negatives in batch for n in negatives]
        start, end = self.group.my_shard(len(batch))
        with autocast(self.device, self.bf16):
            raw_queries, raw_documents = embed_shard(encoder, batch[start:end], self.config.length_bucket_size)
        raw_queries, raw_documents = gather_batch(self.group, batch, raw_queries.float(), raw_documents.float())
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
        with torch.no_grad(), autocast(self.device, self.bf16):
            raw_queries, raw_documents = embed_shard(teacher, batch[start:end], self.config.length_bucket_size)
        raw_queries, raw_documents = gather_batch(self.group, batch, raw_queries.float(), raw_documents.float())
        reference = teacher.treat_queries(raw_queries) @ teacher.treat_documents(raw_documents).T
        return ranking_divergence(scores, reference, self.config.temperature, excluded)

    def _finish_step(self, encoder, optimizer, step: int, record: dict | None, validation: list[Triple],
                     best_metrics: dict, history: list[dict]) -> dict:
        """What follows an optimizer step: the hook, the log, validation, and the checkpoint.

        ``_unfinished_step`` marks the step while its hook and validation run: an interrupt there saves
        ``last/`` flagged unfinished, and the resumed run calls this again for that step (``record`` None: the
        step's loss is not replayed) before training on."""
        config, main = self.config, self.group.is_main
        self._unfinished_step = step
        if self.on_step is not None and main:
            self.on_step(step, self._published(encoder))
            encoder.train()
        if record is not None and (step % config.log_every == 0 or step == config.steps):
            self._log(record, history)
            if main:
                watch_collapse(record, encoder)
        evaluate_now = config.eval_every and step % config.eval_every == 0
        if validation and (evaluate_now or step == config.steps):
            if main:
                best_metrics = self._validate_and_keep_best(encoder, validation, step, best_metrics, history)
            best_metrics = self.group.broadcast_object(best_metrics)
        self._unfinished_step = None
        if step % config.save_every == 0 or step == config.steps:
            self._checkpoint(encoder, optimizer, step, best_metrics)
        return best_metrics

    # ---- what a step leaves behind
    def _published(self, encoder: MagnitudeEncoder) -> MagnitudeEncoder:
        """The model the run validates, measures and saves: the trained weights, or with WiSE-FT their
        interpolation with the start."""
        return encoder if self._wise_base is None else wise_view(encoder, self._wise_base, self.config)

    def _validate_and_keep_best(self, encoder, validation, step, best_metrics, history) -> dict:
        model = self._published(encoder)
        metrics, per_query = self.validation_scores(model, validation)
        encoder.train()
        log = functools.partial(self._log, history=history)
        if self.config.selection == "max":
            return keep_highest(model, step, metrics, best_metrics, self.best_dir, log)
        best_metrics, self.candidates = keep_within_one_standard_error(
            model, step, metrics, per_query, self.candidates, self.best_dir, self.validated_dir, log)
        return best_metrics

    def _log(self, record: dict, history: list[dict]) -> None:
        history.append(record)
        if self.group.is_main:
            write_record(self.log_path, record)

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

    def _stop(self, encoder: MagnitudeEncoder, optimizer: torch.optim.Optimizer, step: int,
              best_metrics: dict) -> None:
        """A stop signal came during ``step``, which is finished: ``last/`` at it (unless the step just saved it)
        is where the same command resumes. Signals during the save are deferred (``stopping.graceful``)."""
        if not (step % self.config.save_every == 0 or step == self.config.steps):
            self._checkpoint(encoder, optimizer, step, best_metrics)
        stopped = stopping.stopped(step, self.config.steps, self.last_dir)
        if self.group.is_main:
            logger.warning("%s", stopped)
        raise stopped

    def _save_last(self, encoder: MagnitudeEncoder, optimizer: torch.optim.Optimizer, step: int,
                   best_metrics: dict, rng_states: list[torch.Tensor], finished: bool = True) -> None:
        """``last/`` at ``step`` (``checkpoint.save_last``); ``finished`` is False when an interrupt came
        inside the step's hook or validation (``_finish_step``)."""
        progress = {"step": step, "step_finished": finished, "world_size": self.group.world_size,
                    "best_metrics": best_metrics, "candidates": self.candidates}
        save_last(self.last_dir, encoder, optimizer, rng_states, progress, self.config.to_dict(),
                  self.data_fingerprint)
