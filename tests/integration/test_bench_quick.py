"""The quick benchmark end to end: real training, FAISS, BM25, the real vLLM server, the report."""

import json

import pytest

from rag_mag.bench.datasets import data_root
from rag_mag.cli.main import main
from rag_mag.models import REPO_ROOT

pytestmark = pytest.mark.integration
QUICK = REPO_ROOT / "eval" / "configs" / "quick.yaml"
DENSE = ("cosine", "qnorm", "base_cosine")
EXPECTED = ({(d, f"rag:{s}") for d in ("sample", "musique") for s in DENSE}
            | {("musique", f"rag_multihop:{s}") for s in DENSE}
            | {(d, s) for d in ("sample", "musique") for s in ("bm25", "closed_book", "oracle", "oracle@base")})


@pytest.mark.skipif(data_root() is None, reason="needs the shared datasets (../shared/data or RAG_MAG_DATA_ROOT)")
def test_quick_benchmark_writes_a_complete_report(tmp_path, vllm_server):
    out = tmp_path / "quick"
    assert main(["bench", str(QUICK), "--output-dir", str(out), "--llm-url", vllm_server]) == 0
    results = json.loads((out / "results.json").read_text())
    rows = results["results"]
    assert {(r["dataset"], r["system"]) for r in rows} == EXPECTED  # both pipelines produce rows
    assert results["failures"] == []
    for row in rows:
        # answers: answer_questions (12; the multi-hop entry's own 8); the ranking: all max_questions (16)
        expected = 8 if row["system"].startswith("rag_multihop:") else 6 if row["system"].endswith("@base") else 12
        assert row["n_questions"] == expected
        low, high = row["rag"]["em_ci"]
        assert 0 <= low <= row["rag"]["em"] <= high <= 100
        assert 0 <= row["rag"]["f1"] <= 100
        if row["system"].startswith("rag:") or row["system"] == "bm25":  # the retriever's ranking, once per dataset
            assert set(row["retrieval"]) >= {"recall@1", "recall@5", "recall@20", "ndcg@10", "mrr@10"}
            assert row["retrieval"]["recall@1"] <= row["retrieval"]["recall@5"] <= row["retrieval"]["recall@20"]
            assert row["n_ranked"] == 16
            assert row["budget"]["max"] == 3  # rag_top_k passages given to the reader
        if row["system"] in ("rag:cosine", "rag:qnorm", "rag:base_cosine"):
            assert "document_norm_cohens_d" in row["diagnostics"]
        if row["system"].startswith("rag_multihop:"):
            # judged on the union of both rounds at its own budget, against round 1 alone at the same budget
            assert {"recall@budget", "round1_recall@budget"} <= set(row["retrieval"])
            assert row["rounds"] > 1 and 3 < row["budget"]["max"] <= 6
            assert "ndcg@10" not in row["retrieval"]
    # retrieval happens: a dense retriever finds supporting passages far above chance on MuSiQue (20 of 1,890)
    musique = {r["system"]: r for r in rows if r["dataset"] == "musique"}
    assert musique["rag:base_cosine"]["retrieval"]["recall@20"] > 30
    # the oracle reads the gold passages: MuSiQue names 2 to 4 supporting passages per question
    assert musique["oracle"]["budget"]["mean"] >= 2
    multihop = [c for c in results["comparisons"] if c["system"] == "rag_multihop:qnorm"]
    assert multihop and {c["baseline"] for c in multihop} == {"rag_multihop:cosine"}
    assert results["environment"]["git_commit"]
    # both readers are named with their checksums, and the run's wall time is recorded
    assert [r["name"] for r in results["readers"]] == ["smollm2-135m-reader", "smollm2-135m-instruct"]
    assert results["readers"][0]["checksum"].startswith("adapter-sha256:") and results["wall_seconds"] > 0
    report = (out / "report.md").read_text()
    for needle in ("rag:cosine", "rag_multihop:qnorm", "bm25", "closed_book", "oracle", "p-value",
                   "Paper findings", "Cohen", "Multi-hop: does the second round help?"):
        assert needle in report, needle
    assert sorted(p.name for p in out.glob("*.png")) == ["document_norms.png", "em_f1.png", "recall_at_k.png"]
    # a second run reuses every finished cell and the generation cache
    assert main(["bench", str(QUICK), "--output-dir", str(out), "--llm-url", vllm_server]) == 0
