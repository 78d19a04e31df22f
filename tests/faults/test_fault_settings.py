"""Changed settings on resume, bad training/mining settings from files and flags, and bad abstention settings of
`rag-mag ask` and `run`: one clear error each."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rag_mag.cli.main import main
from rag_mag.data import write_jsonl
from rag_mag.errors import CheckpointError
from rag_mag.retriever.encoder import MagnitudeEncoder
from rag_mag.retriever.training.config import TrainConfig
from rag_mag.retriever.training.trainer import Trainer
from rag_mag.serving.pipelines import PIPELINES_DIR
from tests.faults.test_fault_checkpoints import SETTINGS
from tests.tiny import capital_triples, tiny_encoder

pytestmark = pytest.mark.faults


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 4-step run (last/ at step 4) that each case copies."""
    root = tmp_path_factory.mktemp("settings-faults")
    write_jsonl(root / "train.jsonl", capital_triples())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MagnitudeEncoder, "build", classmethod(
            lambda cls, base, strategy, *a, **k: tiny_encoder(root / "tok", strategy)))
        Trainer(TrainConfig(**{**SETTINGS, "steps": 4, "train_data": str(root / "train.jsonl"),
                               "out": str(root / "run")})).train()
    return root


@pytest.fixture
def run_copy(finished, tmp_path, monkeypatch):
    monkeypatch.setattr(MagnitudeEncoder, "build", classmethod(
        lambda cls, base, strategy, *a, **k: tiny_encoder(tmp_path / "tok", strategy)))
    shutil.copytree(finished / "run", tmp_path / "run")
    shutil.copy(finished / "train.jsonl", tmp_path / "train.jsonl")

    def make(**overrides) -> TrainConfig:
        values = {**SETTINGS, "steps": 6, "train_data": str(tmp_path / "train.jsonl"), "out": str(tmp_path / "run")}
        return TrainConfig(**{**values, **overrides})

    return make


def other_data(path: Path) -> str:
    rows = capital_triples()
    rows[0]["query"] = "a different question"
    write_jsonl(path, rows)
    return str(path)


@pytest.mark.parametrize("change, named", [
    ({"learning_rate": 2e-3}, "learning_rate"),
    ({"pooling": "cls"}, "pooling"),
    ({"strategy": "dot"}, "strategy"),
    ({"base_model": "sentence-transformers/all-mpnet-base-v2"}, "base_model"),
    ({"batch_size": 4}, "batch_size"),
    ({"temperature": 0.1}, "temperature"),
    ({"seed": 1}, "seed"),
    ({"hard_negatives": 0}, "hard_negatives"),
    ({"calibrate_norms": False}, "calibrate_norms"),
    ("same path, other contents", "train_data: the file's contents differ"),
    ("other path, other contents", "train_data: the file's contents differ"),
])
def test_resume_with_changed_settings_is_refused(run_copy, tmp_path, change, named, fault_case):
    if change == "same path, other contents":
        change = {"train_data": other_data(tmp_path / "train.jsonl")}
    elif change == "other path, other contents":
        change = {"train_data": other_data(tmp_path / "elsewhere.jsonl")}
    before = (tmp_path / "run" / "last" / "trainer_state.json").read_text()
    with pytest.raises(CheckpointError, match=named) as error:
        Trainer(run_copy(**change)).train()
    assert "--resume-anyway" in str(error.value) and "--no-resume" in str(error.value)
    assert (tmp_path / "run" / "last" / "trainer_state.json").read_text() == before
    fault_case.clear_error()


def test_the_same_data_under_another_path_resumes(run_copy, tmp_path, fault_case):
    shutil.copy(tmp_path / "train.jsonl", tmp_path / "moved.jsonl")
    result = Trainer(run_copy(train_data=str(tmp_path / "moved.jsonl"))).train()
    assert [r["step"] for r in result.history if "loss" in r] == [5, 6]
    fault_case.survived()


def test_resume_anyway_keeps_the_checkpoints_model_and_says_so(run_copy, tmp_path, caplog, fault_case):
    with caplog.at_level("WARNING"):
        result = Trainer(run_copy(pooling="cls", learning_rate=2e-3, resume_anyway=True)).train()
    assert [r["step"] for r in result.history if "loss" in r] == [5, 6]
    assert "pooling='mean' in the checkpoint" in caplog.text
    state = json.loads((tmp_path / "run" / "last" / "trainer_state.json").read_text())
    assert state["config"]["pooling"] == "mean" and state["config"]["learning_rate"] == 2e-3  # what really ran
    assert json.loads((tmp_path / "run" / "last" / "rag_mag.json").read_text())["pooling"] == "mean"
    fault_case.survived()


def test_changed_settings_from_the_cli_are_one_line(run_copy, tmp_path, capsys, fault_case):
    code = main(["train", "--train-data", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "run"),
                 "--learning-rate", "0.5", "--steps", "6", "--batch-size", "8", "--log-every", "1",
                 "--save-every", "4", "--eval-every", "0", "--val-fraction", "0", "--warmup-ratio", "0",
                 "--calibration-samples", "8"])
    err = capsys.readouterr().err
    assert code == 2 and "learning_rate=0.001 in the checkpoint, 0.5 now" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    fault_case.clear_error()


# ------------------------------------------------------------------------------ config values
@pytest.mark.parametrize("text, message", [
    ("steps: 2.5", "steps must be a whole number, got 2.5"),
    ("steps: abc", "steps must be a whole number, got 'abc'"),
    ("batch_size: 2.5", "batch_size must be a whole number, got 2.5"),
    ("steps: true", "steps must be a whole number, got True"),
    ("learning_rate: fast", "learning_rate must be a number, got 'fast'"),
    ("temperature: .nan", "temperature must be a finite number"),
    ("calibrate_norms: maybe", "calibrate_norms must be true or false"),
    ("val_fraction: 1.5", "val_fraction must be in"),
    ("hard_negatives: -1", "hard_negatives must be 0 or more"),
    ("pooling: 3", "pooling must be text"),
])
def test_bad_config_file_values_are_one_clear_line(tmp_path, capsys, text, message, fault_case):
    (tmp_path / "c.yaml").write_text(text + "\n")
    code = main(["train", "--config", str(tmp_path / "c.yaml"), "--train-data", "x.jsonl", "--out",
                 str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # nothing ran
    fault_case.clear_error()


@pytest.mark.parametrize("argv, message", [
    (["train", "--steps", "2.5"], "invalid int value: '2.5'"),
    (["mine", "--pairs", "p", "--corpus", "c", "--out", "o", "--limit", "-4"], "at least 0, got -4"),
    (["mine", "--pairs", "p", "--corpus", "c", "--out", "o", "--top-k", "-3"], "at least 1, got -3"),
    (["mine", "--pairs", "p", "--corpus", "c", "--out", "o", "--max-positives", "0"], "at least 1, got 0"),
    (["mine", "--pairs", "p", "--corpus", "c", "--out", "o", "--hard-negatives", "x"], "whole number, got 'x'"),
    (["ask", "q", "--abstain", "bogus"], "argument --abstain: invalid choice: 'bogus'"),
    (["ask", "q", "--min-score", "nan"], "argument --min-score: expected a finite number, got nan"),
    (["ask", "q", "--min-score=-inf"], "argument --min-score: expected a finite number, got -inf"),
    (["ask", "q", "--min-score", "high"], "argument --min-score: expected a number, got 'high'"),
])
def test_bad_flags_are_refused_before_anything_runs(capsys, argv, message, fault_case):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and "Traceback" not in err
    assert [line for line in err.splitlines() if "error:" in line] == [err.strip().splitlines()[-1]]  # one line
    fault_case.clear_error()


# ------------------------------------------------------------------------------ abstention settings
@pytest.mark.parametrize("override, message", [("abstain=bogus", "abstain must be one of auto, off, got 'bogus'"),
                                               ("min_score=.nan", "min_score must be a finite number or null"),
                                               ("answer_builder.min_score=high", "got 'high'")])
def test_bad_abstention_settings_of_a_pipeline_are_one_line(capsys, override, message, fault_case):
    code = main(["run", str(PIPELINES_DIR / "rag.yaml"), "--no-preflight", "--set", override, "--input",
                 json.dumps({"question": "Who wrote Hamlet?"})])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "answer_builder" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    fault_case.clear_error()


def test_abstention_flags_for_a_pipeline_without_them_are_one_line(tmp_path, capsys, fault_case):
    import yaml

    data = yaml.safe_load((PIPELINES_DIR / "rag.yaml").read_text())
    for name in ("abstain", "min_score"):
        del data["metadata"]["rag_mag"]["parameters"][name]
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(data))
    for flags, named in ((["--abstain", "off"], "--abstain"), (["--min-score", "0.3"], "--min-score")):
        code = main(["ask", "Who wrote Hamlet?", "--pipeline", str(tmp_path / "mine.yaml"), *flags])
        err = capsys.readouterr().err
        assert code == 2 and f"{named} needs a pipeline that declares the short name" in err, err
        assert "mine.yaml" in err and "--set COMPONENT." in err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    fault_case.clear_error()


@pytest.mark.parametrize("values, message", [({"top_k": -3}, "top_k must be at least 1, got -3"),
                                             ({"hard_negatives": 2.5}, "hard_negatives must be a whole number")])
def test_bad_mine_settings_of_a_benchmark_config_are_refused(values, message, fault_case):
    from rag_mag.bench.config import MineConfig
    from rag_mag.errors import ConfigError
    from rag_mag.retriever.training.config import make_config

    with pytest.raises(ConfigError, match=message):
        make_config(MineConfig, values, source="mine config")
    fault_case.clear_error()


# ------------------------------------------------------------------------------ index tables
@pytest.mark.parametrize("store, message", [
    (["--store", "pgvector"], "bad table name ''"),
    ([], "--table and --pg-url are for --store pgvector"),
])
def test_an_empty_table_name_is_refused_not_the_default_table(tmp_path, capsys, store, message, fault_case):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("The lighthouse keeper is called Oskar.\n")
    # the name is checked before any server is reached or model loaded: no --pg-url, no retriever needed
    code = main(["index", str(tmp_path / "docs"), *store, "--table", "", "--out", str(tmp_path / "index")])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "index").exists()
    fault_case.clear_error()
