"""The real-documents benchmark: its metrics (file@k, page@k, hubness, norm by length) against hand-computed values,
and `rag-mag bench` on a tiny collection of files with a tiny random retriever and Haystack's BM25."""

from __future__ import annotations

import json
import math

import pytest

from rag_mag.bench.folders.answers import fact_recall, fact_terms, score_answers
from rag_mag.bench.folders.collections import RealQuestion
from rag_mag.bench.folders.runner import load_folders_config
from rag_mag.cli.main import main
from rag_mag.errors import ConfigError
from rag_mag.metrics.files import file_at_k, hubness, norm_by_length, page_at_k
from tests.tiny import tiny_encoder


def test_file_and_page_at_k():
    ranked = ["b.md", "a.pdf", "c.txt"]
    assert file_at_k(ranked, ["a.pdf"], 1) == 0.0 and file_at_k(ranked, ["a.pdf"], 2) == 1.0
    assert file_at_k(ranked, ["x", "c.txt"], 5) == 1.0
    with pytest.raises(ValueError, match="gold file"):
        file_at_k(ranked, [], 5)
    pages = [("a.pdf", 3, 3), ("a.pdf", 4, 6), ("b.pdf", 5, 5)]
    assert page_at_k(pages, ["a.pdf"], [5], 1) == 0.0
    assert page_at_k(pages, ["a.pdf"], [5], 2) == 1.0  # a chunk that spans pages 4-6 cites page 5
    assert page_at_k(pages, ["b.pdf"], [4], 5) == 0.0


def test_hubness_counts_questions_whose_top_k_holds_a_most_retrieved_chunk():
    rankings = [["hub", "a", "b"], ["hub", "c", "d"], ["e", "f", "g"], ["h", "hub", "i"]]
    # 100 chunks: the 1% most retrieved is one chunk, "hub" (3 times); 3 of 4 rankings hold it in their top 3
    assert hubness(rankings, n_chunks=100, k=3) == 0.75
    # in the top 1 only, "hub" still leads (2 times): rankings 1 and 2
    assert hubness(rankings, n_chunks=100, k=1) == 0.5
    # 10% of 20 chunks = 2 hubs: "hub" and, among the chunks seen once, the first by id ("a")
    assert hubness(rankings, n_chunks=20, k=3) == 0.75
    with pytest.raises(ValueError):
        hubness([], n_chunks=10)


def test_norm_by_length_bands_and_rank_correlation():
    words = [3, 10, 12, 30, 60, 100]
    norms = [4.0, 3.2, 3.0, 2.0, 1.5, 1.0]  # falls with length: rho = -1
    figures = norm_by_length(norms, words)
    assert math.isclose(figures["spearman"], -1.0)
    assert figures["median_norm"] == 2.5
    bands = {band["words"]: band for band in figures["bands"]}
    assert bands["5-15"]["chunks"] == 2 and math.isclose(bands["5-15"]["relative_norm"], 3.1 / 2.5)
    assert bands["80+"]["chunks"] == 1 and bands["1-5"]["chunks"] == 1


@pytest.fixture
def tiny_collection(tmp_path):
    files = tmp_path / "collection" / "files"
    files.mkdir(parents=True)
    facts = {"keeper.txt": "The lighthouse keeper is called Oskar. He has lived on the island since 1982 and "
                           "he paints the tower white every spring before the first storms of the year arrive.",
             "river.md": "# Rivers\n\nThe Danube flows through ten countries. It rises in the Black Forest and "
                         "reaches the Black Sea after a long journey across the plains of central Europe.",
             "vault.txt": "The vault on the second floor opens with the code 4711. The caretaker set the code "
                          "and has told nobody else on the staff what it is, so it is written nowhere."}
    for name, text in facts.items():
        (files / name).write_text(text)
    questions = [("q1", "Who is the lighthouse keeper?", ["Oskar"], ["keeper.txt"]),
                 ("q2", "Where does the Danube rise?", ["Black Forest"], ["river.md"]),
                 ("q3", "What code opens the vault?", ["4711"], ["vault.txt"]),
                 ("q4", "Who won the 1998 World Cup?", [], [])]
    with open(tmp_path / "collection" / "questions.jsonl", "w") as handle:
        for qid, question, answers, cited in questions:
            handle.write(json.dumps({"id": qid, "collection": "tiny", "question": question, "answers": answers,
                                     "answer_type": "short", "files": cited, "pages": None,
                                     "answerable": bool(answers), "split": "validation"}) + "\n")
    return tmp_path / "collection"


def test_bench_scores_a_folder_collection_and_reuses_its_cells(tmp_path, tiny_collection, monkeypatch, capsys):
    monkeypatch.setenv("RAG_MAG_ARTIFACTS", str(tmp_path / "artifacts"))
    checkpoint = tiny_encoder(tmp_path / "tok", "qnorm", seed=3).save(tmp_path / "retriever")
    config = tmp_path / "docs.yaml"
    config.write_text(f"name: docs\nsplit: validation\nreader: null\ncollections: [{tiny_collection}]\nsystems:\n"
                      f"  - {{name: qnorm, kind: rag_mag, retriever: {checkpoint}}}\n"
                      f"  - {{name: qnorm_all_chunks, kind: rag_mag, retriever: {checkpoint}, set: {{min_words: 0}}}}\n"
                      f"  - {{name: qnorm_dense, kind: rag_mag, retriever: {checkpoint}, set: {{hybrid: false}}}}\n"
                      "  - {name: bm25, kind: haystack_bm25}\n")
    out = tmp_path / "report"
    assert main(["bench", str(config), "--output-dir", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())["collections"]["tiny"]
    assert set(results) == {"qnorm", "qnorm_all_chunks", "qnorm_dense", "bm25"}
    # a system that differs only in how it ranks reads the index of the one that indexes the same way
    indexes = sorted(path.name.split("-")[0] for path in (tmp_path / "artifacts" / "bench" / "folders").glob("*/*"))
    assert indexes == ["bm25", "qnorm", "qnorm_all_chunks"]
    assert results["bm25"]["file@1"]["mean"] == 100.0  # every question names its file's words
    for summary in results.values():
        assert summary["file@5"]["n"] == 3 and summary["file@5"]["mean"] == 100.0  # 3 files: all in the top 5
        assert 0 <= summary["hubness@5"] <= 100
    assert results["qnorm"]["norm_by_length"]["bands"] and results["bm25"]["norm_by_length"] is None
    report = (out / "report.md").read_text()
    assert "## tiny" in report and "file@5, qnorm minus bm25" in report
    cell = out / "cells" / "tiny__qnorm.json"
    before = cell.stat().st_mtime_ns
    assert main(["bench", str(config), "--output-dir", str(out)]) == 0
    assert cell.stat().st_mtime_ns == before  # reused: same checkpoint, settings and questions
    cell.write_text('{"key": "trunc')  # a cell cut short (a full disk, a copy interrupted) is scored again
    assert main(["bench", str(config), "--output-dir", str(out)]) == 0
    assert json.loads(cell.read_text())["system"] == "qnorm"


@pytest.mark.parametrize("text, message", [
    ("name: x\ncollections: [stici]\nsystems: [{name: a, kind: nope}]\n", "each system needs a name and a kind"),
    ("name: x\ncollections: [stici]\nsystems: [{name: a, kind: rag_mag}]\n", "needs a retriever"),
    ("name: x\ncollections: [stici]\nsplit: train\nsystems: [{name: a, kind: haystack}]\n", "split must be one of"),
    ("name: x\ncollections: [stici]\ntypo: 1\nsystems: [{name: a, kind: haystack}]\n", "unknown keys"),
])
def test_bad_configs_are_one_clear_error(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_folders_config(path)


def test_an_unknown_collection_and_bench_only_flags_are_refused(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("name: x\ncollections: [no_such_thing]\nsystems: [{name: a, kind: haystack_bm25}]\n")
    assert main(["bench", str(config), "--output-dir", str(tmp_path / "out"), "--data-root", str(tmp_path)]) == 2
    assert "neither a known collection" in capsys.readouterr().err
    assert main(["bench", str(config), "--max-questions", "3"]) == 2
    assert "not options of the real-documents benchmark" in capsys.readouterr().err


def test_fact_recall_counts_the_numbers_and_names_of_a_long_reference():
    reference = "Apple's net sales were $81.8 billion in the quarter, and Services grew to 21,213 million."
    assert fact_terms(reference) == {"81.8", "21213", "services"}
    assert fact_recall("$81.8 billion", reference) == pytest.approx(1 / 3)
    assert fact_recall("Net sales: 81.8 billion; services 21,213", reference) == pytest.approx(1.0)
    assert fact_recall("anything", "no facts here at all") is None


def test_answers_are_scored_by_kind_and_unanswerable_questions_by_abstention():
    def question(qid, answers, kind="short"):
        return RealQuestion(id=qid, collection="c", question="?", answers=tuple(answers), answer_type=kind,
                            files=("a.txt",) if answers else (), pages=None, answerable=bool(answers),
                            split="validation")

    questions = [question("s", ["Oskar"]), question("l", ["It opened in 1982 in Bremen."], "long"),
                 question("u", [])]
    scores = score_answers(questions, {"s": "The keeper is Oskar", "l": "1982", "u": "Samuel Johnson"})
    assert scores["em"] == [0.0] and scores["accuracy"] == [1.0] and 0 < scores["f1"][0] < 1
    assert scores["fact_recall"] == [0.5]  # 1982 said, Bremen not
    assert scores["abstain"] == [0.0] and scores["false_abstain"] == [0.0, 0.0]  # it answered the unanswerable one
    abstained = score_answers(questions, {"s": "unanswerable", "l": "1982", "u": "unanswerable"})
    assert abstained["abstain"] == [1.0] and abstained["false_abstain"] == [1.0, 0.0]
    assert abstained["em"] == [0.0] and abstained["accuracy"] == [0.0]  # an abstention scores 0
