"""A full disk: index chunks, the index merge, a checkpoint save and durable writes on a filesystem that fills.

The real cases write to a 2 MB tmpfs (mounted here; they are skipped where mounting is not permitted) filled
with a ballast file to leave a chosen number of bytes. Each write is refused with one line naming the bytes
needed, the bytes free and the path, or, where the disk fills past the estimate, ends in one line too;
nothing saved before is lost, no staging file is left, and the same command resumes once space is freed.
The simulated cases (always run) raise ENOSPC from ``os.posix_fallocate`` / ``os.fsync`` or shrink
``shutil.disk_usage``, for machines without tmpfs.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest

from rag_mag import durable
from rag_mag.cli.main import main
from rag_mag.components import faiss_index
from rag_mag.data import write_jsonl
from rag_mag.errors import DiskFullError
from rag_mag.ingestion.indexing import IndexJob, run_index_job
from rag_mag.models import REPO_ROOT
from rag_mag.retriever.data.build import write_outputs
from rag_mag.retriever.encoder import MagnitudeEncoder
from rag_mag.retriever.training.checkpoint import missing_parts
from rag_mag.retriever.training.config import TrainConfig
from rag_mag.retriever.training.trainer import Trainer
from tests.tiny import capital_triples, tiny_encoder, tiny_reader_adapter

pytestmark = pytest.mark.faults

COUNT = 300  # passages: their shard files (38 kB of vectors) are many tmpfs pages
TRAIN = dict(steps=8, batch_size=8, learning_rate=1e-3, eval_every=0, log_every=1, save_every=4, val_fraction=0.0,
             warmup_ratio=0.0, calibration_samples=8, precision="fp32")


# ----------------------------------------------------------------------------- a small disk
@pytest.fixture
def small_disk(tmp_path) -> Path:
    """A 2 MB tmpfs, unmounted afterwards."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
                                 capture_output=True, text=True, timeout=30)
        reason = mounted.stderr.strip() or "not permitted" if mounted.returncode else ""
    except OSError as error:  # no mount command
        reason = str(error)
    if reason:
        pytest.skip(f"cannot mount a 2 MB tmpfs here ({reason}; it needs root); the simulated cases of this file "
                    "cover the same paths")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(disk: Path, leave: int) -> Path:
    """Write a ballast file so that about ``leave`` bytes stay free on ``disk``; returns it (delete to free)."""
    ballast = disk / "ballast"
    with open(ballast, "ab") as handle:
        handle.write(b"\0" * max(0, durable.free_bytes(disk) - leave))
    return ballast


def one_error_line(stderr: str, command: str) -> str:
    """The one error line (a progress bar may still be drawn around it), and no traceback."""
    errors = [line for line in stderr.splitlines() if line.startswith(f"rag-mag {command}: error: ")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return errors[0]


def leftovers(folder: Path) -> list[str]:
    """Temporary and staging names rag-mag writes before a rename."""
    return sorted(p.name for p in folder.rglob("*") if p.name.startswith(".") or p.name.endswith(".tmp"))


# ----------------------------------------------------------------------------- inputs
@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("disk")
    checkpoint = tiny_encoder(root / "tok", "qnorm").save(root / "checkpoint")
    corpus = root / "corpus.jsonl"
    write_jsonl(corpus, [{"id": f"p{i}", "title": "t", "text": f"the river {i} of paris in france"}
                         for i in range(COUNT)])
    write_jsonl(root / "train.jsonl", capital_triples())
    return {"root": root, "checkpoint": checkpoint, "corpus": corpus}


def index_job(inputs, out: Path, chunk_size: int = 64) -> IndexJob:
    return IndexJob(corpus=inputs["corpus"], retriever=inputs["checkpoint"], out=out, chunk_size=chunk_size,
                    precision="fp32")


def index_command(inputs, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "rag_mag.cli.main", "index", "--retriever", str(inputs["checkpoint"]),
            "--corpus", str(inputs["corpus"]), "--out", str(out), "--chunk-size", "64", "--precision", "fp32",
            *extra]


# ----------------------------------------------------------------------------- index
def test_chunk_files_on_a_full_disk_are_one_error_not_a_sigbus(inputs, small_disk, fault_case):
    work = small_disk / "index.work"
    ballast = fill(small_disk, 16 * 1024)  # room for plan.json, not for the shard's 38 kB of vectors
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    child = subprocess.run(index_command(inputs, small_disk / "index", "--work-dir", str(work)), cwd=REPO_ROOT,
                           env=env, capture_output=True, text=True, timeout=300)
    assert child.returncode != -signal.SIGBUS
    assert child.returncode == 2, child.stderr[-3000:]
    line = one_error_line(child.stderr, "index")
    assert "not enough disk space" in line and "bytes needed" in line and "bytes free" in line
    assert str(work / "shard-0-of-1") in line
    assert not (work / "shard-0-of-1" / "vectors.f32").exists() and leftovers(small_disk) == []
    ballast.unlink()  # space freed: the same job goes on and builds the whole index
    summary = run_index_job(index_job(inputs, small_disk / "index"), work_dir=work, progress=False)
    assert summary["merged"] and summary["encoding"]["encoded_now"] == COUNT
    faiss_index.verify_folder(small_disk / "index")
    fault_case.clear_error()


def _overwrite_on_a_full_disk(inputs, small_disk, tmp_path, leave: int) -> tuple[Path, str, list[str]]:
    """An index at small/index, then a new one (another plan) refused at the merge on a nearly full disk."""
    out, work = small_disk / "index", tmp_path / "work"  # the chunks on a roomy disk, the index on the small one
    run_index_job(index_job(inputs, out, chunk_size=32), progress=False)
    before = faiss_index.verify_folder(out)
    ballast = fill(small_disk, leave)
    with pytest.raises(DiskFullError) as refused:
        run_index_job(index_job(inputs, out), work_dir=work, overwrite=True, progress=False)
    assert faiss_index.verify_folder(out) == before  # the old index is whole and unchanged
    assert json.loads((work / "shard-0-of-1" / "progress.json").read_text()) == {"rows_done": COUNT}
    assert leftovers(small_disk) == []
    ballast.unlink()
    resumed = run_index_job(index_job(inputs, out), work_dir=work, overwrite=True, progress=False)
    assert resumed["merged"] and resumed["encoding"]["encoded_now"] == 0  # no chunk is encoded again
    return out, str(refused.value), leftovers(small_disk)


def test_an_index_merge_that_cannot_fit_is_refused_and_keeps_the_chunks_and_the_old_index(
        inputs, small_disk, tmp_path, fault_case):
    _, message, left = _overwrite_on_a_full_disk(inputs, small_disk, tmp_path, leave=8 * 1024)
    assert message.startswith(f"not enough disk space for the index {small_disk / 'index'}")
    assert "bytes needed" in message and left == []
    fault_case.clear_error()


def test_a_disk_that_fills_during_the_merge_ends_in_one_error(inputs, small_disk, tmp_path, monkeypatch,
                                                              fault_case):
    # past the estimate (another writer took the space, or the estimate was low): the write itself fails
    monkeypatch.setattr(durable, "ensure_free_space", lambda path, needed, what: None)
    _, message, left = _overwrite_on_a_full_disk(inputs, small_disk, tmp_path, leave=24 * 1024)
    assert message.startswith(f"the disk filled up while writing the index {small_disk / 'index'}")
    assert "\n" not in message and "bytes free" in message and left == []
    fault_case.clear_error()


# ----------------------------------------------------------------------------- checkpoints
def train_config(inputs, out: Path, **overrides) -> TrainConfig:
    return TrainConfig(**{**TRAIN, "train_data": str(inputs["root"] / "train.jsonl"), "out": str(out), **overrides})


@pytest.fixture
def tiny_build(inputs, monkeypatch):
    monkeypatch.setattr(MagnitudeEncoder, "build", classmethod(
        lambda cls, base, strategy, *a, **k: tiny_encoder(inputs["root"] / "tok-train", strategy)))


def _save_on_a_full_disk(inputs, small_disk, leave: int) -> tuple[Path, str]:
    """Train to step 8 saving at 4 and 8; after step 5 the disk is filled, so the step-8 save fails."""
    out = small_disk / "run"
    filled = []
    hook = lambda step, encoder: filled.append(fill(small_disk, leave)) if step == 5 else None  # noqa: E731
    with pytest.raises(DiskFullError) as refused:
        Trainer(train_config(inputs, out), on_step=hook).train()
    state = json.loads((out / "last" / "trainer_state.json").read_text())
    assert state["step"] == 4 and not missing_parts(out / "last")
    assert leftovers(out) == []
    filled[0].unlink()
    result = Trainer(train_config(inputs, out)).train()  # the same command resumes from step 4
    assert result.step == 8 and [r["step"] for r in result.history if "loss" in r] == [5, 6, 7, 8]
    return out, str(refused.value)


def test_a_checkpoint_save_that_cannot_fit_is_refused_and_last_stays(inputs, small_disk, tiny_build, fault_case):
    out, message = _save_on_a_full_disk(inputs, small_disk, leave=64 * 1024)
    assert message.startswith(f"not enough disk space for the checkpoint {out / 'last'}: ")
    assert "bytes needed" in message and "bytes free" in message
    fault_case.clear_error()


def test_a_disk_that_fills_inside_safetensors_ends_in_one_error(inputs, small_disk, tiny_build, monkeypatch,
                                                                fault_case):
    monkeypatch.setattr("rag_mag.retriever.training.checkpoint.checkpoint_bytes", lambda encoder, optimizer: 0)
    out, message = _save_on_a_full_disk(inputs, small_disk, leave=32 * 1024)
    assert message.startswith(f"the disk filled up while writing the checkpoint {out / 'last'}")
    assert "Safetensor" not in message and "\n" not in message
    fault_case.clear_error()


def test_train_on_a_full_disk_prints_one_line(inputs, small_disk, capsys, monkeypatch, fault_case):
    fill(small_disk, 64 * 1024)  # room for the lock and the log, not for a checkpoint
    monkeypatch.setattr(MagnitudeEncoder, "build", classmethod(
        lambda cls, base, strategy, *a, **k: tiny_encoder(inputs["root"] / "tok-cli", strategy)))
    assert main(["train", "--train-data", str(inputs["root"] / "train.jsonl"), "--out", str(small_disk / "run"),
                 "--steps", "4", "--save-every", "4", "--batch-size", "8", "--eval-every", "0",
                 "--val-fraction", "0", "--calibration-samples", "8"]) == 2
    assert "not enough disk space for the checkpoint" in one_error_line(capsys.readouterr().err, "train")
    fault_case.clear_error()


# ----------------------------------------------------------------------------- durable writes
def test_a_durable_write_on_a_full_disk_keeps_the_old_file(small_disk, fault_case):
    target = small_disk / "cells" / "cell.json"
    durable.write_text(target, "old")
    with pytest.raises(DiskFullError, match=r"the disk filled up while writing .*cell\.json: [\d,]+ bytes free"):
        durable.write_text(target, "x" * (3 << 20))  # more than the whole disk
    assert target.read_text() == "old" and leftovers(small_disk) == []
    fault_case.clear_error()


def test_build_data_outputs_on_a_full_disk_keep_the_previous_build(small_disk, fault_case):
    out = small_disk / "train_data"
    write_outputs(out, {"train.jsonl": [{"q": 1}], "val.jsonl": [{"q": 2}]}, {"train": 1, "val": 1})
    before = {p.name: p.read_text() for p in out.iterdir()}
    rows = [{"query": "x" * 1000, "row": i} for i in range(2400)]  # train.jsonl fits, val.jsonl does not
    with pytest.raises(DiskFullError):
        write_outputs(out, {"train.jsonl": rows[:1200], "val.jsonl": rows[1200:]}, {"train": 1200, "val": 1200})
    assert {p.name: p.read_text() for p in out.iterdir()} == before  # not a train.jsonl of one build only
    assert leftovers(small_disk) == []
    fault_case.clear_error()


# ----------------------------------------------------------------------------- simulated (no tmpfs needed)
def test_simulated_enospc_at_allocation_removes_the_new_chunk_file(inputs, tmp_path, monkeypatch, fault_case):
    def full(descriptor, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    work = tmp_path / "work"
    with pytest.raises(DiskFullError, match=r"the disk filled up while writing the vectors of shard 0/1"):
        run_index_job(index_job(inputs, tmp_path / "index"), work_dir=work, progress=False)
    assert not (work / "shard-0-of-1" / "vectors.f32").exists()
    monkeypatch.undo()
    assert run_index_job(index_job(inputs, tmp_path / "index"), work_dir=work, progress=False)["merged"]
    fault_case.clear_error()


def test_allocated_chunk_files_hold_real_blocks(tmp_path, fault_case):
    path = tmp_path / "vectors.f32"
    durable.allocate(path, 1 << 20, "vectors")
    # blocks on disk, not a sparse file: writes through a memory map of it cannot meet a full disk
    assert path.stat().st_size == 1 << 20 and path.stat().st_blocks * 512 >= 1 << 20
    fault_case.survived()


def test_simulated_small_disk_refuses_a_checkpoint_before_writing(tmp_path, monkeypatch, fault_case):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(durable.shutil, "disk_usage", lambda path: usage(10_000, 9_000, 1_000))
    encoder = tiny_encoder(tmp_path / "tok")
    with pytest.raises(DiskFullError, match=rf"{encoder.weight_bytes():,} bytes needed, 1,000 bytes free on the "
                                            rf"filesystem of {tmp_path}"):
        encoder.save(tmp_path / "checkpoint")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok"]  # no staging folder was even made
    fault_case.clear_error()


def test_simulated_enospc_at_fsync_keeps_the_old_file(tmp_path, monkeypatch, fault_case):
    target = tmp_path / "stats.json"
    durable.write_text(target, "old")

    def full(descriptor):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(durable.os, "fsync", full)
    with pytest.raises(DiskFullError, match="stats.json"):
        durable.write_text(target, "new")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["stats.json"]
    fault_case.clear_error()


def _safetensors_enospc(*args, **kwargs):
    """What safetensors raises when the disk fills under it: its own type, the OS text inside."""
    raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")


def test_a_merge_that_meets_a_full_disk_keeps_the_merged_model_before_it(tmp_path, monkeypatch, fault_case):
    from transformers import PreTrainedModel

    from rag_mag.reader.merge import merge_reader, merged_adapter_sha

    base_dir, adapter_dir, _ = tiny_reader_adapter(tmp_path)
    out = tmp_path / "merged"
    merge_reader(adapter_dir, base_dir, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(PreTrainedModel, "save_pretrained", _safetensors_enospc)
    with pytest.raises(DiskFullError, match=rf"the disk filled up while writing the merged model {out}: "):
        merge_reader(adapter_dir, base_dir, out, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and merged_adapter_sha(out) is not None
    assert leftovers(tmp_path) == []  # no staging folder left beside it
    fault_case.clear_error()


def test_a_full_disk_no_writer_named_is_still_one_line(monkeypatch, capsys, fault_case):
    # the last resort in cli/main.py: a library's own wrapper of ENOSPC reaching the command line
    monkeypatch.setattr("rag_mag.serving.llm.readers.prepare_readers", _safetensors_enospc)
    assert main(["serve-llm", "--convert-only"]) == 2
    line = one_error_line(capsys.readouterr().err, "serve-llm")
    assert "the disk filled up (" in line and "No space left on device" in line and "bytes are free" in line
    fault_case.clear_error()
