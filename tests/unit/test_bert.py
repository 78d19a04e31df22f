"""The inference BERT (rag_mag.retriever.bert) against transformers' BertModel on the same checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rag_mag.errors import CheckpointError
from rag_mag.models import default_retriever_base
from rag_mag.retriever import bert
from rag_mag.retriever.encoder import MagnitudeEncoder
from tests.tiny import tiny_encoder

TEXTS = ["what is the capital of france", "", "Paris ist die Hauptstadt Frankreichs — 2,1 Mio. Einwohner.",
         "the " * 300, "rome", "王国的首都 is berlin?", "a\tb\nc  d", "London was born in 1066 of England"]


def both(folder):
    return MagnitudeEncoder.load(folder), MagnitudeEncoder.load(folder, inference=True)


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    """The packaged all-MiniLM-L6-v2 saved as a rag-mag checkpoint with a qnorm treatment."""
    folder = tmp_path_factory.mktemp("minilm")
    encoder = MagnitudeEncoder.build(default_retriever_base(), strategy="qnorm", document_max_length=64)
    encoder.config.document_norm_scale = 2.5
    encoder.save(folder)
    return folder


def test_the_inference_model_is_not_transformers(minilm):
    reference, fast = both(minilm)
    assert isinstance(fast.model, bert.BertModel)
    assert not isinstance(reference.model, bert.BertModel)


@pytest.mark.parametrize("max_length", [8, 32, 64])
def test_token_ids_match_transformers(minilm, max_length):
    reference, fast = both(minilm)
    for pad in (None, 8):
        ours = fast.tokenize(TEXTS, max_length, pad_to_multiple_of=pad)
        theirs = reference.tokenize(TEXTS, max_length, pad_to_multiple_of=pad)
        assert set(ours) == set(theirs)
        for name in theirs:
            assert torch.equal(ours[name], theirs[name]), name
    unpadded = fast.tokenizer(TEXTS, truncation=True, max_length=max_length)["input_ids"]
    assert unpadded == reference.tokenizer(TEXTS, truncation=True, max_length=max_length)["input_ids"]
    assert all(ids[-1] == 102 for ids in unpadded)  # [SEP] survives truncation


@pytest.mark.parametrize("side", ["query", "document"])
def test_embeddings_match_transformers_on_minilm(minilm, side):
    reference, fast = both(minilm)
    for treated in (True, False):
        theirs = reference.encode(TEXTS, side, batch_size=3, treated=treated)
        ours = fast.encode(TEXTS, side, batch_size=3, treated=treated)
        np.testing.assert_allclose(ours, theirs, atol=2e-5, rtol=1e-5)


def test_bf16_embeddings_stay_close(minilm):
    reference, fast = both(minilm)
    theirs = reference.encode(TEXTS, "document", bf16=True)
    ours = fast.encode(TEXTS, "document", bf16=True)
    cosine = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    assert cosine.min() > 0.999


def test_a_random_bert_matches_too(tmp_path):
    folder = tmp_path / "tiny"
    tiny_encoder(tmp_path, strategy="dot", seed=3).save(folder)
    reference, fast = both(folder)
    texts = ["the capital of france is paris", "who wrote the book", "berlin"]
    np.testing.assert_allclose(fast.encode(texts, "query"), reference.encode(texts, "query"), atol=1e-5)


def test_an_inference_encoder_refuses_to_save(minilm, tmp_path):
    _, fast = both(minilm)
    with pytest.raises(CheckpointError, match="inference only"):
        fast.save(tmp_path / "copy")
    assert not (tmp_path / "copy").exists()


def test_a_checkpoint_it_does_not_describe_loads_with_transformers(minilm, tmp_path):
    folder = tmp_path / "relative"
    folder.mkdir()
    for file in minilm.iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    config["position_embedding_type"] = "relative_key"
    (folder / "config.json").write_text(json.dumps(config))
    assert not bert.supports(folder)
    assert bert.supports(minilm)
    assert not isinstance(MagnitudeEncoder.load(folder, inference=True).model, bert.BertModel)


def test_missing_tensors_are_a_corrupt_checkpoint(minilm, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "cut"
    folder.mkdir()
    for file in minilm.iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    weights = load_file(folder / "model.safetensors")
    del weights["encoder.layer.3.output.dense.weight"]
    save_file(weights, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match="corrupt checkpoint weights.*layer.3.output.dense.weight"):
        MagnitudeEncoder.load(folder, inference=True)
