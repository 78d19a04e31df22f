"""``rag-mag build-data``: the training and validation triples, built from one data spec YAML."""

from __future__ import annotations

import argparse
import json
import logging

from rag_mag.retriever.data.spec import NEGATIVE_MINERS, POSITIVE_CHOICES

logger = logging.getLogger(__name__)


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "build-data", help="build training + validation triples from gold and filtered mined sources",
        description="Reads a data spec (eval/configs/train_data.yaml is the default recipe): gold pairs (HotpotQA "
                    "supporting paragraphs, NQ-open oracle passages), mined pairs only where the answer is "
                    "specific, hard negatives that hold no answer (lexical, dense or both: --negative-miner). "
                    "Questions of every evaluation file the spec "
                    "lists under `exclude` are dropped. Writes OUT/train.jsonl, OUT/val.jsonl (gold sources only), "
                    "OUT/ablation.jsonl (ablation-only sources) and OUT/stats.json.")
    parser.add_argument("spec", nargs="?", default="eval/configs/train_data.yaml",
                        help="data spec YAML (default: %(default)s)")
    parser.add_argument("--out", default=None, help="output folder (default: the spec's `out`)")
    parser.add_argument("--negative-miner", choices=NEGATIVE_MINERS, default=None,
                        help="the training rows' hard negatives: BM25's (lexical), an encoder's nearest passages "
                             "(dense), or half each (mixed); validation keeps BM25's (default: the spec's "
                             "`negative_miner`, else bm25)")
    parser.add_argument("--positives", choices=POSITIVE_CHOICES, default=None,
                        help="the training rows' positives: all, or where a row has several only those whose title "
                             "the question names (linked); validation keeps all (default: the spec's `positives`, "
                             "else all)")
    parser.add_argument("--data-root", default=None, help="shared data folder (default: RAG_MAG_DATA_ROOT, "
                                                          "else ../shared/data)")
    return parser


def run(args: argparse.Namespace) -> int:
    from rag_mag import durable, stopping, writable
    from rag_mag.bench.datasets import data_root
    from rag_mag.retriever.data.build import build_training_data
    from rag_mag.retriever.data.spec import load_data_spec

    overrides = {"out": args.out} if args.out else {}
    if args.negative_miner:
        overrides["negative_miner"] = args.negative_miner
    if args.positives:
        overrides["positives"] = args.positives
    spec = load_data_spec(args.spec, data_root(args.data_root), overrides)
    writable.check_writable(spec.out, f"the training data folder {spec.out}")
    with durable.job_lock(durable.lock_path(spec.out), f"the training data folder {spec.out}"):
        try:
            summary = build_training_data(spec)
        except KeyboardInterrupt:  # build-data keeps no partial state: it starts over when run again
            raise stopping.interrupted(f"{spec.out} holds a whole build (the previous one, or the new one if the "
                                       "signal came while it was being written), never a mix; run the same command "
                                       "again to build it (build-data starts over)") from None
    print(json.dumps({"out": spec.out, "train": summary["train"], "val": summary["val"],
                      "sources": summary["sources"]}, indent=2))
    return 0
