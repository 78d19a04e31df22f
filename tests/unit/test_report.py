"""The report writer on synthetic result rows: files, numbers, tests and findings computed from data."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rag_mag.bench.report.aggregate import aggregate
from rag_mag.bench.report.compare import compare_to_baseline
from rag_mag.bench.report.environment import collect_environment
from rag_mag.bench.report.write import write_report

ENVIRONMENT = {"command": "rag-mag bench eval/configs/test.yaml", "git_commit": "abc1234", "git_dirty": False,
               "timestamp": "2026-01-01T00:00:00+00:00", "python": "3.11",
               "packages": {"numpy": "2.0", "vllm": None}, "machine": {"cpu_count": 2}}


def _values(n: int, mean: float) -> np.ndarray:
    """n per-question 0/1 values with exactly round(n * mean) ones (so the mean is known exactly)."""
    values = np.zeros(n)
    values[: int(round(n * mean))] = 1.0
    return values


def _row(dataset, system, seed, n, em, ndcg, diagnostics=None):
    retrieval = {} if ndcg is None else {"recall@1": ndcg - 10, "recall@5": ndcg, "recall@20": ndcg + 10,
                                         "ndcg@10": ndcg, "mrr@10": ndcg - 5, "mode": "supporting"}
    return {"dataset": dataset, "system": system, "seed": seed, "n_questions": n, "retrieval": retrieval,
            "rag": {"em": em, "f1": em + 5, "em_ci": [em - 4, em + 4], "f1_ci": [em + 1, em + 9]},
            "diagnostics": diagnostics or {}}


def _suite(qnorm_em: float, dnorm_em: float = 0.32, with_examples: bool = True):
    """Two datasets x (cosine, qnorm, dnorm, dot, bm25); the one-sided systems' EM (and nDCG) as given."""
    rows, per_example, norms = [], {}, {}
    plan = {"cosine": 0.30, "qnorm": qnorm_em, "dnorm": dnorm_em, "dot": 0.25, "bm25": 0.20}
    for dataset, n in (("hotpot_qa", 200), ("trivia_qa", 300)):
        ids = [f"{dataset}-{i}" for i in range(n)]
        for system, mean in plan.items():
            diagnostics = {"document_norm_cohens_d": 0.8 if system != "dot" else -0.3, "query_norm_cv": 0.12,
                           "document_norm_cv": 0.25}
            if system == "cosine":
                diagnostics["fisher_predictor"] = {"prediction": "qnorm", "qnorm": {"condition_number": 12.0},
                                                   "dnorm": {"condition_number": 40.0}}
                diagnostics["side_selector"] = {"prediction": "dnorm", "delta_cv": -0.05}
            rows.append(_row(dataset, system, 0, n, 100 * mean, 100 * mean + 10, diagnostics))
            per_example[(dataset, system, 0)] = {"ids": ids, "em": _values(n, mean), "f1": _values(n, mean + 0.05),
                                                 "ndcg@10": _values(n, mean + 0.1)}
            norms[(dataset, system)] = {"relevant": np.random.default_rng(1).normal(3, 0.3, 50),
                                        "irrelevant": np.random.default_rng(2).normal(2.5, 0.3, 200)}
    return rows, (per_example if with_examples else None), norms


def _write(tmp_path, rows, per_example, norms=None, in_domain=("hotpot_qa",), **kwargs):
    return write_report(tmp_path / "report", rows, config={"name": "unit", "strategies": ["cosine", "qnorm"]},
                        environment=ENVIRONMENT, per_example=per_example, norms=norms, in_domain=in_domain,
                        n_resamples=300, n_permutations=500, **kwargs)


def test_report_files_exist_and_hold_the_numbers(tmp_path):
    rows, per_example, norms = _suite(qnorm_em=0.55)
    files = _write(tmp_path, rows, per_example, norms)
    assert files.results_json.is_file() and files.report_md.is_file()
    assert {path.name for path in files.plots} == {"em_f1.png", "document_norms.png", "recall_at_k.png"}
    for plot in files.plots:
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 5000
    assert not list(files.report_md.parent.glob(".*.tmp"))  # atomic writes leave no temporary files

    results = json.loads(files.results_json.read_text())
    assert results["results"] == json.loads(json.dumps(rows))
    assert results["environment"]["git_commit"] == "abc1234"
    assert results["config"]["name"] == "unit"
    qnorm_em = next(c for c in results["comparisons"]
                    if (c["dataset"], c["system"], c["metric"]) == ("trivia_qa", "qnorm", "em"))
    assert qnorm_em["delta"] == pytest.approx(25.0) and qnorm_em["p_value"] < 0.01 and qnorm_em["n"] == 300

    report = files.report_md.read_text()
    assert "| qnorm | 55.0 [" in report and "| cosine | 30.0 [" in report   # EM with bootstrap CIs
    assert "+25.0 [" in report                                               # delta against cosine
    assert "rag-mag bench eval/configs/test.yaml" in report and "`abc1234`" in report
    assert "| numpy | 2.0 |" in report and "| vllm | not installed |" in report
    assert "## Paper findings: held or not" in report
    assert "![em_f1](em_f1.png)" in report
    assert "| hotpot_qa | dnorm (ΔCV -0.050) | qnorm (κ qnorm 12; κ dnorm 40) | qnorm | qnorm |" in report


def test_findings_are_computed_from_the_numbers(tmp_path):
    rows, per_example, _ = _suite(qnorm_em=0.55)
    findings = {f["finding"]: f for f in json.loads(_write(tmp_path, rows, per_example).results_json.read_text())
                ["findings"]}
    one_sided = findings["Normalizing one side (qnorm or dnorm) beats cosine"]
    assert one_sided["verdict"] == "held" and "2 of 2" in one_sided["detail"]
    # qnorm wins both datasets: the Fisher predictor (qnorm) was right, the delta-CV selector (dnorm) wrong
    assert findings["The Fisher condition number predicts whether qnorm or dnorm wins"]["verdict"] == "held"
    assert findings["The delta-CV selector predicts whether qnorm or dnorm wins"]["verdict"] == "did not hold"
    # document-magnitude systems: qnorm has d > 0 on both datasets, dot has d < 0
    norms_finding = findings["Relevant passages get larger document norms (Cohen's d > 0)"]
    assert norms_finding["verdict"] == "partly held" and "2 of 4" in norms_finding["detail"]

    worse_rows, worse_examples, _ = _suite(qnorm_em=0.10, dnorm_em=0.28)
    worse = {f["finding"]: f for f in json.loads(_write(tmp_path, worse_rows, worse_examples).results_json
                                                  .read_text())["findings"]}
    assert worse["Normalizing one side (qnorm or dnorm) beats cosine"]["verdict"] == "did not hold"
    assert worse["The Fisher condition number predicts whether qnorm or dnorm wins"]["verdict"] == "did not hold"


def test_out_of_domain_finding_needs_both_kinds_of_dataset(tmp_path):
    rows, per_example, _ = _suite(qnorm_em=0.55)
    results = write_report(tmp_path / "r", rows, environment=ENVIRONMENT, per_example=per_example, in_domain=(),
                           n_resamples=200, n_permutations=200).results_json
    finding = next(f for f in json.loads(results.read_text())["findings"] if "out of domain" in f["finding"])
    assert finding["verdict"] == "not checked"
    checked = next(f for f in json.loads(_write(tmp_path, rows, per_example).results_json.read_text())["findings"]
                   if "out of domain" in f["finding"])
    # relative EM gains of qnorm: hotpot (in domain) and trivia (out) are both (55 - 30) / 30: not larger outside
    assert checked["verdict"] in ("did not hold", "partly held")
    assert any("in domain +83.3%" in line for line in checked["evidence"])


def test_without_per_example_values_the_row_cis_are_used_and_tests_are_absent(tmp_path):
    rows, _, _ = _suite(qnorm_em=0.55, with_examples=False)  # no per-question values
    files = _write(tmp_path, rows, None)
    report = files.report_md.read_text()
    assert "| qnorm | 55.0 [51.0, 59.0] |" in report  # the row's own em_ci
    assert "(p n/a)" in report
    findings = json.loads(files.results_json.read_text())["findings"]
    assert next(f for f in findings if f["finding"].startswith("Normalizing one side"))["verdict"] == "not checked"
    assert {path.name for path in files.plots} == {"em_f1.png", "recall_at_k.png"}  # no norms given


def test_seeds_are_averaged_per_question(tmp_path):
    ids = [f"q{i}" for i in range(100)]
    rows = [_row("musique", "cosine", seed, 100, em, None) for seed, em in ((0, 20.0), (1, 40.0))]
    rows.append(_row("musique", "qnorm", 0, 100, 50.0, None))
    per_example = {("musique", "cosine", 0): {"ids": ids, "em": _values(100, 0.2)},
                   ("musique", "cosine", 1): {"ids": ids, "em": _values(100, 0.4)},
                   ("musique", "qnorm", 0): {"ids": list(reversed(ids)), "em": _values(100, 0.5)[::-1]}}
    cells = {cell.system: cell for cell in aggregate(rows, per_example, n_resamples=200)}
    assert cells["cosine"].seeds == [0, 1] and cells["cosine"].means["em"] == pytest.approx(30.0)
    assert cells["cosine"].seed_sd["em"] == pytest.approx(np.std([20.0, 40.0], ddof=1))
    low, high = cells["cosine"].cis["em"]
    assert low < 30.0 < high
    comparison = next(c for c in compare_to_baseline(list(cells.values()), per_example, n_permutations=200)
                      if c["metric"] == "em")
    assert comparison["delta"] == pytest.approx(20.0) and comparison["n"] == 100  # aligned by question id
    report = _write(tmp_path, rows, per_example).report_md.read_text()
    assert "| musique | cosine | 0, 1 | 30.0 ± 14.1 |" in report


def test_nan_diagnostics_become_null_and_bad_input_is_rejected(tmp_path):
    rows = [_row("d", "cosine", 0, 10, 50.0, 40.0, {"document_norm_cohens_d": float("nan")})]
    files = _write(tmp_path, rows, None)
    assert json.loads(files.results_json.read_text())["results"][0]["diagnostics"]["document_norm_cohens_d"] is None
    with pytest.raises(ValueError, match="no result rows"):
        _write(tmp_path, [], None)
    with pytest.raises(ValueError, match="string 'system'"):
        _write(tmp_path, [{"dataset": "d", "seed": 0}], None)


def test_collect_environment_names_command_commit_packages_machine():
    environment = collect_environment(["rag-mag", "bench", "my config.yaml"], extra={"vllm": "0.32"})
    assert environment["command"] == "rag-mag bench 'my config.yaml'"
    assert environment["packages"]["numpy"] == np.__version__
    assert environment["machine"]["cpu_count"] >= 1
    assert environment["vllm"] == "0.32"
    assert environment["git_commit"] is None or len(environment["git_commit"]) == 40


def test_trained_retrievers_are_judged_against_the_untrained_encoder(tmp_path):
    """better: p < 0.05 above base_cosine; worse: below it by more than the trained row's own CI half-width;
    slightly worse: p < 0.05 below it, by less than that."""
    rows, per_example = [], {}
    plan = {"base_cosine": 0.50, "cosine": 0.62, "qnorm": 0.36, "dnorm": 0.49, "dot": 0.46, "bm25": 0.20}
    n = 300
    ids = [f"q{i}" for i in range(n)]
    rng = np.random.default_rng(0)
    for system, mean in plan.items():
        rows.append(_row("musique", system, 0, n, 10.0, 100 * mean))
        # dot: base_cosine's questions with 12 of its hits lost, so paired, significant, and under the half-width
        if system == "dot":
            ndcg = per_example[("musique", "base_cosine", 0)]["ndcg@10"].copy()
            ndcg[np.flatnonzero(ndcg)[:12]] = 0.0
        else:
            ndcg = rng.permutation(_values(n, mean))
        per_example[("musique", system, 0)] = {"ids": ids, "em": _values(n, 0.1), "ndcg@10": ndcg}
    files = _write(tmp_path, rows, per_example)
    entries = {entry["system"]: entry for entry in json.loads(files.results_json.read_text())["against_untrained"]}
    assert set(entries) == {"cosine", "qnorm", "dnorm", "dot"}   # reader baselines are not trained retrievers
    assert entries["cosine"]["verdict"] == "better" and entries["cosine"]["p_value"] < 0.05
    assert entries["qnorm"]["verdict"] == "worse" and entries["qnorm"]["delta"] == pytest.approx(-14.0)
    assert entries["qnorm"]["delta"] < -entries["qnorm"]["half_width"] < 0
    assert entries["dnorm"]["verdict"] == "no clear difference"
    report = files.report_md.read_text()
    assert "## Against the untrained encoder (base_cosine)" in report
    assert entries["dot"]["verdict"] == "slightly worse" and entries["dot"]["p_value"] < 0.05
    assert -entries["dot"]["half_width"] < entries["dot"]["delta"] < 0
    assert "- better: 1 of 4 (musique/cosine)" in report and "- worse: 1 of 4 (musique/qnorm)" in report
    assert "| musique | qnorm | -14.0 [" in report
    # MuSiQue's training split feeds no training data here: one Holm family over its 4 trained systems
    assert all(entry["family"] == 4 and entry["p_holm"] >= entry["p_value"] for entry in entries.values())
    assert entries["cosine"]["p_holm"] < 0.05 and entries["dnorm"]["p_holm"] > 0.05
    assert "after Holm's adjustment over all 4 such pairs: 1 (musique/cosine)" in report
    inside = _write(tmp_path / "inside", rows, per_example, in_domain=("musique",))
    assert not any("p_holm" in entry for entry in json.loads(inside.results_json.read_text())["against_untrained"])
    assert "| in domain |" in inside.report_md.read_text()


def test_without_base_cosine_there_is_no_untrained_section(tmp_path):
    rows, per_example, _ = _suite(qnorm_em=0.55)
    files = _write(tmp_path, rows, per_example)
    assert json.loads(files.results_json.read_text())["against_untrained"] == []
    assert "untrained encoder" not in files.report_md.read_text()
