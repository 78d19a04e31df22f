"""``DIR/report.json`` and ``DIR/report.md``: what adapt measured on the test split and what it published.

Every figure of a system is a mean over the test split's questions (in [0, 100]) with a percentile bootstrap
95% interval; the differences to the base and their p-values are the publish decision's (``decision.py``).
``report.json`` names the split the figures come from (``scored_split``) and the sha256 of its sorted pair ids
(``test_ids_sha256``, as ``splits.ids_digest``), so a reader can check that no other pair counted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rag_mag import durable
from rag_mag.adapt.decision import Decision
from rag_mag.adapt.scoring import METRICS, TestSplit
from rag_mag.adapt.splits import SPLITS
from rag_mag.bench.stats import bootstrap_ci

REPORT_VERSION = 1
SPLIT_NAMES = {"train": "train", "val": "validation", "test": "test"}


def system_summary(scores: Mapping[str, Any]) -> dict:
    """Means in [0, 100] and their bootstrap 95% intervals, from one system's per-question values."""
    means, intervals = {}, {}
    for metric in METRICS:
        values = scores["per_query"][metric]
        means[metric] = 100.0 * sum(values) / len(values)
        low, high = bootstrap_ci(values)
        intervals[metric] = [100.0 * low, 100.0 * high]
    return {"kind": scores["kind"], "model": scores["model"], "n": len(scores["ids"]), "means": means,
            "ci95": intervals, "scoring_seconds": scores.get("seconds")}


def build_report(*, command: str, source: str, pairs_dir: Path, manifest: Mapping[str, Any], test: TestSplit,
                 corpus_chunks: int, scores: Mapping[str, Mapping[str, Any]], decision: Decision,
                 retriever_dir: Path | None, training: Mapping[str, Mapping[str, Any]],
                 reindex: Mapping[str, Any] | None, stage_seconds: Mapping[str, float],
                 synth: Mapping[str, Any] | None) -> dict:
    for name, result in scores.items():  # every figure comes from exactly these test pairs
        if tuple(result["ids"]) != test.ids or result.get("split") != "test":
            raise ValueError(f"the scores of {name} were not measured on the test split {test.sha256[:12]}")
    return {
        "version": REPORT_VERSION,
        "command": command,
        "source": source,
        "pairs": str(pairs_dir),
        "splits": {name: {"files": len(manifest["splits"][name]["files"]), "pairs": manifest["splits"][name]["pairs"],
                          "file_names": manifest["splits"][name]["files"]} for name in SPLITS},
        "split_dropped": manifest.get("dropped", {}),
        "pairs_sha256": manifest["pairs_sha256"],
        "scored_split": "test",
        "test_pairs": len(test.ids),
        "test_ids_sha256": test.ids_sha256,
        "test_split_sha256": test.sha256,
        "corpus_chunks": corpus_chunks,
        "systems": {name: system_summary(result) for name, result in scores.items()},
        "against_base": {name: c.to_dict() for name, c in decision.comparisons.items()},
        "decision": {**decision.to_dict(), "retriever": str(retriever_dir) if retriever_dir else None},
        # the step validation chose, not its figures: every figure of the report is the test split's
        "training": {name: {"step": record.get("step"), "best_step": (record.get("best_validation") or {}).get("step"),
                            "best_dir": record.get("best_dir"), "reused": record.get("reused"),
                            "settings": record.get("settings")} for name, record in training.items()},
        "reindex": dict(reindex) if reindex is not None else None,
        "stage_seconds": {name: round(seconds, 2) for name, seconds in stage_seconds.items()},
        "synth": dict(synth) if synth is not None else None,
    }


def _interval(summary: Mapping[str, Any], metric: str) -> str:
    low, high = summary["ci95"][metric]
    return f"{summary['means'][metric]:.1f} [{low:.1f}, {high:.1f}]"


def _p(value: float) -> str:
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def render_markdown(report: Mapping[str, Any]) -> str:
    decision = report["decision"]
    head, _, why = decision["reason"].partition(": ")
    verdict = f"**{head[0].upper()}{head[1:]}**: {why}."
    if decision["published"]:
        verdict += f" Copied to `{decision['retriever']}`."
    lines = ["# rag-mag adapt", "", f"Source: `{report['source']}`; pairs: `{report['pairs']}`.", "", verdict, "",
             "## Splits (by file)", "", "| split | files | pairs |", "|---|---|---|"]
    lines += [f"| {SPLIT_NAMES[name]} | {split['files']} | {split['pairs']} |"
              for name, split in report["splits"].items()]
    dropped = report.get("split_dropped") or {}
    if any(dropped.values()):
        lines += ["", "Dropped to keep the splits apart: " + ", ".join(
            f"{count} {what.replace('_', ' ')}" for what, count in dropped.items() if count) + "."]
    lines += ["", f"## Test split: {report['test_pairs']} questions over {report['corpus_chunks']} chunks", "",
              "Each test question ranks every chunk of the corpus; its one relevant chunk is the one it was written "
              "from. Means in percent with bootstrap 95% intervals; differences to the untrained base with the "
              "paired permutation p-value, Holm-adjusted over the trained strategies. Figures from the test split "
              f"only (pair ids sha256 `{report['test_ids_sha256'][:16]}...`).", "",
              "| system | nDCG@10 | recall@1 | recall@5 | recall@20 | vs base (nDCG@10) | p | p (Holm) |",
              "|---|---|---|---|---|---|---|---|"]
    for name, summary in report["systems"].items():
        comparison = report["against_base"].get(name)
        versus = (f"{comparison['delta']:+.1f} [{comparison['delta_ci'][0]:+.1f}, {comparison['delta_ci'][1]:+.1f}] | "
                  f"{_p(comparison['p_value'])} | {_p(comparison['p_holm'])}") if comparison else "| |"
        label = {"base": f"{name} (untrained, cosine)", "bm25": name}.get(summary["kind"], f"{name} (trained)")
        lines.append(f"| {label} | " + " | ".join(_interval(summary, metric) for metric in METRICS) + f" | {versus} |")
    lines += ["", "## Training", "", "`best/` is the checkpoint the validation files chose (its figures are in "
              "`runs/STRATEGY/train_log.jsonl`, not here: this report's figures are the test split's).", "",
              "| strategy | steps | best/ is step | reused from an earlier run |", "|---|---|---|---|"]
    for name, run in report["training"].items():
        best_step = "" if run.get("best_step") is None else run["best_step"]
        lines.append(f"| {name} | {run.get('step')} | {best_step} | {'yes' if run.get('reused') else 'no'} |")
    if report.get("reindex"):
        lines += ["", "## Re-embedded index", "", f"`{report['reindex'].get('index')}`: "
                  f"{report['reindex'].get('line', '')}"]
    lines += ["", "## Wall time", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {stage} | {seconds:.1f} |" for stage, seconds in report["stage_seconds"].items()]
    if report.get("synth"):
        lines += ["", "## Synthesis", "", "```json", json.dumps(report["synth"], indent=2, ensure_ascii=False), "```"]
    lines += ["", f"Command: `{report['command']}`", ""]
    return "\n".join(lines)


def write_report(out: Path, report: Mapping[str, Any]) -> tuple[Path, Path]:
    json_path, markdown_path = out / "report.json", out / "report.md"
    durable.write_text(json_path, json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    durable.write_text(markdown_path, render_markdown(report))
    return json_path, markdown_path


def summary_line(report: Mapping[str, Any], json_path: Path) -> str:
    """The one line printed at the end."""
    decision, base = report["decision"], report["systems"].get("base", {})
    head = f"published {decision['published']} to {decision['retriever']}" if decision["published"] else "base kept"
    base_ndcg = base.get("means", {}).get("ndcg@10")
    figures = f"base nDCG@10 {base_ndcg:.1f}" if base_ndcg is not None else ""
    candidate = decision.get("candidate")
    if candidate:
        comparison = report["against_base"][candidate]
        figures += (f", {candidate} {comparison['mean']:.1f} ({comparison['delta']:+.1f}, p {_p(comparison['p_holm'])} "
                    "Holm)")
    reason = "" if decision["published"] else f" ({decision['reason'].split(';')[0].removeprefix('base kept: ')})"
    return (f"adapt: {head}{reason}; test split {report['test_pairs']} questions from "
            f"{report['splits']['test']['files']} file(s): {figures}; report {json_path.with_suffix('.md')} "
            f"({sum(report['stage_seconds'].values()):.0f} s)")
