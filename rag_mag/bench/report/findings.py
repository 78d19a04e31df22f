"""PAPER.md's checkable findings, each with a verdict computed from the report's numbers (``paper_findings``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from rag_mag.bench.config import split_system
from rag_mag.bench.report.compare import significant_gain
from rag_mag.bench.report.format import LABELS, format_p, format_signed
from rag_mag.bench.report.model import ALPHA, Cell, find_comparison, finite

ONE_SIDED = ("qnorm", "dnorm")
DOCUMENT_MAGNITUDE = ("dot", "qnorm", "learnable")  # systems whose scores use the document norm
SIDE_PREDICTORS = (("fisher_predictor", "Fisher condition number"), ("side_selector", "delta-CV selector"))


def of_pipeline(cells: Sequence[Cell], comparisons: Sequence[Mapping], pipeline: str | None,
                ) -> tuple[list[Cell], list[dict]]:
    """The rows of one pipeline and of the reader baselines, named by their system alone (``qnorm``), with their
    comparisons; ``pipeline=None`` keeps everything as it is."""
    if pipeline is None:
        return list(cells), [dict(entry) for entry in comparisons]

    def plain(name: str) -> str | None:
        prefix, system = split_system(name)
        return system if prefix in (None, pipeline) else None

    kept = [replace(cell, system=plain(cell.system)) for cell in cells if plain(cell.system)]
    entries = [{**entry, "system": plain(entry["system"]), "baseline": plain(entry["baseline"])}
               for entry in comparisons if plain(entry["system"]) and plain(entry["baseline"])]
    return kept, entries


def paper_findings(cells: Sequence[Cell], comparisons: Sequence[Mapping], in_domain: Sequence[str] = (),
                   baseline: str = "cosine") -> list[dict]:
    """Each of PAPER.md's checkable findings with a verdict computed from the numbers (of plain system
    names: give one pipeline's rows through ``of_pipeline``)."""
    datasets = list(dict.fromkeys(cell.dataset for cell in cells))
    by_key = {(cell.dataset, cell.system): cell for cell in cells}
    return [_one_sided_beats_baseline(comparisons, datasets, baseline),
            _larger_gains_out_of_domain(by_key, datasets, in_domain, baseline),
            _relevant_norms_larger(cells),
            _retrieval_moves_answers(cells, comparisons, baseline),
            *(_side_predicted(cells, by_key, datasets, key, label) for key, label in SIDE_PREDICTORS)]


def _one_sided_beats_baseline(comparisons: Sequence[Mapping], datasets: Sequence[str], baseline: str) -> dict:
    """1. One-sided normalization beats cosine (EM, and nDCG@10), significance by the paired test."""
    evidence, held, total = [], 0, 0
    for dataset in datasets:
        entries = {(system, metric): find_comparison(comparisons, dataset, system, metric)
                   for system in ONE_SIDED for metric in ("em", "ndcg@10")}
        if not any(entries.values()):
            continue
        if any(entry and entry["p_value"] is not None for entry in entries.values()):
            total += 1  # without per-question values there is no test, so the dataset is shown but not counted
            held += any(significant_gain(entry) for entry in entries.values())
        parts = [f"{system} {LABELS[metric]} {format_signed(entry['delta'])} (p {format_p(entry['p_value'])})"
                 for (system, metric), entry in entries.items() if entry]
        evidence.append(f"{dataset}: " + "; ".join(parts))
    return {"finding": f"Normalizing one side (qnorm or dnorm) beats {baseline}",
            "verdict": _verdict(held, total),
            "detail": f"a one-sided strategy significantly better (p < {ALPHA}) on {held} of {total} datasets",
            "evidence": evidence}


def _larger_gains_out_of_domain(by_key: Mapping, datasets: Sequence[str], in_domain: Sequence[str],
                                baseline: str) -> dict:
    """2. Gains are larger out of domain than in domain (relative EM gain of the one-sided strategies)."""
    out_domain = [dataset for dataset in datasets if dataset not in set(in_domain)]
    inside = [dataset for dataset in datasets if dataset in set(in_domain)]
    gains = {system: {dataset: _relative_gain(by_key, dataset, system, baseline) for dataset in datasets}
             for system in ONE_SIDED}
    if not inside or not out_domain:
        verdict, detail, evidence = "not checked", ("needs at least one in-domain and one out-of-domain dataset; "
                                                   f"in-domain: {', '.join(inside) or 'none given'}"), []
    else:
        evidence, held_systems, checked = [], 0, 0
        for system, per_dataset in gains.items():
            inside_gain = _mean([per_dataset[dataset] for dataset in inside])
            outside_gain = _mean([per_dataset[dataset] for dataset in out_domain])
            if inside_gain is None or outside_gain is None:
                continue
            checked += 1
            held_systems += outside_gain > inside_gain
            evidence.append(f"{system}: relative EM gain over {baseline} in domain {inside_gain:+.1f}%, "
                            f"out of domain {outside_gain:+.1f}%")
        verdict = _verdict(held_systems, checked)
        detail = f"out-of-domain gain larger for {held_systems} of {checked} one-sided strategies"
    return {"finding": "Gains are larger out of domain than in domain", "verdict": verdict,
            "detail": detail, "evidence": evidence}


def _relevant_norms_larger(cells: Sequence[Cell]) -> dict:
    """3. Document-norm Cohen's d > 0 (relevant passages longer) for systems that score with document magnitude."""
    evidence, held, total = [], 0, 0
    for cell in cells:
        value = finite(cell.diagnostics.get("document_norm_cohens_d"))
        if cell.system in DOCUMENT_MAGNITUDE and value is not None:
            total += 1
            held += value > 0
            evidence.append(f"{cell.dataset}/{cell.system}: d = {value:+.2f}")
    return {"finding": "Relevant passages get larger document norms (Cohen's d > 0)",
            "verdict": _verdict(held, total),
            "detail": f"d > 0 in {held} of {total} (dataset, strategy) pairs that score with document "
                      f"magnitude ({', '.join(DOCUMENT_MAGNITUDE)})", "evidence": evidence}


def _retrieval_moves_answers(cells: Sequence[Cell], comparisons: Sequence[Mapping], baseline: str) -> dict:
    """4. Better retrieval turns into better answers: sign agreement of delta nDCG@10 and delta EM vs baseline."""
    evidence, held, total = [], 0, 0
    for cell in cells:
        retrieval = find_comparison(comparisons, cell.dataset, cell.system, "ndcg@10")
        answers = find_comparison(comparisons, cell.dataset, cell.system, "em")
        if retrieval and answers and retrieval["delta"] != 0:
            total += 1
            agree = (retrieval["delta"] > 0) == (answers["delta"] > 0)
            held += agree
            evidence.append(f"{cell.dataset}/{cell.system}: nDCG@10 {format_signed(retrieval['delta'])}, "
                            f"EM {format_signed(answers['delta'])}")
    return {"finding": "Better retrieval turns into better answers", "verdict": _verdict(held, total),
            "detail": f"EM moves with nDCG@10 (same sign of the change against {baseline}) in {held} of "
                      f"{total} cases", "evidence": evidence}


def _side_predicted(cells: Sequence[Cell], by_key: Mapping, datasets: Sequence[str], key: str, label: str) -> dict:
    """5. A side predictor (delta-CV, Fisher condition number) names the winner of qnorm vs dnorm."""
    evidence, held, total = [], 0, 0
    for dataset in datasets:
        prediction = _prediction(cells, dataset, key)
        observed = winner(by_key, dataset, "ndcg@10")
        if prediction in ONE_SIDED and observed is not None:
            total += 1
            held += prediction == observed
            evidence.append(f"{dataset}: predicted {prediction}, observed {observed} (nDCG@10)")
    return {"finding": f"The {label} predicts whether qnorm or dnorm wins", "verdict": _verdict(held, total),
            "detail": f"right on {held} of {total} datasets", "evidence": evidence}


def winner(by_key: Mapping, dataset: str, metric: str) -> str | None:
    """The better of qnorm and dnorm on ``dataset`` by ``metric`` (None without both, or on a tie)."""
    scores = {system: by_key[(dataset, system)].means.get(metric)
              for system in ONE_SIDED if (dataset, system) in by_key}
    if len(scores) < 2 or None in scores.values() or scores["qnorm"] == scores["dnorm"]:
        return None
    return max(scores, key=scores.get)


def _verdict(held: int, total: int) -> str:
    if total == 0:
        return "not checked"
    return "held" if held == total else "partly held" if held else "did not hold"


def _relative_gain(by_key: Mapping, dataset: str, system: str, baseline: str) -> float | None:
    cell, reference = by_key.get((dataset, system)), by_key.get((dataset, baseline))
    if not cell or not reference or "em" not in cell.means or not reference.means.get("em"):
        return None
    return 100.0 * (cell.means["em"] - reference.means["em"]) / reference.means["em"]


def _mean(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return float(np.mean(present)) if present else None


def _prediction(cells: Sequence[Cell], dataset: str, key: str) -> str | None:
    for cell in cells:
        if cell.dataset == dataset and isinstance(cell.diagnostics.get(key), Mapping):
            return cell.diagnostics[key].get("prediction")
    return None
