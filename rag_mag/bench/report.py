"""The benchmark report: ``results.json``, ``report.md`` and PNG plots, from result rows.

Public API::

    files = write_report(out_dir, rows, config=config, per_example=per_example, norms=norms,
                         in_domain=["hotpot_qa"], command=sys.argv)

``rows``: one dict per (dataset, system, seed), the shape of ``results.json``'s ``results``::

    {"dataset": str, "system": str, "seed": int, "n_questions": int,
     "retrieval": {"recall@1", "recall@5", "recall@20", "ndcg@10", "mrr@10", ...,
                   "recall_curve": [recall@1, recall@2, ...] (optional), "mode": str (optional)},
     "rag": {"em", "f1", "em_ci": [lo, hi], "f1_ci": [lo, hi]},
     "diagnostics": {"document_norm_cohens_d", "query_norm_cv", "document_norm_cv", ...,
                     "side_selector": SideSelection.to_dict(), "fisher_predictor": FisherPrediction.to_dict()}}

All metrics in [0, 100]; a system without retrieval (closed book) or without generation may leave
that block empty. ``n_ranked`` (optional): the number of questions the ranking metrics cover, where it
differs from ``n_questions`` (the answered ones). ``per_example`` (kept out of results.json):
``{(dataset, system, seed): {"ids": [...], "em": array, "f1": array, "recall@5": array, ...}}`` with
per-question values in [0, 1], each array covering the first len(array) of ``ids``; it drives the
confidence intervals of seed-averaged systems and the paired tests against ``baseline``. ``norms``:
``{(dataset, system): {"relevant": array, "irrelevant": array}}`` raw document norms for the histograms.

Several seeds of one system are averaged per question before the bootstrap, so a CI covers question
sampling of the seed-averaged system; the spread over seeds is shown in its own table. Every file is
written atomically and durably (rag_mag.durable: temporary file, fsync, rename). The section "Paper
findings: held or not" is computed from the numbers by ``paper_findings``, and "Against the untrained
encoder" (``against_untrained``) says whether training helped each strategy over ``base_cosine``.
"""

from __future__ import annotations

import datetime as _datetime
import io
import json
import logging
import math
import os
import platform
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from rag_mag.bench.config import BASELINES, split_system, system_name
from rag_mag.bench.stats import bootstrap_ci, compare_paired, holm_adjust
from rag_mag.models import REPO_ROOT

logger = logging.getLogger(__name__)

STRATEGY_ORDER = ("cosine", "dot", "qnorm", "dnorm", "learnable", "base_cosine", "bm25", "closed_book", "oracle")
ONE_SIDED = ("qnorm", "dnorm")
DOCUMENT_MAGNITUDE = ("dot", "qnorm", "learnable")  # systems whose scores use the document norm
RETRIEVAL_COLUMNS = ("recall@1", "recall@5", "recall@20", "ndcg@10", "mrr@10", "recall@budget")
COMPARED = ("em", "f1", "accuracy", "ndcg@10", "recall@5", "recall@budget")
LABELS = {"em": "EM", "f1": "F1", "accuracy": "accuracy", "ndcg@10": "nDCG@10", "mrr@10": "MRR@10",
          "recall@budget": "recall@budget"}
PACKAGES = ("rag-mag", "torch", "transformers", "haystack-ai", "vllm-haystack", "faiss-cpu", "datasets",
            "evaluate", "bm25s", "numpy", "matplotlib", "sentence-transformers")
ALPHA = 0.05
UNTRAINED = "base_cosine"  # the encoder every strategy's training starts from


@dataclass(frozen=True)
class ReportFiles:
    results_json: Path
    report_md: Path
    plots: tuple[Path, ...]


# ------------------------------------------------------------------------------ environment
def collect_environment(command: Sequence[str] | str | None = None, extra: Mapping[str, Any] | None = None) -> dict:
    """The exact command, git commit, package versions and machine, for the report's setup section."""
    if command is None:
        import sys

        command = sys.argv
    command_text = command if isinstance(command, str) else shlex.join(str(part) for part in command)
    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    environment = {
        "command": command_text,
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "timestamp": _datetime.datetime.now(_datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "packages": packages,
        "machine": _machine(),
    }
    environment.update(extra or {})
    return environment


def _git(*args: str) -> str | None:
    try:
        result = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip()


def _machine() -> dict:
    machine = {"platform": platform.platform(), "cpu_count": os.cpu_count(), "cpu": platform.processor() or None}
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                machine["cpu"] = line.split(":", 1)[1].strip()
                break
    try:
        machine["memory_gb"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        machine["memory_gb"] = None
    try:
        gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=True)
        machine["gpus"] = [line for line in gpus.stdout.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError):
        machine["gpus"] = []
    return machine


# ------------------------------------------------------------------------------ aggregation
def _rank(name: str) -> tuple[int, str, int, str]:
    """Rows of pipelines first (``rag:...``, by pipeline name), then the reader baselines; within each, the
    strategies in the paper's order, then the baselines, then anything else by name."""
    pipeline, system = split_system(name)
    return (0 if pipeline else 1, pipeline or "",
            STRATEGY_ORDER.index(system) if system in STRATEGY_ORDER else len(STRATEGY_ORDER), system)


def _order(names: Sequence[str]) -> list[str]:
    return sorted(dict.fromkeys(names), key=_rank)


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def seed_averaged(per_example: Mapping, dataset: str, system: str, seeds: Sequence[int], metric: str):
    """(ids, per-question values averaged over seeds) or None when some seed lacks the metric."""
    arrays, ids = [], None
    for seed in seeds:
        entry = per_example.get((dataset, system, seed))
        if entry is None or metric not in entry:
            return None
        values = np.asarray(entry[metric], dtype=np.float64)
        entry_ids = list(entry["ids"])[: len(values)] if "ids" in entry else None
        if arrays and (len(values) != len(arrays[0]) or (ids is not None and entry_ids not in (None, ids))):
            raise ValueError(f"per-example {metric} of {dataset}/{system} covers different questions in different "
                             "seeds; score every seed on the same questions")
        arrays.append(values)
        ids = ids if ids is not None else entry_ids
    return ids, np.mean(arrays, axis=0)


@dataclass
class Cell:
    """One (dataset, system): metric means over seeds, CIs where known."""

    dataset: str
    system: str
    seeds: list[int]
    n_questions: int
    means: dict[str, float]
    cis: dict[str, tuple[float, float]]
    seed_sd: dict[str, float]
    diagnostics: dict
    curve: list[float] | None
    mode: str | None
    n_ranked: int | None = None  # questions the ranking metrics cover (None: the n_questions answered)

    @property
    def ranked(self) -> int:
        return self.n_ranked or self.n_questions

    def to_dict(self) -> dict:
        return {"dataset": self.dataset, "system": self.system, "seeds": self.seeds, "n_questions": self.n_questions,
                "n_ranked": self.ranked, "means": self.means,
                "ci": {key: list(value) for key, value in self.cis.items()}, "seed_sd": self.seed_sd}


def aggregate(rows: Sequence[Mapping], per_example: Mapping | None = None, n_resamples: int = 2000,
              seed: int = 0) -> list[Cell]:
    """Group rows by (dataset, system) and average over seeds (see the module docstring)."""
    per_example = per_example or {}
    groups: dict[tuple[str, str], list[Mapping]] = {}
    for row in rows:
        for key in ("dataset", "system"):
            if not isinstance(row.get(key), str):
                raise ValueError(f"every result row needs a string {key!r}; got {row.get(key)!r}")
        groups.setdefault((row["dataset"], row["system"]), []).append(row)
    cells = []
    for (dataset, system), members in groups.items():
        seeds = [int(member.get("seed", 0)) for member in members]
        values: dict[str, list[float]] = {}
        for member in members:
            for block in ("rag", "retrieval"):
                for metric, value in (member.get(block) or {}).items():
                    if _finite(value) is not None and not metric.endswith("_ci"):
                        values.setdefault(metric, []).append(float(value))
        means = {metric: float(np.mean(numbers)) for metric, numbers in values.items()}
        seed_sd = {metric: float(np.std(numbers, ddof=1)) for metric, numbers in values.items() if len(numbers) > 1}
        cis: dict[str, tuple[float, float]] = {}
        for metric in means:
            averaged = seed_averaged(per_example, dataset, system, seeds, metric)
            if averaged is not None:
                # The mean and its CI come from the same per-question values, so they always agree.
                example_mean = 100.0 * float(averaged[1].mean())
                if abs(example_mean - means[metric]) > 0.5:
                    logger.warning("%s/%s: %s is %.2f in the rows but %.2f in the per-example values; reporting "
                                   "the per-example figure", dataset, system, metric, means[metric], example_mean)
                means[metric] = example_mean
                low, high = bootstrap_ci(averaged[1], n_resamples=n_resamples, seed=seed)
                cis[metric] = (100.0 * low, 100.0 * high)
            elif len(members) == 1 and metric in ("em", "f1") and members[0].get("rag", {}).get(f"{metric}_ci"):
                low, high = members[0]["rag"][f"{metric}_ci"]
                cis[metric] = (float(low), float(high))
        curves = [member.get("retrieval", {}).get("recall_curve") for member in members]
        curve = list(np.mean(curves, axis=0)) if curves and all(curves) and len({len(c) for c in curves}) == 1 else None
        cells.append(Cell(dataset=dataset, system=system, seeds=sorted(seeds),
                          n_questions=int(members[0].get("n_questions", 0)), means=means, cis=cis, seed_sd=seed_sd,
                          diagnostics=dict(members[0].get("diagnostics") or {}), curve=curve,
                          mode=(members[0].get("retrieval") or {}).get("mode"),
                          n_ranked=members[0].get("n_ranked")))
    return cells


def reference_system(system: str, baseline: str = "cosine", primary_pipeline: str | None = None) -> str:
    """What a row is compared against: ``baseline`` in the same pipeline (``rag_multihop:qnorm`` against
    ``rag_multihop:cosine``); a reader baseline (no pipeline) against the primary pipeline's ``baseline``."""
    pipeline, _ = split_system(system)
    return system_name(pipeline or primary_pipeline, baseline)


def compare_to_baseline(cells: Sequence[Cell], per_example: Mapping | None, baseline: str = "cosine",
                        metrics: Sequence[str] = COMPARED, n_resamples: int = 2000, n_permutations: int = 10000,
                        seed: int = 0, primary_pipeline: str | None = None) -> list[dict]:
    """Paired tests of every system against ``baseline`` on the same questions of each dataset (see
    ``reference_system`` for which row that is)."""
    per_example = per_example or {}
    by_key = {(cell.dataset, cell.system): cell for cell in cells}
    comparisons = []
    for cell in cells:
        reference_name = reference_system(cell.system, baseline, primary_pipeline)
        reference = by_key.get((cell.dataset, reference_name))
        if cell.system == reference_name or reference is None:
            continue
        for metric in metrics:
            if metric not in cell.means or metric not in reference.means:
                continue
            entry = {"dataset": cell.dataset, "system": cell.system, "baseline": reference_name, "metric": metric,
                     "delta": cell.means[metric] - reference.means[metric], "delta_ci": None, "p_value": None,
                     "n": None}
            ours = seed_averaged(per_example, cell.dataset, cell.system, cell.seeds, metric)
            theirs = seed_averaged(per_example, cell.dataset, reference_name, reference.seeds, metric)
            if ours is not None and theirs is not None:
                first, second = _align(ours, theirs, f"{cell.dataset}/{cell.system} vs {reference_name}")
                result = compare_paired(first, second, n_resamples=n_resamples, n_permutations=n_permutations,
                                        seed=seed).to_dict(scale=100.0)
                entry.update(delta=result["delta"], delta_ci=result["delta_ci"], p_value=result["p_value"],
                             n=result["n"])
            comparisons.append(entry)
    return comparisons


def against_untrained(cells: Sequence[Cell], per_example: Mapping | None, metric: str = "ndcg@10",
                      n_resamples: int = 2000, n_permutations: int = 10000, seed: int = 0,
                      primary_pipeline: str | None = None, in_domain: Sequence[str] = ()) -> list[dict]:
    """Does training help? Every trained retriever against the untrained encoder it starts from
    (``base_cosine``), paired on the same questions, with a verdict per (dataset, system):

    - ``better``: above it with p < 0.05;
    - ``worse``: below it by more than the half-width of the trained system's own 95% interval;
    - ``slightly worse``: below it with p < 0.05, but by less than that half-width;
    - ``no clear difference``: none of these.

    Entries on a set outside ``in_domain`` (its training split feeds no training data) also get ``p_holm``: the
    p-value Holm-adjusted over every such (set, system) pair, one family, so that "training helps out of domain"
    is claimed at most 5% of the time by chance however many strategies are tried.
    """
    by_key = {(cell.dataset, cell.system): cell for cell in cells}
    entries = []
    for entry in compare_to_baseline(cells, per_example, UNTRAINED, metrics=(metric,), n_resamples=n_resamples,
                                     n_permutations=n_permutations, seed=seed, primary_pipeline=primary_pipeline):
        if split_system(entry["system"])[1] in BASELINES:
            continue
        low, high = by_key[(entry["dataset"], entry["system"])].cis.get(metric, (math.nan, math.nan))
        half_width = (high - low) / 2
        significant = entry["p_value"] is not None and entry["p_value"] < ALPHA
        verdict = ("better" if _significant_gain(entry) else
                   "worse" if math.isfinite(half_width) and entry["delta"] < -half_width else
                   "slightly worse" if significant and entry["delta"] < 0 else "no clear difference")
        entries.append({**entry, "half_width": half_width if math.isfinite(half_width) else None,
                        "verdict": verdict})
    outside = [entry for entry in entries if entry["dataset"] not in set(in_domain) and entry["p_value"] is not None]
    for entry, adjusted in zip(outside, holm_adjust([entry["p_value"] for entry in outside]), strict=True):
        entry["p_holm"], entry["family"] = adjusted, len(outside)
    return entries


def _untrained_section(entries: Sequence[Mapping], datasets: Sequence[str], systems: Sequence[str]) -> list[str]:
    if not entries:
        return []
    metric = LABELS.get(entries[0]["metric"], entries[0]["metric"])
    lines = [f"## Against the untrained encoder ({UNTRAINED})", "",
             f"Training should improve on the model it starts from. Each trained retriever's {metric} against "
             f"{UNTRAINED} on the same questions: **better** is above it with p < {ALPHA}; **worse** is below it by "
             "more than the half-width of the trained system's own 95% interval; **slightly worse** is below it "
             f"with p < {ALPHA} but by less than that half-width; otherwise **no clear difference**.", ""]
    for verdict in ("better", "worse", "slightly worse"):
        named = [f"{entry['dataset']}/{entry['system']}" for entry in entries if entry["verdict"] == verdict]
        lines.append(f"- {verdict}: {len(named)} of {len(entries)}" + (f" ({', '.join(named)})" if named else ""))
    outside = [entry for entry in entries if "p_holm" in entry]
    if outside:
        named = [f"{entry['dataset']}/{entry['system']}" for entry in outside
                 if entry["delta"] > 0 and entry["p_holm"] < ALPHA]
        sets = ", ".join(dict.fromkeys(entry["dataset"] for entry in outside))
        lines.append(f"- better out of domain ({sets}: sets whose training split feeds no training data) with "
                     f"p < {ALPHA} after Holm's adjustment over all {len(outside)} such pairs: {len(named)}"
                     + (f" ({', '.join(named)})" if named else ""))
    lines.append("")
    by_key = {(entry["dataset"], entry["system"]): entry for entry in entries}
    rows = [[dataset, system, _delta_text(entry), _number(entry["half_width"]),
             _p(entry["p_holm"]) if "p_holm" in entry else "in domain", entry["verdict"]]
            for dataset in datasets for system in systems if (entry := by_key.get((dataset, system)))]
    return lines + _table(["dataset", "system", f"Δ {metric} against {UNTRAINED}", "half-width of its 95% CI",
                           "p, Holm-adjusted out of domain", "verdict"], rows)


def _align(ours, theirs, what: str) -> tuple[np.ndarray, np.ndarray]:
    (our_ids, our_values), (their_ids, their_values) = ours, theirs
    if our_ids is None or their_ids is None:
        if len(our_values) != len(their_values):
            raise ValueError(f"{what}: {len(our_values)} and {len(their_values)} questions and no ids to align them")
        return our_values, their_values
    position = {question_id: index for index, question_id in enumerate(their_ids)}
    common = [index for index, question_id in enumerate(our_ids) if question_id in position]
    if len(common) < len(our_ids) or len(common) < len(their_ids):
        logger.warning("%s: paired on the %d questions both systems answered", what, len(common))
    return our_values[common], their_values[[position[our_ids[index]] for index in common]]


# ------------------------------------------------------------------------------ findings
def _verdict(held: int, total: int) -> str:
    if total == 0:
        return "not checked"
    return "held" if held == total else "partly held" if held else "did not hold"


def _lookup(comparisons: Sequence[Mapping], dataset: str, system: str, metric: str) -> Mapping | None:
    for entry in comparisons:
        if (entry["dataset"], entry["system"], entry["metric"]) == (dataset, system, metric):
            return entry
    return None


def _significant_gain(entry: Mapping | None) -> bool:
    return bool(entry and entry["delta"] > 0 and entry["p_value"] is not None and entry["p_value"] < ALPHA)


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
    findings = []

    # 1. One-sided normalization beats cosine (EM, and nDCG@10), significance by the paired test.
    evidence, held, total = [], 0, 0
    for dataset in datasets:
        entries = {(system, metric): _lookup(comparisons, dataset, system, metric)
                   for system in ONE_SIDED for metric in ("em", "ndcg@10")}
        if not any(entries.values()):
            continue
        if any(entry and entry["p_value"] is not None for entry in entries.values()):
            total += 1  # without per-question values there is no test, so the dataset is shown but not counted
            held += any(_significant_gain(entry) for entry in entries.values())
        parts = [f"{system} {LABELS[metric]} {_signed(entry['delta'])} (p {_p(entry['p_value'])})"
                 for (system, metric), entry in entries.items() if entry]
        evidence.append(f"{dataset}: " + "; ".join(parts))
    findings.append({"finding": f"Normalizing one side (qnorm or dnorm) beats {baseline}",
                     "verdict": _verdict(held, total),
                     "detail": f"a one-sided strategy significantly better (p < {ALPHA}) on {held} of {total} datasets",
                     "evidence": evidence})

    # 2. Gains are larger out of domain than in domain (relative EM gain of the one-sided strategies).
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
    findings.append({"finding": "Gains are larger out of domain than in domain", "verdict": verdict,
                     "detail": detail, "evidence": evidence})

    # 3. Document-norm Cohen's d > 0 (relevant passages longer) for systems that score with document magnitude.
    evidence, held, total = [], 0, 0
    for cell in cells:
        value = _finite(cell.diagnostics.get("document_norm_cohens_d"))
        if cell.system in DOCUMENT_MAGNITUDE and value is not None:
            total += 1
            held += value > 0
            evidence.append(f"{cell.dataset}/{cell.system}: d = {value:+.2f}")
    findings.append({"finding": "Relevant passages get larger document norms (Cohen's d > 0)",
                     "verdict": _verdict(held, total),
                     "detail": f"d > 0 in {held} of {total} (dataset, strategy) pairs that score with document "
                               f"magnitude ({', '.join(DOCUMENT_MAGNITUDE)})", "evidence": evidence})

    # 4. Better retrieval turns into better answers: sign agreement of delta nDCG@10 and delta EM vs baseline.
    evidence, held, total = [], 0, 0
    for cell in cells:
        retrieval = _lookup(comparisons, cell.dataset, cell.system, "ndcg@10")
        answers = _lookup(comparisons, cell.dataset, cell.system, "em")
        if retrieval and answers and retrieval["delta"] != 0:
            total += 1
            agree = (retrieval["delta"] > 0) == (answers["delta"] > 0)
            held += agree
            evidence.append(f"{cell.dataset}/{cell.system}: nDCG@10 {_signed(retrieval['delta'])}, "
                            f"EM {_signed(answers['delta'])}")
    findings.append({"finding": "Better retrieval turns into better answers", "verdict": _verdict(held, total),
                     "detail": f"EM moves with nDCG@10 (same sign of the change against {baseline}) in {held} of "
                               f"{total} cases", "evidence": evidence})

    # 5. The side predictors (delta-CV, Fisher condition number) name the winner of qnorm vs dnorm.
    for key, label in (("fisher_predictor", "Fisher condition number"), ("side_selector", "delta-CV selector")):
        evidence, held, total = [], 0, 0
        for dataset in datasets:
            prediction = _prediction(cells, dataset, key)
            winner = _winner(by_key, dataset, "ndcg@10")
            if prediction in ONE_SIDED and winner is not None:
                total += 1
                held += prediction == winner
                evidence.append(f"{dataset}: predicted {prediction}, observed {winner} (nDCG@10)")
        findings.append({"finding": f"The {label} predicts whether qnorm or dnorm wins",
                         "verdict": _verdict(held, total),
                         "detail": f"right on {held} of {total} datasets", "evidence": evidence})
    return findings


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


def _winner(by_key: Mapping, dataset: str, metric: str) -> str | None:
    scores = {system: by_key[(dataset, system)].means.get(metric)
              for system in ONE_SIDED if (dataset, system) in by_key}
    if len(scores) < 2 or None in scores.values() or scores["qnorm"] == scores["dnorm"]:
        return None
    return max(scores, key=scores.get)


# ------------------------------------------------------------------------------ formatting
def _number(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _signed(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1f}"


def _p(value: float | None) -> str:
    if value is None:
        return "n/a"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def _with_ci(cell: Cell | None, metric: str) -> str:
    if cell is None or metric not in cell.means:
        return "–"
    text = _number(cell.means[metric])
    if metric in cell.cis:
        low, high = cell.cis[metric]
        text += f" [{low:.1f}, {high:.1f}]"
    elif metric in cell.seed_sd:
        text += f" ± {cell.seed_sd[metric]:.1f} sd"
    return text


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(value) for value in row) + " |" for row in rows]
    return lines + [""]


def _json_safe(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    if isinstance(value, np.ndarray):
        return _json_safe(value.tolist())
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer, int)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Path):
        return str(value)
    return value


def _write_atomic(path: Path, data: bytes) -> None:
    from rag_mag import durable

    durable.write_bytes(path, data)


# ------------------------------------------------------------------------------ markdown
def render_markdown(title: str, cells: Sequence[Cell], comparisons: Sequence[Mapping], findings: Sequence[Mapping],
                    config: Mapping, environment: Mapping, plots: Sequence[Path], baseline: str = "cosine",
                    notes: Sequence[str] = (), sections: Sequence[str] = (),
                    primary_pipeline: str | None = None, untrained: Sequence[Mapping] = ()) -> str:
    datasets = list(dict.fromkeys(cell.dataset for cell in cells))
    systems = _order([cell.system for cell in cells])
    by_key = {(cell.dataset, cell.system): cell for cell in cells}
    n_questions = {dataset: max(cell.n_questions for cell in cells if cell.dataset == dataset) for dataset in datasets}
    n_ranked = {dataset: max(cell.ranked for cell in cells if cell.dataset == dataset) for dataset in datasets}
    lines = [f"# rag-mag benchmark report: {title}", ""]
    commit = environment.get("git_commit") or "unknown"
    dirty = " (with uncommitted changes)" if environment.get("git_dirty") else ""
    lines += [f"Generated {environment.get('timestamp', '')} at commit `{commit}`{dirty} by:", "",
              f"    {environment.get('command', '')}", ""]
    lines += ["Metrics are in [0, 100]. Brackets are 95% bootstrap confidence intervals over questions; "
              f"p-values come from a paired sign-flip permutation test against {baseline} on the same questions "
              "(uncorrected for multiple comparisons).", ""]
    if primary_pipeline:
        lines += [f"A row named `PIPELINE:SYSTEM` is that retriever answering through `pipelines/PIPELINE.yaml` (or "
                  f"the user's file of that name), compared against `PIPELINE:{baseline}`. `bm25`, `closed_book` "
                  f"and `oracle` answer through the reader pipeline (the BM25 top-k, no passages, the gold "
                  f"passages) and are compared against `{primary_pipeline}:{baseline}`. The retriever's ranking "
                  f"(recall@k, nDCG@10, MRR@10) and the norm diagnostics are shown once per dataset, on the first "
                  f"listed pipeline's rows; recall@budget judges the passages the reader was given (for a "
                  f"multi-round pipeline, the union of its rounds). `oracle` is the reader's ceiling and "
                  f"`closed_book` its floor. A figure marked (n=N) covers the first N questions only.", ""]
    lines += [f"- {note}" for note in notes] + ([""] if notes else [])

    lines += ["## Paper findings: held or not", ""]
    if primary_pipeline:
        lines += [f"Checked on the rows of the `{primary_pipeline}` pipeline (system names below without the "
                  "prefix).", ""]
    lines += _table(["finding", "verdict", "detail"],
                    [[item["finding"], f"**{item['verdict']}**", item["detail"]] for item in findings])
    for item in findings:
        if item["evidence"]:
            lines += [f"*{item['finding']}*: " + "; ".join(item["evidence"]), ""]

    header = ["system"] + [f"{dataset} (n={n_questions[dataset]})" for dataset in datasets]
    for metric, label in (("em", "Exact Match"), ("f1", "F1"),
                          ("accuracy", "accuracy (a gold alias occurs in the answer; lenient)")):
        rows = [[system] + [_with_ci(by_key.get((dataset, system)), metric) + _subset(by_key.get((dataset, system)),
                                                                                     n_questions[dataset])
                            for dataset in datasets]
                for system in systems if any(metric in by_key.get((d, system), _EMPTY).means for d in datasets)]
        lines += [f"## Answers: {label}", ""] + _table(header, rows)

    lines += ["## Retrieval", ""]
    for dataset in datasets:
        modes = {cell.mode for cell in cells if cell.dataset == dataset and cell.mode}
        mode = f" (recall: {', '.join(sorted(modes))})" if modes else ""
        if n_ranked[dataset] != n_questions[dataset]:
            mode += (f": ranking metrics on {n_ranked[dataset]} questions, recall@budget on the "
                     f"{n_questions[dataset]} answered")
        rows = [[system + _subset(by_key.get((dataset, system)), n_ranked[dataset], ranked=True)]
                + [_with_ci(by_key.get((dataset, system)), metric) for metric in RETRIEVAL_COLUMNS]
                for system in systems
                if any(metric in by_key.get((dataset, system), _EMPTY).means for metric in RETRIEVAL_COLUMNS)]
        if rows:
            header = ["system", *(LABELS.get(metric, metric) for metric in RETRIEVAL_COLUMNS)]
            lines += [f"### {dataset}{mode}", ""] + _table(header, rows)

    lines += [f"## Against {baseline}" + (" (of the same pipeline)" if primary_pipeline else ""), ""]
    compared_metrics = [metric for metric in COMPARED if any(entry["metric"] == metric for entry in comparisons)]
    for dataset in datasets:
        rows = []
        for system in systems:
            entries = [_lookup(comparisons, dataset, system, metric) for metric in compared_metrics]
            if any(entries):
                rows.append([system] + [_delta_text(entry) for entry in entries])
        if rows:
            header = ["system"] + [f"Δ {LABELS.get(metric, metric)}" for metric in compared_metrics]
            lines += [f"### {dataset}", ""] + _table(header, rows)
    if not comparisons:
        lines += [f"No {baseline} rows, so no paired comparisons.", ""]

    lines += _untrained_section(untrained, datasets, systems)

    multi_seed = [cell for cell in cells if len(cell.seeds) > 1]
    lines += ["## Seeds", ""]
    if multi_seed:
        lines += _table(["dataset", "system", "seeds", "EM", "F1", "nDCG@10"],
                        [[cell.dataset, cell.system, ", ".join(map(str, cell.seeds)),
                          f"{_number(cell.means.get('em'))} ± {_number(cell.seed_sd.get('em'))}",
                          f"{_number(cell.means.get('f1'))} ± {_number(cell.seed_sd.get('f1'))}",
                          f"{_number(cell.means.get('ndcg@10'))} ± {_number(cell.seed_sd.get('ndcg@10'))}"]
                         for cell in multi_seed])
    else:
        lines += ["Every system ran with one training seed: the intervals cover question sampling only, not "
                  "training variance.", ""]

    lines += ["## Diagnostics", "",
              "Cohen's d compares the raw document norms of relevant and irrelevant corpus passages (positive: "
              "relevant passages are longer); CV is the coefficient of variation of the raw norms. The delta-CV "
              "selector keeps the magnitude of the side whose base-model norms vary more; the Fisher predictor "
              "picks the one-sided strategy whose InfoNCE Fisher is better conditioned at the start of training "
              "(rag_mag/retriever/diagnostics.py documents both).", ""]
    diag_rows = [[cell.dataset, cell.system, _number(_finite(cell.diagnostics.get("document_norm_cohens_d")), 2),
                  _number(_finite(cell.diagnostics.get("query_norm_cv")), 3),
                  _number(_finite(cell.diagnostics.get("document_norm_cv")), 3)]
                 for dataset in datasets for system in systems
                 if (cell := by_key.get((dataset, system))) is not None and cell.diagnostics]
    if diag_rows:
        lines += _table(["dataset", "system", "Cohen's d (doc norms, relevant - irrelevant)", "CV query norms",
                         "CV document norms"], diag_rows)
    predictor_rows = []
    plain_by_key = {(cell.dataset, cell.system): cell for cell in of_pipeline(cells, [], primary_pipeline)[0]}
    for dataset in datasets:
        selector = next((c.diagnostics["side_selector"] for c in cells if c.dataset == dataset
                         and isinstance(c.diagnostics.get("side_selector"), Mapping)), None)
        fisher = next((c.diagnostics["fisher_predictor"] for c in cells if c.dataset == dataset
                       and isinstance(c.diagnostics.get("fisher_predictor"), Mapping)), None)
        if selector or fisher:
            predictor_rows.append([
                dataset,
                f"{selector['prediction']} (ΔCV {_number(_finite(selector.get('delta_cv')), 3)})" if selector else "–",
                f"{fisher['prediction']} ({_kappa(fisher, 'qnorm')}; {_kappa(fisher, 'dnorm')})" if fisher else "–",
                _winner(plain_by_key, dataset, "ndcg@10") or "–", _winner(plain_by_key, dataset, "em") or "–"])
    if predictor_rows:
        lines += _table(["dataset", "delta-CV selector", "Fisher predictor", "winner nDCG@10", "winner EM"],
                        predictor_rows)

    captions = {"em_f1": "EM and F1 per strategy and dataset, 95% CI bars",
                "document_norms": "raw document norms, relevant against irrelevant passages",
                "recall_at_k": "recall@k curves"}
    lines += [section.rstrip() + "\n" for section in sections]
    lines += ["## Plots", ""]
    for path in plots:
        lines += [f"{captions.get(path.stem, path.stem)}:", "", f"![{path.stem}]({path.name})", ""]
    lines += ["## Setup", "", "### Configuration", "", "```json", json.dumps(_json_safe(config), indent=2), "```", ""]
    machine = environment.get("machine", {})
    lines += ["### Machine", ""] + [f"- {key}: {value}" for key, value in machine.items()] + [""]
    lines += ["### Packages", ""] + _table(["package", "version"], [[name, version or "not installed"] for name, version
                                                                     in environment.get("packages", {}).items()])
    extra = {key: value for key, value in environment.items()
             if key not in ("machine", "packages", "command", "git_commit", "git_dirty", "timestamp")}
    lines += [f"- {key}: {value}" for key, value in extra.items()] + [""]
    return "\n".join(lines)


def _subset(cell: Cell | None, n_dataset: int, ranked: bool = False) -> str:
    """`` (n=N)`` when the cell covers fewer questions than the dataset's column (its answers, or its ranking)."""
    if cell is None:
        return ""
    count = cell.ranked if ranked else cell.n_questions
    return f" (n={count})" if count != n_dataset else ""


def _kappa(fisher: Mapping, strategy: str) -> str:
    spectrum = fisher.get(strategy) or {}
    full, trimmed = _finite(spectrum.get("condition_number")), _finite(spectrum.get("trimmed_condition_number"))
    text = f"κ {strategy} " + ("n/a" if full is None else f"{full:.3g}")
    return text + (f", trimmed {trimmed:.3g}" if trimmed is not None else "")


def _delta_text(entry: Mapping | None) -> str:
    if entry is None:
        return "–"
    text = _signed(entry["delta"])
    if entry.get("delta_ci"):
        text += f" [{entry['delta_ci'][0]:+.1f}, {entry['delta_ci'][1]:+.1f}]"
    return text + f" (p {_p(entry.get('p_value'))})"


_EMPTY = Cell("", "", [], 0, {}, {}, {}, {}, None, None)


# ------------------------------------------------------------------------------ plots
def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(figure)  # Agg without pyplot: no global backend state, safe in servers and threads
    return figure


def _save(figure, path: Path) -> Path:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    _write_atomic(path, buffer.getvalue())
    return path


def plot_answers(cells: Sequence[Cell], path: Path) -> Path | None:
    datasets = list(dict.fromkeys(cell.dataset for cell in cells))
    systems = [system for system in _order([cell.system for cell in cells])
               if any(cell.system == system and "em" in cell.means for cell in cells)]
    if not systems:
        return None
    by_key = {(cell.dataset, cell.system): cell for cell in cells}
    figure = _figure(max(7.0, 0.45 * len(systems) * len(datasets) * 2 + 2), 4.2)
    width = 0.8 / len(systems)
    for position, metric in enumerate(("em", "f1")):
        axes = figure.add_subplot(1, 2, position + 1)
        for index, system in enumerate(systems):
            means, errors = [], [[], []]
            for dataset in datasets:
                cell = by_key.get((dataset, system))
                mean = cell.means.get(metric, np.nan) if cell else np.nan
                low, high = cell.cis.get(metric, (mean, mean)) if cell else (np.nan, np.nan)
                means.append(mean)
                errors[0].append(max(mean - low, 0.0) if np.isfinite(mean) else 0.0)
                errors[1].append(max(high - mean, 0.0) if np.isfinite(mean) else 0.0)
            axes.bar(np.arange(len(datasets)) + index * width - 0.4 + width / 2, means, width, yerr=errors,
                     capsize=2, label=system)
        axes.set_xticks(np.arange(len(datasets)), datasets, rotation=20)
        axes.set_ylabel(f"{metric.upper()} (95% CI)")
        axes.set_title("Exact Match" if metric == "em" else "F1")
    handles, labels = axes.get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=min(len(systems), 8), fontsize=8,
                  bbox_to_anchor=(0.5, -0.08))
    return _save(figure, path)


def plot_norms(norms: Mapping, cells: Sequence[Cell], path: Path) -> Path | None:
    keys = [key for key in norms if len(norms[key].get("relevant", [])) and len(norms[key].get("irrelevant", []))]
    if not keys:
        return None
    datasets = list(dict.fromkeys(dataset for dataset, _ in keys))
    systems = _order([system for _, system in keys])
    by_key = {(cell.dataset, cell.system): cell for cell in cells}
    figure = _figure(3.0 * len(systems), 2.4 * len(datasets))
    for row, dataset in enumerate(datasets):
        for column, system in enumerate(systems):
            if (dataset, system) not in norms:
                continue
            axes = figure.add_subplot(len(datasets), len(systems), row * len(systems) + column + 1)
            relevant = np.asarray(norms[(dataset, system)]["relevant"], dtype=np.float64)
            irrelevant = np.asarray(norms[(dataset, system)]["irrelevant"], dtype=np.float64)
            bins = np.linspace(min(relevant.min(), irrelevant.min()), max(relevant.max(), irrelevant.max()), 40)
            axes.hist(irrelevant, bins=bins, density=True, alpha=0.5, label="irrelevant")
            axes.hist(relevant, bins=bins, density=True, alpha=0.5, label="relevant")
            cell = by_key.get((dataset, system))
            d = _finite(cell.diagnostics.get("document_norm_cohens_d")) if cell else None
            axes.set_title(f"{dataset} / {system}" + (f"  d={d:+.2f}" if d is not None else ""), fontsize=8)
            axes.tick_params(labelsize=7)
    figure.axes[0].legend(fontsize=7)
    figure.supxlabel("raw document norm")
    return _save(figure, path)


def _recall_k(metric: str) -> int | None:
    """k of ``recall@k`` (None for other metrics, and for ``recall@budget``: no fixed k)."""
    name, _, k = metric.partition("@")
    return int(k) if name == "recall" and k.isdigit() else None


def plot_recall(cells: Sequence[Cell], path: Path) -> Path | None:
    datasets = [d for d in dict.fromkeys(cell.dataset for cell in cells) if any(
        c.dataset == d and (c.curve or any(_recall_k(k) for k in c.means)) for c in cells)]
    if not datasets:
        return None
    figure = _figure(4.0 * len(datasets), 3.4)
    for index, dataset in enumerate(datasets):
        axes = figure.add_subplot(1, len(datasets), index + 1)
        largest = 1
        for cell in sorted((c for c in cells if c.dataset == dataset), key=lambda c: _rank(c.system)):
            if cell.curve:
                ks, values = list(range(1, len(cell.curve) + 1)), cell.curve
            else:
                points = sorted((_recall_k(k), v) for k, v in cell.means.items() if _recall_k(k))
                ks, values = [k for k, _ in points], [v for _, v in points]
            if ks:
                axes.plot(ks, values, marker="." if len(ks) > 5 else "o", label=cell.system)
                largest = max(largest, ks[-1])
        axes.set_xscale("log")
        ticks = [k for k in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if k <= largest]
        axes.set_xticks(ticks, [str(k) for k in ticks])
        axes.set_xlabel("k")
        axes.set_ylabel("recall@k")
        axes.set_title(dataset)
    figure.axes[-1].legend(fontsize=7)
    return _save(figure, path)


# ------------------------------------------------------------------------------ entry point
def write_report(out_dir: str | os.PathLike, rows: Sequence[Mapping], *, config: Mapping | None = None,
                 environment: Mapping | None = None, per_example: Mapping | None = None,
                 norms: Mapping | None = None, in_domain: Sequence[str] = (), baseline: str = "cosine",
                 title: str | None = None, command: Sequence[str] | str | None = None, notes: Sequence[str] = (),
                 sections: Sequence[str] = (), extra: Mapping | None = None,
                 n_resamples: int = 2000, n_permutations: int = 10000, seed: int = 0,
                 primary_pipeline: str | None = None) -> ReportFiles:
    """Write ``results.json``, ``report.md`` and the plots into ``out_dir`` (see the module docstring)."""
    if not rows:
        raise ValueError("no result rows to report; run at least one (dataset, system) cell")
    out = Path(out_dir)
    environment = dict(environment) if environment is not None else collect_environment(command)
    cells = aggregate(rows, per_example, n_resamples=n_resamples, seed=seed)
    comparisons = compare_to_baseline(cells, per_example, baseline, n_resamples=n_resamples,
                                      n_permutations=n_permutations, seed=seed, primary_pipeline=primary_pipeline)
    findings = paper_findings(*of_pipeline(cells, comparisons, primary_pipeline), in_domain=in_domain,
                              baseline=baseline)
    untrained = against_untrained(cells, per_example, n_resamples=n_resamples, n_permutations=n_permutations,
                                  seed=seed, primary_pipeline=primary_pipeline, in_domain=in_domain)
    plots = [plot for plot in (plot_answers(cells, out / "em_f1.png"), plot_norms(norms or {}, cells,
                                                                                    out / "document_norms.png"),
                               plot_recall(cells, out / "recall_at_k.png")) if plot is not None]
    results = {"config": dict(config or {}), "environment": environment, "results": list(rows),
               "aggregates": [cell.to_dict() for cell in cells], "comparisons": comparisons, "findings": findings,
               "against_untrained": untrained,
               "in_domain": list(in_domain), "plots": [plot.name for plot in plots], **dict(extra or {})}
    results_path, report_path = out / "results.json", out / "report.md"
    _write_atomic(results_path, json.dumps(_json_safe(results), indent=2, allow_nan=False).encode("utf-8"))
    markdown = render_markdown(title or out.name, cells, comparisons, findings, config or {}, environment, plots,
                               baseline=baseline, notes=notes, sections=sections,
                               primary_pipeline=primary_pipeline, untrained=untrained)
    _write_atomic(report_path, markdown.encode("utf-8"))
    logger.info("report written to %s (%d rows, %d plots)", out, len(rows), len(plots))
    return ReportFiles(results_json=results_path, report_md=report_path, plots=tuple(plots))
