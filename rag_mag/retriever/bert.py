"""A BERT encoder for inference, in plain torch, that loads a checkpoint without importing transformers.

Importing transformers' BERT costs about 2.4 s of every command that loads a retriever (its import pulls
in torch.distributed.tensor and the hub-kernel integrations), against 0.1 s for the weights themselves.
``load(folder)`` reads the same ``model.safetensors`` and ``tokenizer.json`` into the modules below, whose
parameter names are those of ``transformers.BertModel``; ``tests/unit/test_bert.py`` checks that the two
give the same hidden states. Training, and any checkpoint this module does not describe (``supports``),
keep using transformers.
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional

from rag_mag.errors import CheckpointError

WEIGHTS_NAME = "model.safetensors"
TOKENIZER_NAME = "tokenizer.json"
UNUSED_WEIGHTS = ("pooler.",)  # BertModel's pooler: rag-mag pools the hidden states itself


@dataclass(frozen=True)
class BertConfig:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float


def supports(folder: Path) -> bool:
    """Whether ``folder`` holds a plain BERT (absolute positions, exact GELU) with a fast tokenizer."""
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return (raw.get("model_type") == "bert" and raw.get("hidden_act") == "gelu"
            and raw.get("position_embedding_type", "absolute") == "absolute" and not raw.get("is_decoder")
            and (folder / WEIGHTS_NAME).is_file() and (folder / TOKENIZER_NAME).is_file())


class Linear(nn.Linear):
    """``nn.Linear`` without its random initialisation: every weight comes from the checkpoint (``load``), and
    initialising MiniLM's 22M parameters first was 0.1 s of each load."""

    def reset_parameters(self) -> None:
        pass


class Embedding(nn.Embedding):
    """``nn.Embedding`` without its random initialisation, as ``Linear``."""

    def reset_parameters(self) -> None:
        pass


class Output(NamedTuple):
    last_hidden_state: torch.Tensor


class Embeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        summed = (self.word_embeddings(input_ids) + self.position_embeddings(positions)[None]
                  + self.token_type_embeddings(token_type_ids))
        return self.LayerNorm(summed)


class SelfAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.heads = config.num_attention_heads
        self.query = Linear(config.hidden_size, config.hidden_size)
        self.key = Linear(config.hidden_size, config.hidden_size)
        self.value = Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = hidden.shape

        def heads(layer: nn.Linear) -> torch.Tensor:  # (batch, heads, tokens, head width)
            return layer(hidden).view(batch, tokens, self.heads, width // self.heads).transpose(1, 2)

        context = functional.scaled_dot_product_attention(heads(self.query), heads(self.key), heads(self.value),
                                                          attn_mask=mask, scale=1 / math.sqrt(width // self.heads))
        return context.transpose(1, 2).reshape(batch, tokens, width)


class Residual(nn.Module):
    """A dense layer, then LayerNorm over its output plus the block's input (BERT's "output" modules)."""

    def __init__(self, width_in: int, width_out: int, eps: float) -> None:
        super().__init__()
        self.dense = Linear(width_in, width_out)
        self.LayerNorm = nn.LayerNorm(width_out, eps=eps)

    def forward(self, hidden: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(hidden) + skip)


class Attention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = SelfAttention(config)
        self.output = Residual(config.hidden_size, config.hidden_size, config.layer_norm_eps)


class Intermediate(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = Linear(config.hidden_size, config.intermediate_size)


class Layer(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = Attention(config)
        self.intermediate = Intermediate(config)
        self.output = Residual(config.intermediate_size, config.hidden_size, config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        attended = self.attention.output(self.attention.self(hidden, mask), hidden)
        return self.output(functional.gelu(self.intermediate.dense(attended)), attended)


class Stack(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(Layer(config) for _ in range(config.num_hidden_layers))


class BertModel(nn.Module):
    """``transformers.BertModel`` without its pooler, dropout or caches: the forward pass of inference."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = Stack(config)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> Output:
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        hidden = self.embeddings(input_ids, token_type_ids)
        mask = attention_mask.bool()[:, None, None, :]  # (batch, 1, 1, keys): True where a key may be attended
        for layer in self.encoder.layer:
            hidden = layer(hidden, mask)
        return Output(hidden)


class Tokenizer:
    """The checkpoint's fast tokenizer, called the way ``MagnitudeEncoder`` calls transformers' one."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as RustTokenizer

        self.backend = RustTokenizer.from_file(str(path))
        saved = (self.backend.padding or {}).get("pad_token", "[PAD]")
        self.pad_token, self.pad_id = saved, self.backend.token_to_id(saved)
        if self.pad_id is None:
            raise CheckpointError(f"the tokenizer {path} has no padding token {saved!r}")
        self._lock = threading.Lock()  # truncation and padding are the backend's state, set per call

    def __call__(self, texts: list[str], padding: bool = False, truncation: bool = False,
                 max_length: int | None = None, pad_to_multiple_of: int | None = None,
                 return_tensors: str | None = None) -> dict:
        with self._lock:
            if truncation and max_length:  # counted with [CLS] and [SEP], which stay
                self.backend.enable_truncation(max_length)
            else:
                self.backend.no_truncation()
            if padding:
                self.backend.enable_padding(pad_id=self.pad_id, pad_token=self.pad_token,
                                            pad_to_multiple_of=pad_to_multiple_of)
            else:
                self.backend.no_padding()
            encodings = self.backend.encode_batch(list(texts))
        if not padding:
            return {"input_ids": [encoding.ids for encoding in encodings]}
        return {"input_ids": torch.tensor([encoding.ids for encoding in encodings], dtype=torch.long),
                "token_type_ids": torch.tensor([encoding.type_ids for encoding in encodings], dtype=torch.long),
                "attention_mask": torch.tensor([encoding.attention_mask for encoding in encodings], dtype=torch.long)}


def load(folder: Path) -> tuple[BertModel, Tokenizer]:
    """The model (in eval mode) and tokenizer of a checkpoint folder that ``supports`` describes."""
    from safetensors.torch import load_file

    raw = json.loads((folder / "config.json").read_text())
    config = BertConfig(**{name: raw[name] for name in BertConfig.__dataclass_fields__})
    model = BertModel(config)
    weights = {name: tensor for name, tensor in load_file(folder / WEIGHTS_NAME).items()
               if not name.startswith(UNUSED_WEIGHTS)}
    missing, unexpected = model.load_state_dict(weights, strict=False, assign=True)
    if missing or unexpected:
        raise CheckpointError(f"corrupt checkpoint weights in {folder}: missing {missing[:3]}, unexpected "
                              f"{unexpected[:3]}. Retrain or restore the folder from a backup")
    return model.eval(), Tokenizer(folder / TOKENIZER_NAME)
