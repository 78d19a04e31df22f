"""kill -9 in every phase of a checkpoint save, damaged last/ folders, and what a rerun makes of them.

A child process trains the tiny random BERT for 8 steps, saving at steps 4 and 8, and SIGKILLs itself at a
chosen point of the second save (``RAG_MAG_KILL_AT``). The same command run again must resume from the last
completed save, finish, and end with the same weights, log and loss as a run that was never interrupted.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from rag_mag.data import write_jsonl
from rag_mag.errors import CheckpointError
from rag_mag.models import REPO_ROOT
from rag_mag.retriever.encoder import MagnitudeEncoder
from rag_mag.retriever.training.config import TrainConfig
from rag_mag.retriever.training.trainer import Trainer
from tests.tiny import capital_triples, tiny_encoder

pytestmark = pytest.mark.faults

SETTINGS = dict(steps=8, batch_size=8, learning_rate=1e-3, eval_every=0, log_every=1, save_every=4,
                val_fraction=0.0, warmup_ratio=0.0, calibration_samples=8,
                precision="fp32")  # exact replay: bf16 kernels differ between thread counts
# Every point of checkpoint.save_last; "moved-aside" exists only on the two-rename fallback of the folder swap.
PHASES = ["checkpoint:staging", "checkpoint:model", "checkpoint:optimizer", "checkpoint:state", "checkpoint:synced",
          "checkpoint:swapped", "checkpoint:done", "checkpoint:moved-aside"]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("checkpoint-faults")
    write_jsonl(root / "train.jsonl", capital_triples())
    return root


@pytest.fixture
def tiny_build(workspace, monkeypatch):
    monkeypatch.setattr(MagnitudeEncoder, "build", classmethod(
        lambda cls, base, strategy, *a, **k: tiny_encoder(workspace / "tok", strategy)))


def config(workspace: Path, out: Path, **overrides) -> TrainConfig:
    return TrainConfig(**{**SETTINGS, "train_data": str(workspace / "train.jsonl"), "out": str(out), **overrides})


def logged_steps(out: Path) -> list[int]:
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    return [record["step"] for record in records if "loss" in record]


@pytest.fixture(scope="module")
def straight(workspace) -> dict:
    """The uninterrupted run every killed-and-resumed one must reproduce."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MagnitudeEncoder, "build", classmethod(
            lambda cls, base, strategy, *a, **k: tiny_encoder(workspace / "tok", strategy)))
        result = Trainer(config(workspace, workspace / "straight")).train()
    return {"loss": [r["loss"] for r in result.history if "loss" in r],
            "weights": load_file(str(workspace / "straight" / "last" / "model.safetensors"))}


def run_child(workspace: Path, out: Path, kill_at: str, no_exchange: bool = False) -> subprocess.CompletedProcess:
    arguments = {**SETTINGS, "train_data": str(workspace / "train.jsonl"), "out": str(out),
                 "tokenizer_dir": str(workspace / "tok-child")}
    env = {**os.environ, "RAG_MAG_KILL_AT": kill_at, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    if no_exchange:
        env["RAG_MAG_TEST_NO_EXCHANGE"] = "1"
    return subprocess.run([sys.executable, "-m", "tests.faults.children", "train", json.dumps(arguments)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("phase", PHASES)
def test_kill_in_every_phase_of_a_save_loses_nothing(workspace, straight, tiny_build, phase, fault_case):
    out = workspace / f"killed-{phase.replace(':', '-')}"
    # the second save (step 8): the swap points are passed only when a previous last/ exists, so once
    nth = 1 if phase.endswith(("swapped", "moved-aside")) else 2
    child = run_child(workspace, out, f"{phase}#{nth}", no_exchange=phase.endswith("moved-aside"))
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    state_file = out / "last" / "trainer_state.json"
    committed = json.loads(state_file.read_text())["step"] if state_file.is_file() else None
    resumed = Trainer(config(workspace, out)).train()  # the same command again
    assert resumed.step == 8
    if committed is not None:
        assert committed in (4, 8)  # the kill never leaves a half-written last/ in place
    # nothing lost and nothing twice: each step logged once, in order, and the same run as without the kill
    assert logged_steps(out) == list(range(1, 9))
    assert [r["loss"] for r in resumed.history if "loss" in r] == pytest.approx(straight["loss"][8 - len(
        [r for r in resumed.history if "loss" in r]):], rel=1e-3)
    weights = load_file(str(out / "last" / "model.safetensors"))
    assert all(float((weights[name] - straight["weights"][name]).abs().max()) < 1e-4 for name in weights)
    assert [p.name for p in out.iterdir() if p.name.startswith(".last.")] == []  # leftovers cleaned
    fault_case.survived()


def _trained(workspace: Path, name: str) -> Path:
    """A copy of the straight run (steps 1-8, last/ at step 8) to damage."""
    out = workspace / name
    shutil.copytree(workspace / "straight", out)
    return out


@pytest.mark.parametrize("damage, missing", [
    (lambda last: (last / "trainer_state.json").unlink(), "trainer_state.json"),
    (lambda last: (last / "optimizer.safetensors").unlink(), "optimizer.safetensors"),
    (lambda last: (last / "model.safetensors").write_bytes((last / "model.safetensors").read_bytes()[:1000]),
     "model.safetensors"),
    (lambda last: (last / "trainer_state.json").write_text("{\"step\": "), "unreadable"),
    (lambda last: [path.unlink() for path in last.iterdir() if path.name != "rag_mag.json"], "trainer_state.json"),
])
def test_an_incomplete_last_is_refused_not_restarted(workspace, straight, tiny_build, damage, missing, fault_case):
    out = _trained(workspace, f"damaged-{missing.split('.')[0]}-{len(list(workspace.iterdir()))}")
    damage(out / "last")
    before = sorted((path.name, path.stat().st_size) for path in (out / "last").iterdir())
    log_before = (out / "train_log.jsonl").read_text()
    with pytest.raises(CheckpointError, match=f"incomplete.*{missing}.*--no-resume"):
        Trainer(config(workspace, out)).train()
    assert sorted((path.name, path.stat().st_size) for path in (out / "last").iterdir()) == before
    assert (out / "train_log.jsonl").read_text() == log_before  # the log of steps 1-8 is kept
    fault_case.clear_error()


def test_a_moved_aside_checkpoint_is_restored(workspace, straight, tiny_build, fault_case):
    out = _trained(workspace, "moved-aside")
    (out / "last").rename(out / ".last.old")  # a kill between the two renames of the fallback swap
    result = Trainer(config(workspace, out, steps=10)).train()
    assert [r["step"] for r in result.history if "loss" in r] == [9, 10]
    assert logged_steps(out) == list(range(1, 11)) and not (out / ".last.old").exists()
    fault_case.survived()


def test_staging_leftovers_are_removed_and_the_run_resumes(workspace, straight, tiny_build, fault_case):
    out = _trained(workspace, "staging-leftover")
    (out / ".last.staging-abc123").mkdir()
    (out / ".last.staging-abc123" / "model.safetensors").write_bytes(b"half")
    (out / ".last.x1y2z3w4").mkdir()  # the staging name of older rag-mag versions
    result = Trainer(config(workspace, out, steps=9)).train()
    assert [r["step"] for r in result.history if "loss" in r] == [9]
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []
    fault_case.survived()


def test_a_log_line_torn_by_a_kill_is_dropped(workspace, straight, tiny_build, fault_case):
    out = _trained(workspace, "torn-log")
    with open(out / "train_log.jsonl", "a") as handle:
        handle.write('{"loss": 0.5, "step": 9, "accu')  # killed in the middle of logging step 9
    Trainer(config(workspace, out, steps=10)).train()
    assert logged_steps(out) == list(range(1, 11))
    fault_case.survived()


def test_no_resume_starts_over_with_a_fresh_log(workspace, straight, tiny_build, fault_case):
    out = _trained(workspace, "no-resume")
    result = Trainer(config(workspace, out, steps=4, resume=False)).train()
    assert [r["step"] for r in result.history if "loss" in r] == [1, 2, 3, 4]
    assert logged_steps(out) == [1, 2, 3, 4]
    assert json.loads((out / "last" / "trainer_state.json").read_text())["step"] == 4
    fault_case.survived()
