"""kill -9 while an index is written, tampered index files, and leftovers of interrupted writes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from haystack import Document

from rag_mag.cli.main import main
from rag_mag.components import faiss_index
from rag_mag.components.faiss_document_store import FAISSDocumentStore
from rag_mag.errors import CheckpointError
from rag_mag.models import REPO_ROOT

pytestmark = pytest.mark.faults

COUNT = 30
# Every point of faiss_index.write_folder; "moved-aside" exists only on the two-rename fallback of the swap.
PHASES = ["index:staging", "index:faiss", "index:ids", "index:documents", "index:manifest", "index:synced",
          "index:swapped", "index:done", "index:moved-aside"]


def write_index(out: Path, seed: int, kill_at: str | None = None, no_exchange: bool = False):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("RAG_MAG_KILL_AT", None)
    if kill_at:
        env["RAG_MAG_KILL_AT"] = kill_at
    if no_exchange:
        env["RAG_MAG_TEST_NO_EXCHANGE"] = "1"
    return subprocess.run([sys.executable, "-m", "tests.faults.children", "index",
                           json.dumps({"out": str(out), "seed": seed, "count": COUNT})],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)


def contents(folder: Path) -> list[str]:
    store = FAISSDocumentStore(path=str(folder))
    return [document.content for document in store.filter_documents()]


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("index-faults")
    for seed in (1, 2):
        assert write_index(root / f"v{seed}", seed).returncode == 0
    return {"root": root, 1: contents(root / "v1"), 2: contents(root / "v2")}


@pytest.mark.parametrize("phase", PHASES)
def test_kill_while_overwriting_an_index_leaves_one_whole_version(versions, tmp_path, phase, fault_case):
    out = tmp_path / "index"
    assert write_index(out, 1).returncode == 0
    killed = write_index(out, 2, kill_at=phase, no_exchange=phase.endswith("moved-aside"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    if phase == "index:moved-aside":  # killed between the two renames: the next write puts the old one back
        assert not out.exists() and (tmp_path / ".index.old").is_dir()
        from rag_mag import durable

        durable.recover_dir(out, is_complete=faiss_index.is_index_folder)  # what every write runs first
    assert contents(out) in (versions[1], versions[2])  # the old index or the new one, whole and verified
    faiss_index.verify_folder(out)
    assert write_index(out, 2).returncode == 0  # the next write cleans up and succeeds
    assert contents(out) == versions[2]
    assert [p.name for p in tmp_path.iterdir() if p.name != "index"] == []
    fault_case.survived()


def _copy(versions, tmp_path) -> Path:
    import shutil

    return Path(shutil.copytree(versions["root"] / "v1", tmp_path / "index"))


def permute_together(folder: Path) -> None:
    ids = json.loads((folder / "ids.json").read_text())
    lines = (folder / "documents.jsonl").read_text().splitlines()
    (folder / "ids.json").write_text(json.dumps(ids[1:] + ids[:1]))
    (folder / "documents.jsonl").write_text("\n".join(lines[1:] + lines[:1]) + "\n")


def swap_texts(folder: Path) -> None:
    records = [json.loads(line) for line in (folder / "documents.jsonl").read_text().splitlines()]
    records[0]["content"], records[1]["content"] = records[1]["content"], records[0]["content"]
    (folder / "documents.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def edit_text(folder: Path) -> None:
    text = (folder / "documents.jsonl").read_text()
    (folder / "documents.jsonl").write_text(text.replace("passage 3 of", "passage 8 of", 1))


def flip_vector_byte(folder: Path) -> None:
    data = bytearray((folder / "index.faiss").read_bytes())
    data[-5] ^= 0x40
    (folder / "index.faiss").write_bytes(bytes(data))


def rename_an_id(folder: Path) -> None:
    ids = json.loads((folder / "ids.json").read_text())
    records = [json.loads(line) for line in (folder / "documents.jsonl").read_text().splitlines()]
    ids[0] = records[0]["id"] = "forged"
    (folder / "ids.json").write_text(json.dumps(ids))
    (folder / "documents.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def drop_checksums(folder: Path) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["files"]
    (folder / "manifest.json").write_text(json.dumps(manifest))


def delete_documents(folder: Path) -> None:
    (folder / "documents.jsonl").unlink()


# (damage, the error's words, whether loading catches it; the rest only `index --verify` reads)
TAMPERING = [
    (permute_together, "was changed", True),
    (swap_texts, "was changed", True),
    (edit_text, "was changed", True),
    (rename_an_id, "was changed", True),
    (drop_checksums, "no file checksums", True),
    (delete_documents, "documents.jsonl", True),
    (flip_vector_byte, "index.faiss does not match its checksum", False),
]


@pytest.mark.parametrize("damage, words, on_load", TAMPERING, ids=[t[0].__name__ for t in TAMPERING])
def test_a_tampered_index_is_refused(versions, tmp_path, capsys, damage, words, on_load, fault_case):
    folder = _copy(versions, tmp_path)  # a sound index (test_verify_passes_a_sound_index...)
    damage(folder)
    if on_load:
        with pytest.raises(CheckpointError, match=words):
            FAISSDocumentStore(path=str(folder)).count_documents()
    assert main(["index", "--verify", str(folder)]) == 2
    err = capsys.readouterr().err
    assert words in err and "rag-mag index" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    fault_case.clear_error()


def test_verify_passes_a_sound_index_and_refuses_a_non_index(versions, tmp_path, capsys, fault_case):
    assert main(["index", "--verify", str(versions["root"] / "v1")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["count"] == COUNT and report["files"] == sorted(
        ["documents.jsonl", "ids.json", "index.faiss"])
    assert main(["index", "--verify", str(tmp_path)]) == 2
    assert "not a rag-mag index folder" in capsys.readouterr().err
    fault_case.clear_error()


def test_staging_leftovers_are_reported_then_removed(versions, tmp_path, caplog, fault_case):
    folder = _copy(versions, tmp_path)
    (tmp_path / ".index.staging-k1ll3d").mkdir()
    (tmp_path / ".index.ab12cd34").mkdir()  # the staging name of older rag-mag versions
    with caplog.at_level("WARNING"):
        assert FAISSDocumentStore(path=str(folder)).count_documents() == COUNT
    assert "left by an interrupted index write" in caplog.text
    store = FAISSDocumentStore(path=str(folder))
    store.write_documents([Document(id="new", content="new passage", embedding=np.ones(8, np.float32).tolist(),
                                     meta={"embedding_checkpoint": "fault-suite", "embedding_strategy": "dot"})])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]
    assert FAISSDocumentStore(path=str(folder)).count_documents() == COUNT + 1
    fault_case.survived()


def test_an_index_of_the_previous_format_still_loads_with_a_warning(versions, tmp_path, caplog, fault_case):
    folder = _copy(versions, tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest = {k: v for k, v in manifest.items() if k not in ("files", "ids_sha256")}
    (folder / "manifest.json").write_text(json.dumps({**manifest, "format_version": 1}))
    with caplog.at_level("WARNING"):
        assert FAISSDocumentStore(path=str(folder)).count_documents() == COUNT
    assert "no checksums" in caplog.text
    with pytest.raises(CheckpointError, match="cannot be verified"):
        faiss_index.verify_folder(folder)
    fault_case.survived()
