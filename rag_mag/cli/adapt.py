"""``rag-mag adapt``: train the retriever for a folder of documents on synthetic questions, and publish it only
where the folder's held-out test files show it better than the base (rag_mag/adapt/run.py)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from rag_mag import durable, writable
from rag_mag.cli import DefaultsHelpFormatter


def add_parser(subparsers) -> argparse.ArgumentParser:
    from rag_mag.adapt.splits import DEFAULT_MIN_PAIRS, DEFAULT_TEST_FRACTION, DEFAULT_VAL_FRACTION
    from rag_mag.adapt.synth import SynthSettings
    from rag_mag.adapt.training import DEFAULT_STRATEGIES, STRATEGIES
    from rag_mag.retriever.training.config import TrainConfig

    parser = subparsers.add_parser(
        "adapt", help="fit the retriever to your documents with synthetic questions; publish it only if it tests "
                      "better",
        description="From a folder's synthetic question/chunk pairs (--pairs, or synthesized into OUT/pairs): split "
                    "them by file into train/validation/test (OUT/splits), train every --strategies run under the "
                    "default recipe (OUT/runs/STRATEGY, best/ chosen on validation), score the untrained base, BM25 "
                    "and every trained run on the test files alone (each test question ranks every chunk), and "
                    "copy the best run to OUT/retriever only if its test nDCG@10 beats the base's with a "
                    "Holm-adjusted paired permutation p < 0.05; otherwise the base is kept and OUT/retriever is not "
                    "written. With --index, re-embeds the folder with the published retriever. Writes "
                    "OUT/report.md and OUT/report.json and ends with one line. Rerun the same command to resume: "
                    "finished splits, runs and scores are reused.", formatter_class=DefaultsHelpFormatter)
    parser.add_argument("source", metavar="FOLDER|INDEX",
                        help="the documents the pairs come from (what synthesis reads; what --index re-embeds)")
    parser.add_argument("--out", required=True, help="the adapt folder (pairs, splits, runs, scores, report)")
    parser.add_argument("--pairs", default=None, metavar="PAIRS_DIR",
                        help="synthetic pairs already written (pairs.jsonl, corpus.jsonl); default: synthesize into "
                             "OUT/pairs")
    parser.add_argument("--chunks", type=int, default=SynthSettings.chunks,
                        help="chunks to synthesize a question for (without --pairs)")
    parser.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES),
                        help=f"comma-separated strategies to train, of: {', '.join(STRATEGIES)}")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"optimizer steps per strategy (default: train's, {TrainConfig.steps})")
    parser.add_argument("--batch-size", type=int, default=None,
                        help=f"queries per step (default: train's, {TrainConfig.batch_size})")
    parser.add_argument("--base-model", default=None,
                        help="encoder to start from and to compare with (default: the packaged all-MiniLM-L6-v2)")
    parser.add_argument("--precision", choices=["auto", "bf16", "fp32"], default=None,
                        help="training and scoring precision (default: auto, bf16 only where native)")
    parser.add_argument("--train-config", default=None, metavar="FILE",
                        help="YAML or JSON of further training settings, as `rag-mag train --config` takes (not "
                             "strategy, train_data, val_data or out: adapt sets those)")
    parser.add_argument("--no-resume", action="store_true",
                        help="train every strategy from its start again, replacing OUT/runs/STRATEGY/last")
    parser.add_argument("--index", default=None, metavar="INDEX_DIR",
                        help="after publishing, re-embed FOLDER into this index with the published retriever")
    parser.add_argument("--val-fraction", type=float, default=DEFAULT_VAL_FRACTION,
                        help="share of the files for validation")
    parser.add_argument("--test-fraction", type=float, default=DEFAULT_TEST_FRACTION,
                        help="share of the files for test")
    parser.add_argument("--min-pairs", type=int, default=DEFAULT_MIN_PAIRS,
                        help="pairs the train and the test split need at least")
    return parser


def training_settings(args: argparse.Namespace) -> dict:
    """The training settings file's values, then the flags given."""
    from rag_mag.retriever.training.config import read_config_file

    values = read_config_file(args.train_config) if args.train_config else {}
    for name in ("steps", "batch_size", "base_model", "precision"):
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    if args.no_resume:
        values["resume"] = False
    return values


def run(args: argparse.Namespace) -> int:
    from rag_mag.adapt.run import AdaptSettings, adapt

    settings = AdaptSettings(source=args.source, out=Path(args.out), pairs=args.pairs, strategies=args.strategies,
                             training=training_settings(args), index=args.index, chunks=args.chunks,
                             val_fraction=args.val_fraction, test_fraction=args.test_fraction,
                             min_pairs=args.min_pairs, progress=sys.stderr.isatty(),
                             command=shlex.join(["rag-mag", *sys.argv[1:]]))
    writable.check_writable(settings.out, f"the adapt folder {settings.out}")  # before any model loads
    with durable.job_lock(durable.lock_path(settings.out), f"the adapt folder {settings.out}"):
        result = adapt(settings)
    print(result.summary)
    return 0
