"""Which fine-tuning recipe keeps the base model: leave-one-source-out validation of the retriever's recipes.

    .venv/bin/python eval/bench_recipes.py                        # every hold-out and recipe; resumes
    .venv/bin/python eval/bench_recipes.py --holdout nq_oracle_gold --recipe plain   # one run
    .venv/bin/python eval/bench_recipes.py --report-only          # eval/reports/recipes/README.md from the cells

The training data (``data/train_default/``) has three sources: HotpotQA gold triples, NQ-open oracle pairs and
mined pairs of HotpotQA/2Wiki questions. A run that validates on its own sources never sees the drift it causes
elsewhere, so each hold-out trains without some sources and validates on two sets at every checkpoint:

* ``held-out``: up to 300 queries of the held-out sources (a domain the run does not train on);
* ``in-domain``: the committed validation rows of the sources it trains on.

Hold-outs: ``nq_oracle_gold`` (train on HotpotQA gold + mined, validate on NQ) and ``hotpot`` (train on NQ, validate
on HotpotQA gold; the mined pairs are HotpotQA/2Wiki questions, so they are held out with it). Recipes, each
``cosine`` at the crossover study's settings (batch 32, one hard negative, learning rate 2e-5, 200 steps): ``plain``
(every weight), ``top2`` (only the top 2 of MiniLM's 6 layers: partial fine-tuning), ``l2sp`` (decoupled decay
toward the starting weights, ``anchor_weight`` 500: one hundredth of the distance a step at the peak learning rate),
``distill`` (the KL divergence from the untrained model's in-batch ranking of each query, ``distill_weight`` 1: the
loss keeps the base model's rankings rather than its weights), and ``wise`` (WiSE-FT: ``plain``'s final weights
interpolated with the base at alpha 0.25, 0.5, 0.75, scored at the last step). Two more runs ask how a one-sided
strategy should start: ``qnorm`` (the paper's recipe: qnorm from the untrained MiniLM, whose norms mean little) and
``qnorm_cos`` (a curriculum: qnorm from ``plain``'s final cosine weights). Every delta is against the untrained
MiniLM scored by cosine (``plain``'s step 0). The held-out columns choose; the test sets are never read here.
Each run's measurements are a cell (``eval/reports/recipes/cells/HOLDOUT_RECIPE.json``), written after every
checkpoint; an interrupted run resumes from its ``last/`` and its cell.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rag_mag import durable  # noqa: E402
from rag_mag.data import Passage, iter_jsonl, read_triples, write_jsonl  # noqa: E402
from rag_mag.precision import cpu_kind, use_bf16  # noqa: E402
from rag_mag.retriever.training.config import TrainConfig  # noqa: E402
from rag_mag.retriever.training.trainer import Trainer  # noqa: E402
from rag_mag.retriever.training.validation import validation_scores  # noqa: E402

logger = logging.getLogger("bench_recipes")

HOLDOUTS = {"nq_oracle_gold": ("nq_oracle_gold",), "hotpot": ("hotpotqa_gold", "mined")}
RECIPES = {"plain": {}, "top2": {"train_layers": 2}, "l2sp": {"anchor_weight": 500.0},
           "distill": {"distill_weight": 1.0}, "qnorm": {"strategy": "qnorm"}, "qnorm_cos": {"strategy": "qnorm"}}
STARTS_FROM_PLAIN = ("wise", "qnorm_cos")  # need the hold-out's finished plain (cosine) run
ALPHAS = (0.25, 0.5, 0.75)
# wise_alpha 1: every recipe is plain fine-tuning plus its own change (the step hook measures the trained weights;
# WiSE-FT, the default since this comparison chose it, is measured as the `wise` recipe)
SETTINGS = dict(strategy="cosine", batch_size=32, hard_negatives=1, learning_rate=2e-5, temperature=0.05,
                val_max_queries=300, eval_every=0, save_every=50, precision="auto", val_fraction=0.0, wise_alpha=1.0)
MEASURE_EVERY = 100  # steps between the measurements of both validations (and step 0 and the last step)


def split_sources(train_file: Path, val_file: Path, held_out: tuple[str, ...], folder: Path,
                  max_held_out: int = 300, distractors: int = 1000) -> dict[str, Path]:
    """Training rows without the held-out sources; held-out rows (validation rows first, then training rows)
    up to ``max_held_out``; the in-domain validation rows; and for each validation set a pool of ``distractors``
    passages of its own sources' other rows (a seeded sample), so that it ranks among thousands of passages
    instead of its own 600, where MiniLM already scores 95 on NQ. Written once (atomically) into ``folder``."""
    names = ("train", "held_out", "in_domain", "held_out_pool", "in_domain_pool")
    paths = {name: folder / f"{name}.jsonl" for name in names}
    if all(path.is_file() for path in paths.values()):
        return paths
    train = [row for _, row in iter_jsonl(train_file)]
    validation = [row for _, row in iter_jsonl(val_file)]
    if not {row.get("source") for row in train} & set(held_out):
        raise SystemExit(f"no row of {train_file} comes from {', '.join(held_out)}")
    held = [row for row in validation + train if row.get("source") in held_out]
    kept = [row for row in train if row.get("source") not in held_out]
    rng = random.Random(0)

    def pool(rows: list[dict], queries: list[dict]) -> list[dict]:
        shown = {p["id"] for row in queries for p in row["positives"] + row["hard_negatives"]}
        passages = {p["id"]: p for row in rows for p in row["positives"] + row["hard_negatives"]
                    if p["id"] not in shown}
        return rng.sample(sorted(passages.values(), key=lambda p: p["id"]), min(distractors, len(passages)))

    folder.mkdir(parents=True, exist_ok=True)
    in_domain = [row for row in validation if row.get("source") not in held_out]
    write_jsonl(paths["train"], kept)
    write_jsonl(paths["held_out"], held[:max_held_out])
    write_jsonl(paths["in_domain"], in_domain)
    write_jsonl(paths["held_out_pool"], pool(held[max_held_out:], held[:max_held_out]))
    write_jsonl(paths["in_domain_pool"], pool(kept, in_domain))
    return paths


def paired(values: list[float], reference: list[float]) -> dict[str, float]:
    """Mean difference of per-query nDCG@10 against the reference, with its standard error."""
    diff = np.asarray(values) - np.asarray(reference)
    return {"delta": round(float(diff.mean()), 2), "se": round(float(diff.std(ddof=1) / np.sqrt(len(diff))), 2)}


class RecipeRun:
    """One (hold-out, recipe) run: trains with the trainer's own resume, measures both validations at every
    checkpoint in the trainer's step hook, and keeps them in its cell."""

    def __init__(self, holdout: str, recipe: str, steps: int, data: dict[str, Path], runs: Path, cells: Path) -> None:
        self.holdout, self.recipe, self.steps, self.data = holdout, recipe, steps, data
        self.out = runs / f"{holdout}_{recipe if recipe != 'wise' else 'plain'}"
        self.cell_path = cells / f"{holdout}_{recipe}.json"
        self.cell = json.loads(self.cell_path.read_text()) if self.cell_path.is_file() else {}
        self.sets = {name: read_triples(data[name])[:SETTINGS["val_max_queries"]] for name in ("held_out", "in_domain")}
        self.pools = {name: [Passage(row["id"], row.get("title", ""), row["text"])
                             for _, row in iter_jsonl(data[f"{name}_pool"])] for name in self.sets}

    def config(self) -> TrainConfig:
        settings = {**SETTINGS, **RECIPES["plain" if self.recipe == "wise" else self.recipe]}
        if self.recipe == "qnorm_cos":
            settings["base_model"] = str(self._finished_plain())
        # the trainer validates nothing itself: this run's step hook measures both validations
        return TrainConfig(**settings, steps=self.steps, train_data=str(self.data["train"]), out=str(self.out))

    def _finished_plain(self) -> Path:
        """The final checkpoint of this hold-out's finished plain run (what wise and qnorm_cos start from)."""
        plain_path = self.cell_path.with_name(f"{self.holdout}_plain.json")
        plain = json.loads(plain_path.read_text()) if plain_path.is_file() else {}
        last = self.out.with_name(f"{self.holdout}_plain") / "last"
        state = json.loads((last / "trainer_state.json").read_text()) if (last / "trainer_state.json").is_file() else {}
        if not plain.get("finished") or state.get("step") != self.steps:
            raise SystemExit(f"{self.recipe} needs the finished plain run of {self.holdout} at {self.steps} steps "
                             f"({plain_path}, {last}); run --recipe plain first")
        return last

    def _save(self) -> None:
        self.cell_path.parent.mkdir(parents=True, exist_ok=True)
        durable.write_text(self.cell_path, json.dumps(self.cell, indent=1) + "\n")

    def _measure(self, encoder, bf16: bool) -> dict:
        point = {}
        for name, triples in self.sets.items():
            metrics, per_query = validation_scores(encoder, triples, self.pools[name], bf16=bf16)
            point[name] = {"ndcg@10": round(metrics["ndcg@10"], 2), "per_query": per_query}
        return point

    def on_step(self, step: int, encoder) -> None:
        points = self.cell.setdefault("points", {})
        if (step % MEASURE_EVERY == 0 or step == self.steps) and str(step) not in points:
            points[str(step)] = self._measure(encoder, use_bf16(SETTINGS["precision"], encoder.device))
            encoder.train()
            self._save()

    def _wise_from_plain(self) -> None:
        """WiSE-FT of the finished plain run: its step-0 and final points, and the interpolated weights."""
        from rag_mag.retriever.encoder import MagnitudeEncoder

        last = self._finished_plain()
        plain = json.loads(self.cell_path.with_name(f"{self.holdout}_plain.json").read_text())
        self.cell["points"] = {step: plain["points"][step] for step in ("0", str(self.steps))}
        encoder = MagnitudeEncoder.load(last)
        self._wise(encoder, use_bf16(SETTINGS["precision"], encoder.device))

    def _wise(self, encoder, bf16: bool) -> None:
        from rag_mag.retriever.interpolate import interpolate
        from rag_mag.retriever.training.recipes import base_transformer

        base = base_transformer(self.config())
        tuned = encoder.to("cpu")
        for alpha in ALPHAS:
            mixed = interpolate(tuned, base, alpha).to(encoder.device)
            self.cell.setdefault("alphas", {})[str(alpha)] = self._measure(mixed, bf16)
            logger.info("%s wise alpha %.2f: held-out nDCG@10 %.2f, in-domain %.2f", self.holdout, alpha,
                        self.cell["alphas"][str(alpha)]["held_out"]["ndcg@10"],
                        self.cell["alphas"][str(alpha)]["in_domain"]["ndcg@10"])

    def run(self) -> None:
        if self.cell.get("finished"):
            logger.info("%s %s: done (cell %s)", self.holdout, self.recipe, self.cell_path)
            return
        started = time.perf_counter()
        config = self.config()
        self.cell.update(holdout=self.holdout, recipe=self.recipe, steps=self.steps, cpu=cpu_kind(),
                         settings={k: v for k, v in config.to_dict().items() if k in (*SETTINGS, "base_model", *RECIPES[
                             "plain" if self.recipe == "wise" else self.recipe])},
                         train_rows=sum(1 for _ in iter_jsonl(self.data["train"])),
                         queries={name: len(triples) for name, triples in self.sets.items()})
        if self.recipe == "wise":
            self._wise_from_plain()
        elif str(self.steps) not in self.cell.get("points", {}):
            Trainer(config, on_step=self.on_step).train()
        self.cell["finished"] = True
        self.cell["seconds"] = round(self.cell.get("seconds", 0) + time.perf_counter() - started, 1)
        self._save()


def references(cells: list[dict]) -> dict[str, dict]:
    """Per hold-out, the untrained MiniLM scored by cosine (the plain run's step 0): what every delta is against.
    A hold-out without a plain run falls back on each cell's own step 0."""
    return {cell["holdout"]: cell["points"]["0"] for cell in cells
            if cell["recipe"] == "plain" and "0" in cell.get("points", {})}


def summary_rows(cells: list[dict]) -> list[str]:
    lines = ["| hold-out | recipe | step / alpha | held-out nDCG@10 (vs base) | in-domain nDCG@10 (vs base) |",
             "|---|---|---|---|---|"]
    reference = references(cells)
    for cell in cells:
        base = reference.get(cell["holdout"], cell["points"].get("0"))
        if not base:
            continue
        entries = [(f"step {step}", point) for step, point in sorted(cell["points"].items(), key=lambda kv: int(kv[0]))
                   if cell["recipe"] != "wise" or step == "0"]
        entries += [(f"alpha {alpha}", point) for alpha, point in sorted(cell.get("alphas", {}).items())]
        if cell["recipe"] == "wise" and str(cell["steps"]) in cell["points"]:
            entries.append(("alpha 1.0", cell["points"][str(cell["steps"])]))
        for label, point in entries:
            parts = []
            for name in ("held_out", "in_domain"):
                d = paired(point[name]["per_query"], base[name]["per_query"])
                parts.append(f"{point[name]['ndcg@10']:.1f} ({d['delta']:+.1f} ± {d['se']:.1f})")
            lines.append(f"| {cell['holdout']} | {cell['recipe']} | {label} | {parts[0]} | {parts[1]} |")
    return lines


def candidates(cell: dict) -> list[tuple[str, dict]]:
    """The points a cell offers to choose from: its checkpoints, or (wise) its mixing weights, 0 and 1 included."""
    if cell["recipe"] != "wise":
        return [(f"step {s}", p) for s, p in cell["points"].items()]
    return ([(f"alpha {a}", p) for a, p in cell.get("alphas", {}).items()] + [("alpha 0.0", cell["points"]["0"])]
            + [("alpha 1.0", p) for s, p in cell["points"].items() if s == str(cell["steps"])])


def default_recipe(cells: list[dict]) -> list[str]:
    """The rule that picks the default recipe, over the cosine recipes' points measured on every hold-out:

    1. training must buy something where it trains: the in-domain gain over the untrained model must exceed
       twice its standard error on every hold-out;
    2. of those points, the highest mean held-out change wins (what the run costs where it did not train);
       ties go to the point nearer the base.

    Without 1 the rule would keep the untrained model whenever every recipe costs something held out, which
    is no fine-tuning recipe at all; both columns are the validation sets', never a test set's."""
    reference = references(cells)
    holdouts = sorted({cell["holdout"] for cell in cells if cell.get("finished")})
    gains: dict[tuple[str, str], dict[str, tuple[dict, dict]]] = {}
    for cell in cells:
        if not cell.get("finished") or cell["recipe"] not in ("plain", "top2", "l2sp", "distill", "wise"):
            continue
        base = reference.get(cell["holdout"], cell["points"]["0"])
        for label, point in candidates(cell):
            if label in ("alpha 1.0", "step 0", "alpha 0.0"):
                continue  # plain's last step (already a candidate), and the untrained model itself
            gains.setdefault((cell["recipe"], label), {})[cell["holdout"]] = tuple(
                paired(point[name]["per_query"], base[name]["per_query"]) for name in ("held_out", "in_domain"))
    complete = {key: by for key, by in gains.items() if set(by) == set(holdouts)}
    if not complete:
        return ["- no recipe has finished on every hold-out yet"]

    def held_out_mean(by: dict) -> float:
        return float(np.mean([held["delta"] for held, _ in by.values()]))

    def eligible(by: dict) -> bool:
        return all(inside["delta"] > 2 * inside["se"] for _, inside in by.values())

    def nearness(key: tuple[str, str]) -> float:
        return float(key[1].split()[1]) / (1.0 if key[0] == "wise" else 1000.0)

    ranked = sorted(complete.items(), key=lambda kv: (not eligible(kv[1]), -held_out_mean(kv[1]), nearness(kv[0])))
    header = " | ".join(f"{h}: held-out / in-domain" for h in holdouts)
    lines = [f"| recipe | point | {header} | mean held-out | in-domain gain > 2 SE everywhere |",
             "|---|---|" + "---|" * len(holdouts) + "---|---|"]
    for (recipe, label), by in ranked:
        cols = " | ".join(f"{by[h][0]['delta']:+.1f} / {by[h][1]['delta']:+.1f} ± {by[h][1]['se']:.1f}"
                          for h in holdouts)
        lines.append(f"| {recipe} | {label} | {cols} | {held_out_mean(by):+.2f} | {'yes' if eligible(by) else 'no'} |")
    (recipe, label), by = ranked[0]
    verdict = (f"Chosen by the rule: **{recipe} {label}**." if eligible(by) else
               "No point gains in-domain by more than twice its standard error on every hold-out: the rule keeps "
               "the untrained model.")
    return [*lines, "", verdict]


def choices(cells: list[dict]) -> list[str]:
    """Per hold-out and recipe, the point the held-out validation chooses (the highest held-out nDCG@10; ties
    go to the earlier step or the smaller alpha, the point nearer the base)."""
    lines, reference = [], references(cells)
    for cell in cells:
        offered = candidates(cell)
        if not offered:
            continue
        label, point = max(offered, key=lambda c: (c[1]["held_out"]["ndcg@10"], -float(c[0].split()[1])))
        base = reference.get(cell["holdout"], cell["points"]["0"])
        d_out = paired(point["held_out"]["per_query"], base["held_out"]["per_query"])
        d_in = paired(point["in_domain"]["per_query"], base["in_domain"]["per_query"])
        lines.append(f"- {cell['holdout']} / {cell['recipe']}: {label} (held-out {d_out['delta']:+.1f} ± "
                     f"{d_out['se']:.1f}, in-domain {d_in['delta']:+.1f} ± {d_in['se']:.1f})")
    return lines


def write_report(cells_dir: Path, out: Path) -> Path:
    cells = [json.loads(p.read_text()) for p in sorted(cells_dir.glob("*.json"))]
    lines = ["# Fine-tuning recipes against a held-out source", "",
             "Written by `python eval/bench_recipes.py` from its cells. Each row is a checkpoint of a cosine run "
             "trained without the held-out sources: nDCG@10 on up to 300 held-out queries and on the in-domain "
             "validation rows, each ranking its queries' passages plus 1,000 distractors of its own sources, with "
             "the paired difference from the untrained MiniLM (step 0) ± its standard error. No test question is "
             "read.", ""]
    for cell in cells:
        queries = cell.get("queries") or {}
        lines.append(f"- {cell['holdout']} / {cell['recipe']}: {cell.get('train_rows')} training rows, "
                     f"{queries.get('held_out')} held-out and {queries.get('in_domain')} in-domain validation "
                     f"queries, {cell.get('steps')} steps, {'finished' if cell.get('finished') else 'in progress'}, "
                     f"on a CPU with {cell.get('cpu')}")
    lines += ["", *summary_rows(cells), "", "## What the held-out validation chooses", "", *choices(cells), "",
              "## The default recipe", "", *default_recipe(cells), ""]
    durable.write_text(out, "\n".join(lines))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-data", default=str(REPO / "data/train_default/train.jsonl.gz"))
    parser.add_argument("--val-data", default=str(REPO / "data/train_default/val.jsonl.gz"))
    parser.add_argument("--holdout", action="append", choices=sorted(HOLDOUTS), help="default: every one")
    parser.add_argument("--recipe", action="append", choices=[*RECIPES, "wise"], help="default: every one")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--runs", default=str(REPO / "artifacts/recipes"), help="training folders (resumable)")
    parser.add_argument("--report", default=str(REPO / "eval/reports/recipes"))
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    report = Path(args.report)
    if not args.report_only:
        for holdout in args.holdout or list(HOLDOUTS):
            data = split_sources(Path(args.train_data), Path(args.val_data), HOLDOUTS[holdout],
                                 Path(args.runs) / f"data_{holdout}")
            for recipe in args.recipe or [*RECIPES, "wise"]:
                RecipeRun(holdout, recipe, args.steps, data, Path(args.runs), report / "cells").run()
    print(write_report(report / "cells", report / "README.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
