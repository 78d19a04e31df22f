"""Where two retrievers rank differently: per-question nDCG@10 on one test set, and the top titles of the
questions that changed most.

A diagnosis tool, for reading a result after it is measured: it reads evaluation questions, so nothing it
shows may choose a setting (choices are made on validation; eval/probe_validation.py).

    .venv/bin/python eval/compare_rankings.py base artifacts/probes/cosine_s0_step200 --dataset musique

``base`` is the untrained encoder under the other checkpoint's strategy (a positive scale per side, the norm
calibration, changes no ranking). Datasets and question counts are those of eval/configs/crossover.yaml.
Prints the means, how many questions moved by more than ``--moved`` points either way, and the ``--show``
largest losses with their supporting titles and each retriever's top 5; writes
``eval/reports/probes/compare_NAME.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from rag_mag import durable  # noqa: E402
from rag_mag.bench.crossover.config import load_crossover_config  # noqa: E402
from rag_mag.bench.crossover.held_out import load_test_sets, rank_test_set  # noqa: E402
from rag_mag.retriever.encoder import MagnitudeEncoder  # noqa: E402

OUT = REPO_ROOT / "eval" / "reports" / "probes"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", help="a retriever checkpoint folder, or `base` (the untrained encoder)")
    parser.add_argument("second", help="a retriever checkpoint folder")
    parser.add_argument("--dataset", required=True, help="a dataset of the crossover config, e.g. musique")
    parser.add_argument("--config", default=str(REPO_ROOT / "eval" / "configs" / "crossover.yaml"))
    parser.add_argument("--moved", type=float, default=20.0, help="count questions that moved by more than this")
    parser.add_argument("--show", type=int, default=8, help="show this many of the largest losses")
    parser.add_argument("--name", default="", help="report name (default: DATASET)")
    args = parser.parse_args(argv)

    config = load_crossover_config(args.config)
    if args.dataset not in config.datasets:
        parser.error(f"--dataset must be one of {', '.join(config.datasets)}")
    config.datasets = [args.dataset]
    dataset = load_test_sets(config)[0]
    second = MagnitudeEncoder.load(args.second)
    first = MagnitudeEncoder.build(None, second.config.strategy) if args.first == "base" \
        else MagnitudeEncoder.load(args.first)
    (top_a, ndcg_a), (top_b, ndcg_b) = rank_test_set(first, dataset), rank_test_set(second, dataset)
    ndcg_a, ndcg_b = 100.0 * np.asarray(ndcg_a), 100.0 * np.asarray(ndcg_b)  # in percent
    change = ndcg_b - ndcg_a
    titles = [p.title for p in dataset.corpus]
    losses = []
    for index in np.argsort(change)[: args.show]:
        record = dataset.records[index]
        losses.append({"question": record.question, "change": round(float(change[index]), 1),
                       "supporting": [c.title for c in record.contexts if c.is_supporting],
                       "first_top5": [titles[j] for j in top_a[index][:5]],
                       "second_top5": [titles[j] for j in top_b[index][:5]]})
    report = {"first": args.first, "second": args.second, "dataset": args.dataset, "questions": len(change),
              "ndcg@10": [round(float(np.mean(ndcg_a)), 2), round(float(np.mean(ndcg_b)), 2)],
              f"lost_more_than_{args.moved:g}": int((change < -args.moved).sum()),
              f"gained_more_than_{args.moved:g}": int((change > args.moved).sum()),
              "largest_losses": losses}
    print(f"{args.dataset}, {len(change)} questions: nDCG@10 {report['ndcg@10'][0]:.1f} -> {report['ndcg@10'][1]:.1f}; "
          f"{report[f'lost_more_than_{args.moved:g}']} lost more than {args.moved:g} points, "
          f"{report[f'gained_more_than_{args.moved:g}']} gained more than {args.moved:g}")
    for loss in losses:
        print(f"\n{loss['change']:+.1f}  {loss['question']}\n  supporting: {loss['supporting']}\n"
              f"  first:  {loss['first_top5']}\n  second: {loss['second_top5']}")
    path = OUT / f"compare_{args.name or args.dataset}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    durable.write_text(path, json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
