"""``adapt`` end to end from a folder of files: synthesis (the writer and reader replaced by the functions of
test_synth.py, vLLM being the integration tier's), splits by file, training a tiny BERT, test-split scores, and
the decision."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

from rag_mag.adapt.run import AdaptSettings, adapt
from tests.unit.test_adapt import TRAINING, save_base
from tests.unit.test_synth import Writer, make_folder, reader


@pytest.fixture()
def _threads_restored():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("_threads_restored")
def test_adapt_runs_from_a_folder_of_files_to_a_decision_on_held_out_files(tmp_path, monkeypatch):
    @contextlib.contextmanager
    def served(model, url, given, *, max_tokens):
        yield Writer() if "writer" in model else reader

    monkeypatch.setattr("rag_mag.adapt.synth.served", served)
    folder, base = make_folder(tmp_path, files=12), save_base(tmp_path / "base")
    out = tmp_path / "adapt"
    result = adapt(AdaptSettings(source=str(folder), out=out, strategies=["cosine", "qnorm"], min_pairs=2,
                                 training={**TRAINING, "base_model": str(base), "steps": 4, "eval_every": 2},
                                 progress=False))
    report = result.report
    pairs = [json.loads(line) for line in (out / "pairs" / "pairs.jsonl").read_text().splitlines()]
    assert len(pairs) == json.loads((out / "pairs" / "synth.json").read_text())["counts"]["kept"] >= 12
    files = {name: set(report["splits"][name]["file_names"]) for name in ("train", "val", "test")}
    assert not (files["train"] & files["val"] or files["train"] & files["test"] or files["val"] & files["test"])
    assert sum(report["splits"][name]["pairs"] for name in files) <= len(pairs)
    test_rows = [json.loads(line) for line in (out / "splits" / "test.jsonl").read_text().splitlines()]
    assert {row["file"] for row in test_rows} <= files["test"] and report["test_pairs"] == len(test_rows)
    assert report["scored_split"] == "test" and set(report["systems"]) == {"base", "bm25", "cosine", "qnorm"}
    base_ndcg = report["systems"]["base"]["means"]["ndcg@10"]
    if result.published is None:
        assert not (out / "retriever").exists()
    else:  # a published retriever beats the base on the held-out files
        assert report["systems"][report["decision"]["published"]]["means"]["ndcg@10"] > base_ndcg
