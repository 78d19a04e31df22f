"""The crossover study's report: curves, the data-size axis, tuning and ablation tables, and a verdict.

The verdict is computed from the numbers: for each one-sided strategy, the first checkpoint at which
its test nDCG@10 (questions of all test sets pooled, seed-averaged) beats cosine's at the same step
with a paired permutation test p < 0.05, Holm-adjusted over the checkpoints compared (the verdict asks
"ahead at any checkpoint?", so one lucky checkpoint of several must not decide it; a checkpoint where it
is behind enters that family as p = 1); or the statement that it does not within the largest run. The
data-size verdict adjusts over the sizes the same way.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rag_mag import durable
from rag_mag.bench.report.environment import collect_environment
from rag_mag.bench.stats import compare_paired, holm_adjust

ONE_SIDED = ("qnorm", "dnorm")
ALPHA = 0.05


def selected_point(cell: Mapping) -> Mapping | None:
    """The measurement of the step a main run published: its curve point there, else its ``published`` one
    (a step between the curve's checkpoints, measured after the run)."""
    step = cell.get("selected_step")
    point = {p["step"]: p for p in cell.get("curve", [])}.get(step)
    published = cell.get("published")
    return point or (published if published and published.get("step") == step else None)


def _points(cells: Sequence[Mapping], group: str, **match: Any) -> dict[str, dict[int, list[Mapping]]]:
    """strategy -> step -> [curve point per seed] for the cells of a group that match the run fields."""
    found: dict[str, dict[int, list[Mapping]]] = defaultdict(lambda: defaultdict(list))
    for cell in cells:
        run = cell["run"]
        if run["group"] != group or any(run.get(k) != v for k, v in match.items()):
            continue
        for point in cell["curve"]:
            found[run["strategy"]][point["step"]].append(point)
    return found


def _pooled(points: Sequence[Mapping], datasets: Sequence[str]) -> np.ndarray:
    """Seed-averaged per-question nDCG@10, all test sets concatenated."""
    per_seed = [np.concatenate([point["test"][d]["per_example"] for d in datasets]) for point in points]
    return np.mean(per_seed, axis=0)


def _test_mean(points: Sequence[Mapping], dataset: str) -> float:
    return float(np.mean([point["test"][dataset]["ndcg@10"] for point in points]))


def _adjust(rows: list[dict]) -> None:
    """Add ``p_holm`` (Holm-adjusted over ``rows``, one family) and the family size to each row.

    The family asks "ahead of cosine at any of them?": a row where the strategy is behind is no evidence
    of that, however small its two-sided p, so it enters the family as p = 1 (else a significant loss at
    one checkpoint would relax the bar for a gain at another).
    """
    directional = [r["p"] if r["delta"] > 0 else 1.0 for r in rows]
    for row, adjusted in zip(rows, holm_adjust(directional), strict=True):
        row["p_holm"], row["family"] = adjusted, len(rows)


def _p_text(row: Mapping, what: str) -> str:
    if row.get("family", 1) <= 1:
        return f"p = {row['p']:.3g}"
    return f"p = {row['p']:.3g}, Holm-adjusted over {row['family']} {what} {row['p_holm']:.3g}"


def _peaks(rows: Sequence[Mapping]) -> str:
    """Whether an overtake is the strategy rising above cosine's best, or cosine falling below the strategy:
    each one's highest pooled test nDCG@10 over the checkpoints compared (descriptive; nothing is chosen by
    it)."""
    own = max(rows, key=lambda r: r["mean"])
    cosine = max(rows, key=lambda r: r["cosine_mean"])
    above = own["mean"] > cosine["cosine_mean"]
    return (f"Its best checkpoint (pooled {own['mean']:.1f} at {own['step']} steps) is {'' if above else 'not '}"
            f"above cosine's best ({cosine['cosine_mean']:.1f} at {cosine['step']} steps)"
            + ("." if above else ": the lead comes from cosine losing more with longer training."))


def verdicts(cells: Sequence[Mapping], datasets: Sequence[str], n_train: int) -> list[dict]:
    main = _points(cells, "main", fraction=1.0)
    if "cosine" not in main:
        return []
    results = []
    for strategy in [s for s in main if s != "cosine"]:
        steps = sorted(set(main[strategy]) & set(main["cosine"]))
        rows = []
        for step in steps:
            comparison = compare_paired(_pooled(main[strategy][step], datasets),
                                        _pooled(main["cosine"][step], datasets), n_resamples=1000,
                                        n_permutations=2000)
            rows.append({"step": step, "delta": comparison.delta, "ci": list(comparison.delta_ci),
                         "p": comparison.p_value, "mean": comparison.mean_a, "cosine_mean": comparison.mean_b})
        _adjust([r for r in rows if r["step"] > 0])
        overtakes = next((r for r in rows if r["step"] > 0 and r["delta"] > 0 and r["p_holm"] < ALPHA), None)
        largest = max(steps) if steps else 0
        if overtakes:
            text = (f"{strategy} overtakes cosine at {overtakes['step']} steps ({n_train} training pairs): pooled "
                    f"test nDCG@10 {overtakes['delta']:+.2f} (95% CI {overtakes['ci'][0]:+.2f} to "
                    f"{overtakes['ci'][1]:+.2f}, {_p_text(overtakes, 'checkpoints')}). " + _peaks(rows))
        else:
            last = rows[-1] if rows else None
            text = (f"{strategy} does not overtake cosine within the largest run ({largest} steps, {n_train} "
                    f"training pairs)" + (f": at {largest} steps it is {last['delta']:+.2f} nDCG@10 "
                                          f"(95% CI {last['ci'][0]:+.2f} to {last['ci'][1]:+.2f}, "
                                          f"{_p_text(last, 'checkpoints')})." if last else "."))
        results.append({"strategy": strategy, "by_step": rows, "overtakes_at": overtakes["step"] if overtakes else None,
                        "largest_steps": largest, "text": text})
    return results


def size_verdicts(cells: Sequence[Mapping], datasets: Sequence[str]) -> list[dict]:
    """The data-size axis: at each share of the pairs, each strategy against cosine at the runs' last step."""
    final: dict[str, dict[float, list[Mapping]]] = defaultdict(lambda: defaultdict(list))
    sizes: dict[float, int] = {}
    for cell in cells:
        if cell["run"]["group"] == "data_size" and cell["curve"] and cell["curve"][-1]["test"]:
            final[cell["run"]["strategy"]][cell["run"]["fraction"]].append(cell["curve"][-1])
            sizes[cell["run"]["fraction"]] = cell["train_size"]
    results = []
    for strategy in [s for s in final if s != "cosine" and "cosine" in final]:
        rows = []
        for fraction in sorted(set(final[strategy]) & set(final["cosine"])):
            comparison = compare_paired(_pooled(final[strategy][fraction], datasets),
                                        _pooled(final["cosine"][fraction], datasets), n_resamples=1000,
                                        n_permutations=2000)
            rows.append({"fraction": fraction, "pairs": sizes[fraction], "delta": comparison.delta,
                         "ci": list(comparison.delta_ci), "p": comparison.p_value,
                         "steps": final[strategy][fraction][0]["step"]})
        if not rows:
            continue
        _adjust(rows)
        overtakes = next((r for r in rows if r["delta"] > 0 and r["p_holm"] < ALPHA), None)
        if overtakes:
            text = (f"{strategy} overtakes cosine at {overtakes['pairs']} training pairs ({overtakes['steps']} "
                    f"steps): pooled test nDCG@10 {overtakes['delta']:+.2f} (95% CI {overtakes['ci'][0]:+.2f} to "
                    f"{overtakes['ci'][1]:+.2f}, {_p_text(overtakes, 'sizes')}).")
        else:
            last = rows[-1]
            text = (f"{strategy} does not overtake cosine at any data size up to {last['pairs']} training pairs "
                    f"({last['steps']} steps): with all of them it is {last['delta']:+.2f} nDCG@10 (95% CI "
                    f"{last['ci'][0]:+.2f} to {last['ci'][1]:+.2f}, {_p_text(last, 'sizes')}).")
        results.append({"strategy": strategy, "axis": "data_size", "by_size": rows,
                        "overtakes_at_pairs": overtakes["pairs"] if overtakes else None, "text": text})
    return results


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows)]


def render(result: Mapping, command: str) -> tuple[str, dict]:
    config, cells = result["config"], result["cells"]
    datasets = config["datasets"]
    n_train = max((c["train_size"] for c in cells if c["run"]["group"] == "main"), default=0)
    found = verdicts(cells, datasets, n_train)
    by_size = size_verdicts(cells, datasets)
    lines = [f"# Crossover study: {config['name']}", "", f"Command: `{command}`", ""]
    planned = result.get("planned")
    if planned and len(cells) < planned:
        lines += [f"**In progress: {len(cells)} of {planned} runs finished.** Run the same command again to "
                  "continue (`--only LABEL` for one run); finished runs are kept. Still to run: "
                  + ", ".join(f"`{label}`" for label in result.get("pending", [])) + ".", ""]
    lines += ["## Verdict", "", "Computed from the numbers below: a strategy overtakes cosine where its pooled "
              "per-question test nDCG@10 (seed-averaged, all test sets) is higher with a paired permutation "
              f"p < {ALPHA}, Holm-adjusted over the checkpoints (or data sizes) compared, since the question is "
              "whether it is ahead at any of them (one where it is behind counts as p = 1).", "",
              "Training length:", ""] + ([f"- {v['text']}" for v in found] or [
        "- No verdict yet: cosine and at least one other strategy need a finished main run."]) + [""]
    if by_size:
        lines += ["Training data size:", ""] + [f"- {v['text']}" for v in by_size] + [""]
    main = _points(cells, "main", fraction=1.0)
    lines += ["## Curves (main runs): nDCG@10 against training steps", "",
              "Validation: the fixed held-out training queries (val.jsonl). Test: each dataset's first "
              f"{config['max_questions']} questions against its own corpus. Step 0 is the untrained encoder "
              "under the strategy (for cosine, the base model). Mean over seeds; seeds in brackets.", ""]
    header = ["strategy", "step", "validation", *datasets, "test mean"]
    rows = []
    for strategy in sorted(main):
        for step in sorted(main[strategy]):
            points = main[strategy][step]
            tests = [_test_mean(points, d) for d in datasets]
            rows.append([strategy, str(step), f"{np.mean([p['validation']['ndcg@10'] for p in points]):.1f}",
                         *(f"{t:.1f}" for t in tests), f"{np.mean(tests):.1f} [{len(points)}]"])
    lines += _table(header, rows) + [""]
    lines += _published(cells, datasets)
    precisions = sorted({_precision(c) for c in cells})
    if len(precisions) > 1:
        lines += [f"The runs trained in different precisions ({' and '.join(precisions)}: `precision: auto` on "
                  "machines with and without native bf16); each run's precision is in the tables below and in "
                  "results.json (`bf16`).", ""]
    for group, title in (("data_size", "Data-size axis"), ("tuning", "Tuning on validation"),
                         ("ablation", "Training-data ablation (validation)")):
        group_cells = [c for c in cells if c["run"]["group"] == group]
        if not group_cells:
            continue
        lines += [f"## {title}", "", *_table(
            ["run", "pairs", "steps", "precision", "best val nDCG@10 (step)", "final val", "final test mean", "loss"],
            [[c["label"], str(c["train_size"]), str(c["run"]["steps"]), _precision(c), _best(c), _final_val(c),
              _final_test(c, datasets),
              f"{c['final_loss']:.3f}" if c.get("final_loss") is not None else "-"] for c in group_cells]), ""]
    lines += ["## Environment", "", "```json", json.dumps(collect_environment(command), indent=1), "```", ""]
    return "\n".join(lines), {"verdicts": found, "size_verdicts": by_size, "n_train": n_train}


def _published(cells: Sequence[Mapping], datasets: Sequence[str]) -> list[str]:
    """Which checkpoint each main run published as best/ (what the benchmark scores), and its test nDCG@10."""
    rows = []
    for cell in (c for c in cells if c["run"]["group"] == "main"):
        step = cell.get("selected_step")  # None: a run finished before the rule was recorded (max)
        rule = cell.get("selection", "max")
        point = selected_point(cell)
        tests = [f"{point['test'][d]['ndcg@10']:.1f}" if point and d in point["test"] else "-" for d in datasets]
        validation = f"{point['validation']['ndcg@10']:.1f}" if point else "-"
        rows.append([cell["label"], rule, "-" if step is None else str(step), validation, *tests])
    if not rows:
        return []
    return ["## Published checkpoints (main runs)", "",
            "`best/` of each main run, the checkpoint `rag-mag bench` scores. `one_se`: the earliest validated "
            "checkpoint whose validation nDCG@10 is within one paired standard error of the best one, the "
            "untrained step 0 included (`rag_mag/retriever/training/selection.py`); `max`: the highest validation "
            "nDCG@10 (the rule before it). The trainer validates every 100 steps; a step between the curve's "
            "checkpoints is measured after its run (`published` in its cell).", "",
            *_table(["run", "rule", "best/ step", "validation", *datasets], rows), ""]


def _precision(cell: Mapping) -> str:
    return "bf16" if cell.get("bf16") else "fp32"


def _best(cell: Mapping) -> str:
    best = max(cell["curve"], key=lambda p: p["validation"]["ndcg@10"])
    return f"{best['validation']['ndcg@10']:.1f} ({best['step']})"


def _final_test(cell: Mapping, datasets: Sequence[str]) -> str:
    test = cell["curve"][-1]["test"]
    return f"{np.mean([test[d]['ndcg@10'] for d in datasets]):.1f}" if test else "-"


def _final_val(cell: Mapping) -> str:
    return f"{cell['curve'][-1]['validation']['ndcg@10']:.1f}"


def plot(result: Mapping, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    datasets = result["config"]["datasets"]
    main = _points(result["cells"], "main", fraction=1.0)
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for strategy in sorted(main):
        steps = sorted(main[strategy])
        validation = [np.mean([p["validation"]["ndcg@10"] for p in main[strategy][s]]) for s in steps]
        test = [np.mean([_test_mean(main[strategy][s], d) for d in datasets]) for s in steps]
        left.plot(steps, validation, marker="o", label=strategy)
        right.plot(steps, test, marker="o", label=strategy)
    left.set(title="validation nDCG@10", xlabel="training steps")
    right.set(title="test nDCG@10 (mean of test sets)", xlabel="training steps")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def write(result: Mapping, out_dir: Path, command: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    markdown, summary = render(result, command)
    plot(result, out_dir / "curves.png")
    durable.write_text(out_dir / "report.md", markdown)
    slim = {"config": result["config"], "summary": summary,
            "cells": [{k: v for k, v in c.items() if k != "curve"} | {"curve": [
                {**p, "test": {d: {"ndcg@10": t["ndcg@10"]} for d, t in p["test"].items()}} for p in c["curve"]]}
                for c in result["cells"]]}
    durable.write_text(out_dir / "results.json", json.dumps(slim, indent=1))
    return out_dir / "report.md"
