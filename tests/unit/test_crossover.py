"""The crossover study on a tiny random BERT: curves from one run's checkpoints, tuning on validation only,
resumable cells, and a verdict computed from the numbers."""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
from pathlib import Path

import pytest
import torch

from rag_mag import precision as precision_module
from rag_mag.bench.crossover import measure as crossover_measure
from rag_mag.bench.crossover import runner as crossover_module
from rag_mag.bench.crossover import store as crossover_store
from rag_mag.bench.crossover.config import CrossoverConfig, RunSpec
from rag_mag.bench.crossover.measure import CheckpointMeter
from rag_mag.bench.crossover.report import write
from rag_mag.bench.crossover.runner import CrossoverRunner
from rag_mag.bench.crossover.tuning import with_tuned
from rag_mag.bench.datasets import EvalDataset
from rag_mag.data import Context, EvalRecord, Passage, write_jsonl
from rag_mag.errors import CheckpointError, ConfigError
from rag_mag.retriever.encoder import MagnitudeEncoder
from rag_mag.retriever.training.config import TrainConfig
from rag_mag.retriever.training.trainer import Trainer
from tests.tiny import tiny_encoder

TOPICS = [("paris", "france"), ("london", "england"), ("berlin", "germany"), ("rome", "italy"),
          ("madrid", "spain"), ("lisbon", "portugal")]


def triple(i: int, source: str) -> dict:
    city, country = TOPICS[i % len(TOPICS)]
    other, _ = TOPICS[(i + 1) % len(TOPICS)]
    return {"id": f"{source}{i}", "query": f"capital of {country} {i}", "answers": [city], "source": source,
            "positives": [{"id": f"p{source}{i}", "title": city, "text": f"{city} is the capital of {country}"}],
            "hard_negatives": [{"id": f"n{source}{i}", "title": other, "text": f"{other} is a river town"}]}


@pytest.fixture
def study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(MagnitudeEncoder, "build",
                        classmethod(lambda cls, base, strategy, *a, **k: tiny_encoder(tmp_path / "tok", strategy)))
    monkeypatch.setattr(crossover_store, "artifacts_dir", lambda: tmp_path / "artifacts")
    rows = [json.dumps(triple(i, "gold" if i % 2 else "mined")) + "\n" for i in range(24)]
    with gzip.open(tmp_path / "train.jsonl.gz", "wt") as handle:   # gzipped, as the committed build is
        handle.writelines(rows)
    write_jsonl(tmp_path / "val.jsonl", [triple(100 + i, "gold") for i in range(6)])
    write_jsonl(tmp_path / "ablation.jsonl", [triple(200 + i, "loose") for i in range(8)])
    corpus = [Passage(id=f"d{i}", title=city, text=f"{city} is the capital of {country}")
              for i, (city, country) in enumerate(TOPICS)]
    records = [EvalRecord(id=f"e{i}", question=f"capital of {country}", answers=(city,),
                          contexts=(Context(id=f"d{i}", title=city, text="", is_supporting=True),))
               for i, (city, country) in enumerate(TOPICS)]
    test_set = EvalDataset(name="toy", records=records, corpus=corpus, source="test")
    monkeypatch.setattr(crossover_module, "load_test_sets", lambda config: [test_set])

    def make(**overrides) -> CrossoverConfig:
        values = dict(name="toy", train_data=str(tmp_path / "train.jsonl.gz"), val_data=str(tmp_path / "val.jsonl"),
                      ablation_data=str(tmp_path / "ablation.jsonl"), datasets=["toy"], max_questions=6,
                      output_dir=str(tmp_path / "report"), checkpoints=[0, 2], tuned=["learning_rate"],
                      train=dict(batch_size=4, hard_negatives=1, calibration_samples=8, warmup_ratio=0.0,
                                 val_max_queries=6),
                      runs=[{"group": "tuning", "strategies": ["cosine"], "steps": 2,
                             "grid": {"learning_rate": [1e-5, 1e-3]}},
                            {"group": "main", "strategies": ["cosine", "qnorm"], "steps": 4},
                            {"group": "data_size", "strategies": ["cosine", "qnorm"], "fractions": [0.5],
                             "steps": 2},
                            {"group": "ablation", "strategy": "cosine", "steps": 2, "sources": ["gold", "loose"]}])
        values.update(overrides)
        return CrossoverConfig(**values)

    return make


def test_study_measures_checkpoints_of_one_run_tunes_on_validation_and_resumes(study, tmp_path, monkeypatch):
    config = study()
    result = CrossoverRunner(config, "crossover.yaml").run()
    cells = {cell["label"]: cell for cell in result["cells"]}
    assert set(cells) == {"tuning_cosine_s0_2_learning_rate1e-05", "tuning_cosine_s0_2_learning_rate0.001",
                          "main_cosine_s0_4", "main_qnorm_s0_4", "data_size_cosine_s0_2_f0.5",
                          "data_size_qnorm_s0_2_f0.5", "ablation_cosine_s0_2_gold+loose"}
    main = cells["main_cosine_s0_4"]
    # the curve comes from checkpoints 0, 2 and the last step of the same run, each with per-question test scores
    assert [point["step"] for point in main["curve"]] == [0, 2, 4]
    assert all(len(point["test"]["toy"]["per_example"]) == 6 for point in main["curve"])
    # tuning and ablation runs are judged on validation only
    assert all(not point["test"] for point in cells["tuning_cosine_s0_2_learning_rate0.001"]["curve"])
    # every later run takes the learning rate with the best validation nDCG@10 (qnorm: the best mean)
    tuning = {cell["run"]["overrides"]["learning_rate"]: max(p["validation"]["ndcg@10"] for p in cell["curve"])
              for cell in result["cells"] if cell["run"]["group"] == "tuning"}
    chosen = max(tuning, key=tuning.get)
    assert main["run"]["tuned"] == {"learning_rate": chosen}
    assert cells["main_qnorm_s0_4"]["run"]["tuned"] == {"learning_rate": chosen}
    # sources and fractions select the training pairs
    assert cells["ablation_cosine_s0_2_gold+loose"]["train_size"] == 12 + 8
    assert cells["data_size_cosine_s0_2_f0.5"]["train_size"] == 12
    assert all(cell["train_size"] == 24 for label, cell in cells.items() if label.startswith("main_"))
    # a finished main run is published under a stable name for `bench` configs (retrievers:)
    published = tmp_path / "artifacts" / "crossover" / "retrievers" / "main_qnorm_s0_4"
    assert (published / "best" / "rag_mag.json").is_file()
    assert json.loads((published / "best" / "rag_mag.json").read_text())["strategy"] == "qnorm"
    # its best/ is the checkpoint the one_se rule chose, recorded in the cell with per-query validation
    qnorm = cells["main_qnorm_s0_4"]
    assert qnorm["selection"] == "one_se" and qnorm["selected_step"] in (0, 2, 4)
    assert all(len(point["validation_per_query"]) == 6 for point in qnorm["curve"])
    state = json.loads((published / "last" / "trainer_state.json").read_text())
    assert state["best_metrics"]["step"] == qnorm["selected_step"]

    # a second invocation trains nothing: every cell is cached under the same key
    monkeypatch.setattr(Trainer, "train", lambda self: pytest.fail("a cached cell was trained again"))
    again = CrossoverRunner(config, "crossover.yaml").run()
    assert [c["key"] for c in again["cells"]] == [c["key"] for c in result["cells"]]

    path = write(again, config.out_dir(), "rag-mag crossover crossover.yaml")
    report = path.read_text()
    assert "## Verdict" in report and "qnorm" in report and "rag-mag crossover crossover.yaml" in report
    verdict = json.loads((config.out_dir() / "results.json").read_text())["summary"]
    text = verdict["verdicts"][0]["text"]
    assert ("overtakes cosine at" in text) or ("does not overtake cosine within the largest run (4 steps" in text)
    assert verdict["size_verdicts"] and "training pairs" in verdict["size_verdicts"][0]["text"]
    assert "different precisions" not in report  # one machine, one precision
    assert f"| main_qnorm_s0_4 | one_se | {qnorm['selected_step']} |" in report  # the published checkpoints

    # runs from machines with and without native bf16: the report says so, and each row names its precision
    mixed = {**again, "cells": [{**c, "bf16": c["label"].startswith("tuning")} for c in again["cells"]]}
    report = write(mixed, config.out_dir(), "rag-mag crossover crossover.yaml").read_text()
    assert "trained in different precisions (bf16 and fp32" in report
    assert "| tuning_cosine_s0_2_learning_rate1e-05 | 24 | 2 | bf16 |" in report
    assert "| ablation_cosine_s0_2_gold+loose | 20 | 2 | fp32 |" in report


def test_time_budget_stops_between_runs_and_a_later_call_continues(study, monkeypatch):
    config = study(runs=[{"group": "main", "strategies": ["cosine", "qnorm"], "steps": 2}], tuned=[])
    now, train = [0.0], Trainer.train
    monkeypatch.setattr(crossover_module.time, "monotonic", lambda: now[0])

    def slow_train(self):  # every run takes 100 seconds
        now[0] += 100
        return train(self)

    monkeypatch.setattr(Trainer, "train", slow_train)
    first = CrossoverRunner(config, "c.yaml").run(time_budget_s=50)
    assert [c["label"] for c in first["cells"]] == ["main_cosine_s0_2"]
    report = write(first, config.out_dir(), "c").read_text()
    assert "In progress: 1 of 2 runs finished" in report and "Still to run: `main_qnorm_s0_2`." in report
    second = CrossoverRunner(config, "c.yaml").run()
    assert [c["label"] for c in second["cells"]] == ["main_cosine_s0_2", "main_qnorm_s0_2"]


def test_a_resumed_runs_seconds_count_every_process(study, monkeypatch):
    config = study(runs=[{"group": "main", "strategies": ["cosine"], "steps": 4}], tuned=[])
    now = [0.0]
    monkeypatch.setattr(crossover_module.time, "monotonic", lambda: now[0])
    step, interrupt = Trainer._step, [True]

    def timed_step(self, *args):  # each training step takes 100 seconds; the first process dies in step 4
        now[0] += 100
        if self.step == 3 and interrupt and interrupt.pop():
            raise KeyboardInterrupt
        return step(self, *args)

    monkeypatch.setattr(Trainer, "_step", timed_step)
    with pytest.raises(KeyboardInterrupt):
        CrossoverRunner(config, "c.yaml").run()
    cell = CrossoverRunner(config, "c.yaml").run()["cells"][0]
    assert cell["steps_done"] == 4
    assert cell["seconds"] == 500  # 400 in the first process (3 steps and the interrupted one), 100 in the second
    assert [point["seconds"] for point in cell["curve"]] == [0, 200, 500]
    assert cell["cpu_kinds"] == [precision_module.cpu_kind()]  # one kind, recorded once over both processes


def test_an_interrupt_inside_a_checkpoints_measurement_loses_no_point(study, tmp_path, monkeypatch):
    """A SIGTERM during step 2's test evaluation: the resumed run measures step 2 from last/ (saved at step 2)
    and its curve equals an uninterrupted run's, query for query."""
    config = study(runs=[{"group": "main", "strategies": ["cosine"], "steps": 4}], tuned=[])
    config.train["precision"] = "fp32"
    straight = CrossoverRunner(config, "c.yaml").run()["cells"][0]
    shutil.rmtree(tmp_path / "artifacts")
    shutil.rmtree(tmp_path / "report")
    test_point, interrupt = CheckpointMeter.test_point, [True]

    def interrupted(self, step, *args):
        if step == 2 and interrupt and interrupt.pop():
            raise KeyboardInterrupt
        return test_point(self, step, *args)

    monkeypatch.setattr(CheckpointMeter, "test_point", interrupted)
    with pytest.raises(KeyboardInterrupt):
        CrossoverRunner(config, "c.yaml").run()
    cell = CrossoverRunner(config, "c.yaml").run()["cells"][0]
    assert [point["step"] for point in cell["curve"]] == [0, 2, 4]
    for resumed, whole in zip(cell["curve"], straight["curve"], strict=True):
        assert resumed["validation_per_query"] == whole["validation_per_query"]
        assert resumed["test"]["toy"]["per_example"] == whole["test"]["toy"]["per_example"]
    assert cell["selected_step"] == straight["selected_step"]


def test_rebuild_recreates_a_finished_runs_checkpoint_or_refuses_one_that_differs(study, tmp_path, monkeypatch,
                                                                                   caplog):
    from safetensors.torch import load_file

    config = study(runs=[{"group": "main", "strategies": ["qnorm"], "steps": 4}], tuned=[])
    config.train["precision"] = "fp32"  # the same on every CI machine
    cell = CrossoverRunner(config, "c.yaml").run()["cells"][0]
    assert cell["cpu_kinds"] == [precision_module.cpu_kind()]
    runs = tmp_path / "artifacts" / "crossover" / "runs"
    run_dir = next(runs.iterdir())
    weights = {name: load_file(run_dir / folder / "model.safetensors")
               for name, folder in (("best", "best"), ("last", "last"))}
    published = tmp_path / "artifacts" / "crossover" / "retrievers" / "main_qnorm_s0_4"

    def fresh_clone() -> None:  # the cells are committed; the checkpoints stay on the machine that trained
        shutil.rmtree(tmp_path / "artifacts")

    fresh_clone()
    CrossoverRunner(config, "c.yaml").run()  # without --rebuild a finished cell trains nothing
    assert not runs.exists() and not published.exists()
    CrossoverRunner(config, "c.yaml").run(rebuild=True)
    rebuilt = load_file(published / "best" / "model.safetensors")
    assert rebuilt.keys() == weights["best"].keys()
    assert all(torch.equal(rebuilt[name], weights["best"][name]) for name in rebuilt)  # the same weights
    record = json.loads((run_dir / "rebuilt.json").read_text())
    assert record["step"] == cell["selected_step"] and record["queries_changed"] == 0
    assert record["precision"] == record["cell_precision"]  # same machine, same precision (bf16 where native)
    # the rebuild's own training log lies beside best/, ending with the selected step's validation
    log = [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == cell["selected_step"]
    assert log[-1]["validation"]["ndcg@10"] == record["validation_ndcg@10"]["rebuilt"]
    assert [r["step"] for r in log if "loss" in r] == list(range(1, cell["selected_step"]))
    assert not (tmp_path / "artifacts" / "crossover" / "rebuilds").exists() or \
        not any((tmp_path / "artifacts" / "crossover" / "rebuilds").iterdir())  # its training state is gone
    # a second call finds best/ and trains nothing
    CrossoverRunner(config, "c.yaml").run(rebuild=True)

    # the selected step may be any checkpoint: here the last, published as last/'s trained weights halfway back
    # to the start (the default recipe, WiSE-FT at wise_alpha 0.5)
    cells_file = config.out_dir() / "cells" / "main_qnorm_s0_4.json"
    write_jsonl(cells_file, [{**cell, "selected_step": 4}])
    fresh_clone()
    CrossoverRunner(config, "c.yaml").run(rebuild=True)
    rebuilt = load_file(published / "best" / "model.safetensors")
    start, alpha = tiny_encoder(tmp_path / "tok", "qnorm").model.state_dict(), TrainConfig().wise_alpha
    assert alpha < 1 and any(not torch.equal(rebuilt[name], weights["last"][name]) for name in rebuilt)
    assert all(torch.allclose(rebuilt[name], (1 - alpha) * start[name] + alpha * weights["last"][name], atol=1e-6)
               for name in rebuilt if rebuilt[name].is_floating_point())

    # a bf16 run is rebuilt in bf16 where the CPU computes it natively, else in fp32 (and says so)
    write_jsonl(cells_file, [{**cell, "bf16": True}])
    monkeypatch.setattr(precision_module, "cpu_has_native_bf16", lambda: False)
    fresh_clone()
    with caplog.at_level("WARNING"):
        CrossoverRunner(config, "c.yaml").run(rebuild=True)
    assert "rebuilding it in fp32" in caplog.text
    record = json.loads((run_dir / "rebuilt.json").read_text())
    assert (record["precision"], record["cell_precision"], record["queries_changed"]) == ("fp32", "bf16", 0)

    # a rebuild that does not reproduce the cell's validation score is not published
    tampered = [{**point, "validation": {**point["validation"], "ndcg@10": point["validation"]["ndcg@10"] - 5}}
                for point in cell["curve"]]
    write_jsonl(cells_file, [{**cell, "curve": tampered, "cpu_kinds": ["avx2", "avx512"]}])
    fresh_clone()
    caplog.clear()
    with caplog.at_level("WARNING"), pytest.raises(CheckpointError, match="more than 0.5 points apart") as refused:
        CrossoverRunner(config, "c.yaml").run(rebuild=True)
    # a run resumed on another kind of CPU is named, before the rebuild and in its refusal
    assert "trained on avx2 and avx512 CPUs" in caplog.text and "trained on avx2 and avx512 CPUs" in str(refused.value)
    assert not published.exists() and not (run_dir / "best").exists()


def test_a_published_step_between_checkpoints_is_measured_from_best_and_can_be_rebuilt(study, tmp_path):
    from safetensors.torch import load_file

    config = study(runs=[{"group": "main", "strategies": ["qnorm"], "steps": 4}], tuned=[])
    config.train["precision"] = "fp32"
    cell = CrossoverRunner(config, "c.yaml").run()["cells"][0]
    # as when the trainer publishes a validation step the curve does not measure (step 300 of 400 in the study)
    step = cell["selected_step"]
    measured = next(point for point in cell["curve"] if point["step"] == step)
    cells_file = config.out_dir() / "cells" / "main_qnorm_s0_4.json"
    write_jsonl(cells_file, [{**cell, "curve": [p for p in cell["curve"] if p["step"] != step]}])
    report = write(CrossoverRunner(config, "c.yaml").collect(), config.out_dir(), "c").read_text()
    assert f"| main_qnorm_s0_4 | one_se | {step} | - | - |" in report
    # the next call measures best/ there, the same numbers as the curve had
    again = CrossoverRunner(config, "c.yaml").run()["cells"][0]
    published = again["published"]
    assert published["step"] == step and published["validation_per_query"] == measured["validation_per_query"]
    assert published["test"]["toy"]["per_example"] == measured["test"]["toy"]["per_example"]
    assert [p["step"] for p in again["curve"]] == [p["step"] for p in cell["curve"] if p["step"] != step]
    report = write(CrossoverRunner(config, "c.yaml").collect(), config.out_dir(), "c").read_text()
    assert f"| main_qnorm_s0_4 | one_se | {step} | {measured['validation']['ndcg@10']:.1f} |" in report
    # a fresh clone rebuilds that step against the published measurement
    retriever = tmp_path / "artifacts" / "crossover" / "retrievers" / "main_qnorm_s0_4" / "best"
    weights = load_file(retriever / "model.safetensors")
    shutil.rmtree(tmp_path / "artifacts")
    CrossoverRunner(config, "c.yaml").run(rebuild=True)
    rebuilt = load_file(retriever / "model.safetensors")
    assert all(torch.equal(rebuilt[name], weights[name]) for name in weights)


def test_test_last_only_measures_the_test_sets_at_the_last_step_alone_and_keeps_other_keys(study):
    runs = [{"group": "main", "strategies": ["cosine"], "steps": 4},
            {"group": "data_size", "strategies": ["cosine"], "fractions": [0.5], "steps": 4}]
    before = CrossoverRunner(study(runs=runs, tuned=[]), "c.yaml").run(only=["main_cosine_s0_4"])
    result = CrossoverRunner(study(runs=runs, tuned=[], test_last_only=["data_size"]), "c.yaml").run()
    cells = {cell["label"]: cell for cell in result["cells"]}
    size = cells["data_size_cosine_s0_4_f0.5"]["curve"]
    assert [p["step"] for p in size] == [0, 2, 4] and [bool(p["test"]) for p in size] == [False, False, True]
    assert all(p["test"] for p in cells["main_cosine_s0_4"]["curve"])  # other groups: every checkpoint
    assert cells["main_cosine_s0_4"]["key"] == before["cells"][0]["key"]  # its cell was not trained again


def test_the_selection_rule_is_part_of_a_main_runs_key_only(study):
    runs = [{"group": "main", "strategies": ["cosine"], "steps": 2},
            {"group": "ablation", "strategy": "cosine", "steps": 2, "sources": ["gold"]}]
    one_se = CrossoverRunner(study(runs=runs, tuned=[]), "c.yaml").run()
    # under the max rule the main run publishes another best/, so its cell is trained again; the ablation's is not
    config = study(runs=runs, tuned=[], train=dict(batch_size=4, hard_negatives=1, calibration_samples=8,
                                                   warmup_ratio=0.0, val_max_queries=6, selection="max"))
    runner = CrossoverRunner(config, "c.yaml")
    specs = {spec.label: spec for spec in config.run_specs()}
    keys = {label: runner.store.key(spec, runner.store.train_file(spec)) for label, spec in specs.items()}
    before = {cell["label"]: cell["key"] for cell in one_se["cells"]}
    assert keys["main_cosine_s0_2"] != before["main_cosine_s0_2"]
    assert keys["ablation_cosine_s0_2_gold"] == before["ablation_cosine_s0_2_gold"]


def test_a_cells_key_covers_the_training_defaults(study, monkeypatch):
    """The default recipe written out keys the same cells as left to the default; a changed default (plain
    fine-tuning in place of WiSE-FT 0.5) makes them stale."""
    spec = study().run_specs()[-1]

    def key(**train) -> str:
        config = study(train=dict(batch_size=4, **train))
        store = CrossoverRunner(config, "c.yaml").store
        return store.key(spec, store.train_file(spec))

    default = key()
    assert key(wise_alpha=TrainConfig().wise_alpha) == default
    assert key(wise_alpha=1.0) != default

    @dataclasses.dataclass
    class PlainByDefault(TrainConfig):
        wise_alpha: float = 1.0

    monkeypatch.setattr(crossover_store, "TrainConfig", PlainByDefault)
    assert key() == key(wise_alpha=1.0) != default


def test_step_0_is_measured_once_per_starting_encoder(study, monkeypatch):
    calls = []
    measure = crossover_measure.test_ndcg
    monkeypatch.setattr(crossover_measure, "test_ndcg", lambda encoder, dataset, bf16: calls.append(1) or
                        measure(encoder, dataset, bf16))
    runs = [{"group": "main", "strategies": ["qnorm"], "steps": 2}, {"group": "main", "strategies": ["qnorm"],
                                                                     "steps": 4}]
    result = CrossoverRunner(study(runs=runs, tuned=[]), "c.yaml").run()
    short, long = ({p["step"]: p["test"]["toy"] for p in c["curve"]} for c in result["cells"])
    assert sorted(long) == [0, 2, 4] and long[0] == short[0]  # the same untrained encoder (both seed 0)
    assert len(calls) == 2 + 2  # steps 0 and 2, then 2 and 4: step 0 of the second run came from the cache
    other = CrossoverRunner(study(runs=[{"group": "main", "strategies": ["cosine"], "steps": 2}], tuned=[]),
                            "c.yaml").run()
    assert len(calls) == 4 + 2  # another strategy ranks differently at step 0: measured, not read
    assert other["cells"][0]["curve"][0]["step"] == 0


def test_only_trains_the_named_runs_and_refuses_an_unknown_label(study):
    config = study(runs=[{"group": "main", "strategies": ["cosine", "qnorm"], "steps": 2}], tuned=[])
    with pytest.raises(ConfigError, match="no run labelled main_dot_s0_2 .* main_cosine_s0_2, main_qnorm_s0_2"):
        CrossoverRunner(config, "c.yaml").run(only=["main_dot_s0_2"])
    result = CrossoverRunner(config, "c.yaml").run(only=["main_qnorm_s0_2"])
    assert [c["label"] for c in result["cells"]] == ["main_qnorm_s0_2"]


def test_runs_that_need_tuning_first_and_bad_configs_are_refused(study):
    with pytest.raises(ConfigError, match="has no tuning runs"):
        CrossoverRunner(study(runs=[{"group": "main", "strategies": ["cosine"], "steps": 2}]), "c.yaml").run()
    with pytest.raises(ConfigError, match="lists no runs"):
        study(runs=[])
    with pytest.raises(ConfigError, match="checkpoints must be increasing"):
        study(checkpoints=[4, 2])
    with pytest.raises(ConfigError, match="no training triples left"):
        CrossoverRunner(study(runs=[{"group": "ablation", "strategy": "cosine", "steps": 2,
                                     "sources": ["nowhere"]}], tuned=[]), "c.yaml").run()


def test_cells_of_an_earlier_recipe_are_neither_reported_nor_used_for_tuning(study, tmp_path, caplog):
    config = study(runs=[{"group": "tuning", "strategies": ["cosine"], "steps": 2,
                          "grid": {"learning_rate": [1e-5, 1e-3]}},
                         {"group": "main", "strategies": ["cosine"], "steps": 2}])
    first = CrossoverRunner(config, "c.yaml").run()
    assert len(first["cells"]) == 3 and not first["pending"]
    # the recipe changes: the same labels, other training triples
    train = tmp_path / "train.jsonl.gz"
    with gzip.open(train, "at") as handle:
        handle.write(json.dumps(triple(999, "gold")) + "\n")
    stale = CrossoverRunner(config, "c.yaml").collect()
    assert stale["cells"] == [] and len(stale["pending"]) == 3
    assert "3 finished cells were trained on other data or settings" in caplog.text
    # a main run does not take its learning rate from the old tuning cells: it waits for new ones
    assert with_tuned(CrossoverRunner(config, "c.yaml").store, config.run_specs()[-1], config.run_specs()) is None
    # without the training data (a fresh clone) the cells cannot be checked and are reported as they are
    train.unlink()
    unchecked = CrossoverRunner(config, "c.yaml").collect()
    assert len(unchecked["cells"]) == 3 and "cannot check the finished cells" in caplog.text


def test_tuning_runs_listed_last_still_go_first(study):
    config = study(runs=[{"group": "main", "strategies": ["qnorm"], "steps": 2},
                         {"group": "tuning", "strategies": ["qnorm"], "steps": 2,
                          "grid": {"learning_rate": [1e-5, 1e-3]}}])
    cells = CrossoverRunner(config, "c.yaml").run(poll_s=0)["cells"]
    main = next(c for c in cells if c["run"]["group"] == "main")
    assert main["run"]["tuned"]["learning_rate"] in (1e-5, 1e-3)


def test_a_strategy_with_its_own_tuning_runs_waits_only_for_them(study):
    config = study(runs=[{"group": "tuning", "strategies": ["cosine", "qnorm"], "steps": 2,
                          "grid": {"learning_rate": [1e-5, 1e-3]}},
                         {"group": "main", "strategies": ["cosine", "dot"], "steps": 2}])
    specs = config.run_specs()
    main_cosine, main_dot = (next(s for s in specs if s.label.startswith(name)) for name in ("main_cosine", "main_dot"))
    runner = CrossoverRunner(config, "c.yaml")
    runner.run(only=[s.label for s in specs if s.label.startswith("tuning_cosine")])
    tuned = with_tuned(runner.store, main_cosine, specs)
    assert tuned is not None and tuned.tuned["learning_rate"] in (1e-5, 1e-3)
    assert with_tuned(runner.store, main_dot, specs) is None      # no tuning of its own: it waits for all of them
    runner.run(only=[s.label for s in specs if s.label.startswith("tuning_qnorm")])
    assert with_tuned(runner.store, main_dot, specs) is not None


def test_a_run_claimed_by_one_worker_is_not_taken_by_another(study):
    store = CrossoverRunner(study(), "c.yaml").store
    with store.claim("k1") as first:
        with store.claim("k1") as second, store.claim("k2") as other:
            assert first and not second and other
    with store.claim("k1") as again:
        assert again  # released when the first worker let go (or died)


def test_run_labels_name_what_varies():
    assert RunSpec("qnorm", seed=1, steps=800).label == "main_qnorm_s1_800"
    assert RunSpec("cosine", fraction=0.25, steps=400, group="data_size").label == "data_size_cosine_s0_400_f0.25"
    spec = RunSpec("cosine", steps=2, group="tuning", overrides={"learning_rate": 5e-5}, tuned={"x": 1})
    assert spec.label == "tuning_cosine_s0_2_learning_rate5e-05"


def test_the_shipped_config_loads():
    from rag_mag.bench.crossover.config import load_crossover_config
    from rag_mag.models import REPO_ROOT

    config = load_crossover_config(REPO_ROOT / "eval" / "configs" / "crossover.yaml")
    specs = config.run_specs()
    main = [s for s in specs if s.group == "main"]
    assert {(s.strategy, s.seed, s.steps) for s in main if s.strategy in ("cosine", "qnorm")} == {
        ("cosine", 0, 800), ("cosine", 1, 800), ("qnorm", 0, 800), ("qnorm", 1, 800)}
    assert all(s.steps >= 400 for s in main)
    assert specs[0].group == "tuning" and {s.fraction for s in specs if s.group == "data_size"} == {0.25, 0.5, 1.0}


def _main_cell(strategy: str, per_step: dict[int, list[float]]) -> dict:
    return {"run": {"group": "main", "strategy": strategy, "fraction": 1.0},
            "curve": [{"step": step,
                       "test": {"hotpot_qa": {"per_example": values, "ndcg@10": 100 * sum(values) / len(values)}}}
                      for step, values in per_step.items()]}


@pytest.mark.parametrize(("better", "elsewhere"), [(115, "tied"), (115, "behind"), (150, "behind")])
def test_the_verdict_adjusts_for_asking_at_every_checkpoint(better, elsewhere):
    """One strategy beats cosine at one of three checkpoints: by 115 of 200 questions (raw p about 0.03,
    which three looks make about 0.1) the verdict is no, also where it is far behind at the other two
    (a loss is no evidence of a gain); by 150 of 200 it is yes, at that step."""
    from rag_mag.bench.crossover.report import verdicts
    from rag_mag.bench.stats import paired_permutation_test

    cosine = [0.5] * 200
    winner = [0.6] * better + [0.4] * (200 - better)
    other = cosine if elsewhere == "tied" else [0.3] * 200
    cells = [_main_cell("cosine", {0: cosine, 100: cosine, 200: cosine, 400: cosine}),
             _main_cell("qnorm", {0: cosine, 100: other, 200: winner, 400: other})]
    raw = paired_permutation_test(winner, cosine, n_permutations=2000)
    assert raw < 0.05  # each checkpoint alone would have said yes

    (found,) = verdicts(cells, ["hotpot_qa"], n_train=3000)
    at_200 = next(row for row in found["by_step"] if row["step"] == 200)
    assert at_200["family"] == 3 and at_200["p_holm"] == pytest.approx(min(1.0, 3 * at_200["p"]))
    if better == 115:
        assert at_200["p_holm"] > 0.05 and found["overtakes_at"] is None
        assert found["text"].startswith("qnorm does not overtake cosine within the largest run (400 steps")
    else:
        assert found["overtakes_at"] == 200
        assert "overtakes cosine at 200 steps" in found["text"] and "Holm-adjusted over 3 checkpoints" in found["text"]


def test_an_overtake_says_whether_the_strategy_rose_above_cosines_best_or_cosine_fell():
    """Ahead at 400 steps either way; the sentence tells a strategy that climbs past cosine's best from one
    that only holds up better while cosine overfits."""
    from rag_mag.bench.crossover.report import verdicts

    def seq(value):
        return [value] * 150 + [value - 0.2] * 50

    for cosine_at_400, qnorm_at_400, says in ((0.5, 0.7, "is above cosine's best"),
                                              (0.2, 0.4, "the lead comes from cosine losing more")):
        cells = [_main_cell("cosine", {0: seq(0.5), 100: seq(0.6), 400: seq(cosine_at_400)}),
                 _main_cell("qnorm", {0: seq(0.4), 100: seq(0.5), 400: seq(qnorm_at_400)})]
        (found,) = verdicts(cells, ["hotpot_qa"], n_train=3000)
        assert found["overtakes_at"] == 400
        assert says in found["text"]


def test_the_committed_study_cells_are_current_under_their_config():
    """A new TrainConfig field (val_corpus, for adapt) once changed every cell's key, so that `--rebuild` on a
    fresh clone waited forever for tuning runs it took for unfinished. A field that runs set for themselves
    belongs in RUN_SETTINGS; one that changes what a run learns makes the cells stale on purpose."""
    from rag_mag.bench.crossover.config import load_crossover_config
    from rag_mag.bench.crossover.store import CrossoverStore
    from rag_mag.bench.crossover.tuning import as_trained
    from rag_mag.models import REPO_ROOT

    config = load_crossover_config(REPO_ROOT / "eval" / "configs" / "crossover.yaml")
    store = CrossoverStore(config)
    specs = config.run_specs()
    checked = 0
    for spec in specs:
        cell = store.cell(spec.label)
        if not cell or spec.sources or spec.fraction < 1:  # those would write their filtered file first
            continue
        trained = as_trained(store, spec, specs)
        assert trained is not None, f"{spec.label}: its tuning cells are stale"
        assert cell["key"] == store.key(trained, store.train_file(trained)), f"{spec.label}: stale cell key"
        checked += 1
    assert checked >= 11  # six tuning runs and five main runs at least
