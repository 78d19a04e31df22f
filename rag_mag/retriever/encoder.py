"""The magnitude-aware encoder: a Hugging Face transformer, a pooling, and per-side treatment.

``MagnitudeEncoder.build()`` makes a fresh one for training, ``load()`` / ``save()`` read and write a
checkpoint folder: the transformer as safetensors, its tokenizer, and ``rag_mag.json`` (strategy,
learned degrees, norm scales, pooling, base model, lengths). The encoder knows nothing of the loss,
the trainer or Haystack.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from rag_mag import durable
from rag_mag.errors import CheckpointError, ConfigError
from rag_mag.retriever import bert
from rag_mag.retriever.strategies import DegreeParameters, SideTreatment, Strategy, treat

logger = logging.getLogger(__name__)

CONFIG_NAME = "rag_mag.json"
POOLINGS = ("mean", "cls")
FORMAT_VERSION = 1


def _refuse_pickled_weights(model: str | os.PathLike, error: type[Exception]) -> None:
    """Weights load from safetensors only: a local folder with pickled ones (``pytorch_model.bin``) is refused."""
    folder = Path(model)
    if folder.is_dir() and not any(folder.glob("*.safetensors")):
        raise error(f"{folder} holds no safetensors weights (model.safetensors); rag-mag never unpickles "
                    "weights from a path. Convert a copy you trust with transformers: "
                    "`AutoModel.from_pretrained(FOLDER).save_pretrained(FOLDER)` writes safetensors")


@dataclass
class EncoderConfig:
    """Everything needed to rebuild an encoder for inference (saved as ``rag_mag.json``)."""

    base_model: str
    strategy: str = "cosine"
    pooling: str = "mean"
    query_max_length: int = 32
    document_max_length: int = 128
    query_degree: float = 1.0
    document_degree: float = 1.0
    query_norm_scale: float = 1.0
    document_norm_scale: float = 1.0
    temperature: float = 0.05
    training: dict = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        self.strategy = Strategy.parse(self.strategy).value
        if self.pooling not in POOLINGS:
            raise ConfigError(f"unknown pooling {self.pooling!r}; valid poolings are: {', '.join(POOLINGS)}")
        for name in ("query_max_length", "document_max_length"):
            if int(getattr(self, name)) < 2:
                raise ConfigError(f"{name} must be at least 2, got {getattr(self, name)}")
        for name in ("query_norm_scale", "document_norm_scale", "temperature"):
            value = float(getattr(self, name))
            if not np.isfinite(value) or value <= 0:
                raise ConfigError(f"{name} must be a positive finite number, got {value}")


class MagnitudeEncoder(torch.nn.Module):
    """One shared transformer for queries and documents, with its own length limit per side."""

    def __init__(self, model: torch.nn.Module, tokenizer, config: EncoderConfig) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.degrees = DegreeParameters(config.strategy, config.query_degree, config.document_degree)
        # One encoder is shared by every embedder of a process (the demo serves requests from many
        # threads), and a fast tokenizer must not be used by two threads at once.
        self._inference_lock = threading.Lock()

    # ----------------------------------------------------------------- construction
    @classmethod
    def build(cls, base_model: str | None = None, strategy: str = "cosine", pooling: str = "mean",
              query_max_length: int = 32, document_max_length: int = 128, temperature: float = 0.05,
              ) -> MagnitudeEncoder:
        """A fresh encoder from a local folder or hub id (default: the packaged all-MiniLM-L6-v2)."""
        from transformers import AutoModel, AutoTokenizer

        from rag_mag.models import default_retriever_base

        base_model = base_model or default_retriever_base()
        strategy = Strategy.parse(strategy)
        query_degree, document_degree = DegreeParameters(strategy).as_floats()
        config = EncoderConfig(base_model=base_model, strategy=strategy.value, pooling=pooling,
                               query_max_length=query_max_length, document_max_length=document_max_length,
                               query_degree=query_degree, document_degree=document_degree,
                               temperature=temperature)
        _refuse_pickled_weights(base_model, ConfigError)
        try:
            # AutoModel loads the bare transformer: a sentence-transformers Normalize module is not applied.
            model = AutoModel.from_pretrained(base_model, use_safetensors=True)
            tokenizer = AutoTokenizer.from_pretrained(base_model)
        except OSError as error:
            raise ConfigError(f"cannot load base model {base_model!r}: {error}. Give a local model folder, or a "
                              "hub id on a machine that can reach the hub.") from None
        return cls(model, tokenizer, config)

    @classmethod
    def load(cls, path: str | os.PathLike, inference: bool = False) -> MagnitudeEncoder:
        """Load a checkpoint folder written by ``save``; fails clearly if it is missing or corrupt.

        ``inference=True`` reads a BERT checkpoint into ``rag_mag.retriever.bert`` (the same forward pass
        without importing transformers, about 2 s faster): such an encoder embeds but cannot be trained or saved.
        """
        folder = resolve_checkpoint_dir(path)
        config_file = folder / CONFIG_NAME
        if not folder.is_dir():
            raise CheckpointError(f"retriever checkpoint {folder} does not exist; train one with "
                                  "`rag-mag train --out DIR` or pass the right --retriever folder")
        if not config_file.is_file():
            raise CheckpointError(f"{folder} is not a rag-mag checkpoint: {CONFIG_NAME} is missing")
        try:
            raw = json.loads(config_file.read_text())
            config = EncoderConfig(**raw)
        except (json.JSONDecodeError, TypeError, ConfigError, ValueError) as error:
            raise CheckpointError(f"corrupt checkpoint config {config_file}: {error}") from None
        _refuse_pickled_weights(folder, CheckpointError)
        try:
            if inference and bert.supports(folder):
                model, tokenizer = bert.load(folder)
            else:
                from transformers import AutoModel, AutoTokenizer

                model = AutoModel.from_pretrained(folder, use_safetensors=True)
                tokenizer = AutoTokenizer.from_pretrained(folder)
        except CheckpointError:
            raise
        except Exception as error:  # transformers and safetensors raise many types for a damaged folder
            raise CheckpointError(f"corrupt checkpoint weights in {folder}: {error}. Retrain or restore "
                                  "the folder from a backup") from None
        encoder = cls(model, tokenizer, config)
        encoder.eval()
        return encoder

    def save(self, path: str | os.PathLike) -> Path:
        """Write the checkpoint atomically: a synced staging folder that replaces ``path`` in one rename."""
        target = Path(path)
        what = f"the checkpoint {target}"
        durable.ensure_free_space(target.parent, self.weight_bytes(), what)
        staging = durable.staging_dir(target)
        try:
            with durable.disk_full_as_error(target, what):
                self.write_files(staging)
                durable.sync_tree(staging)
                durable.replace_dir(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target

    def weight_bytes(self) -> int:
        """The size of the weights as saved (a lower bound of a checkpoint folder's size)."""
        return sum(tensor.numel() * tensor.element_size() for tensor in self.model.state_dict().values())

    def write_files(self, folder: str | os.PathLike) -> None:
        """Write weights, tokenizer and ``rag_mag.json`` into an existing folder (no swap, no fsync)."""
        folder = Path(folder)
        if not hasattr(self.model, "save_pretrained"):
            raise CheckpointError("this encoder was loaded for inference only; load the checkpoint with "
                                  "MagnitudeEncoder.load(path) to train or save it")
        self.config.query_degree, self.config.document_degree = self.degrees.as_floats()
        self.model.save_pretrained(folder, safe_serialization=True)
        self.tokenizer.save_pretrained(folder)
        (folder / CONFIG_NAME).write_text(json.dumps(asdict(self.config), indent=2))

    # ----------------------------------------------------------------- treatments
    def query_treatment(self) -> SideTreatment:
        return SideTreatment(self.degrees.as_floats()[0], self.config.query_norm_scale)

    def document_treatment(self) -> SideTreatment:
        return SideTreatment(self.degrees.as_floats()[1], self.config.document_norm_scale)

    def treat_queries(self, embeddings: torch.Tensor) -> torch.Tensor:
        """Differentiable in g (used by the trainer)."""
        return treat(embeddings, self.degrees.degrees()[0], self.config.query_norm_scale)

    def treat_documents(self, embeddings: torch.Tensor) -> torch.Tensor:
        return treat(embeddings, self.degrees.degrees()[1], self.config.document_norm_scale)

    # ----------------------------------------------------------------- forward
    def tokenize(self, texts: Sequence[str], max_length: int, pad_to_multiple_of: int | None = None
                 ) -> dict[str, torch.Tensor]:
        """Dynamic padding: the batch is padded to its own longest text (rounded up to a multiple of
        ``pad_to_multiple_of`` if given), not to ``max_length``."""
        batch = self.tokenizer(list(texts), padding=True, truncation=True, max_length=max_length,
                               pad_to_multiple_of=pad_to_multiple_of, return_tensors="pt")
        return {name: tensor.to(self.device) for name, tensor in batch.items()}

    @property
    def device(self) -> torch.device:
        """Where the transformer's weights are (``encoder.to(device)`` moves it)."""
        return next(self.model.parameters()).device

    def pool(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Raw pooled embeddings (batch, dim): no normalization, the magnitude is kept."""
        hidden = self.model(**batch).last_hidden_state  # (batch, tokens, dim)
        if self.config.pooling == "cls":
            return hidden[:, 0]
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (batch, tokens, 1)
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)

    def embed_queries(self, texts: Sequence[str], bucket_size: int = 0) -> torch.Tensor:
        return self.embed_bucketed(texts, self.config.query_max_length, bucket_size)

    def embed_documents(self, texts: Sequence[str], bucket_size: int = 0) -> torch.Tensor:
        return self.embed_bucketed(texts, self.config.document_max_length, bucket_size)

    def embed_bucketed(self, texts: Sequence[str], max_length: int, bucket_size: int = 0) -> torch.Tensor:
        """Raw pooled embeddings (n, dim), differentiable, in the order given.

        With ``bucket_size`` > 0 the texts are sorted by token length and run in chunks of that size, each
        padded only to its own longest text: most tokens of a mixed batch are otherwise padding.
        """
        texts = list(texts)
        if bucket_size <= 0 or len(texts) <= bucket_size:
            return self.pool(self.tokenize(texts, max_length))
        lengths = [len(ids) for ids in self.tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]]
        order = sorted(range(len(texts)), key=lengths.__getitem__)
        chunks = [self.pool(self.tokenize([texts[i] for i in order[start:start + bucket_size]], max_length))
                  for start in range(0, len(texts), bucket_size)]
        inverse = torch.empty(len(order), dtype=torch.long, device=self.device)
        inverse[torch.tensor(order, device=self.device)] = torch.arange(len(order), device=self.device)
        return torch.cat(chunks)[inverse]

    @torch.inference_mode()
    def encode(self, texts: Sequence[str], side: str, batch_size: int = 64, treated: bool = True,
               show_progress: bool = False, bf16: bool = False) -> np.ndarray:
        """Embed many texts for inference: (n, dim) float32, in the order given.

        Texts are sorted by length so each batch holds similar lengths (little padding), then the
        original order is restored. ``treated=False`` returns the raw pooled vectors. ``bf16`` runs the
        transformer under bfloat16 autocast on its device: about 2.8x faster on CPUs with avx512_bf16, with
        embeddings within 1e-4 in cosine and 0.5% in norm of fp32 (eval/README.md). Callers decide with
        ``rag_mag.precision.use_bf16(precision, encoder.device)``.
        """
        if side not in ("query", "document"):
            raise ValueError(f"side must be 'query' or 'document', got {side!r}")
        with self._inference_lock, torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16):
            return self._encode(list(texts), side, batch_size, treated, show_progress)

    def _encode(self, texts: list[str], side: str, batch_size: int, treated: bool, show_progress: bool) -> np.ndarray:
        dim = self.model.config.hidden_size
        if not texts:
            return np.zeros((0, dim), dtype=np.float32)
        max_length = self.config.query_max_length if side == "query" else self.config.document_max_length
        order = np.argsort([-len(text) for text in texts], kind="stable")
        output = np.zeros((len(texts), dim), dtype=np.float32)
        was_training = self.training
        self.eval()
        batches = range(0, len(texts), batch_size)
        if show_progress:
            from tqdm.auto import tqdm

            batches = tqdm(batches, desc=f"encoding {side} texts", unit="batch")
        for start in batches:
            index = order[start:start + batch_size]
            # Lengths rounded up to a multiple of 8: fewer distinct input shapes, so oneDNN builds (and
            # caches) fewer kernels over a long corpus; padding is masked, the vectors are the same.
            vectors = self.pool(self.tokenize([texts[i] for i in index], max_length, pad_to_multiple_of=8)).float()
            if treated:
                vectors = (self.query_treatment() if side == "query" else self.document_treatment()).apply(vectors)
            output[index] = vectors.cpu().numpy()
        self.train(was_training)
        return output


def resolve_checkpoint_dir(path: str | os.PathLike) -> Path:
    """The checkpoint folder itself, or the ``best/`` checkpoint of a training output folder."""
    folder = Path(path).expanduser().resolve()
    if not (folder / CONFIG_NAME).exists() and (folder / "best" / CONFIG_NAME).is_file():
        return folder / "best"
    return folder


def checkpoint_digest(path: str | os.PathLike) -> str:
    """A checkpoint's content identity: sha256 over its files' names and contents, not its path or file
    times, so that results scored with it are recognised after a move or on another machine."""
    folder = resolve_checkpoint_dir(path)
    if not (folder / CONFIG_NAME).is_file():
        raise CheckpointError(f"{folder} is not a rag-mag checkpoint (no {CONFIG_NAME})")
    digest = hashlib.sha256()
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(folder).as_posix()}\t{durable.sha256_of(file)}\n".encode())
    return digest.hexdigest()
