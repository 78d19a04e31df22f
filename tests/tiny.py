"""Tiny randomly initialised models built in the test process (no files, no hub): a BERT encoder, and a Llama
reader with a LoRA adapter for the merge."""

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


def tiny_llama(seed: int = 0):
    """A 2-layer, 32-dim Llama over 97 tokens with random weights (the reader's architecture, small)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=True)
    return LlamaForCausalLM(config)


def tiny_reader_adapter(folder: Path):
    """A tiny Llama with its tokenizer saved in ``folder/base`` and a LoRA adapter (random, non-zero B, with
    checksums) in ``folder/adapter``, as ``merge_reader`` takes them; returns (base, adapter, the PEFT model)."""
    from peft import LoraConfig, get_peft_model
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from rag_mag.reader.merge import write_checksums

    base_dir, adapter_dir = folder / "base", folder / "adapter"
    tiny_llama().save_pretrained(base_dir)
    vocab = {f"t{i}": i for i in range(97)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")))
    tokenizer.save_pretrained(base_dir)
    peft_model = get_peft_model(tiny_llama(), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)  # a trained adapter's B is not zero
    peft_model.save_pretrained(adapter_dir)
    write_checksums(adapter_dir)
    return base_dir, adapter_dir, peft_model


def paris_index(root: Path) -> Path:
    """``root/index-qnorm``: a one-passage corpus ("paris is in france") indexed with a tiny qnorm retriever saved
    at ``root/retriever-qnorm``, through pipelines/indexing.yaml; the demo's fault tests serve it."""
    import json

    from rag_mag.serving.pipelines import PIPELINES_DIR, load_pipeline, run_pipeline

    (root / "corpus.jsonl").write_text(json.dumps({"id": "p0", "title": "Paris", "text": "paris is in france"}) + "\n")
    checkpoint = tiny_encoder(root / "tok", "qnorm", seed=1).save(root / "retriever-qnorm")
    run_pipeline(load_pipeline(PIPELINES_DIR / "indexing.yaml", {
        "corpus": str(root / "corpus.jsonl"), "retriever": str(checkpoint), "out": str(root / "index-qnorm"),
        "embedder.progress_bar": False}), {})
    return root / "index-qnorm"
