"""``rag-mag quickstart``'s sample retrievers: the demo's comparison retriever is built only beside the sample's."""

from __future__ import annotations

import json

import pytest

from rag_mag import durable
from rag_mag.cli import quickstart


@pytest.fixture
def artifacts(tmp_path, monkeypatch):
    monkeypatch.setenv("RAG_MAG_ARTIFACTS", str(tmp_path))
    built = []
    monkeypatch.setattr(quickstart, "ensure_retriever", lambda strategy, folder: built.append(("train", strategy,
                                                                                                folder.name)))
    monkeypatch.setattr(quickstart, "ensure_index", lambda strategy, retriever, folder: built.append(
        ("index", strategy, folder.name)))
    return tmp_path, built


def write_index(folder, strategy: str, corpus_sha256: str) -> None:
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"strategy": strategy, "corpus_sha256": corpus_sha256}))


def test_cosine_is_built_beside_the_quickstart_qnorm_index(artifacts):
    root, built = artifacts
    write_index(root / "index-default", "qnorm", durable.sha256_of(quickstart.SAMPLE / "corpus.jsonl"))
    quickstart.ensure_comparison()
    assert built == [("train", "cosine", "retriever-cosine"), ("index", "cosine", "index-cosine")]


def test_a_cosine_default_is_compared_with_qnorm(artifacts):
    root, built = artifacts
    write_index(root / "index-default", "cosine", durable.sha256_of(quickstart.SAMPLE / "corpus.jsonl"))
    quickstart.ensure_comparison()
    assert [step[1] for step in built] == ["qnorm", "qnorm"]


def test_nothing_is_built_beside_another_corpus_or_when_the_comparison_exists(artifacts):
    root, built = artifacts
    write_index(root / "index-default", "qnorm", "0" * 64)
    quickstart.ensure_comparison()
    assert built == []
    (root / "index-default" / "manifest.json").unlink()
    quickstart.ensure_comparison()  # no default index at all
    assert built == []
    write_index(root / "index-cosine", "cosine", "1" * 64)
    (root / "retriever-cosine").mkdir()
    (root / "retriever-cosine" / "rag_mag.json").write_text("{}")
    (root / "index-default" / "manifest.json").write_text(json.dumps({
        "strategy": "qnorm", "corpus_sha256": durable.sha256_of(quickstart.SAMPLE / "corpus.jsonl")}))
    quickstart.ensure_comparison()
    assert built == []
