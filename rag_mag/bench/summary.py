"""Turn finished cells into result rows and hand them to the report writer (rag_mag/report.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rag_mag.report import write_report
from rag_mag.stats import bootstrap_ci


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
            "n_questions": cell["n_questions"], "retrieval": retrieval, "rag": rag, "diagnostics": diagnostics,
            "seconds": cell.get("seconds")}


def training_curves(systems) -> dict:
    """Per trained system: validation metrics at every evaluation step (held-out training queries)."""
    curves = {}
    for system in systems:
        log = system.checkpoint.parent / "train_log.jsonl" if system.checkpoint is not None else None
        if log is None or not log.is_file():
            continue
        records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
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


def write_outputs(runner, cells: list[dict], predictors: dict, datasets: dict) -> Path:
    config = runner.config
    rows = [cell_to_row(cell, predictors, config.bootstrap_resamples) for cell in cells]
    per_example, norms = {}, {}
    for cell in cells:
        key = (cell["dataset"], cell["system"], cell["seed"])
        values = {"ids": [r.id for r in datasets[cell["dataset"]].records]}
        values.update({k: np.asarray(v) for k, v in cell["rag_per_example"].items()})
        values.update({k: np.asarray(v) for k, v in (cell.get("retrieval_per_example") or {}).items()})
        per_example[key] = values
        if cell.get("norm_samples") and cell["seed"] == min(c["seed"] for c in cells if c["system"] == cell["system"]):
            norms[(cell["dataset"], cell["system"])] = {k: np.asarray(v) for k, v in cell["norm_samples"].items()}
    notes = list(config.notes)
    training = training_curves(runner.systems)
    write_report(runner.out, rows, config=config.to_dict(), environment=runner.environment(),
                 per_example=per_example, norms=norms, in_domain=config.in_domain,
                 title=config.name, command=runner.command, notes=notes,
                 n_resamples=config.bootstrap_resamples, sections=[training_section(training)] if training else [],
                 extra={"training": training})
    return runner.out
