"""Two runs into one folder: every writer command takes its output's lock before any model loads, and a
second writer is refused at once with one line naming the folder and the holder's PID and command line.

The first writer is a child process that holds the lock exactly as the command would (``durable.job_lock``
on the same path) until the test tells it to finish; the second is the real command, in this process (and
once as a real ``rag-mag`` process). A lock whose holder was killed is no lock.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rag_mag import durable
from rag_mag.cli.main import main
from rag_mag.data import write_jsonl
from rag_mag.models import REPO_ROOT
from rag_mag.retriever.encoder import MagnitudeEncoder
from tests.tiny import capital_triples, tiny_encoder

pytestmark = pytest.mark.faults

REFUSED_WITHIN_S = 15
HOLDER = """
import sys
from rag_mag import durable
with durable.job_lock(sys.argv[1], "the test's output"):
    print("locked", flush=True)
    sys.stdin.readline()  # hold until the test says so
"""


class Holder:
    """A child process holding the lock file ``path`` until ``finish()``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.process = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), "--pretend", "training"],
                                        cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout.readline().strip() == "locked"

    @property
    def pid(self) -> int:
        return self.process.pid

    def finish(self) -> int:
        self.process.stdin.write("done\n")
        self.process.stdin.flush()
        return self.process.wait(timeout=30)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("locks")
    checkpoint = tiny_encoder(root / "tok", "qnorm").save(root / "checkpoint")
    write_jsonl(root / "train.jsonl", capital_triples())
    corpus = root / "corpus.jsonl"
    write_jsonl(corpus, [{"id": f"p{i}", "title": "t", "text": f"paris is the capital of france {i}"}
                         for i in range(6)])
    write_jsonl(root / "pairs.jsonl", [{"question": "capital of france", "answers": ["paris"]}])
    (root / "spec.yaml").write_text(f"out: {root / 'data'}\nsources: [{{name: t, kind: triples, path: "
                                    f"{root / 'train.jsonl'}}}]\n")
    (root / "bench.yaml").write_text("name: lock-test\ndatasets: [trivia_qa]\n")
    return {"root": root, "checkpoint": checkpoint, "corpus": corpus}


def command(name: str, inputs: dict[str, Path], out: Path) -> tuple[list[str], Path]:
    """The arguments of writer command ``name`` writing to ``out``, and the lock file it must take."""
    root = inputs["root"]
    arguments = {
        "train": (["--train-data", str(root / "train.jsonl"), "--out", str(out)], durable.lock_path(out)),
        "index": (["--retriever", str(inputs["checkpoint"]), "--corpus", str(inputs["corpus"]), "--out", str(out)],
                  out.with_name(out.name + ".work") / "shard-0-of-1.lock"),
        "build-data": ([str(root / "spec.yaml"), "--out", str(out)], durable.lock_path(out)),
        "export-index": ([str(root / "no-index"), "--qdrant", str(out)], durable.lock_path(out)),
        "mine": (["--pairs", str(root / "pairs.jsonl"), "--corpus", str(inputs["corpus"]), "--out", str(out)],
                 durable.lock_path(out)),
        "encode": (["--retriever", str(inputs["checkpoint"]), "--text", "paris", "--out", str(out) + ".npz"],
                   durable.lock_path(Path(str(out) + ".npz"))),
        "bench": ([str(root / "bench.yaml"), "--output-dir", str(out)], durable.lock_path(out)),
        "train-reader": (["--out", str(out)], durable.lock_path(out)),
        "synth": ([str(root), "--out", str(out)], durable.lock_path(out)),
        "adapt": ([str(root), "--out", str(out)], durable.lock_path(out)),
    }[name]
    return [name, *arguments[0]], arguments[1]


@pytest.fixture
def no_model_loads(monkeypatch):
    """A refused writer must not get as far as loading a model (or training, or building data)."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded although the output is locked")

    monkeypatch.setattr(MagnitudeEncoder, "load", classmethod(refuse))
    monkeypatch.setattr(MagnitudeEncoder, "build", classmethod(refuse))
    monkeypatch.setattr("rag_mag.retriever.training.trainer.Trainer.train", refuse)
    monkeypatch.setattr("rag_mag.retriever.data.build.build_training_data", refuse)
    monkeypatch.setattr("rag_mag.reader.trainer.ReaderTrainer.train", refuse)
    monkeypatch.setattr("rag_mag.serving.llm.gguf_convert.convert_gguf", refuse)


def refused_line(err: str, name: str) -> str:
    lines = err.strip().splitlines()
    assert "Traceback" not in err and lines, err
    assert lines[-1].startswith(f"rag-mag {name}: error: "), err
    return lines[-1]


@pytest.mark.parametrize("name", ["train", "index", "build-data", "export-index", "mine", "encode", "bench",
                                  "train-reader", "synth", "adapt"])
def test_a_second_writer_is_refused_at_once_and_the_first_completes(inputs, tmp_path, capsys, no_model_loads,
                                                                    name, fault_case):
    out = tmp_path / "out"
    arguments, lock = command(name, inputs, out)
    holder = Holder(lock)
    started = time.monotonic()
    assert main(arguments) == 2
    assert time.monotonic() - started < REFUSED_WITHIN_S
    line = refused_line(capsys.readouterr().err, name)
    assert f"process {holder.pid} " in line and "--pretend training" in line and str(lock) in line, line
    assert not out.exists() and not Path(str(out) + ".npz").exists()  # the refused run wrote nothing
    assert holder.finish() == 0  # the first writer was not disturbed
    assert not lock.exists()  # and let go of its lock as it finished
    fault_case.clear_error()


def test_a_real_rag_mag_process_is_refused_within_seconds(inputs, tmp_path, fault_case):
    arguments, lock = command("index", inputs, tmp_path / "index")
    executable = str(Path(sys.executable).with_name("rag-mag"))
    # the CLI's own start-up on this machine (imports, no model), measured first: a busy machine slows both
    started = time.monotonic()
    subprocess.run([executable, "index", "--help"], cwd=REPO_ROOT, capture_output=True, timeout=300, check=True)
    start_up = time.monotonic() - started
    holder = Holder(lock)
    started = time.monotonic()
    second = subprocess.run([executable, *arguments], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    refused_after = time.monotonic() - started
    assert second.returncode == 2 and refused_after < start_up + REFUSED_WITHIN_S, \
        (start_up, refused_after, second.stderr[-2000:])
    assert f"process {holder.pid} " in refused_line(second.stderr, "index")
    assert holder.finish() == 0
    fault_case.clear_error()


def test_other_shards_of_one_index_run_beside_a_held_one(inputs, tmp_path, capsys, fault_case):
    out = tmp_path / "index"
    arguments, _ = command("index", inputs, out)
    holder = Holder(out.with_name("index.work") / "shard-0-of-2.lock")
    assert main([*arguments, "--shard", "1/2"]) == 0  # encodes its own half, waits for shard 0 to merge
    assert json.loads(capsys.readouterr().out)["waiting_for_shards"] == [0]
    assert main([*arguments, "--shard", "0/2"]) == 2
    assert f"process {holder.pid} " in refused_line(capsys.readouterr().err, "index")
    assert holder.finish() == 0
    assert main([*arguments, "--shard", "0/2"]) == 0 and (out / "manifest.json").is_file()  # now it merges
    fault_case.survived()


def test_a_lock_left_by_a_killed_writer_is_no_lock(inputs, tmp_path, capsys, fault_case):
    out = tmp_path / "vectors"
    arguments, lock = command("encode", inputs, out)
    Holder(lock).kill()
    assert lock.exists()  # the killed holder could not clean up; its flock died with it
    assert main(arguments) == 0
    assert json.loads(capsys.readouterr().out)["count"] == 1 and not lock.exists()
    fault_case.survived()


@pytest.mark.parametrize("rank, refused", [("0", True), ("1", False)])
def test_under_torchrun_rank_zero_alone_holds_the_training_lock(inputs, tmp_path, capsys, monkeypatch, rank,
                                                                refused, fault_case):
    arguments, lock = command("train", inputs, tmp_path / "run")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setattr("rag_mag.cli.train._train", lambda config: 0)  # what the rank would train
    holder = Holder(lock)
    assert main(arguments) == (2 if refused else 0)
    assert (f"process {holder.pid} " in capsys.readouterr().err) == refused
    assert holder.finish() == 0
    fault_case.clear_error() if refused else fault_case.survived()
