"""Fine-tuning recipes that keep the base model: partial fine-tuning, L2-SP toward the start, distillation of the
start's rankings, WiSE-FT."""

from __future__ import annotations

import pytest
import torch

from rag_mag.data import write_jsonl
from rag_mag.errors import CheckpointError, ConfigError
from rag_mag.retriever.encoder import MagnitudeEncoder
from rag_mag.retriever.interpolate import interpolate
from rag_mag.retriever.training.config import TrainConfig
from rag_mag.retriever.training.recipes import freeze_below_top_layers, layer_index, ranking_divergence
from rag_mag.retriever.training.trainer import Trainer
from tests.tiny import capital_triples, tiny_encoder


@pytest.fixture
def setup(tmp_path, monkeypatch):
    write_jsonl(tmp_path / "train.jsonl", capital_triples())
    monkeypatch.setattr(MagnitudeEncoder, "build",
                        classmethod(lambda cls, base, strategy, *a, **k: tiny_encoder(tmp_path / "tok", strategy)))
    base = tmp_path / "base"
    tiny_encoder(tmp_path / "tok").model.save_pretrained(base)  # the weights build() starts from (seed 0)

    def make(**overrides):
        values = dict(train_data=str(tmp_path / "train.jsonl"), out=str(tmp_path / "run"), steps=10, batch_size=8,
                      learning_rate=1e-3, eval_every=0, val_fraction=0.0, warmup_ratio=0.0, calibration_samples=8,
                      base_model=str(base), wise_alpha=1.0)  # each recipe alone; WiSE-FT where a test asks
        values.update(overrides)
        return TrainConfig(**values)

    return make


def _weights(folder) -> dict[str, torch.Tensor]:
    return {name: value.clone() for name, value in MagnitudeEncoder.load(folder).model.state_dict().items()}


def test_layer_index_reads_bert_and_llama_names():
    assert layer_index("encoder.layer.3.attention.self.query.weight") == 3
    assert layer_index("model.layers.11.mlp.up_proj.weight") == 11
    assert layer_index("embeddings.word_embeddings.weight") is None


def test_partial_fine_tuning_changes_only_the_top_layers(setup, tmp_path):
    start = tiny_encoder(tmp_path / "tok").model.state_dict()
    result = Trainer(setup(train_layers=1)).train()
    trained = _weights(result.best_dir)
    changed = {name for name in start if not torch.equal(start[name], trained[name])}
    assert changed and all(layer_index(name) == 1 for name in changed)  # the tiny BERT has layers 0 and 1
    assert torch.equal(start["embeddings.word_embeddings.weight"], trained["embeddings.word_embeddings.weight"])


def test_l2sp_keeps_the_weights_near_their_start(setup, tmp_path):
    start = tiny_encoder(tmp_path / "tok").model.state_dict()

    def drift(folder) -> float:
        trained = _weights(folder)
        return sum(float((trained[n] - start[n]).pow(2).sum()) for n in start if start[n].is_floating_point())

    free = drift(Trainer(setup(out=str(tmp_path / "free"))).train().best_dir)
    anchored = drift(Trainer(setup(out=str(tmp_path / "anchored"), anchor_weight=900.0)).train().best_dir)
    assert anchored < 0.5 * free


def test_ranking_divergence_is_zero_only_for_the_same_ranking_and_skips_excluded_candidates():
    teacher = torch.tensor([[0.9, 0.1, 0.3], [0.2, 0.8, 0.5]])
    assert float(ranking_divergence(teacher, teacher, 0.05)) == pytest.approx(0.0, abs=1e-6)
    swapped = teacher[:, [1, 0, 2]]
    assert float(ranking_divergence(swapped, teacher, 0.05)) > 1.0
    excluded = torch.tensor([[False, False, True], [False, False, True]])
    changed_only_there = teacher.clone()
    changed_only_there[:, 2] = -5.0
    masked = ranking_divergence(changed_only_there, teacher, 0.05, excluded)
    assert torch.isfinite(masked) and float(masked) == pytest.approx(0.0, abs=1e-6)


def test_distillation_keeps_the_starting_rankings(setup, tmp_path):
    triples = capital_triples()
    start = tiny_encoder(tmp_path / "tok", "cosine")

    def divergence(folder) -> float:
        trained = MagnitudeEncoder.load(folder)
        with torch.no_grad():
            queries = [t["query"] for t in triples]
            passages = [t["positives"][0]["text"] for t in triples]
            scores = [e.treat_queries(e.embed_queries(queries)) @ e.treat_documents(e.embed_documents(passages)).T
                      for e in (trained, start)]
        return float(ranking_divergence(scores[0], scores[1], 0.05))

    free = divergence(Trainer(setup(out=str(tmp_path / "free"), strategy="cosine")).train().best_dir)
    kept = divergence(Trainer(setup(out=str(tmp_path / "kept"), strategy="cosine", distill_weight=20.0)).train()
                      .best_dir)
    assert kept < 0.5 * free


def test_wise_alpha_publishes_the_interpolation_and_trains_on_the_trained_weights(setup, tmp_path):
    start = tiny_encoder(tmp_path / "tok", "cosine").model.state_dict()
    handed: dict[int, dict] = {}

    def hook(step, encoder):
        handed[step] = {name: value.clone() for name, value in encoder.model.state_dict().items()}

    result = Trainer(setup(strategy="cosine", wise_alpha=0.5), on_step=hook).train()
    best, last = _weights(result.best_dir), _weights(result.last_dir)
    floats = [name for name in start if start[name].is_floating_point()]
    assert any(not torch.equal(last[name], start[name]) for name in floats)  # it trained
    for name in floats:  # best/ (no validation: the final model) is the midpoint; last/ keeps the trained weights
        assert torch.allclose(best[name], 0.5 * start[name] + 0.5 * last[name], atol=1e-6)
    assert all(torch.allclose(handed[0][name], start[name]) for name in floats)  # the hook saw the start at step 0
    assert all(torch.allclose(handed[10][name], best[name], atol=1e-6) for name in floats)
    assert MagnitudeEncoder.load(result.best_dir).config.training["wise_ft"]["alpha"] == 0.5


@pytest.mark.parametrize("field, value, message", [("train_layers", -1, "train_layers"),
                                                    ("wise_alpha", 0.0, "wise_alpha"),
                                                    ("wise_alpha", 1.5, "wise_alpha"),
                                                    ("anchor_weight", -1.0, "anchor_weight"),
                                                    ("distill_weight", -0.5, "distill_weight"),
                                                    ("distill_weight", float("nan"), "distill_weight"),
                                                    ("anchor_weight", 2000.0, "overshoot")])
def test_bad_recipe_settings_are_refused(field, value, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**{field: value, "learning_rate": 1e-3})


def test_more_top_layers_than_the_model_has_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="has 2 layers"):
        freeze_below_top_layers(tiny_encoder(tmp_path).model, 3)


def test_wise_ft_is_the_straight_line_between_base_and_tuned(tmp_path):
    base = tiny_encoder(tmp_path / "a", "learnable", seed=0)
    tuned = tiny_encoder(tmp_path / "b", "learnable", seed=1)
    tuned.config.query_degree = 0.9
    tuned = MagnitudeEncoder(tuned.model, tuned.tokenizer, tuned.config)
    name = "encoder.layer.0.attention.self.query.weight"
    b, t = base.model.state_dict()[name], tuned.model.state_dict()[name]
    for alpha, expected in ((0.0, b), (1.0, t), (0.25, 0.75 * b + 0.25 * t)):
        mixed = interpolate(tuned, base.model, alpha)
        assert torch.allclose(mixed.model.state_dict()[name], expected, atol=1e-6)
    half = interpolate(tuned, base.model, 0.5)
    assert half.degrees.as_floats()[0] == pytest.approx(0.7, abs=1e-4)  # from 0.5 (learnable's start) to 0.9
    assert tuned.degrees.as_floats()[0] == pytest.approx(0.9, abs=1e-4)  # the tuned encoder is left as it was


def test_wise_ft_refuses_a_bad_alpha_and_another_base(tmp_path):
    tuned = tiny_encoder(tmp_path / "a")
    with pytest.raises(ConfigError, match="alpha"):
        interpolate(tuned, tiny_encoder(tmp_path / "b").model, 1.5)
    with pytest.raises(CheckpointError, match="not trained from this base"):
        interpolate(tuned, tiny_encoder(tmp_path / "c", hidden_size=16).model, 0.5)


def test_rag_mag_interpolate_writes_the_mixed_checkpoint_and_records_alpha(tmp_path, capsys):
    import json

    from rag_mag.cli.main import main

    tiny_encoder(tmp_path / "t0", seed=0).model.save_pretrained(tmp_path / "base")
    tuned = tiny_encoder(tmp_path / "t1", seed=1).save(tmp_path / "tuned")
    flags = ["interpolate", "--retriever", str(tuned), "--base-model", str(tmp_path / "base"), "--out"]
    assert main(flags + [str(tmp_path / "mixed"), "--alpha", "0.5"]) == 0
    mixed = MagnitudeEncoder.load(tmp_path / "mixed")
    name = "encoder.layer.1.output.dense.weight"
    expected = 0.5 * (tiny_encoder(tmp_path / "t0", seed=0).model.state_dict()[name]
                      + MagnitudeEncoder.load(tuned).model.state_dict()[name])
    assert torch.allclose(mixed.model.state_dict()[name], expected, atol=1e-6)
    assert json.loads((tmp_path / "mixed" / "rag_mag.json").read_text())["training"]["wise_ft"]["alpha"] == 0.5
    capsys.readouterr()
    assert main(flags + [str(tmp_path / "bad"), "--alpha", "-0.1"]) == 2
    assert "alpha must be a number in [0, 1]" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    # a checkpoint that is itself WiSE-FT (best/ under the default recipe) is not mixed a second time
    again = ["interpolate", "--retriever", str(tmp_path / "mixed"), "--base-model", str(tmp_path / "base"),
             "--out", str(tmp_path / "twice"), "--alpha", "0.5"]
    assert main(again) == 2
    assert "already WiSE-FT at alpha 0.5" in capsys.readouterr().err and not (tmp_path / "twice").exists()
