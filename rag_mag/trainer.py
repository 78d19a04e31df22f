"""Contrastive training of a MagnitudeEncoder under one similarity strategy.

The trainer knows the encoder, the loss and the data; it knows nothing of Haystack. Output folder:

* ``best/``  the checkpoint with the best validation nDCG@10 (what users index with);
* ``last/``  the latest checkpoint plus ``trainer_state.json`` and ``optimizer.safetensors`` (for resuming);
* ``train_log.jsonl``  one JSON line per logged step and per validation.

Nothing here is pickled: optimizer state is saved as safetensors, the rest as JSON.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch.optim.lr_scheduler import LambdaLR

from rag_mag.config import TrainConfig
from rag_mag.data import Passage, Triple, read_triples
from rag_mag.encoder import MagnitudeEncoder
from rag_mag.errors import CheckpointError, DataError, TrainingError
from rag_mag.loss import InfoNCELoss
from rag_mag.metrics.retrieval import judge_supporting, score_retrieval

logger = logging.getLogger(__name__)

STATE_NAME = "trainer_state.json"
RNG_KEY = "rng.torch"
OPTIMIZER_NAME = "optimizer.safetensors"
# Below this coefficient of variation a raw side carries (almost) no magnitude signal.
COLLAPSE_CV = 1e-3
# Above this mean cosine between different passages of a batch, directions have collapsed together.
COLLAPSE_COSINE = 0.98


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


# ----------------------------------------------------------------------------- statistics
def norm_statistics(raw: torch.Tensor) -> tuple[float, float]:
    """Mean and coefficient of variation of the L2 norms of (n, dim) raw embeddings."""
    norms = raw.detach().float().norm(dim=-1)
    mean = float(norms.mean())
    return mean, float(norms.std(unbiased=False) / max(mean, 1e-12))


def mean_pairwise_cosine(raw: torch.Tensor) -> float:
    unit = torch.nn.functional.normalize(raw.detach().float(), dim=-1)
    cosines = unit @ unit.T
    n = cosines.shape[0]
    return float((cosines.sum() - cosines.diagonal().sum()) / max(n * (n - 1), 1))


# ----------------------------------------------------------------------------- trainer
class Trainer:
    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        self.out = Path(config.out)
        self.best_dir, self.last_dir = self.out / "best", self.out / "last"
        self.log_path = self.out / "train_log.jsonl"

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
    def _save_last(self, encoder: MagnitudeEncoder, optimizer: torch.optim.Optimizer, step: int,
                   best_metrics: dict) -> None:
        if not all(torch.isfinite(p).all() for p in encoder.parameters()):
            raise TrainingError(f"non-finite weights at step {step}; the last good checkpoint in {self.last_dir} "
                                "was kept. Lower --learning-rate or raise --temperature")
        encoder.save(self.last_dir)
        tensors, slots = {}, []
        for group_index, group in enumerate(optimizer.param_groups):
            for param_index, parameter in enumerate(group["params"]):
                for key, value in optimizer.state.get(parameter, {}).items():
                    tensors[f"{group_index}.{param_index}.{key}"] = torch.as_tensor(value).detach().clone().contiguous()
            slots.append(len(group["params"]))
        tensors[RNG_KEY] = torch.get_rng_state()  # dropout masks: a resumed run replays the same ones
        save_file(tensors, str(self.last_dir / OPTIMIZER_NAME))
        state = {"step": step, "best_metrics": best_metrics, "param_group_sizes": slots,
                 "config": self.config.to_dict()}
        (self.last_dir / STATE_NAME).write_text(json.dumps(state, indent=2))

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
        if RNG_KEY in tensors:
            torch.set_rng_state(tensors.pop(RNG_KEY))
        for key, value in tensors.items():
            group_index, param_index, slot = key.split(".", 2)
            parameter = optimizer.param_groups[int(group_index)]["params"][int(param_index)]
            optimizer.state[parameter][slot] = value
        step = int(state["step"])
        scheduler.last_epoch = step
        for group, base_lr, factor in zip(optimizer.param_groups, scheduler.base_lrs,
                                          [fn(step) for fn in scheduler.lr_lambdas], strict=True):
            group["lr"] = base_lr * factor
        return step, state.get("best_metrics", {})

    # ---- validation
    @torch.inference_mode()
    def validate(self, encoder: MagnitudeEncoder, validation: list[Triple]) -> dict[str, float]:
        """Rank the pool of all validation passages for each validation query (recall@k, nDCG@10)."""
        pool: dict[str, Passage] = {}
        for triple in validation:
            for passage in (*triple.positives, *triple.hard_negatives):
                pool.setdefault(passage.id, passage)
        ids = list(pool)
        documents = encoder.encode([pool[i].content for i in ids], "document", bf16=self.config.bf16)
        queries = encoder.encode([t.query for t in validation], "query", bf16=self.config.bf16)
        scores = queries @ documents.T
        top = np.argsort(-scores, axis=1)[:, :20]
        judgements = [judge_supporting([ids[j] for j in row], [p.id for p in triple.positives])
                      for row, triple in zip(top, validation, strict=True)]
        means = score_retrieval(judgements, ks=(1, 5, 20)).means
        return {name: means[name] for name in ("recall@1", "recall@5", "recall@20", "ndcg@10")}

    # ---- the loop
    def train(self) -> TrainResult:
        config = self.config
        torch.manual_seed(config.seed)
        if config.threads:
            torch.set_num_threads(config.threads)
        train, validation = self._load_data()
        resuming = config.resume and (self.last_dir / STATE_NAME).is_file()
        if resuming:
            encoder = MagnitudeEncoder.load(self.last_dir)
            if encoder.config.strategy != config.strategy:
                raise CheckpointError(f"{self.last_dir} holds a {encoder.config.strategy} run, not "
                                      f"{config.strategy}; use a new --out or pass --no-resume")
        else:
            encoder = MagnitudeEncoder.build(config.base_model or None, config.strategy, config.pooling,
                                             config.query_max_length, config.document_max_length,
                                             config.temperature)
            if config.calibrate_norms:
                self._calibrate(encoder, train)
        encoder.config.training = config.to_dict()
        optimizer, scheduler = self._build_optimizer(encoder)
        step, best_metrics = self._resume(optimizer, scheduler) if resuming else (0, {})
        if resuming:
            logger.info("resuming %s from step %d of %d", self.last_dir, step, config.steps)
        self.out.mkdir(parents=True, exist_ok=True)
        loss_fn = InfoNCELoss(config.temperature)
        history: list[dict] = []
        from tqdm.auto import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        progress = tqdm(total=config.steps, initial=step, desc=f"train {config.strategy}", unit="step")
        encoder.train()
        started = time.perf_counter()
        with logging_redirect_tqdm():
            try:
                while step < config.steps:
                    record = self._step(encoder, loss_fn, optimizer, scheduler, train, step)
                    step += 1
                    progress.update(1)
                    progress.set_postfix(loss=f"{record['loss']:.3f}", acc=f"{record['accuracy']:.2f}")
                    if step % config.log_every == 0 or step == config.steps:
                        record.update(step=step, seconds=round(time.perf_counter() - started, 1))
                        self._log(record, history)
                        self._watch_collapse(record, encoder)
                    evaluate_now = config.eval_every and step % config.eval_every == 0
                    if validation and (evaluate_now or step == config.steps):
                        best_metrics = self._validate_and_keep_best(encoder, validation, step, best_metrics, history)
                    if step % config.save_every == 0 or step == config.steps:
                        self._save_last(encoder, optimizer, step, best_metrics)
            except KeyboardInterrupt:
                progress.close()
                if step > 0:
                    self._save_last(encoder, optimizer, step, best_metrics)
                logger.warning("interrupted at step %d; run the same command again to resume", step)
                raise
        progress.close()
        if not validation:
            encoder.save(self.best_dir)  # nothing to select on: the final model is the best we know
        return TrainResult(self.best_dir, self.last_dir, step, best_metrics, history)

    def _step(self, encoder, loss_fn, optimizer, scheduler, train, step: int) -> dict:
        batch = make_batch(train, step, self.config)
        documents = [positive for _, positive, _ in batch] + [n for _, _, negatives in batch for n in negatives]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.config.bf16):
            bucket = self.config.length_bucket_size
            raw_queries = encoder.embed_queries([triple.query for triple, _, _ in batch], bucket)  # (batch, dim)
            raw_documents = encoder.embed_documents([d.content for d in documents], bucket)  # (n_docs, dim)
        raw_queries, raw_documents = raw_queries.float(), raw_documents.float()
        queries = encoder.treat_queries(raw_queries)
        treated_documents = encoder.treat_documents(raw_documents)
        hard_negatives = treated_documents[len(batch):]
        output = loss_fn(queries, treated_documents[: len(batch)],
                         hard_negatives if hard_negatives.shape[0] else None,
                         false_negatives=false_negative_mask(batch, documents))
        loss = output["loss"]
        if not torch.isfinite(loss):
            raise TrainingError(f"loss became {loss.item()} at step {step + 1}; nothing was saved over the last "
                                f"good checkpoint in {self.last_dir}. Lower --learning-rate, raise --temperature "
                                "or turn off --bf16")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        gradient_norm = torch.nn.utils.clip_grad_norm_(encoder.parameters(), self.config.max_grad_norm)
        if not torch.isfinite(gradient_norm):
            raise TrainingError(f"gradient norm became {gradient_norm.item()} at step {step + 1}; lower "
                                "--learning-rate or raise --temperature")
        optimizer.step()
        scheduler.step()
        query_mean, query_cv = norm_statistics(raw_queries)
        document_mean, document_cv = norm_statistics(raw_documents)
        query_degree, document_degree = encoder.degrees.as_floats()
        return {"loss": loss.item(), "accuracy": float(output["accuracy"]), "grad_norm": float(gradient_norm),
                "query_norm_mean": query_mean, "query_norm_cv": query_cv, "document_norm_mean": document_mean,
                "document_norm_cv": document_cv, "document_cosine": mean_pairwise_cosine(raw_documents),
                "g_query": query_degree, "g_document": document_degree, "lr": scheduler.get_last_lr()[0]}

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
        metrics = self.validate(encoder, validation)
        encoder.train()
        improved = metrics["ndcg@10"] > best_metrics.get("ndcg@10", -1.0)
        self._log({"step": step, "validation": metrics, "best": improved}, history)
        if improved:
            encoder.save(self.best_dir)
            return {**metrics, "step": step}
        return best_metrics

    def _log(self, record: dict, history: list[dict]) -> None:
        history.append(record)
        with self.log_path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        if "validation" in record:
            logger.info("step %d validation %s%s", record["step"],
                        " ".join(f"{k}={v:.2f}" for k, v in record["validation"].items()),
                        " (best so far)" if record.get("best") else "")
        else:
            logger.info("step %d loss %.4f acc %.3f |q| %.2f (cv %.3f) |d| %.2f (cv %.3f) g=(%.3f, %.3f)",
                        record["step"], record["loss"], record["accuracy"], record["query_norm_mean"],
                        record["query_norm_cv"], record["document_norm_mean"], record["document_norm_cv"],
                        record["g_query"], record["g_document"])
