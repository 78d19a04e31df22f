"""The real-documents benchmark end to end with the real parts: the default retriever (trained MiniLM) through
pipelines/index_files.yaml, Haystack's stock pipeline with the packaged MiniLM, BM25, and the trained reader on the
real vLLM server answering from each system's chunks."""

from __future__ import annotations

import json

import pytest

from rag_mag.cli.main import main
from rag_mag.models import default_retriever_dir

pytestmark = pytest.mark.integration

FACTS = {
    "lighthouse.md": "# The lighthouse\n\nThe lighthouse keeper is called Oskar. He has lived on the island since 1982 "
                     "and paints the tower white every spring, before the first storms of the year arrive.\n\n"
                     "See also the harbour.",
    "river.txt": "The Danube rises in the Black Forest. It flows through ten countries and reaches the Black Sea "
                 "after a long journey across the plains of central Europe, past Vienna and Budapest.",
    "vault.html": "<html><body><article><h1>The vault</h1><p>The vault on the second floor opens with the code "
                  "4711. The caretaker set the code and has told nobody else on the staff what it is, so it is "
                  "written down nowhere at all.</p></article></body></html>",
}


def test_the_benchmark_ranks_and_answers_with_the_real_models(vllm_server, tmp_path, monkeypatch, capsys):
    retriever = default_retriever_dir()  # the set-up's, before the benchmark's artifacts go to tmp_path
    monkeypatch.setenv("RAG_MAG_ARTIFACTS", str(tmp_path / "artifacts"))
    collection = tmp_path / "collection"
    (collection / "files").mkdir(parents=True)
    for name, text in FACTS.items():
        (collection / "files" / name).write_text(text)
    rows = [("q1", "What is the name of the lighthouse keeper?", ["Oskar"], ["lighthouse.md"]),
            ("q2", "Which code opens the vault?", ["4711"], ["vault.html"]),
            ("q3", "Where does the Danube rise?", ["Black Forest", "the Black Forest"], ["river.txt"])]
    with open(collection / "questions.jsonl", "w") as handle:
        for qid, question, answers, files in rows:
            handle.write(json.dumps({"id": qid, "collection": "mini", "question": question, "answers": answers,
                                     "answer_type": "short", "files": files, "pages": None, "answerable": True,
                                     "split": "test"}) + "\n")
    config = tmp_path / "mini.yaml"
    config.write_text(f"name: mini\nsplit: test\nreader: smollm2-135m-reader\nllm_url: {vllm_server}\n"
                      f"collections: [{collection}]\nsystems:\n"
                      f"  - {{name: qnorm, kind: rag_mag, retriever: {retriever}}}\n"
                      "  - {name: haystack_stock, kind: haystack}\n  - {name: haystack_bm25, kind: haystack_bm25}\n")
    out = tmp_path / "report"
    assert main(["bench", str(config), "--output-dir", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())["collections"]["mini"]
    for system in ("qnorm", "haystack_stock", "haystack_bm25"):
        assert results[system]["file@1"]["mean"] >= 66.0, results[system]  # the right file first, 2 of 3 at least
        assert results[system]["accuracy"]["n"] == 3
    assert results["qnorm"]["accuracy"]["mean"] >= 66.0  # the trained reader reads the answer off the chunk
    cell = json.loads((out / "cells" / "mini__qnorm.json").read_text())
    assert set(cell["predictions"]) == {"q1", "q2", "q3"} and cell["norm_by_length"] is not None
    assert "| qnorm |" in (out / "report.md").read_text()
