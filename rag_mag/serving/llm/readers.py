"""The readers a vLLM server serves: the packaged ones prepared once, a --model argument resolved, checksums."""

from __future__ import annotations

from pathlib import Path

from rag_mag.errors import ConfigError
from rag_mag.models import (
    default_llm_dir,
    default_reader_dir,
    default_writer_dir,
    packaged_smollm2_gguf,
    shipped_reader_adapter,
    shipped_writer_adapter,
)
from rag_mag.serving.llm.gguf_convert import convert_gguf, is_converted
from rag_mag.serving.llm.settings import BASE_SERVED_MODEL_NAME, DEFAULT_SERVED_MODEL_NAME, WRITER_SERVED_MODEL_NAME

PACKAGED = (DEFAULT_SERVED_MODEL_NAME, BASE_SERVED_MODEL_NAME, WRITER_SERVED_MODEL_NAME)


def prepare_readers(*, force: bool = False) -> dict[str, Path]:
    """Convert the packaged SmolLM2 and merge the shipped reader adapter and question writer adapter into it,
    once each; ``{served name: folder}`` of the three models."""
    from rag_mag.reader.merge import merge_reader

    base = convert_gguf(force=force)
    reader = merge_reader(shipped_reader_adapter(), base, default_reader_dir(), force=force)
    writer = merge_reader(shipped_writer_adapter(), base, default_writer_dir(), force=force)
    return {DEFAULT_SERVED_MODEL_NAME: reader, BASE_SERVED_MODEL_NAME: base, WRITER_SERVED_MODEL_NAME: writer}


def _packaged_reader(name: str) -> Path:
    from rag_mag.reader.merge import merged_adapter_sha

    if name == BASE_SERVED_MODEL_NAME:
        folder, ready = default_llm_dir(), is_converted(default_llm_dir())
    else:
        folder = default_writer_dir() if name == WRITER_SERVED_MODEL_NAME else default_reader_dir()
        ready = merged_adapter_sha(folder) is not None
    if not ready:
        raise ConfigError(f"the {name} reader is not prepared yet ({folder} is missing or unfinished); "
                          "run `rag-mag serve-llm --convert-only` (or scripts/setup.sh)")
    return folder


def resolve_model(model: str | None) -> tuple[str, str]:
    """``(what vLLM loads, served model name)``: the trained reader by default; the name of a packaged reader
    (``smollm2-135m-reader``, ``smollm2-135m-instruct``: the untrained base, ``smollm2-135m-writer``: the question
    writer), a local path or a hub id."""
    if model is None or model in PACKAGED:
        name = model or DEFAULT_SERVED_MODEL_NAME
        return str(_packaged_reader(name)), name
    candidate = Path(model).expanduser()
    if candidate.exists():
        if not (candidate / "config.json").is_file():
            raise ConfigError(f"model folder {candidate} has no config.json; pass a Hugging Face model folder")
        return str(candidate.resolve()), model
    if model.startswith(("/", "./", "../", "~")) or model.count("/") > 1:
        raise ConfigError(f"model folder {model} does not exist; pass an existing folder or a hub id (org/name)")
    return model, model  # a hub id: vLLM downloads it (needs a model hub)


def served_name(model: str | None) -> str | None:
    """The name a server started for ``model`` serves it under (None: any)."""
    if model is None:
        return None
    return model if model in PACKAGED else resolve_model(model)[1]


def reader_checksum(model: str) -> str:
    """What identifies a reader's weights: the merged adapter's sha256 for the trained reader and for any folder
    an adapter was merged into, the GGUF file's size for the packaged base (its conversion is deterministic), else
    the model name itself."""
    from rag_mag.reader.merge import merged_adapter_sha, verify_adapter

    if model in (DEFAULT_SERVED_MODEL_NAME, WRITER_SERVED_MODEL_NAME):
        folder, adapter = ((default_reader_dir(), shipped_reader_adapter()) if model == DEFAULT_SERVED_MODEL_NAME
                           else (default_writer_dir(), shipped_writer_adapter()))
        return "adapter-sha256:" + (merged_adapter_sha(folder) or verify_adapter(adapter))
    if model == BASE_SERVED_MODEL_NAME:
        return f"gguf:{packaged_smollm2_gguf().name}:{packaged_smollm2_gguf().stat().st_size}"
    merged = merged_adapter_sha(Path(model)) if Path(model).is_dir() else None  # an adapter merged into a folder
    return f"adapter-sha256:{merged}" if merged else f"model:{model}"
