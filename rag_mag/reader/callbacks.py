"""The reader trainer's hooks into the Hugging Face Trainer: validation, the adapter chosen on it, durable
checkpoints, the log, a stop on non-finite loss, and a stop signal acted on between two steps."""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from rag_mag import durable, stopping
from rag_mag.errors import TrainingError
from rag_mag.reader.export import low_rank_weights, write_adapter
from rag_mag.reader.merge import ADAPTER_WEIGHTS
from rag_mag.reader.prompts import validation_scores

logger = logging.getLogger(__name__)


class ReaderCallbacks(TrainerCallback):
    """Validates at step 0, every ``eval_every`` steps and at the end; the best exact match so far (ties: the
    earlier step) becomes ``adapter/``. Each Trainer checkpoint is moved whole into ``last/``."""

    def __init__(self, owner, tokenizer, validation: list, run_record: dict[str, Any], *, bf16: bool,
                 base_weights: dict | None = None) -> None:
        self.owner = owner
        self.base_weights = base_weights  # method full: the starting linear weights the adapter is cut from
        self.config = owner.config
        self.tokenizer = tokenizer
        self.validation = validation[: self.config.val_max_examples]
        self.run_record = run_record
        self.bf16 = bf16
        self.best: dict[str, Any] = {}
        self.trainer = None
        self.stopped_at: int | None = None  # the step a stop signal ended the run at (last/ holds it)

    def bind(self, trainer) -> None:
        self.trainer = trainer

    # ------------------------------------------------------------------------------------------ log
    def _append(self, record: dict[str, Any]) -> None:
        self.owner.out.mkdir(parents=True, exist_ok=True)
        durable.append_line(self.owner.log_path, json.dumps(record))

    def rewind_log(self, resume_dir: Path) -> None:
        """Keep the log up to the resumed step, and the best validation among those lines."""
        step = json.loads((resume_dir / "trainer_state.json").read_text())["global_step"]
        if not self.owner.log_path.is_file():
            return
        kept = [json.loads(line) for line in self.owner.log_path.read_text().splitlines() if line.strip()]
        kept = [record for record in kept if record["step"] <= step]
        durable.write_text(self.owner.log_path, "".join(json.dumps(record) + "\n" for record in kept))
        for record in kept:
            if "val_em" in record and (not self.best or record["val_em"] > self.best["em"]):
                self.best = {"step": record["step"], "em": record["val_em"], "f1": record["val_f1"]}
        logger.info("resuming at step %d; best validation so far: %s", step, self.best or "none")

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "loss" not in logs:
            return
        loss = float(logs["loss"])
        if not math.isfinite(loss):
            raise TrainingError(f"the reader's loss is {loss} at step {state.global_step}; the last good checkpoint "
                                f"in {self.owner.last_dir} was kept. Lower --learning-rate and resume")
        self._append({"step": state.global_step, "loss": loss, "learning_rate": logs.get("learning_rate"),
                      "grad_norm": logs.get("grad_norm")})

    # ----------------------------------------------------------------------------------- validation
    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0 and not self.owner.log_path.is_file():
            self._validate(0, kwargs["model"])

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if step % self.config.eval_every == 0 or step >= state.max_steps:
            self._validate(step, kwargs["model"])
        if stopping.requested() is not None:  # inside stopping.graceful(): this step is finished, save it, stop
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = step
        return control

    def _scores(self, model) -> tuple[dict[str, Any], list[str]]:
        return validation_scores(model, self.tokenizer, self.validation, max_new_tokens=self.config.max_new_tokens,
                                 bf16=self.bf16)

    def _validate(self, step: int, model) -> None:
        scores, answers = self._scores(model)
        full = {}
        if self.base_weights is not None and step > 0:
            # method full: what ships is the rank-r cut of the change, so that is what is chosen on
            full = {"val_em_full": scores["em"], "val_f1_full": scores["f1"]}
            with low_rank_weights(model, self.base_weights, self.config.export_rank):
                scores, answers = self._scores(model)
        record = {"step": step, "val_em": scores["em"], "val_f1": scores["f1"], "val_n": scores["n"], **full,
                  **{f"val_{name}": value for name, value in scores.items()
                     if name.startswith(("em_", "n_")) or name in ("valid", "false_abstain")}}
        logger.info("step %d validation: EM %.1f F1 %.1f on %d held-out examples%s", step, scores["em"],
                    scores["f1"], scores["n"], f" (full weights: EM {full['val_em_full']:.1f})" if full else "")
        self._append(record)
        if step > 0 and (not self.best or scores["em"] > self.best["em"]):
            self.best = {"step": step, **scores}
            self._save_adapter(model, step, scores, answers)

    def _save_adapter(self, model, step: int, scores: dict, answers: list[str]) -> None:
        staging = durable.staging_dir(self.owner.adapter_dir)
        try:
            if self.base_weights is None:
                model.save_pretrained(staging, safe_serialization=True)
            else:
                scores = {**scores, "export_rank": self.config.export_rank,
                          "change_kept": write_adapter(model, self.base_weights, self.config.export_rank, staging,
                                                       str(self.owner.base_dir))}
            self.tokenizer.save_pretrained(staging)
            record = {"step": step, "validation": scores, "config": self.config.to_dict(),
                      "examples_digest": self.run_record["examples_digest"],
                      "adapter_sha256": durable.sha256_of(staging / ADAPTER_WEIGHTS)}
            (staging / "reader.json").write_text(json.dumps(record, indent=2) + "\n")
            samples = [{"question": e.question, "answers": list(e.answers), "prediction": a}
                       for e, a in zip(self.validation[:20], answers[:20], strict=True)]
            (staging / "validation_samples.json").write_text(json.dumps(samples, indent=2) + "\n")
            durable.sync_tree(staging)
            durable.replace_dir(staging, self.owner.adapter_dir, fault_prefix="adapter")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        logger.info("step %d is the best so far: adapter written to %s", step, self.owner.adapter_dir)

    # ----------------------------------------------------------------------------------- checkpoints
    def on_save(self, args, state, control, **kwargs):
        """The Trainer wrote ``checkpoint-N`` in the work folder: record the run's settings in it, sync it and
        swap it in as ``last/``; the previous ``last/`` stays until then."""
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if not (folder / "trainer_state.json").is_file():
            raise TrainingError(f"the Trainer's checkpoint {folder} is incomplete; {self.owner.last_dir} was kept")
        (folder / "rag_mag_reader.json").write_text(json.dumps(self.run_record, indent=2) + "\n")
        durable.sync_tree(folder)
        durable.replace_dir(folder, self.owner.last_dir, fault_prefix="checkpoint")
        logger.info("step %d: resumable checkpoint in %s", state.global_step, self.owner.last_dir)
