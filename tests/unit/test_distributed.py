"""Training on 2 real gloo processes equals training on one process with the combined batch.

Each rank is a subprocess (``tests/distributed_child.py``) with torchrun's environment; nothing is mocked but
the encoder, which is the tiny random BERT with dropout off (N processes cannot draw one process's masks).
A hung process group fails the test through the subprocess timeout instead of hanging the suite.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rag_mag.data import write_jsonl
from rag_mag.retriever.encoder import MagnitudeEncoder
from rag_mag.retriever.training.config import TrainConfig
from rag_mag.retriever.training.distributed import shard_bounds
from rag_mag.retriever.training.trainer import Trainer
from tests.distributed_child import gradient_recorder, tiny_build

ROOT = Path(__file__).resolve().parents[2]
TOPICS = [("paris", "france"), ("london", "england"), ("berlin", "germany"), ("rome", "italy")]
CHILD_TIMEOUT_S = 300


def triples():
    """24 queries; every fourth shares its positive's text (false negatives to mask); hard negative pools
    of 1 or 2, so the ranks hold different numbers of documents."""
    rows = []
    for i, (city, country) in enumerate(TOPICS * 6):
        negatives = [{"id": f"n{i}-{k}", "title": TOPICS[(i + k + 1) % 4][0],
                      "text": f"{TOPICS[(i + k + 1) % 4][0]} is a city in {TOPICS[(i + k + 1) % 4][1]}"}
                     for k in range(1 + i % 2)]
        rows.append({"id": f"q{i}", "query": f"what is the capital of {country} {i % 6}",
                     "positives": [{"id": f"p{i}", "title": city, "text": f"{city} is the capital of {country}"}],
                     "hard_negatives": negatives})
    return rows


def settings(tmp_path: Path, out: str, **overrides) -> dict:
    # batch 7 over 2 processes: shards of 3 and 4 queries; learnable: the degrees are trained too
    values = dict(train_data=str(tmp_path / "train.jsonl"), out=str(tmp_path / out), strategy="learnable",
                  steps=3, batch_size=7, hard_negatives=2, learning_rate=1e-3, warmup_ratio=0.0, eval_every=2,
                  log_every=1, save_every=2, val_fraction=0.2, calibration_samples=8, precision="fp32",
                  device="cpu", threads=1)
    values.update(overrides)
    return values


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_processes(world_size: int, args: dict, rank_env: dict[int, dict] | None = None) -> list:
    """Start ``world_size`` ranks as torchrun would (``rank_env``: extra variables for some ranks)."""
    port = free_port()
    children = []
    for rank in range(world_size):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world_size),
               "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(rank_env or {}).get(rank, {})}
        children.append(subprocess.Popen([sys.executable, "-m", "tests.distributed_child", json.dumps(args)],
                                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True))
    return children


def finish(children: list, timeout: float = CHILD_TIMEOUT_S) -> list[tuple[int, str]]:
    """(return code, output) of every rank; all are killed if one is still running after ``timeout``."""
    results = []
    try:
        for child in children:
            output = child.communicate(timeout=timeout)[0]
            results.append((child.returncode, output))
    except subprocess.TimeoutExpired:
        for child in children:
            child.kill()
            child.communicate()
        pytest.fail(f"{len(children)} training processes did not finish in {timeout} s (hung group?)")
    return results


def run_processes(world_size: int, args: dict) -> None:
    for rank, (code, output) in enumerate(finish(start_processes(world_size, args))):
        assert code == 0, f"rank {rank} failed:\n{output[-4000:]}"


def log_records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def assert_same_tensors(ours: dict, theirs: dict, rtol: float, atol: float) -> None:
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


@pytest.fixture
def data(tmp_path, monkeypatch):
    write_jsonl(tmp_path / "train.jsonl", triples())
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)  # the in-process reference runs alone
    monkeypatch.setattr(MagnitudeEncoder, "build", tiny_build(tmp_path / "tok", dropout=0.0))
    return tmp_path


def test_shards_are_contiguous_and_cover_the_batch():
    assert shard_bounds(7, 2) == [(0, 3), (3, 7)]
    assert shard_bounds(8, 3) == [(0, 2), (2, 5), (5, 8)]


def test_two_processes_train_like_one_with_the_combined_batch_and_resume_with_one(data):
    run_processes(2, {**settings(data, "two"), "tokenizer_dir": str(data / "tok"), "record_gradients": True})
    Trainer(TrainConfig(**settings(data, "one")), on_step=gradient_recorder(data / "one" / "gradients")).train()

    # the same loss, accuracy, norms and gradient norm at every step, and the same validation
    two_log, one_log = log_records(data / "two"), log_records(data / "one")
    assert [r["step"] for r in two_log] == [r["step"] for r in one_log] == [0, 1, 2, 2, 3, 3]
    for ours, theirs in zip(two_log, one_log, strict=True):
        for key in ("loss", "accuracy", "grad_norm", "query_norm_mean", "document_norm_cv", "g_query"):
            if key in theirs:
                assert ours[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), (ours["step"], key)
        if "validation" in theirs:
            assert ours["validation"] == pytest.approx(theirs["validation"], abs=1e-6)
    # the same averaged gradient of every parameter, the degrees' logits included
    for step in (1, 2, 3):
        assert_same_tensors(load_file(str(data / "two" / "gradients" / f"step-{step}.safetensors")),
                            load_file(str(data / "one" / "gradients" / f"step-{step}.safetensors")),
                            rtol=1e-4, atol=1e-6)
    # rank 0 wrote one checkpoint that records the world size and both ranks' generators
    state = json.loads((data / "two" / "last" / "trainer_state.json").read_text())
    assert state["step"] == 3 and state["world_size"] == 2
    assert {"rng.torch", "rng.torch.1"} <= set(load_file(str(data / "two" / "last" / "optimizer.safetensors")))
    two_weights = load_file(str(data / "two" / "last" / "model.safetensors"))
    assert_same_tensors(two_weights, load_file(str(data / "one" / "last" / "model.safetensors")),
                        rtol=1e-4, atol=1e-5)

    # one process resumes the 2-process checkpoint and continues the same global schedule: steps 4 and 5
    # equal those of the single-process run resumed from its own checkpoint
    resumed_two = Trainer(TrainConfig(**settings(data, "two", steps=5))).train()
    resumed_one = Trainer(TrainConfig(**settings(data, "one", steps=5))).train()
    losses = [[r["loss"] for r in result.history if "loss" in r] for result in (resumed_two, resumed_one)]
    assert len(losses[0]) == 2 and losses[0] == pytest.approx(losses[1], rel=1e-4)
    assert_same_tensors(load_file(str(data / "two" / "last" / "model.safetensors")),
                        load_file(str(data / "one" / "last" / "model.safetensors")), rtol=1e-4, atol=1e-5)


def test_two_processes_resume_their_own_checkpoint_with_the_same_dropout_masks(data):
    """Dropout on: each rank's generator is saved and restored, so a killed and resumed 2-process run ends
    with the weights of the run that was never stopped."""
    args = {**settings(data, "straight", steps=4, val_fraction=0.0, eval_every=0), "tokenizer_dir": str(data / "tok"),
            "dropout": 0.1}
    run_processes(2, args)
    args["out"] = str(data / "killed")
    children = start_processes(2, args, rank_env={0: {"RAG_MAG_KILL_AT": "checkpoint:done"}})  # after step 2
    code, output = finish(children[:1])[0]
    assert code == -9, output[-4000:]
    children[1].kill()  # waiting for rank 0 at the barrier after the save, or failed when it vanished
    children[1].communicate()
    assert json.loads((data / "killed" / "last" / "trainer_state.json").read_text())["step"] == 2
    run_processes(2, args)
    assert_same_tensors(load_file(str(data / "killed" / "last" / "model.safetensors")),
                        load_file(str(data / "straight" / "last" / "model.safetensors")), rtol=1e-5, atol=1e-6)


def test_a_sigterm_to_one_rank_stops_every_rank_at_the_same_saved_step(data):
    """A scheduler's SIGTERM may reach one process of a torchrun job first: rank 1 gets it in step 2, the ranks
    agree to stop after that step, rank 0 saves step 2 (though it got no signal), every rank exits 143, and the
    2-process resume ends with the weights of a run that was never stopped."""
    args = {**settings(data, "straight", steps=4, val_fraction=0.0, eval_every=0, save_every=100),
            "tokenizer_dir": str(data / "tok"), "dropout": 0.1}
    run_processes(2, args)
    args["out"] = str(data / "stopped")
    results = finish(start_processes(2, args, rank_env={1: {"RAG_MAG_TEST_SIGTERM_AT_STEP": "2"}}))
    for rank, (code, output) in enumerate(results):
        assert code == 143, f"rank {rank}:\n{output[-4000:]}"
        assert f"STOPPED stopped at step 2 of 4 by SIGTERM; saved {data / 'stopped' / 'last'}" in output, output[-4000:]
    assert json.loads((data / "stopped" / "last" / "trainer_state.json").read_text())["step"] == 2
    assert [r["step"] for r in log_records(data / "stopped") if "loss" in r] == [1, 2]
    run_processes(2, args)
    assert [r["step"] for r in log_records(data / "stopped") if "loss" in r] == [1, 2, 3, 4]
    assert_same_tensors(load_file(str(data / "stopped" / "last" / "model.safetensors")),
                        load_file(str(data / "straight" / "last" / "model.safetensors")), rtol=1e-5, atol=1e-6)
