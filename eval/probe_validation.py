"""What validation can see of a trained checkpoint: weight interpolation with its starting model, and a wider pool.

Both probes read validation queries only (the 300 held-out training queries by default), never an
evaluation question, so they may inform a recipe choice.

* ``interpolation``: the weights ``(1 - a) * start + a * trained`` for each ``--alphas`` value ``a``
  (WiSE-FT, Wortsman et al., 2022), the starting model rebuilt from the checkpoint's ``base_model`` with the
  checkpoint's norm calibration. Each is validated as the trainer validates (the validation queries'
  positives and hard negatives as the pool), and the one-standard-error band of ``selection.py`` is
  computed over ``a``, so the row marked ``chosen`` is the smallest mixing weight the rule would publish.
* ``wide_pool``: the starting model (``a = 0``) and the checkpoint (``a = 1``), or the ``--wide-alphas``
  mixes, ranking a pool widened by every passage of the training triples (16,016 instead of the 1,924 of
  the 300 validation queries): closer to searching a real corpus, where the rare name in a question has to
  be found among many passages. ``--versus OTHER`` ranks that pool with a second checkpoint too (another
  recipe's), so the band and the paired standard error compare the two recipes query by query.

    cp -r artifacts/crossover/runs/29df483fc83f/validated/step-200 artifacts/probes/cosine_s0_step200
    .venv/bin/python eval/probe_validation.py artifacts/probes/cosine_s0_step200 --name cosine_s0_step200

(probe a copy: a running trainer deletes the ``validated/`` checkpoints its selection rule no longer needs).

Prints a table per probe and writes ``eval/reports/probes/NAME.json``. About 6 minutes for 5 mixing
weights and 17 minutes for the wide pool on 2 cores (fp32).
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
from rag_mag.data import read_triples  # noqa: E402
from rag_mag.retriever.encoder import MagnitudeEncoder  # noqa: E402
from rag_mag.retriever.training.selection import paired_standard_error, within_one_standard_error  # noqa: E402
from rag_mag.retriever.training.validation import validation_scores  # noqa: E402

DATA = REPO_ROOT / "data" / "train_default"
OUT = REPO_ROOT / "eval" / "reports" / "probes"


def starting_model(trained: MagnitudeEncoder) -> MagnitudeEncoder:
    """The model the checkpoint was trained from: its base weights, its settings and its norm calibration."""
    config = trained.config
    start = MagnitudeEncoder.build(config.base_model, config.strategy, config.pooling, config.query_max_length,
                                   config.document_max_length, config.temperature)
    start.config.query_norm_scale = config.query_norm_scale
    start.config.document_norm_scale = config.document_norm_scale
    return start


def mixed(start: dict, trained: dict, alpha: float) -> dict:
    return {name: (1.0 - alpha) * start[name] + alpha * value if value.is_floating_point() else value
            for name, value in trained.items()}


def band_rows(scores: dict[float, list[float]], label: str) -> list[dict]:
    """One row per candidate, in order: mean nDCG@10, its distance from the best and the paired SE."""
    keyed = dict(enumerate(scores))  # the rule picks the earliest key in the band: candidates in order
    chosen, band = within_one_standard_error({index: scores[value] for index, value in keyed.items()})
    best = max(scores, key=lambda value: np.mean(scores[value]))
    return [{label: value, "ndcg@10": round(float(np.mean(per_query)), 3),
             "below_best": round(float(np.mean(scores[best]) - np.mean(per_query)), 3),
             "paired_se": round(paired_standard_error(scores[best], per_query), 3),
             "in_band": index in band, "chosen": index == chosen}
            for index, (value, per_query) in enumerate(scores.items())]


def print_rows(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    columns = list(rows[0])
    print(" | ".join(columns))
    for row in rows:
        print(" | ".join(str(row[column]) for column in columns))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a trained retriever folder (best/ or validated/step-N/)")
    parser.add_argument("--name", required=True, help="report name: eval/reports/probes/NAME.json")
    parser.add_argument("--val-data", default=str(DATA / "val.jsonl.gz"), help="validation triples")
    parser.add_argument("--train-data", default=str(DATA / "train.jsonl.gz"), help="widens the pool (wide_pool)")
    parser.add_argument("--val-max-queries", type=int, default=300, help="the trainer's val_max_queries")
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0],
                        help="mixing weights of the trained model, ascending (0: the starting model)")
    parser.add_argument("--wide-alphas", type=float, nargs="+", default=[0.0, 1.0],
                        help="mixing weights ranked against the wide pool, ascending")
    parser.add_argument("--versus", default=None, metavar="CHECKPOINT",
                        help="wide_pool: also rank with this checkpoint (another recipe's), paired by query")
    parser.add_argument("--probes", nargs="+", choices=("interpolation", "wide_pool"),
                        default=["interpolation", "wide_pool"])
    args = parser.parse_args(argv)
    for name in ("alphas", "wide_alphas"):
        values = getattr(args, name)
        if sorted(values) != values or not all(0.0 <= a <= 1.0 for a in values):
            parser.error(f"--{name.replace('_', '-')} must be ascending values in [0, 1]")

    validation = read_triples(args.val_data)[: args.val_max_queries]
    trained = MagnitudeEncoder.load(args.checkpoint)
    trained_state = {name: value.clone() for name, value in trained.state_dict().items()}
    start_state = starting_model(trained).state_dict()
    report = {"checkpoint": str(args.checkpoint), "validation_queries": len(validation)}

    if "interpolation" in args.probes:
        scores = {}
        for alpha in args.alphas:
            trained.load_state_dict(mixed(start_state, trained_state, alpha))
            scores[alpha] = validation_scores(trained, validation)[1]
            print(f"alpha {alpha}: validation nDCG@10 {np.mean(scores[alpha]):.3f}", flush=True)
        report["interpolation"] = band_rows(scores, "alpha")
        print_rows("interpolation (validation pool)", report["interpolation"])

    if "wide_pool" in args.probes:
        distractors = [p for triple in read_triples(args.train_data) for p in (*triple.positives,
                                                                               *triple.hard_negatives)]
        scores = {}
        for alpha in args.wide_alphas:
            trained.load_state_dict(mixed(start_state, trained_state, alpha))
            scores[alpha] = validation_scores(trained, validation, distractors)[1]
            print(f"alpha {alpha}: wide-pool nDCG@10 {np.mean(scores[alpha]):.3f}", flush=True)
        if args.versus:
            label = f"versus {args.versus}"
            scores[label] = validation_scores(MagnitudeEncoder.load(args.versus), validation, distractors)[1]
            print(f"{label}: wide-pool nDCG@10 {np.mean(scores[label]):.3f}", flush=True)
        report["wide_pool"] = {"pool_added": len({p.id for p in distractors}), "rows": band_rows(scores, "alpha"),
                               "per_query": {str(key): values for key, values in scores.items()}}
        print_rows(f"wide pool (+{report['wide_pool']['pool_added']} training passages)", report["wide_pool"]["rows"])

    path = OUT / f"{args.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    durable.write_text(path, json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
