"""The quick benchmark end to end: real training, FAISS, BM25, the real vLLM server, the report."""

import json

import pytest

from rag_mag.cli.main import main
from rag_mag.datasets import data_root
from rag_mag.models import REPO_ROOT

pytestmark = pytest.mark.integration
QUICK = REPO_ROOT / "eval" / "configs" / "quick.yaml"
SYSTEMS = {"cosine", "qnorm", "bm25", "base_cosine", "closed_book"}


@pytest.mark.skipif(data_root() is None, reason="needs the shared datasets (../shared/data or RAG_MAG_DATA_ROOT)")
def test_quick_benchmark_writes_a_complete_report(tmp_path, vllm_server):
    out = tmp_path / "quick"
    assert main(["bench", str(QUICK), "--output-dir", str(out), "--llm-url", vllm_server]) == 0
    results = json.loads((out / "results.json").read_text())
    rows = results["results"]
    assert {(r["dataset"], r["system"]) for r in rows} == {(d, s) for d in ("sample", "musique") for s in SYSTEMS}
    for row in rows:
        assert row["n_questions"] == 16
        low, high = row["rag"]["em_ci"]
        assert 0 <= low <= row["rag"]["em"] <= high <= 100
        assert 0 <= row["rag"]["f1"] <= 100
        if row["system"] != "closed_book":
            assert set(row["retrieval"]) >= {"recall@1", "recall@5", "recall@20", "ndcg@10", "mrr@10"}
            assert row["retrieval"]["recall@1"] <= row["retrieval"]["recall@5"] <= row["retrieval"]["recall@20"]
        if row["system"] in ("cosine", "qnorm", "base_cosine"):
            assert "document_norm_cohens_d" in row["diagnostics"]
    # retrieval happens: a dense retriever finds supporting passages far above chance on MuSiQue (20 of 1,890)
    musique = {r["system"]: r for r in rows if r["dataset"] == "musique"}
    assert musique["base_cosine"]["retrieval"]["recall@20"] > 30
    assert results["environment"]["git_commit"]
    report = (out / "report.md").read_text()
    for needle in ("cosine", "qnorm", "bm25", "closed_book", "p-value", "Paper findings", "Cohen"):
        assert needle in report, needle
    assert sorted(p.name for p in out.glob("*.png")) == ["document_norms.png", "em_f1.png", "recall_at_k.png"]
    # a second run reuses every finished cell and the generation cache
    assert main(["bench", str(QUICK), "--output-dir", str(out), "--llm-url", vllm_server]) == 0
