"""A tiny randomly initialised BERT encoder built in the test process (no files, no hub)."""

from __future__ import annotations

import string
from pathlib import Path

import torch

from rag_mag.retriever.encoder import EncoderConfig, MagnitudeEncoder
from rag_mag.retriever.strategies import initial_degrees

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def tiny_tokenizer(folder: Path):
    from transformers import BertTokenizerFast

    words = sorted({w for w in ("the a of in is was who what which where when how capital city river paris france "
                                "london england berlin germany rome italy born wrote book film song king queen "
                                "year war ocean mountain").split()} - set(string.ascii_lowercase))
    pieces = [f"##{c}" for c in string.ascii_lowercase]
    vocab = SPECIAL + list(string.ascii_lowercase) + list(string.digits) + words + pieces
    folder.mkdir(parents=True, exist_ok=True)
    return BertTokenizerFast(vocab={token: i for i, token in enumerate(vocab)}, do_lower_case=True)


def tiny_encoder(folder: Path, strategy: str = "cosine", seed: int = 0, hidden_size: int = 32,
                 dropout: float = 0.1) -> MagnitudeEncoder:
    """A 2-layer, 32-dim BERT with random weights, wrapped as a MagnitudeEncoder (``dropout``: BERT's 0.1)."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    tokenizer = tiny_tokenizer(folder / "tokenizer")
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=hidden_size, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=128,
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    model = BertModel(config)
    query_degree, document_degree = initial_degrees(strategy)
    encoder_config = EncoderConfig(base_model="tiny-random-bert", strategy=strategy, query_max_length=16,
                                   document_max_length=48, query_degree=query_degree,
                                   document_degree=document_degree)
    return MagnitudeEncoder(model, tokenizer, encoder_config)


TOPICS = [("paris", "france"), ("london", "england"), ("berlin", "germany"), ("rome", "italy")]


def capital_triples() -> list[dict]:
    """24 training triples the tiny BERT can learn: "capital of COUNTRY" -> "CITY is the capital of COUNTRY",
    with the next topic's city as the hard negative."""
    rows = []
    for i, (city, country) in enumerate(TOPICS * 6):
        other_city, other_country = TOPICS[(i + 1) % len(TOPICS)]
        rows.append({"id": f"q{i}", "query": f"what is the capital of {country} {i % 6}",
                     "positives": [{"id": f"p{i}", "title": city, "text": f"{city} is the capital of {country}"}],
                     "hard_negatives": [{"id": f"n{i}", "title": other_city,
                                         "text": f"{other_city} is a city in {other_country}"}]})
    return rows
