"""``rag-mag train-reader``: fine-tune the packaged SmolLM2 into a reader that answers with a short span."""

from __future__ import annotations

import argparse
import json

from rag_mag import durable, writable
from rag_mag.reader.config import ReaderConfig
from rag_mag.retriever.training.config import add_dataclass_arguments, load_train_config


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train-reader", help="fine-tune the reader (SmolLM2 + LoRA) to answer with short spans from its passages",
        description="Supervised fine-tuning (TRL's SFTTrainer, the loss on the answer tokens only; --method lora "
                    "trains a LoRA adapter, --method full the decoder's linear weights, shipped as the rank "
                    "--export-rank SVD cut of their change) "
                    "of the packaged SmolLM2-135M-Instruct on training-side questions: HotpotQA supporting "
                    "paragraphs among distractors, NQ-open oracle passages, mined answer-bearing passages, and a "
                    "dense retriever's top-k. Every question of the evaluation sets that --exclude-from lists is "
                    "left out. The prompts are the pipelines' own (AnswerPromptBuilder). Writes OUT/adapter (the "
                    "best validation exact match), OUT/last (resumable), OUT/data (the examples) and "
                    "OUT/train_log.jsonl. Settings come from the defaults, then --config FILE, then the flags. "
                    "eval/configs/reader.yaml builds the reader the product ships (data/reader_default/). "
                    "SIGTERM or Ctrl-C ends the current step, saves it in OUT/last and exits 143 (SIGTERM) or 130 "
                    "(Ctrl-C); the same command resumes at that step.")
    parser.add_argument("--config", help="YAML or JSON file of reader settings (field names as the flags, "
                                         "with underscores)")
    parser.add_argument("--data-root", default=None, help="shared data folder for {data_root} in paths (default: "
                                                          "RAG_MAG_DATA_ROOT, else ../shared/data)")
    parser.add_argument("--publish", metavar="DIR", default=None,
                        help="then copy the chosen adapter, its reader.json and the training log into DIR with "
                             "SHA256SUMS (data/reader_default is the shipped reader)")
    add_dataclass_arguments(parser, ReaderConfig)
    return parser


def run(args: argparse.Namespace) -> int:
    from rag_mag.bench.datasets import data_root
    from rag_mag.reader.trainer import ReaderTrainer
    from rag_mag.serving.llm.gguf_convert import convert_gguf

    config = load_train_config(args, args.config, ReaderConfig, source="reader config")
    trainer = ReaderTrainer(config, data_root(args.data_root))
    writable.check_writable(trainer.out, f"the reader training folder {trainer.out}")  # before any model loads
    with durable.job_lock(durable.lock_path(trainer.out), f"the reader training folder {trainer.out}"):
        if not config.base_model:
            convert_gguf()  # the packaged SmolLM2, once
        result = trainer.train()
    summary = {"adapter": str(result.adapter_dir), "step": result.step, "validation": result.validation}
    if args.publish:
        from pathlib import Path

        from rag_mag.reader.merge import publish_adapter

        summary["published"] = str(publish_adapter(result.adapter_dir, Path(args.publish), trainer.log_path))
    print(json.dumps(summary, indent=2))
    return 0
