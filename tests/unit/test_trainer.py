"""Trainer: real steps on a tiny random BERT lower the loss; resume; divergence; bad inputs."""

import json

import pytest
import torch

from rag_mag.data import Passage, write_jsonl
from rag_mag.errors import CheckpointError, ConfigError, DataError, TrainingError
from rag_mag.retriever.encoder import MagnitudeEncoder
from rag_mag.retriever.loss import InfoNCELoss
from rag_mag.retriever.training import trainer as trainer_module
from rag_mag.retriever.training import validation as validation_module
from rag_mag.retriever.training.batches import load_training_data
from rag_mag.retriever.training.config import TrainConfig
from rag_mag.retriever.training.log import watch_collapse
from rag_mag.retriever.training.optimizer import build_optimizer
from rag_mag.retriever.training.trainer import Trainer
from tests.tiny import capital_triples, tiny_encoder


@pytest.fixture
def setup(tmp_path, monkeypatch):
    write_jsonl(tmp_path / "train.jsonl", capital_triples())
    # Trainer.build would load the packaged MiniLM: hand it the tiny random BERT instead.
    monkeypatch.setattr(MagnitudeEncoder, "build",
                        classmethod(lambda cls, base, strategy, *a, **k: tiny_encoder(tmp_path / "tok", strategy)))

    def make(**overrides):
        values = dict(train_data=str(tmp_path / "train.jsonl"), out=str(tmp_path / "run"), steps=12,
                      batch_size=8, learning_rate=1e-3, eval_every=6, log_every=1, save_every=4, val_fraction=0.2,
                      warmup_ratio=0.0, calibration_samples=8, wise_alpha=1.0)  # plain: best/ is trained weights
        values.update(overrides)
        return TrainConfig(**values)

    return make


@pytest.mark.parametrize("strategy", ["cosine", "qnorm", "learnable"])
def test_real_steps_lower_the_loss(setup, strategy):
    result = Trainer(setup(strategy=strategy, steps=30, eval_every=0, val_fraction=0.0)).train()
    losses = [r["loss"] for r in result.history if "loss" in r]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5
    assert (result.best_dir / "rag_mag.json").is_file()
    if strategy == "learnable":
        assert result.history[-1]["g_query"] != pytest.approx(0.5, abs=1e-4)


def test_logs_norm_statistics_and_validation(setup, tmp_path):
    Trainer(setup()).train()
    lines = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "loss" in line]
    for key in ("accuracy", "query_norm_mean", "query_norm_cv", "document_norm_mean", "document_norm_cv",
                "g_query", "g_document"):
        assert key in steps[0]
    validations = [line for line in lines if "validation" in line]
    assert [v["step"] for v in validations] == [0, 6, 12]  # one_se: the starting model is a candidate
    assert 0 <= validations[0]["validation"]["ndcg@10"] <= 100


def test_calibration_is_recorded_in_the_checkpoint(setup):
    result = Trainer(setup(strategy="dot", steps=2)).train()
    config = json.loads((result.last_dir / "rag_mag.json").read_text())
    assert config["query_norm_scale"] != 1.0 and config["document_norm_scale"] != 1.0
    assert config["training"]["strategy"] == "dot"


def test_resume_continues_from_the_saved_step(setup, tmp_path):
    Trainer(setup(steps=8)).train()
    state = json.loads((tmp_path / "run" / "last" / "trainer_state.json").read_text())
    assert state["step"] == 8
    resumed = Trainer(setup(steps=12)).train()
    steps = [r["step"] for r in resumed.history if "loss" in r]
    assert steps == [9, 10, 11, 12]


def test_an_interrupted_run_resumes_where_it_stopped(setup, tmp_path, monkeypatch):
    straight = Trainer(setup(steps=8, out=str(tmp_path / "straight"), eval_every=0)).train()
    real_step = Trainer._step

    def interrupt_at_five(self, encoder, loss_fn, optimizer, scheduler, train, step):
        if step == 5:
            raise KeyboardInterrupt
        return real_step(self, encoder, loss_fn, optimizer, scheduler, train, step)

    monkeypatch.setattr(Trainer, "_step", interrupt_at_five)
    with pytest.raises(KeyboardInterrupt):
        Trainer(setup(steps=8, out=str(tmp_path / "split"), eval_every=0)).train()
    state = json.loads((tmp_path / "split" / "last" / "trainer_state.json").read_text())
    assert state["step"] == 5  # saved on the way out, although save_every is 4
    monkeypatch.setattr(Trainer, "_step", real_step)
    resumed = Trainer(setup(steps=8, out=str(tmp_path / "split"), eval_every=0)).train()
    assert [r["step"] for r in resumed.history if "loss" in r] == [6, 7, 8]
    # same batches, learning rates and optimizer moments: the same loss as the uninterrupted run
    last_straight = [r for r in straight.history if "loss" in r][-1]["loss"]
    assert [r for r in resumed.history if "loss" in r][-1]["loss"] == pytest.approx(last_straight, rel=1e-3)


def test_an_interrupt_inside_a_steps_hook_is_finished_on_resume(setup, tmp_path, monkeypatch):
    """last/ saved on an interrupt in step 6's hook holds step 6's weights: the resumed run runs that hook and
    validates step 6 before training on, so neither the hook's measurement nor the best/ candidate is lost."""
    straight = Trainer(setup(out=str(tmp_path / "straight")))
    straight.on_step = lambda step, encoder: None
    straight_result = straight.train()
    hooked, interrupt = [], [True]

    def hook(step, encoder):
        if step == 6 and interrupt and interrupt.pop():
            raise KeyboardInterrupt
        hooked.append(step)

    first = Trainer(setup(out=str(tmp_path / "split")))
    first.on_step = hook
    with pytest.raises(KeyboardInterrupt):
        first.train()
    state = json.loads((tmp_path / "split" / "last" / "trainer_state.json").read_text())
    assert state["step"] == 6 and state["step_finished"] is False
    second = Trainer(setup(out=str(tmp_path / "split")))
    second.on_step = hook
    resumed = second.train()
    assert hooked == list(range(13))  # 6 once, by the resumed run, before step 7
    logged = [json.loads(line) for line in (tmp_path / "split" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "validation" in r] == [0, 6, 12]
    assert resumed.best_metrics["step"] == straight_result.best_metrics["step"]
    assert resumed.best_metrics["ndcg@10"] == pytest.approx(straight_result.best_metrics["ndcg@10"])


def test_a_step_runs_outside_train(setup, tmp_path):
    """eval/bench_training.py times Trainer._step alone, on an encoder and optimizer it built itself."""
    config = setup(val_fraction=0.0)
    encoder = tiny_encoder(tmp_path / "tok", "cosine")
    optimizer, scheduler = build_optimizer(encoder, config)
    train = load_training_data(config)[0]
    record = Trainer(config)._step(encoder, InfoNCELoss(config.temperature), optimizer, scheduler, train, 0)
    assert record["loss"] > 0 and "divergence" not in record


def test_resume_refuses_another_strategy(setup):
    Trainer(setup(steps=4)).train()
    with pytest.raises(CheckpointError, match="--no-resume"):
        Trainer(setup(steps=8, strategy="dot")).train()


def test_nan_loss_stops_with_a_clear_message_and_keeps_the_checkpoint(setup, tmp_path, monkeypatch):
    Trainer(setup(steps=4)).train()
    good = (tmp_path / "run" / "last" / "model.safetensors").read_bytes()
    real_loss = trainer_module.InfoNCELoss.forward

    def poisoned(self, *args, **kwargs):
        output = real_loss(self, *args, **kwargs)
        return {**output, "loss": output["loss"] * torch.tensor(float("nan"))}

    monkeypatch.setattr(trainer_module.InfoNCELoss, "forward", poisoned)
    with pytest.raises(TrainingError, match="loss became nan"):
        Trainer(setup(steps=8)).train()
    assert (tmp_path / "run" / "last" / "model.safetensors").read_bytes() == good


def test_magnitude_collapse_is_reported(setup, caplog):
    trainer = Trainer(setup(strategy="qnorm"))
    encoder = tiny_encoder(trainer.out.parent / "tok2", "qnorm")
    record = {"step": 3, "document_norm_cv": 1e-6, "query_norm_cv": 0.2, "document_cosine": 0.999}
    with caplog.at_level("WARNING"):
        watch_collapse(record, encoder)
    assert "magnitude collapse" in caplog.text and "direction collapse" in caplog.text


@pytest.mark.parametrize("field, value, message", [("strategy", "manhattan", "valid strategies"),
                                                    ("steps", 0, "steps"), ("temperature", -1.0, "temperature"),
                                                    ("pooling", "max", "valid poolings")])
def test_bad_config_values_are_rejected(field, value, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**{field: value})


def test_bad_training_file_names_file_and_line(setup, tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"query": "q", "positives": ["p"]}\n{broken\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2"):
        Trainer(setup(train_data=str(tmp_path / "bad.jsonl"))).train()


def test_best_is_the_checkpoint_the_one_se_rule_chooses_and_only_its_band_is_kept(setup, tmp_path):
    from rag_mag.retriever.training.selection import within_one_standard_error

    result = Trainer(setup(steps=12, eval_every=3, save_every=3)).train()
    state = json.loads((result.last_dir / "trainer_state.json").read_text())
    candidates = {int(step): c["per_query"] for step, c in state["candidates"].items()}
    chosen, band = within_one_standard_error(candidates)
    assert result.best_metrics["step"] == chosen and sorted(candidates) == band
    kept = sorted(int(p.name.removeprefix("step-")) for p in (tmp_path / "run" / "validated").iterdir())
    assert kept == band  # checkpoints outside the band were deleted
    weights = "model.safetensors"
    assert (result.best_dir / weights).read_bytes() == \
        (tmp_path / "run" / "validated" / f"step-{chosen}" / weights).read_bytes()
    last = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()][-1]
    assert last["chosen"] == chosen and last["band"] == band


def test_the_max_rule_keeps_the_highest_validation_and_skips_step_0(setup, tmp_path):
    result = Trainer(setup(selection="max")).train()
    validations = [r for r in result.history if "validation" in r]
    assert [r["step"] for r in validations] == [6, 12]
    assert result.best_metrics["ndcg@10"] == max(r["validation"]["ndcg@10"] for r in validations)
    assert not (tmp_path / "run" / "validated").exists()


def test_an_unknown_selection_rule_is_refused():
    with pytest.raises(ConfigError, match="valid rules are: one_se, max"):
        TrainConfig(selection="latest")


def test_a_hook_and_the_trainer_validating_the_same_step_share_one_validation(setup, monkeypatch):
    passes = []
    score = validation_module.score_retrieval
    monkeypatch.setattr(validation_module, "score_retrieval", lambda *a, **k: passes.append(1) or score(*a, **k))
    trainer = Trainer(setup())
    validation = load_training_data(trainer.config)[1]
    hooked = {}
    trainer.on_step = lambda step, encoder: hooked.setdefault(step, trainer.validation_scores(encoder, validation)) \
        if step % 6 == 0 else None
    result = trainer.train()
    assert sorted(hooked) == [0, 6, 12] and len(passes) == 3  # steps 0, 6 and 12, each validated once
    logged = {r["step"]: r["validation"] for r in result.history if "validation" in r}
    assert all(logged[step] == hooked[step][0] for step in hooked)
    passes.clear()
    trainer.validate(MagnitudeEncoder.load(result.best_dir), validation)  # outside train(): always computed
    assert len(passes) == 1


def test_validation_ranks_the_distractors_too(setup):
    """A wider pool (eval/probe_validation.py) can only push the positives down: a passage that repeats the
    query word for word outranks every positive under cosine."""
    trainer = Trainer(setup(strategy="cosine"))
    validation = load_training_data(trainer.config)[1]
    encoder = MagnitudeEncoder.build(None, "cosine")
    plain, plain_per_query = validation_module.validation_scores(encoder, validation)
    assert plain == trainer.validate(encoder, validation)
    echoes = [Passage(id=f"echo{i}", title="", text=triple.query) for i, triple in enumerate(validation)]
    widened, widened_per_query = validation_module.validation_scores(encoder, validation, echoes)
    assert plain["recall@1"] > 0 and widened["recall@1"] == 0
    assert all(w <= p for w, p in zip(widened_per_query, plain_per_query, strict=True))
    assert widened["ndcg@10"] < plain["ndcg@10"]


def test_val_corpus_widens_the_validation_pool_to_a_whole_corpus(setup, tmp_path, monkeypatch):
    """val_corpus's passages are read once and join every validation's pool; without it the pool is the
    validation triples' own passages."""
    corpus = [{"id": f"c{n}", "title": "madrid", "text": f"madrid is the capital of spain {n}"} for n in range(5)]
    write_jsonl(tmp_path / "corpus.jsonl", corpus)
    seen = []
    real = trainer_module.validation_scores

    def spy(encoder, validation, distractors=(), bf16=False):
        seen.append([p.id for p in distractors])
        return real(encoder, validation, distractors, bf16=bf16)

    monkeypatch.setattr(trainer_module, "validation_scores", spy)
    config = setup(val_corpus=str(tmp_path / "corpus.jsonl"))
    _, validation = load_training_data(config)
    encoder = tiny_encoder(tmp_path / "tok", "cosine")
    trainer = Trainer(config)
    trainer.validate(encoder, validation)
    trainer.step = 1  # another step: validated again, from the corpus read once
    trainer.validate(encoder, validation)
    Trainer(setup()).validate(encoder, validation)
    assert seen == [[f"c{n}" for n in range(5)]] * 2 + [[]]


def test_short_negatives_are_crops_of_other_queries_positives_and_train(setup):
    from rag_mag.data import read_triples
    from rag_mag.retriever.training.batches import SHORT_WORDS, make_batch

    config = setup(short_negatives=2, hard_negatives=1)
    triples = read_triples(config.train_data)
    batch = make_batch(triples, step=3, config=config)
    for triple, _, negatives in batch:
        crops = [n for n in negatives if "#short" in n.id]
        assert len(crops) == 2 and len(negatives) == 3
        own = {p.text for p in triple.positives}
        for crop in crops:
            assert len(crop.text.split()) <= SHORT_WORDS[1]
            assert not any(text.startswith(crop.text) for text in own)  # never a piece of the query's own answer
    assert make_batch(triples, step=3, config=config) == batch  # seeded by (seed, step): resuming replays it
    result = Trainer(setup(short_negatives=1, steps=6, eval_every=0, val_fraction=0.0)).train()
    assert [r["step"] for r in result.history if "loss" in r][-1] == 6
    with pytest.raises(ConfigError, match="short_negatives"):
        TrainConfig(short_negatives=-1)
