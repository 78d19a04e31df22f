"""Encoder: pooling, treatments, checkpoint round-trip and corrupt checkpoints (tiny random BERT)."""

import json

import numpy as np
import pytest
import torch

from rag_mag.errors import CheckpointError, ConfigError
from rag_mag.retriever.encoder import CONFIG_NAME, MagnitudeEncoder
from tests.tiny import tiny_encoder

TEXTS = ["the capital of france is paris", "who wrote the book", "a river in germany", "rome"]


def test_checkpoint_round_trip_gives_identical_embeddings(tmp_path):
    encoder = tiny_encoder(tmp_path, "learnable")
    with torch.no_grad():
        encoder.degrees.query_logit.fill_(1.3)  # a learned g that is not the initial 0.5
    encoder.config.document_norm_scale = 2.5
    before_q = encoder.encode(TEXTS, "query")
    before_d = encoder.encode(TEXTS, "document")
    encoder.save(tmp_path / "checkpoint")
    loaded = MagnitudeEncoder.load(tmp_path / "checkpoint")
    assert loaded.config.strategy == "learnable"
    assert loaded.degrees.as_floats() == pytest.approx(encoder.degrees.as_floats())
    np.testing.assert_array_equal(loaded.encode(TEXTS, "query"), before_q)
    np.testing.assert_array_equal(loaded.encode(TEXTS, "document"), before_d)


def test_encode_keeps_input_order_despite_length_sorting(tmp_path):
    encoder = tiny_encoder(tmp_path)
    together = encoder.encode(TEXTS, "document", batch_size=2, treated=False)
    one_by_one = np.stack([encoder.encode([text], "document", treated=False)[0] for text in TEXTS])
    np.testing.assert_allclose(together, one_by_one, atol=1e-5)


def test_treatment_per_side_follows_the_strategy(tmp_path):
    encoder = tiny_encoder(tmp_path, "qnorm")
    queries = encoder.encode(TEXTS, "query")
    documents = encoder.encode(TEXTS, "document")
    raw_documents = encoder.encode(TEXTS, "document", treated=False)
    np.testing.assert_allclose(np.linalg.norm(queries, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(documents, raw_documents)  # raw side, norm scale 1
    assert np.linalg.norm(documents, axis=1).std() > 1e-3


def test_cls_pooling_differs_from_mean(tmp_path):
    encoder = tiny_encoder(tmp_path)
    mean = encoder.encode(TEXTS, "document", treated=False)
    encoder.config.pooling = "cls"
    assert not np.allclose(mean, encoder.encode(TEXTS, "document", treated=False))


def test_missing_checkpoint_says_how_to_make_one(tmp_path):
    with pytest.raises(CheckpointError, match="rag-mag train"):
        MagnitudeEncoder.load(tmp_path / "nowhere")


def test_corrupt_config_is_reported(tmp_path):
    tiny_encoder(tmp_path).save(tmp_path / "checkpoint")
    (tmp_path / "checkpoint" / CONFIG_NAME).write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupt checkpoint config"):
        MagnitudeEncoder.load(tmp_path / "checkpoint")


def test_corrupt_weights_are_reported(tmp_path):
    tiny_encoder(tmp_path).save(tmp_path / "checkpoint")
    (tmp_path / "checkpoint" / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="corrupt checkpoint weights"):
        MagnitudeEncoder.load(tmp_path / "checkpoint")


def test_pickled_weights_are_refused_not_loaded(tmp_path):
    encoder = tiny_encoder(tmp_path)
    encoder.save(tmp_path / "checkpoint")
    (tmp_path / "checkpoint" / "model.safetensors").unlink()
    torch.save(encoder.model.state_dict(), tmp_path / "checkpoint" / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="no safetensors weights"):
        MagnitudeEncoder.load(tmp_path / "checkpoint")
    encoder.model.config.save_pretrained(tmp_path / "base")  # a base model folder whose weights are pickled
    encoder.tokenizer.save_pretrained(tmp_path / "base")
    torch.save(encoder.model.state_dict(), tmp_path / "base" / "pytorch_model.bin")
    with pytest.raises(ConfigError, match="no safetensors weights"):
        MagnitudeEncoder.build(str(tmp_path / "base"))


def test_unknown_strategy_in_a_checkpoint_is_reported(tmp_path):
    tiny_encoder(tmp_path).save(tmp_path / "checkpoint")
    config = json.loads((tmp_path / "checkpoint" / CONFIG_NAME).read_text())
    config["strategy"] = "manhattan"
    (tmp_path / "checkpoint" / CONFIG_NAME).write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="valid strategies"):
        MagnitudeEncoder.load(tmp_path / "checkpoint")


def test_save_replaces_an_existing_checkpoint_atomically(tmp_path):
    first = tiny_encoder(tmp_path, seed=1)
    first.save(tmp_path / "checkpoint")
    second = tiny_encoder(tmp_path, seed=2)
    second.save(tmp_path / "checkpoint")
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".checkpoint")]
    assert leftovers == []
    np.testing.assert_array_equal(MagnitudeEncoder.load(tmp_path / "checkpoint").encode(TEXTS, "query"),
                                  second.encode(TEXTS, "query"))


def test_length_buckets_give_the_same_embeddings_and_gradients(tmp_path):
    encoder = tiny_encoder(tmp_path)
    encoder.eval()  # no dropout, so both paths compute the same function
    texts = TEXTS * 3 + ["a much longer text about the war in the ocean and the mountain city of rome in italy"]
    one_batch = encoder.embed_documents(texts)
    bucketed = encoder.embed_documents(texts, bucket_size=4)
    torch.testing.assert_close(bucketed, one_batch, atol=1e-5, rtol=1e-4)
    bucketed.sum().backward()
    assert all(p.grad is not None for p in encoder.model.embeddings.parameters() if p.requires_grad)


def test_bf16_encoding_stays_close_to_fp32(tmp_path):
    encoder = tiny_encoder(tmp_path, "qnorm")
    full = encoder.encode(TEXTS, "document", treated=False)
    half = encoder.encode(TEXTS, "document", treated=False, bf16=True)
    cosines = (full * half).sum(1) / (np.linalg.norm(full, axis=1) * np.linalg.norm(half, axis=1))
    assert cosines.min() > 0.995
    np.testing.assert_allclose(np.linalg.norm(half, axis=1), np.linalg.norm(full, axis=1), rtol=0.03)
