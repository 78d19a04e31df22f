"""SIGTERM (a scheduler's preemption) in the middle of training, and again during the save it causes.

A child ``rag-mag train`` on the tiny random BERT (8 steps, periodic saves at 4 and 8) sends itself SIGTERM in
step 6. It must finish step 6, save ``last/`` at step 6, say so in one line, and exit 143; the same command
run again resumes at step 6 and ends with the weights of a run never interrupted (the tolerance of
test_fault_checkpoints). A second SIGTERM in the middle of that save (``RAG_MAG_KILL_AT`` with
``RAG_MAG_FAULT_SIGNAL=SIGTERM``) must not cut it short.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from rag_mag import stopping
from rag_mag.bench.datasets import data_root
from rag_mag.models import REPO_ROOT
from rag_mag.retriever.training.checkpoint import missing_parts
from tests.faults.test_fault_checkpoints import SETTINGS, logged_steps, straight, workspace  # noqa: F401

pytestmark = pytest.mark.faults


def train_argv(workspace: Path, out: Path) -> list[str]:  # noqa: F811
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in SETTINGS.items()]
    return ["train", "--train-data", str(workspace / "train.jsonl"), "--out", str(out), *flags]


def run_cli(workspace: Path, out: Path, signal_at_step: int | None = None, kill_at: str = "") -> subprocess.CompletedProcess:  # noqa: F811,E501
    arguments = {"argv": train_argv(workspace, out), "tokenizer_dir": str(workspace / "tok-child"),
                 "signal_at_step": signal_at_step}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "RAG_MAG_KILL_AT": kill_at, "RAG_MAG_FAULT_SIGNAL": "SIGTERM"}
    return subprocess.run([sys.executable, "-m", "tests.faults.children", "cli", json.dumps(arguments)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)


def stop_then_resume(workspace: Path, straight: dict, out: Path, kill_at: str = "") -> None:  # noqa: F811
    stopped = run_cli(workspace, out, signal_at_step=6, kill_at=kill_at)
    assert stopped.returncode == stopping.exit_code(signal.SIGTERM) == 143, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr
    if kill_at:  # the second SIGTERM came in the middle of the save and was held until it was done
        assert "SIGTERM received again: the state is being saved" in stopped.stderr, stopped.stderr[-3000:]
    assert f"rag-mag train: stopped at step 6 of 8 by SIGTERM; saved {out / 'last'}; run the same command again " \
           "to resume" in stopped.stderr, stopped.stderr[-3000:]
    assert json.loads((out / "last" / "trainer_state.json").read_text())["step"] == 6  # not 4: no step lost
    assert missing_parts(out / "last") == [] and logged_steps(out) == list(range(1, 7))
    resumed = run_cli(workspace, out)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming {out / 'last'} from step 6 of 8" in resumed.stderr
    assert logged_steps(out) == list(range(1, 9))  # each step once
    weights = load_file(str(out / "last" / "model.safetensors"))
    assert all(float((weights[name] - straight["weights"][name]).abs().max()) < 1e-4 for name in weights)
    assert [p.name for p in out.iterdir() if p.name.startswith(".last.")] == []


def test_sigterm_between_two_saves_saves_that_step_and_resumes_from_it(workspace, straight, fault_case):  # noqa: F811
    stop_then_resume(workspace, straight, workspace / "sigterm")
    fault_case.survived()


@pytest.mark.parametrize("phase", ["checkpoint:model", "checkpoint:synced"])
def test_a_second_sigterm_during_the_save_does_not_cut_it_short(workspace, straight, phase, fault_case):  # noqa: F811
    # the first save (step 4) is the periodic one; the second is the one the SIGTERM of step 6 asks for
    stop_then_resume(workspace, straight, workspace / f"sigterm-twice-{phase.split(':')[1]}", kill_at=f"{phase}#2")
    fault_case.survived()


def test_the_reader_saves_and_stops_at_the_step_a_signal_came_in(fault_case):
    from types import SimpleNamespace

    from transformers import TrainerControl

    from rag_mag.reader.callbacks import ReaderCallbacks
    from rag_mag.reader.config import ReaderConfig

    owner = SimpleNamespace(config=ReaderConfig(out="unused", eval_every=100, steps=10))
    callbacks = ReaderCallbacks(owner, tokenizer=None, validation=[], run_record={}, bf16=False)
    state = SimpleNamespace(global_step=3, max_steps=10)
    before = {signum: signal.getsignal(signum) for signum in stopping.STOP_SIGNALS}
    with pytest.raises(stopping.Stopped, match="stopped at step 3 of 10 by SIGTERM; saved here"):
        with stopping.graceful():
            control = callbacks.on_step_end(None, state, TrainerControl())
            assert not control.should_save and callbacks.stopped_at is None  # no signal yet: train on
            os.kill(os.getpid(), signal.SIGTERM)  # held by graceful(), not raised in the step
            control = callbacks.on_step_end(None, state, TrainerControl())
            assert control.should_save and control.should_training_stop and callbacks.stopped_at == 3
            raise stopping.stopped(callbacks.stopped_at, 10, "here")
    assert {signum: signal.getsignal(signum) for signum in stopping.STOP_SIGNALS} == before  # the handlers are put back
    fault_case.survived()


def run_reader(out: Path, steps: int, signal_at_step: int | None = None) -> subprocess.CompletedProcess:
    argv = ["train-reader", "--out", str(out), "--retrieval-corpus", "", "--val-questions", "2",
            "--val-max-examples", "2", "--batch-size", "2", "--eval-every", str(steps), "--save-every", "100",
            "--log-every", "1", "--steps", str(steps)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "tests.faults.children", "reader_cli",
                           json.dumps({"argv": argv, "signal_at_step": signal_at_step})],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1200)


@pytest.mark.integration
@pytest.mark.skipif(data_root() is None, reason="needs the shared datasets (../shared/data or RAG_MAG_DATA_ROOT)")
def test_sigterm_to_train_reader_saves_that_step_and_the_resume_ends_where_a_straight_run_does(tmp_path,
                                                                                              fault_case):
    """The real SmolLM2 reader, 3 steps, no periodic save before the end: SIGTERM in step 2 must save step 2
    (nothing else would), exit 143 with one line, and the same command then trains step 3 only and ends with
    the weights of a run that was never stopped."""
    uninterrupted = run_reader(tmp_path / "straight", 3)
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]
    out = tmp_path / "stopped"
    stopped = run_reader(out, 3, signal_at_step=2)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr
    assert f"rag-mag train-reader: stopped at step 2 of 3 by SIGTERM; saved {out / 'last'}; run the same " \
           "command again to resume" in stopped.stderr, stopped.stderr[-3000:]
    assert json.loads((out / "last" / "trainer_state.json").read_text())["global_step"] == 2
    resumed = run_reader(out, 3)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming at step 2" in resumed.stderr, resumed.stderr[-3000:]
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [record["step"] for record in log if "loss" in record] == [1, 2, 3]  # each step once
    ours = load_file(str(out / "last" / "adapter_model.safetensors"))
    theirs = load_file(str(tmp_path / "straight" / "last" / "adapter_model.safetensors"))
    assert ours.keys() == theirs.keys() and ours
    assert max(float((ours[name] - theirs[name]).abs().max()) for name in ours) < 1e-4
    fault_case.survived()
