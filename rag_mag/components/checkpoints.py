"""Loading retriever checkpoints for the embedder components, once per process.

The document and text embedders of one pipeline (or of several pipelines in one server) usually
point at the same checkpoint folder, so the loaded encoder is shared. A *fingerprint* (a hash of
the checkpoint's config and weights) ties an index to the checkpoint that embedded it: the index
records it, and the retriever refuses query embeddings from a different checkpoint.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from rag_mag.errors import CheckpointError
from rag_mag.retriever.encoder import CONFIG_NAME, MagnitudeEncoder, resolve_checkpoint_dir

logger = logging.getLogger(__name__)

_CHUNK = 1 << 20
_cache: dict[tuple, LoadedCheckpoint] = {}
_fingerprints: dict[tuple, str] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class LoadedCheckpoint:
    """An encoder ready for inference, with what identifies it."""

    path: str
    encoder: MagnitudeEncoder
    fingerprint: str

    @property
    def strategy(self) -> str:
        return self.encoder.config.strategy


def _checkpoint_files(folder: Path) -> list[Path]:
    """The files that decide what the encoder computes: its config, weights and tokenizer."""
    files = [folder / CONFIG_NAME]
    files += sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin"))
    files += [folder / name for name in ("config.json", "tokenizer.json", "vocab.txt") if (folder / name).is_file()]
    return files


def _stamp(folder: Path) -> tuple:
    try:
        return tuple((str(path), path.stat().st_size, path.stat().st_mtime_ns) for path in _checkpoint_files(folder))
    except FileNotFoundError as error:
        raise CheckpointError(f"retriever checkpoint {folder} is incomplete: {error.filename} is missing; "
                              "train one with `rag-mag train --out DIR` or pass the right folder") from None


def checkpoint_fingerprint(path: str | os.PathLike) -> str:
    """A short hash (16 hex digits) of a checkpoint's config, weights and tokenizer files."""
    folder = resolve_checkpoint_dir(path)
    if not (folder / CONFIG_NAME).is_file():
        raise CheckpointError(f"{folder} is not a rag-mag retriever checkpoint ({CONFIG_NAME} is missing); "
                              "train one with `rag-mag train --out DIR` or pass the right folder")
    stamp = _stamp(folder)  # the files' sizes and times: the same stamp, the same hash (read once per process)
    if stamp not in _fingerprints:
        digest = hashlib.sha256()
        for file in _checkpoint_files(folder):
            digest.update(file.name.encode())
            with open(file, "rb") as handle:
                while chunk := handle.read(_CHUNK):
                    digest.update(chunk)
        _fingerprints[stamp] = digest.hexdigest()[:16]
    return _fingerprints[stamp]


def load_checkpoint(path: str | os.PathLike) -> LoadedCheckpoint:
    """Load (or reuse) the encoder of a checkpoint folder; reloaded if its files changed on disk."""
    folder = resolve_checkpoint_dir(path)
    if not folder.is_dir():
        raise CheckpointError(f"retriever checkpoint {folder} does not exist; train one with "
                              "`rag-mag train --out DIR` or pass the right folder")
    with _lock:
        key = (str(folder), _stamp(folder))
        cached = _cache.get(key)
        if cached is not None:
            return cached
        logger.info("loading retriever checkpoint %s", folder)
        encoder = MagnitudeEncoder.load(folder, inference=True)
        loaded = LoadedCheckpoint(path=str(folder), encoder=encoder, fingerprint=checkpoint_fingerprint(folder))
        for stale in [k for k in _cache if k[0] == str(folder)]:
            del _cache[stale]
        _cache[key] = loaded
        return loaded
