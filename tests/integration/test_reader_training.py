"""rag-mag train-reader on the real packaged SmolLM2: a few steps, an adapter chosen on validation, a resume."""

from __future__ import annotations

import json

import pytest

from rag_mag.bench.datasets import data_root
from rag_mag.cli.main import main
from rag_mag.reader.merge import merge_reader
from rag_mag.serving.llm import gguf_convert

pytestmark = pytest.mark.integration


@pytest.mark.skipif(data_root() is None, reason="needs the shared datasets (../shared/data or RAG_MAG_DATA_ROOT)")
def test_train_reader_writes_a_validated_adapter_resumes_and_refuses_other_settings(tmp_path, capsys):
    out = tmp_path / "reader"
    flags = ["train-reader", "--out", str(out), "--retrieval-corpus", "", "--val-questions", "4",
             "--val-max-examples", "4", "--batch-size", "2", "--eval-every", "2", "--save-every", "1",
             "--log-every", "1"]
    assert main(flags + ["--steps", "2"]) == 0
    adapter = json.loads((out / "adapter" / "reader.json").read_text())
    assert adapter["step"] == 2 and adapter["validation"]["n"] == 4
    state = json.loads((out / "last" / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and (out / "last" / "rag_mag_reader.json").is_file()
    stats = json.loads((out / "data" / "examples.json").read_text())["stats"]
    assert stats["excluded_eval_overlap"] >= 738  # the NQ-oracle questions that are NQ test questions, at least
    assert main(flags + ["--steps", "3"]) == 0  # resumes at step 2 and trains one more
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    losses = [record["step"] for record in log if "loss" in record]
    assert losses == sorted(set(losses)) and losses[-1] == 3  # no step logged twice after the resume
    assert [record["step"] for record in log if "val_em" in record] == [0, 2, 3]
    assert main(flags + ["--steps", "3"]) == 0  # complete: reports its adapter and trains nothing more
    assert (out / "train_log.jsonl").read_text().splitlines() == [json.dumps(record) for record in log]
    assert json.loads((out / "last" / "trainer_state.json").read_text())["global_step"] == 3
    capsys.readouterr()
    assert main(flags + ["--steps", "4", "--learning-rate", "1e-4"]) == 2
    assert "learning_rate: saved 0.0005, now 0.0001" in capsys.readouterr().err
    merged = merge_reader(out / "adapter", gguf_convert.convert_gguf(), tmp_path / "merged")
    assert (merged / "model.safetensors").is_file() and (merged / "rag_mag_reader.json").is_file()
