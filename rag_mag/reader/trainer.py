"""Supervised fine-tuning of the reader with TRL's SFTTrainer and a LoRA adapter (PEFT).

``ReaderTrainer(config).train()`` builds (or reuses) the examples under ``OUT/data/``, renders every prompt
with ``answer_messages`` (the pipelines' own prompt) and the model's chat template, and trains with the loss
on the answer tokens only. Outputs:

* ``OUT/adapter/``: the LoRA adapter of the validation step with the highest exact match (the untrained
  model is step 0 and is never written), with ``reader.json`` (step, validation EM/F1, settings);
* ``OUT/last/``: the Trainer's checkpoint (adapter, optimizer, scheduler, RNG), swapped in whole only when
  complete, with ``rag_mag_reader.json`` (settings and the examples' sha256), so a resumed run is the run
  that was started or is refused;
* ``OUT/train_log.jsonl``: loss, learning rate and validation EM/F1 by step.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rag_mag import durable, stopping
from rag_mag.data import read_corpus
from rag_mag.errors import CheckpointError, ConfigError, TrainingError
from rag_mag.models import default_llm_dir
from rag_mag.reader import examples as reader_examples
from rag_mag.reader import export
from rag_mag.reader.config import ReaderConfig
from rag_mag.reader.merge import ADAPTER_WEIGHTS
from rag_mag.reader.prompts import render

logger = logging.getLogger(__name__)

RUN_FILE = "rag_mag_reader.json"   # in last/: the settings and data a resumed run must match
READER_FILE = "reader.json"        # in adapter/: what the adapter is and how it scored
# Settings a resumed run may change: how long and how often, not what is trained.
RESUMABLE = frozenset({"steps", "eval_every", "save_every", "log_every", "threads", "resume", "val_max_examples"})


@dataclass
class ReaderResult:
    adapter_dir: Path
    step: int
    validation: dict[str, float]


def base_model_dir(config: ReaderConfig) -> Path:
    folder = Path(config.base_model) if config.base_model else default_llm_dir()
    if not (folder / "config.json").is_file():
        raise ConfigError(f"base model folder {folder} has no config.json; run `rag-mag serve-llm --convert-only` "
                          "(the packaged SmolLM2) or pass --base-model with a Hugging Face model folder")
    return folder


class ReaderTrainer:
    def __init__(self, config: ReaderConfig, data_root: Path | None = None) -> None:
        if not config.out:
            raise ConfigError("no output folder: pass --out DIR")
        self.config = config
        self.data_root = data_root
        self.out = Path(config.out)
        self.last_dir = self.out / "last"
        self.adapter_dir = self.out / "adapter"
        self.log_path = self.out / "train_log.jsonl"
        self.base_dir = Path(config.base_model)  # the model trained from, set by train()

    # ----------------------------------------------------------------------------------------- examples
    def _path(self, value: str) -> str:
        if "{data_root}" in value:
            if self.data_root is None:
                raise ConfigError(f"{value} refers to {{data_root}}, but no data root was found; set "
                                  "RAG_MAG_DATA_ROOT or pass --data-root")
            value = value.replace("{data_root}", str(self.data_root))
        return value

    def _exclude_paths(self) -> list[str]:
        from rag_mag.retriever.data.spec import load_data_spec

        if not self.config.exclude_from:
            return []
        return load_data_spec(self.config.exclude_from, self.data_root).exclude

    def examples(self) -> tuple[list[reader_examples.ReaderExample], list[reader_examples.ReaderExample], str]:
        """Training and validation examples (built once, then read back) and the sha256 of both files."""
        folder = self.out / "data"
        settings = {name: self._path(value) if isinstance(value, str) else value
                    for name, value in self.config.data_settings().items()}
        manifest_path = folder / "examples.json"
        if manifest_path.is_file():
            manifest = json.loads(manifest_path.read_text())
            files = manifest.get("files") or {}
            if manifest.get("settings") == settings and set(files) == {"train.jsonl", "val.jsonl"} and all(
                    (folder / name).is_file() and durable.sha256_of(folder / name) == digest
                    for name, digest in files.items()):
                logger.info("reusing the reader examples in %s", folder)
                return (reader_examples.read_examples(folder / "train.jsonl"),
                        reader_examples.read_examples(folder / "val.jsonl"), manifest["digest"])
            logger.info("the reader examples in %s were built with other settings or changed; building again",
                        folder)
        train, validation, stats = self._build_examples(settings)
        folder.mkdir(parents=True, exist_ok=True)
        files = {"train.jsonl": reader_examples.write_examples(folder / "train.jsonl", train),
                 "val.jsonl": reader_examples.write_examples(folder / "val.jsonl", validation)}
        digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
        durable.write_text(manifest_path, json.dumps({"settings": settings, "files": files, "digest": digest,
                                                       "stats": asdict(stats)}, indent=2) + "\n")
        logger.info("reader examples: %d training, %d validation (%s)", len(train), len(validation),
                    json.dumps(asdict(stats)))
        return train, validation, digest

    def _build_examples(self, settings: dict[str, Any]):
        config = self.config
        stats = reader_examples.ExampleStats()
        questions = reader_examples.read_questions(settings["gold_triples"], settings["gold_eval"],
                                                   settings["mined_rows"])
        excluded = reader_examples.excluded_questions(self._exclude_paths())
        kept = []
        for question in questions:
            if reader_examples.normalize_answer(question.question) in excluded:
                stats.excluded_eval_overlap += 1
            else:
                kept.append(question)
                stats.questions[question.source] = stats.questions.get(question.source, 0) + 1
        train_questions, val_questions = reader_examples.split_questions(kept, config.val_questions, config.seed)
        if settings["task"] == "question":
            train = reader_examples.build_question_examples(train_questions, passage_chars=config.passage_char_values,
                                                            seed=config.seed, stats=stats)
            validation = reader_examples.build_question_examples(val_questions, seed=config.seed + 1, stats=stats,
                                                                 passage_chars=config.passage_char_values[:1])
            return train, validation, stats
        retrieve = None
        if settings["retrieval_corpus"]:
            corpus = read_corpus(settings["retrieval_corpus"])
            retrieve = reader_examples.dense_retriever(settings["retrieval_model"], corpus, config.precision)
        build = dict(max_passages=config.max_passages, passage_counts=config.passage_count_values,
                     passage_chars=config.passage_char_values, retrieve=retrieve, stats=stats,
                     no_answer_share=config.no_answer_share)
        train = reader_examples.build_examples(train_questions, seed=config.seed, followup_chars=config.followup_chars,
                                               **build)
        validation = reader_examples.build_examples(val_questions, seed=config.seed + 1, **build)
        return train, validation, stats

    # --------------------------------------------------------------------------------------- resuming
    def _run_record(self, digest: str) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "examples_digest": digest}

    def _resume_from(self, digest: str) -> Path | None:
        if not self.config.resume:
            return None
        durable.recover_dir(self.last_dir)
        if not self.last_dir.exists():
            return None
        record_path = self.last_dir / RUN_FILE
        if not record_path.is_file() or not (self.last_dir / "trainer_state.json").is_file():
            raise CheckpointError(f"{self.last_dir} is incomplete ({RUN_FILE} or trainer_state.json is missing); "
                                  "delete it, or pass --no-resume to start over")
        saved = json.loads(record_path.read_text())
        differences = [f"{name}: saved {value!r}, now {self.config.to_dict().get(name)!r}"
                       for name, value in saved["config"].items()
                       if name not in RESUMABLE and self.config.to_dict().get(name) != value]
        if saved.get("examples_digest") != digest:
            differences.append("the training examples differ")
        if differences:
            raise ConfigError(f"{self.last_dir} was trained with other settings ({'; '.join(differences)}); use "
                              "the same settings, another --out, or --no-resume to start over")
        return self.last_dir

    def _completed(self, resume_dir: Path) -> ReaderResult | None:
        """The result of a run whose checkpoint already reached ``steps``, so that its command run again only
        reports it (and ``--publish`` publishes it): a Trainer resumed at its last step trains one step more."""
        step = json.loads((resume_dir / "trainer_state.json").read_text()).get("global_step", 0)
        record_path = self.adapter_dir / "reader.json"
        if step < self.config.steps or not record_path.is_file():
            return None
        record = json.loads(record_path.read_text())
        weights = self.adapter_dir / ADAPTER_WEIGHTS
        if not weights.is_file() or durable.sha256_of(weights) != record.get("adapter_sha256"):
            raise CheckpointError(f"{self.adapter_dir} does not match its reader.json; delete {self.adapter_dir} "
                                  "and train again, or pass --no-resume to start over")
        logger.info("%s already trained %d of %d steps; its adapter is from step %d (validation EM %.1f)",
                    self.out, step, self.config.steps, record["step"], record["validation"]["em"])
        return ReaderResult(self.adapter_dir, record["step"], {"step": record["step"], **record["validation"]})

    def _continued_adapter(self, model):
        """``model`` with the LoRA adapter of ``init_adapter`` (verified against its SHA256SUMS), trainable."""
        from peft import PeftModel

        from rag_mag.reader.merge import ADAPTER_CONFIG, verify_adapter

        folder = Path(self.config.init_adapter)
        verify_adapter(folder)
        rank = json.loads((folder / ADAPTER_CONFIG).read_text()).get("r")
        if rank != self.config.lora_rank:
            raise ConfigError(f"the adapter {folder} has rank {rank}, but lora_rank is {self.config.lora_rank}; set "
                              f"--lora-rank {rank}")
        logger.info("continuing the LoRA adapter %s", folder)
        return PeftModel.from_pretrained(model, str(folder), is_trainable=True)

    # ---------------------------------------------------------------------------------------- training
    def train(self) -> ReaderResult:
        import torch
        from datasets import Dataset
        from peft import LoraConfig
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from trl import SFTConfig

        from rag_mag.precision import describe, resolve_device, use_bf16
        from rag_mag.reader.callbacks import ReaderCallbacks
        from rag_mag.reader.sft import AnswerOnlySFTTrainer

        config = self.config
        if config.threads:
            torch.set_num_threads(config.threads)
        base = base_model_dir(config)
        train, validation, digest = self.examples()
        resume_dir = self._resume_from(digest)
        if resume_dir is not None and (done := self._completed(resume_dir)) is not None:
            return done
        tokenizer = AutoTokenizer.from_pretrained(base)
        tokenizer.padding_side = "left"  # validation generates in batches
        rows, too_long = [], 0
        for example in train:
            prompt_ids, answer_ids = render(tokenizer, example)
            if len(prompt_ids) + len(answer_ids) > config.max_length:
                too_long += 1
                continue
            rows.append({"input_ids": prompt_ids + answer_ids,
                         "completion_mask": [0] * len(prompt_ids) + [1] * len(answer_ids)})
        if not rows:
            raise ConfigError(f"no training example fits max_length {config.max_length}; raise --max-length")
        logger.info("%d training examples (%d longer than %d tokens left out)", len(rows), too_long,
                    config.max_length)
        device = resolve_device("auto")
        bf16 = use_bf16(config.precision, device)
        logger.info("reader training precision: %s", describe(config.precision, device))
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        self.base_dir = base
        lora, base_weights = None, None
        if config.init_adapter:
            model = self._continued_adapter(model)
        elif config.method == "lora":
            lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                              target_modules="all-linear", task_type="CAUSAL_LM")
        else:
            base_weights = export.snapshot(model, export.train_decoder_linears(model))
            logger.info("full fine-tuning of %d linear weights (%.1fM parameters); the adapter is cut at rank %d",
                        len(base_weights), sum(w.numel() for w in base_weights.values()) / 1e6, config.export_rank)
        work = self.out / ".work"
        shutil.rmtree(work, ignore_errors=True)  # a killed run's unpromoted checkpoints are never trusted
        args = SFTConfig(
            output_dir=str(work), per_device_train_batch_size=1, gradient_accumulation_steps=config.batch_size,
            max_steps=config.steps,
            learning_rate=config.learning_rate, lr_scheduler_type="linear",
            warmup_steps=math.ceil(config.warmup_ratio * config.steps), weight_decay=config.weight_decay,
            logging_steps=config.log_every, save_strategy="steps", save_steps=config.save_every, save_total_limit=1,
            eval_strategy="no", bf16=bf16, use_cpu=device.type == "cpu", seed=config.seed, data_seed=config.seed,
            report_to="none", dataloader_num_workers=0, max_length=config.max_length, completion_only_loss=True,
            gradient_checkpointing=False, disable_tqdm=False, logging_first_step=True,
        )
        callbacks = ReaderCallbacks(self, tokenizer, validation, self._run_record(digest), bf16=bf16,
                                    base_weights=base_weights)
        trainer = AnswerOnlySFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                                       processing_class=tokenizer, peft_config=lora, callbacks=[callbacks])
        callbacks.bind(trainer)
        if resume_dir is not None:
            callbacks.rewind_log(resume_dir)
        with stopping.graceful():  # a stop signal ends the run after its step, saved in last/ (ReaderCallbacks)
            trainer.train(resume_from_checkpoint=str(resume_dir) if resume_dir else None)
            if callbacks.stopped_at is not None:
                logger.warning("%s", stopped := stopping.stopped(callbacks.stopped_at, config.steps, self.last_dir))
                raise stopped
        shutil.rmtree(work, ignore_errors=True)
        if not callbacks.best:
            raise TrainingError("no validation ran, so no adapter was chosen; set --eval-every to at most --steps")
        return ReaderResult(self.adapter_dir, callbacks.best["step"], callbacks.best)
