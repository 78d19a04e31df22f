"""rag-mag index's sharded, resumable encoding (rag_mag.ingestion.indexing) on a tiny random BERT."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rag_mag.cli.main import main
from rag_mag.components import faiss_index
from rag_mag.components.faiss_document_store import FAISSDocumentStore
from rag_mag.errors import ConfigError
from rag_mag.ingestion.indexing import IndexJob, parse_shard, run_index_job, shard_rows
from tests.tiny import tiny_encoder
from tests.unit.test_faiss_store import embed_store, make_documents

REPO_ROOT = Path(__file__).resolve().parents[2]
COUNT = 45


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("indexing")
    encoder = tiny_encoder(root / "tok", "qnorm", seed=3)
    encoder.config.query_norm_scale, encoder.config.document_norm_scale = 1.7, 2.3
    checkpoint = encoder.save(root / "qnorm")
    documents = make_documents(COUNT, seed=5)
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": d.id, "title": d.meta["title"], "text": d.content}) + "\n"
                              for d in documents))
    # The in-memory path (what pipelines/indexing.yaml runs) is the reference.
    reference = root / "reference"
    pipeline_documents = [type(d)(id=d.id, content=d.content, meta={"title": d.meta["title"]}) for d in documents]
    embed_store(checkpoint, pipeline_documents, reference)
    return {"root": root, "checkpoint": checkpoint, "corpus": corpus, "reference": reference}


def job(setup, out: Path, **extra) -> IndexJob:
    return IndexJob(corpus=setup["corpus"], retriever=setup["checkpoint"], out=out, chunk_size=8, batch_size=5,
                    precision="fp32", **extra)


def same_index(folder: Path, reference: Path) -> None:
    faiss_index.verify_folder(folder)
    ours, theirs = FAISSDocumentStore(path=str(folder)), FAISSDocumentStore(path=str(reference))
    assert [d.to_dict() for d in ours.filter_documents()] != [] and ours.count_documents() == COUNT
    np.testing.assert_allclose(np.stack([ours.embedding_at(r) for r in range(COUNT)]),
                               np.stack([theirs.embedding_at(r) for r in range(COUNT)]), atol=1e-5)
    # Same documents and meta; the raw norm agrees to float noise (batches pad differently in chunks).
    strip = lambda docs: [{**d.to_dict(), "embedding": None, "embedding_raw_norm": None} for d in docs]  # noqa: E731
    assert strip(ours.filter_documents()) == strip(theirs.filter_documents())
    norms = lambda store: [d.meta["embedding_raw_norm"] for d in store.filter_documents()]  # noqa: E731
    np.testing.assert_allclose(norms(ours), norms(theirs), rtol=1e-5)
    for key in ("count", "dim", "checkpoint", "strategy"):
        assert ours.manifest[key] == theirs.manifest[key]


def test_one_process_gives_the_pipelines_index(setup, tmp_path):
    summary = run_index_job(job(setup, tmp_path / "index"), progress=False)
    assert summary["merged"] and summary["encoding"]["encoded_now"] == COUNT
    same_index(tmp_path / "index", setup["reference"])
    assert not (tmp_path / "index.work").exists()  # removed after the merge


def test_three_shards_merge_into_the_same_index_when_the_last_one_finishes(setup, tmp_path):
    out = tmp_path / "index"
    first = run_index_job(job(setup, out), shard=(2, 3), progress=False)
    assert not first["merged"] and first["waiting_for_shards"] == [0, 1] and not out.exists()
    assert not run_index_job(job(setup, out), shard=(0, 3), progress=False)["merged"]
    last = run_index_job(job(setup, out), shard=(1, 3), progress=False)
    assert last["merged"] and last["encoding"]["rows"] == 15
    same_index(out, setup["reference"])


def test_a_kill_mid_encoding_resumes_from_the_last_finished_chunk(setup, tmp_path):
    out = tmp_path / "index"
    env = {**os.environ, "RAG_MAG_KILL_AT": "index:chunk#3", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "rag_mag.cli.main", "index", "--retriever", str(setup["checkpoint"]),
               "--corpus", str(setup["corpus"]), "--out", str(out), "--chunk-size", "8", "--batch-size", "5",
               "--precision", "fp32"]
    killed = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    progress = json.loads((tmp_path / "index.work" / "shard-0-of-1" / "progress.json").read_text())
    assert progress == {"rows_done": 24} and not out.exists()  # three chunks of 8 survived the kill
    summary = run_index_job(job(setup, out), progress=False)
    assert summary["encoding"]["resumed_after"] == 24 and summary["encoding"]["encoded_now"] == COUNT - 24
    same_index(out, setup["reference"])


def test_sigterm_mid_encoding_stops_after_the_chunk_and_resumes(setup, tmp_path):
    out = tmp_path / "index"
    env = {**os.environ, "RAG_MAG_KILL_AT": "index:chunk#2", "RAG_MAG_FAULT_SIGNAL": "SIGTERM",
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "rag_mag.cli.main", "index", "--retriever", str(setup["checkpoint"]),
               "--corpus", str(setup["corpus"]), "--out", str(out), "--chunk-size", "8", "--batch-size", "5",
               "--precision", "fp32"]
    stopped = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    assert f"stopped after 16 of {COUNT} passages of shard 0/1 by SIGTERM" in stopped.stderr
    assert "Traceback" not in stopped.stderr and not out.exists()
    summary = run_index_job(job(setup, out), progress=False)
    assert summary["encoding"]["resumed_after"] == 16
    same_index(out, setup["reference"])


def test_a_rerun_with_other_settings_is_refused_until_restart(setup, tmp_path):
    out = tmp_path / "index"
    run_index_job(job(setup, out), shard=(0, 2), progress=False)
    with pytest.raises(ConfigError, match="chunk_size: was 8, now 16.*--restart"):
        run_index_job(IndexJob(corpus=setup["corpus"], retriever=setup["checkpoint"], out=out, chunk_size=16,
                               precision="fp32"), shard=(1, 2), progress=False)
    with pytest.raises(ConfigError, match="shards: was 2, now 1"):
        run_index_job(job(setup, out), progress=False)
    assert run_index_job(job(setup, out), restart=True, progress=False)["merged"]
    same_index(out, setup["reference"])
    with pytest.raises(ConfigError, match="already exists.*--overwrite"):
        run_index_job(job(setup, out), progress=False)


@pytest.mark.parametrize("index_type", ["ivf", "hnsw_mips", "auto"])
def test_approximate_types_are_built_from_chunks(setup, tmp_path, index_type):
    out = tmp_path / "index"
    run_index_job(job(setup, out, index_type=index_type, nlist=2 if index_type == "ivf" else None), progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["index_type"] == {"auto": "flat"}.get(index_type, index_type)
    store = FAISSDocumentStore(path=str(out), index_type=index_type, nprobe=2, ef_search=64)
    reference = FAISSDocumentStore(path=str(setup["reference"]))
    queries = np.stack([reference.embedding_at(r) for r in (0, 9, 30)])
    np.testing.assert_array_equal(store.search(queries, 3)[1], reference.search(queries, 3)[1])


def test_shard_arguments():
    assert parse_shard("1/4") == (1, 4) and parse_shard(None, {}) == (0, 1)
    assert parse_shard(None, {"RANK": "2", "WORLD_SIZE": "3"}) == (2, 3)
    for bad in ("4/4", "x", "1/0", "-1/2"):
        with pytest.raises(ConfigError, match="--shard"):
            parse_shard(bad)
    assert [shard_rows(10, k, 3) for k in range(3)] == [(0, 3), (3, 6), (6, 10)]


def test_cli_errors_are_one_line(setup, tmp_path, capsys):
    assert main(["index", "--retriever", str(setup["checkpoint"]), "--corpus", str(setup["corpus"]),
                 "--out", str(tmp_path / "i"), "--shard", "3/2"]) == 2
    assert "bad --shard '3/2'" in capsys.readouterr().err
    assert main(["index", "--retriever", str(setup["checkpoint"]), "--corpus", str(tmp_path / "missing.jsonl"),
                 "--out", str(tmp_path / "i")]) == 2
    assert "does not exist" in capsys.readouterr().err
