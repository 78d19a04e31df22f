"""``rag-mag train``: fine-tune a retriever under one similarity strategy."""

from __future__ import annotations

import argparse
import contextlib
import json

from rag_mag import durable, writable
from rag_mag.errors import ConfigError
from rag_mag.retriever.training.config import TrainConfig, add_dataclass_arguments, load_train_config


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train", help="train a magnitude-aware retriever with InfoNCE",
        description="Fine-tune an encoder with InfoNCE under one similarity strategy. Writes OUT/best (the "
                    "validated checkpoint --selection chooses: by default the earliest within one standard error "
                    "of the best validation nDCG@10, the untrained step 0 included), OUT/last (resumable) and "
                    "OUT/train_log.jsonl. Settings come from the defaults, then --config FILE (YAML or JSON with "
                    "these field names), then the flags. SIGTERM or Ctrl-C ends the current step, saves it in "
                    "OUT/last and exits 143 (SIGTERM) or 130 (Ctrl-C); the same command resumes at that step. An "
                    "OUT that cannot be written is refused before any model loads (exit 2).")
    parser.add_argument("--config", help="YAML or JSON file of training settings (field names as the flags, "
                                         "with underscores)")
    add_dataclass_arguments(parser, TrainConfig)
    return parser


def run(args: argparse.Namespace) -> int:
    config = load_train_config(args, args.config)
    if not config.train_data:
        raise ConfigError("no training data: pass --train-data FILE (triples JSONL) or set train_data in --config")
    if not config.out:
        raise ConfigError("no output folder: pass --out DIR")
    from rag_mag.retriever.training.distributed import launched_rank

    writable.check_writable(config.out, f"the training folder {config.out}")  # before any model loads
    # under torchrun rank 0 alone writes OUT, so it alone holds the lock (the others share its job)
    lock = durable.job_lock(durable.lock_path(config.out), f"the training folder {config.out}") \
        if launched_rank() == 0 else contextlib.nullcontext()
    with lock:
        return _train(config)


def _train(config: TrainConfig) -> int:
    from rag_mag.retriever.training.trainer import Trainer

    trainer = Trainer(config)
    result = trainer.train()
    if not trainer.group.is_main:  # under torchrun the run's summary is printed once, by rank 0
        return 0
    print(json.dumps({"best": str(result.best_dir), "last": str(result.last_dir), "step": result.step,
                      "best_validation": result.best_metrics}, indent=2))
    return 0
