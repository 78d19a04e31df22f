"""The served reader: a LoRA adapter merged into its base model, written once as a folder vLLM reads.

vLLM can serve an adapter beside its base (``--enable-lora``), but on CPU its LoRA kernels ran 13x slower
here (212 against 2,754 prompt tokens/s at 16 requests in flight), so the adapter is merged into the weights.
The adapter's files are checked against its ``SHA256SUMS`` before they are trusted, and the merged folder
records the adapter's sha256, so a changed adapter is merged again and a finished merge is kept.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from rag_mag import durable
from rag_mag.errors import CheckpointError, ConfigError

logger = logging.getLogger(__name__)

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
CHECKSUMS = "SHA256SUMS"
MERGE_MARKER = "rag_mag_reader.json"  # written last: its presence means the merged folder is complete


def verify_adapter(adapter_dir: Path) -> str:
    """Check the adapter's files against ``SHA256SUMS`` (when the folder has one); return the weights' sha256."""
    adapter_dir = Path(adapter_dir)
    for name in (ADAPTER_WEIGHTS, ADAPTER_CONFIG):
        if not (adapter_dir / name).is_file():
            raise CheckpointError(f"reader adapter {adapter_dir} has no {name}; train one with `rag-mag train-reader` "
                                  "or restore it with git (data/reader_default/, data/writer_default/)")
    sums = adapter_dir / CHECKSUMS
    if sums.is_file():
        for line in sums.read_text().splitlines():
            if not line.strip():
                continue
            digest, name = line.split(maxsplit=1)
            path = adapter_dir / name.strip().lstrip("*")
            if not path.is_file() or durable.sha256_of(path) != digest:
                raise CheckpointError(f"reader adapter file {path} is missing or does not match {sums}; restore it "
                                      f"(git checkout {adapter_dir}) or retrain with `rag-mag train-reader`")
    return durable.sha256_of(adapter_dir / ADAPTER_WEIGHTS)


def write_checksums(adapter_dir: Path) -> None:
    files = sorted(p for p in Path(adapter_dir).iterdir() if p.is_file() and p.name != CHECKSUMS)
    durable.write_text(Path(adapter_dir) / CHECKSUMS,
                       "".join(f"{durable.sha256_of(p)}  {p.name}\n" for p in files))


PUBLISHED_FILES = (ADAPTER_WEIGHTS, ADAPTER_CONFIG, "reader.json")


def publish_adapter(adapter_dir: Path, target: Path, log: Path | None = None) -> Path:
    """Copy a trained adapter (and its training log) into ``target`` with ``SHA256SUMS``, swapped in whole: what
    ``data/reader_default/`` holds."""
    verify_adapter(adapter_dir)
    staging = durable.staging_dir(target)
    try:
        for name in PUBLISHED_FILES:
            shutil.copyfile(Path(adapter_dir) / name, staging / name)
        if log is not None and log.is_file():
            shutil.copyfile(log, staging / "train_log.jsonl")
        readme = Path(target) / "README.md"
        if readme.is_file():  # the folder's own description stays
            shutil.copyfile(readme, staging / "README.md")
        write_checksums(staging)
        durable.sync_tree(staging)
        durable.replace_dir(staging, Path(target))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Path(target)


def merged_adapter_sha(out_dir: Path) -> str | None:
    marker = Path(out_dir) / MERGE_MARKER
    if not marker.is_file() or not (Path(out_dir) / "config.json").is_file():
        return None
    try:
        return json.loads(marker.read_text())["adapter_sha256"]
    except (json.JSONDecodeError, KeyError):
        return None


def merge_reader(adapter_dir: Path, base_dir: Path, out_dir: Path, *, force: bool = False) -> Path:
    """Merge ``adapter_dir`` into the model of ``base_dir`` and write bfloat16 safetensors into ``out_dir``."""
    adapter_sha = verify_adapter(adapter_dir)
    if merged_adapter_sha(out_dir) == adapter_sha and not force:
        logger.info("merged reader already in %s", out_dir)
        return out_dir
    if not (Path(base_dir) / "config.json").is_file():
        raise ConfigError(f"base model {base_dir} is not converted yet; run `rag-mag serve-llm --convert-only`")
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("merging the reader adapter %s into %s", adapter_dir, base_dir)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    merged.to(torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    staging = durable.staging_dir(out_dir)
    with durable.disk_full_as_error(out_dir, f"the merged model {out_dir}"):
        try:
            merged.save_pretrained(staging, safe_serialization=True)
            tokenizer.save_pretrained(staging)
            record = {"adapter": str(adapter_dir), "adapter_sha256": adapter_sha, "base": str(base_dir)}
            (staging / MERGE_MARKER).write_text(json.dumps(record, indent=2) + "\n")
            durable.sync_tree(staging)
            durable.replace_dir(staging, Path(out_dir))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    logger.info("merged reader written to %s", out_dir)
    return Path(out_dir)
