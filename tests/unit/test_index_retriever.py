"""Which retriever an index is built and queried with when none is given: files get the strategy measured best on
real documents, an existing index keeps its own, and ask finds the one the index records."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from rag_mag.cli.index import default_retriever
from rag_mag.components.checkpoints import checkpoint_fingerprint
from rag_mag.models import FILES_STRATEGY, default_retriever_dir, files_retriever_dir
from rag_mag.serving.retrievers import index_checkpoint, own_retriever, retriever_for
from tests.tiny import tiny_encoder


@pytest.fixture
def artifacts(tmp_path, monkeypatch) -> Path:
    """An artifacts folder with a qnorm default retriever and the files (cosine) one, of different weights."""
    root = tmp_path / "artifacts"
    monkeypatch.setenv("RAG_MAG_ARTIFACTS", str(root))
    tiny_encoder(tmp_path / "tok-q", "qnorm", seed=1).save(default_retriever_dir())
    tiny_encoder(tmp_path / "tok-c", FILES_STRATEGY, seed=2).save(files_retriever_dir())
    return root


def _index(folder: Path, retriever: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"checkpoint": checkpoint_fingerprint(retriever)}))
    return folder


def test_the_files_default_is_cosine_and_the_corpus_default_stays_qnorm(artifacts, tmp_path):
    assert FILES_STRATEGY == "cosine" and files_retriever_dir() == artifacts / "retriever-cosine"
    files = argparse.Namespace(paths=["docs"], store="faiss", out=str(tmp_path / "new-index"))
    assert default_retriever(files) == files_retriever_dir()
    corpus = argparse.Namespace(paths=[], store="faiss", out=str(tmp_path / "index"))
    assert default_retriever(corpus) == default_retriever_dir()


def test_an_existing_index_keeps_the_retriever_that_built_it(artifacts, tmp_path):
    index = _index(tmp_path / "old-index", default_retriever_dir())
    assert index_checkpoint(index) == checkpoint_fingerprint(default_retriever_dir())
    assert retriever_for(index_checkpoint(index)) == default_retriever_dir()
    files = argparse.Namespace(paths=["docs"], store="faiss", out=str(index))
    assert default_retriever(files) == default_retriever_dir()  # not re-embedded with cosine behind the user's back
    assert own_retriever(index, files_retriever_dir()) == default_retriever_dir()


def test_an_index_of_an_unknown_retriever_falls_back(artifacts, tmp_path):
    stranger = tiny_encoder(tmp_path / "tok-s", "dot", seed=3).save(tmp_path / "elsewhere")
    index = _index(tmp_path / "index", stranger)
    assert retriever_for(index_checkpoint(index)) is None
    assert own_retriever(index, default_retriever_dir()) == default_retriever_dir()
    assert index_checkpoint(tmp_path / "no-index") is None and retriever_for(None) is None


def test_a_missing_files_retriever_is_trained_once_on_the_sample(artifacts, tmp_path, monkeypatch):
    import shutil

    import rag_mag.cli.quickstart as quickstart

    shutil.rmtree(files_retriever_dir())
    trained = []
    monkeypatch.setattr(quickstart, "ensure_retriever", lambda strategy, folder: trained.append((strategy, folder)))
    files = argparse.Namespace(paths=["docs"], store="faiss", out=str(tmp_path / "new-index"))
    assert default_retriever(files) == files_retriever_dir()
    assert trained == [(FILES_STRATEGY, files_retriever_dir())]
