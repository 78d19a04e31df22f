"""The abstention benchmark's Markdown report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rag_mag import durable


def _cell(rate: dict[str, Any] | None) -> str:
    return "-" if rate is None else f"{rate['value']:.1f} [{rate['ci'][0]:.1f}, {rate['ci'][1]:.1f}]"


def write_report(config, results: dict[str, Any], out: Path) -> None:
    lines = [f"# Abstention: {config.name}", "",
             "Each reader answers, through `pipelines/reader.yaml`, questions with the passages a retrieval system "
             "gave the reader (answerable) and questions whose passages do not answer them (another question's "
             "passages on the Wikipedia sets; ClapNQ's dev questions whose passage does not answer; the real "
             "documents' unanswerable questions). Rates in %, 95% bootstrap intervals in brackets. `false abst.`: "
             "abstentions on questions that have an answer; `... held`: only those whose passages hold it. "
             "`P/R/F1`: abstention precision, recall and F1 (a question without an answer is a positive). "
             "`EM - report`: EM paired with the committed report's on the same questions and passages.", "",
             "Readers: " + "; ".join(f"`{label}` = {r['model']} ({r['identity'][:30]})"
                                     for label, r in results["readers"].items()), ""]
    header = ("| reader | signal | set | system | EM | F1 | false abst. | false abst. held | abstains (no answer) "
              "| P | R | F1 (abst.) | EM - report |")
    lines += [header, "|" + "---|" * (header.count("|") - 1)]
    for group in results["groups"]:
        abstention = group.get("abstention") or {}
        versus = group.get("em_vs_report")
        delta = "-" if not versus else (f"{versus['delta']:+.1f} [{versus['delta_ci'][0]:+.1f}, "
                                        f"{versus['delta_ci'][1]:+.1f}]")
        lines.append(f"| {group['reader']} | {group['signal']} | {group['set']} | {group['system'] or '-'} | "
                     f"{_cell(group['em'])} | {_cell(group['f1'])} | {_cell(group['false_abstain'])} | "
                     f"{_cell(group['false_abstain_held'])} | {_cell(group['abstain'])} | "
                     f"{_cell(abstention.get('precision'))} | {_cell(abstention.get('recall'))} | "
                     f"{_cell(abstention.get('f1'))} | {delta} |")
    durable.write_text(out / "report.md", "\n".join(lines) + "\n")
