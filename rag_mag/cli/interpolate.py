"""``rag-mag interpolate``: WiSE-FT, a trained retriever mixed with the base encoder it started from."""

from __future__ import annotations

import argparse
import json

from rag_mag import durable
from rag_mag.cli import DefaultsHelpFormatter


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "interpolate", help="mix a trained retriever with its base encoder (WiSE-FT), keeping what the base knew",
        description="Write the checkpoint whose weights are (1 - alpha) x base + alpha x trained (WiSE-FT, Wortsman "
                    "et al. 2022): alpha 1 is the trained retriever, 0 the base encoder under the trained strategy "
                    "and norm scales. Choose alpha on validation from a domain the retriever did not train on "
                    "(eval/bench_recipes.py), not on test questions. The checkpoint records alpha and the trained "
                    "checkpoint's digest.", formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--retriever", required=True,
                        help="trained weights: a checkpoint of plain fine-tuning (--wise-alpha 1) or a run's last/ "
                             "folder; an interpolated checkpoint (best/ under the default recipe) is refused")
    parser.add_argument("--alpha", type=float, required=True, help="weight of the trained model, in [0, 1]")
    parser.add_argument("--base-model", default=None,
                        help="the base encoder folder (default: the one the checkpoint records)")
    parser.add_argument("--out", required=True, help="output checkpoint folder")
    return parser


def run(args: argparse.Namespace) -> int:
    from rag_mag.retriever.interpolate import check_alpha, interpolate_checkpoint

    check_alpha(args.alpha)  # before any model loads
    with durable.job_lock(durable.lock_path(args.out), f"the checkpoint folder {args.out}"):
        encoder = interpolate_checkpoint(args.retriever, args.alpha, args.out, args.base_model)
    print(json.dumps({"out": args.out, **encoder.config.training["wise_ft"]}, indent=2))
    return 0
