"""Turn finished cells into result rows and hand them to the report writer (rag_mag/bench/report/write.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from rag_mag.bench.report.aggregate import seed_averaged
from rag_mag.bench.report.model import ALPHA
from rag_mag.bench.report.write import write_report
from rag_mag.bench.stats import bootstrap_ci, compare_paired


def cell_to_row(cell: dict, predictors: dict, resamples: int) -> dict:
    """One row of results.json: metrics in [0, 100] with 95% bootstrap CIs of EM and F1."""
    rag = dict(cell["rag"])
    for metric in ("em", "f1"):
        low, high = bootstrap_ci(np.asarray(cell["rag_per_example"][metric]), n_resamples=resamples)
        rag[f"{metric}_ci"] = [100.0 * low, 100.0 * high]
    retrieval = dict(cell.get("retrieval") or {})
    if retrieval:
        retrieval["recall_curve"] = cell.get("recall_curve")
        retrieval["mode"] = cell.get("retrieval_mode")
    diagnostics = dict(cell.get("diagnostics") or {})
    dataset_predictors = predictors.get("datasets", {}).get(cell["dataset"], {})
    if diagnostics:
        diagnostics["side_selector"] = dataset_predictors.get("delta_cv")
        diagnostics["side_selector_training_data"] = predictors.get("training_data", {}).get("delta_cv")
        diagnostics["fisher_predictor"] = predictors.get("training_data", {}).get("fisher")
    return {"dataset": cell["dataset"], "system": cell["system"], "seed": cell["seed"],
            "n_questions": cell["n_questions"], "n_ranked": cell.get("n_ranked"), "retrieval": retrieval,
            "rag": rag, "diagnostics": diagnostics,
            "pipeline": cell.get("pipeline"), "budget": cell.get("budget"), "rounds": cell.get("rounds"),
            "seconds": cell.get("seconds")}


def read_training_log(path: Path) -> list[dict]:
    """What the report shows of a ``train_log.jsonl``: its validation records and its last loss record
    (empty when there is no log)."""
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    losses = [r for r in records if "loss" in r]
    return [r for r in records if "validation" in r] + losses[-1:]


def training_curves(systems, recorded: dict | None = None) -> dict:
    """Per trained system: validation metrics at every evaluation step (held-out training queries).

    ``recorded``: training logs by checkpoint digest (``retrievers.json``), for retrievers whose run
    folder is not on this machine."""
    by_digest = {r["digest"]: r.get("train_log") or [] for r in (recorded or {}).values()}
    curves = {}
    for system in systems:
        if system.checkpoint is None:
            continue
        records = read_training_log(system.checkpoint.parent / "train_log.jsonl") or by_digest.get(system.digest)
        if not records:
            continue
        losses = [r for r in records if "loss" in r]
        curves[system.label] = {
            "validation": [{"step": r["step"], **r["validation"]} for r in records if "validation" in r],
            "final_loss": losses[-1]["loss"] if losses else None,
            "g": [losses[-1]["g_query"], losses[-1]["g_document"]] if losses else None,
        }
    return curves


def training_section(curves: dict) -> str:
    steps = sorted({point["step"] for curve in curves.values() for point in curve["validation"]})
    lines = ["## Training length: validation nDCG@10 on held-out training queries", "",
             "Each strategy's best checkpoint on this validation set is the one evaluated above; these figures "
             "show how the comparison moves with training length (never tuned on the evaluation questions).", "",
             "| system | " + " | ".join(f"step {step}" for step in steps) + " | final loss | g (query, document) |",
             "|---" * (len(steps) + 3) + "|"]
    for label, curve in curves.items():
        by_step = {point["step"]: point["ndcg@10"] for point in curve["validation"]}
        cells = [f"{by_step[step]:.1f}" if step in by_step else "–" for step in steps]
        loss = f"{curve['final_loss']:.3f}" if curve["final_loss"] is not None else "–"
        g = ", ".join(f"{x:.2f}" for x in curve["g"]) if curve["g"] else "–"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {loss} | {g} |")
    return "\n".join(lines)


def rounds_section(cells: list[dict], resamples: int) -> str | None:
    """Per multi-round system: recall of the union of all rounds against the first round alone, at the same
    budget. A system's seeds are averaged per question, as everywhere in the report."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for cell in cells:
        values = cell.get("retrieval_per_example") or {}
        if cell.get("rounds", 1.0) > 1.0 and "round1_recall@budget" in values:
            groups.setdefault((cell["dataset"], cell["system"]), []).append(cell)
    per_example = {(cell["dataset"], cell["system"], cell.get("seed", 0)): cell["retrieval_per_example"]
                   for group in groups.values() for cell in group}
    rows = []
    for (dataset, system), group in groups.items():
        group.sort(key=lambda cell: cell.get("seed", 0))
        seeds = [cell.get("seed", 0) for cell in group]
        _, union = seed_averaged(per_example, dataset, system, seeds, "recall@budget")
        _, first = seed_averaged(per_example, dataset, system, seeds, "round1_recall@budget")
        result = compare_paired(union, first, n_resamples=resamples).to_dict(scale=100.0)
        low, high = result["delta_ci"]
        significant = result["p_value"] < ALPHA
        verdict = ("helps" if significant and result["delta"] > 0 else
                   "hurts" if significant and result["delta"] < 0 else "no clear difference")
        rounds = np.mean([cell["rounds"] for cell in group])
        budget = np.mean([cell["budget"]["mean"] for cell in group])
        rows.append(f"| {dataset} | {system} | {', '.join(map(str, seeds))} | {group[0]['n_questions']} | "
                    f"{rounds:.2f} | {budget:.1f} | {100 * first.mean():.1f} | {100 * union.mean():.1f} | "
                    f"{result['delta']:+.1f} [{low:+.1f}, {high:+.1f}] | {result['p_value']:.3f} | {verdict} |")
    if not rows:
        return None
    return "\n".join([
        "## Multi-hop: does the second round help?", "",
        "Retrieval of a multi-round pipeline is judged on the union of all rounds' passages (what the reader was "
        "given). The budget is that number of passages per question (at most top_k per round: 6 for "
        "rag_multihop.yaml's two rounds at the benchmark's rag_top_k of 3), and the first round "
        "alone is judged at the same budget: the retriever's top-*budget* for the question. Recall is the "
        "dataset's (fraction of supporting passages, or an answer-bearing hit); Δ = union - first round, with a "
        "paired 95% bootstrap CI and permutation p-value, seed-averaged per question. The second round **helps** "
        f"or **hurts** where p < {ALPHA}.", "",
        "| dataset | system | seeds | n | rounds | budget | round 1 only | all rounds | Δ [95% CI] | p "
        "| second round |",
        "|---|---|---|---|---|---|---|---|---|---|---|", *rows])


def failures_section(failures: list[dict]) -> str | None:
    if not failures:
        return None
    lines = ["## Failed cells", "",
             "These cells kept failing after the generator's retries and the benchmark's waits (llm_timeout, "
             "llm_max_retries, llm_retry_waits); they have no row above. Rerun the same command to compute them: "
             "every finished cell and cached answer is reused.", "", "| dataset | system | error |", "|---|---|---|"]
    lines += [f"| {f['dataset']} | {f['system']} | {f['error'].replace('|', '/')} |" for f in failures]
    return "\n".join(lines)


def write_outputs(runner, cells: list[dict], predictors: dict, datasets: dict, failures: list[dict] | None = None,
                  ) -> Path:
    config = runner.config
    failures = list(failures or [])
    rows = [cell_to_row(cell, predictors, config.bootstrap_resamples) for cell in cells]
    per_example, norms = {}, {}
    for cell in cells:
        key = (cell["dataset"], cell["system"], cell["seed"])
        # each metric covers the dataset's first len(values) questions: answers the first n_questions
        # (answer_questions), the ranking metrics all of them; an oracle cell names its own (question_ids)
        values = {"ids": cell.get("question_ids") or [r.id for r in datasets[cell["dataset"]].records]}
        values.update({k: np.asarray(v) for k, v in cell["rag_per_example"].items()})
        values.update({k: np.asarray(v) for k, v in (cell.get("retrieval_per_example") or {}).items()})
        per_example[key] = values
        if cell.get("norm_samples") and cell["seed"] == min(c["seed"] for c in cells if c["system"] == cell["system"]):
            norms[(cell["dataset"], cell["system"])] = {k: np.asarray(v) for k, v in cell["norm_samples"].items()}
    readers = runner.readers()
    notes = [f"Rows are answered by the reader `{readers[0]['name']}` ({readers[0]['checksum']})" +
             (f"; rows named ROW@base by `{readers[1]['name']}` ({readers[1]['checksum']})." if len(readers) > 1
              else "."), *config.notes]
    if failures:
        notes.append(f"{len(failures)} cell(s) failed and have no row; see the section 'Failed cells'.")
    training = training_curves(runner.systems, runner.catalog.records)
    sections = [section for section in (rounds_section(cells, config.bootstrap_resamples),
                                        training_section(training) if training else None,
                                        failures_section(failures)) if section]
    primary = config.pipeline_entries()[0].name
    write_report(runner.out, rows, config=config.to_dict(), environment=runner.environment(),
                 per_example=per_example, norms=norms, in_domain=config.in_domain,
                 title=config.name, command=runner.command, notes=notes,
                 n_resamples=config.bootstrap_resamples, sections=sections, primary_pipeline=primary,
                 extra={"training": training, "failures": failures, "readers": readers,
                        "wall_seconds": round(time.perf_counter() - runner.started, 1),
                        "cell_seconds_total": round(sum(cell.get("seconds", 0.0) for cell in cells), 1)})
    return runner.out
