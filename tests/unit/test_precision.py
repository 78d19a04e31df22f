"""precision: auto means bf16 only where the hardware computes it natively, for training, encoding and vLLM."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rag_mag import precision
from rag_mag.errors import ConfigError

NATIVE = frozenset({"avx512f", "avx512_bf16"})
EMULATED = frozenset({"avx512f", "avx2"})  # an AVX-512 Xeon without avx512_bf16


@pytest.mark.parametrize(("flags", "cap", "native"), [
    (NATIVE, "", True),
    (frozenset({"amx_bf16", "avx512f"}), "", True),
    (EMULATED, "", False),
    (NATIVE, "AVX512_CORE", False),       # oneDNN capped below bf16: torch emulates it
    (NATIVE, "avx512_core_bf16", True),
])
def test_native_bf16_follows_the_cpu_flags_and_the_onednn_cap(flags, cap, native):
    assert precision.cpu_has_native_bf16(flags, cap) is native


def test_cpu_flags_are_read_from_cpuinfo(tmp_path: Path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor : 0\nflags\t\t: fpu sse avx512f avx512_bf16\n")
    precision.cpu_flags.cache_clear()
    try:
        assert precision.cpu_flags(str(cpuinfo)) == {"fpu", "sse", "avx512f", "avx512_bf16"}
        assert precision.cpu_flags(str(tmp_path / "missing")) == frozenset()
    finally:
        precision.cpu_flags.cache_clear()


@pytest.mark.parametrize("native", [True, False])
def test_auto_picks_bf16_only_on_native_cpus_for_every_consumer(native, monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda *a, **k: native)
    assert precision.use_bf16("auto", "cpu") is native
    assert precision.vllm_dtype("auto", cuda=False) == ("bfloat16" if native else "float32")
    assert ("bf16 on cpu" if native else "fp32 on cpu") in precision.describe("auto", "cpu")
    # explicit choices are obeyed whatever the CPU
    assert precision.use_bf16("bf16", "cpu") and not precision.use_bf16("fp32", "cpu")
    assert precision.vllm_dtype("fp32", cuda=False) == "float32"
    assert precision.vllm_dtype("bf16", cuda=False) == "bfloat16"


def test_on_a_gpu_vllm_keeps_the_models_dtype():
    assert precision.vllm_dtype("auto", cuda=True) == "auto"


def test_the_vllm_command_carries_the_chosen_dtype(monkeypatch):
    from rag_mag.serving.llm import server as llm_server

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda *a, **k: False)
    monkeypatch.setattr(precision, "has_nvidia_gpu", lambda: False)
    command = llm_server.build_command("m", host="127.0.0.1", port=1, served_model_name="m", python=Path("/py"))
    assert command[command.index("--dtype") + 1] == "float32"


@pytest.mark.parametrize("bad", ["bfloat", "half", "", "fp16"])
def test_unknown_precisions_are_refused_with_the_valid_ones(bad):
    with pytest.raises(ConfigError, match="valid precisions are: auto, bf16, fp32"):
        precision.parse_precision(bad)


def test_devices_are_validated_and_cuda_without_a_gpu_is_a_clear_error(monkeypatch):
    with pytest.raises(ConfigError, match="valid devices"):
        precision.parse_device("tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert precision.resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="no CUDA GPU"):
        precision.resolve_device("cuda:0")


def test_training_config_refuses_the_old_bf16_field_with_the_new_name():
    from rag_mag.retriever.training.config import TrainConfig, make_config

    with pytest.raises(ConfigError, match="replaced by precision"):
        make_config(TrainConfig, {"bf16": True})
    with pytest.raises(ConfigError, match="valid precisions"):
        make_config(TrainConfig, {"precision": "fast"})


def test_autocast_runs_bf16_matmuls_only_when_enabled():
    a = torch.randn(4, 8)
    with precision.autocast("cpu", enabled=True):
        assert (a @ a.T).dtype == torch.bfloat16
    with precision.autocast("cpu", enabled=False):
        assert (a @ a.T).dtype == torch.float32


def test_cpu_kind_is_the_widest_vector_instruction_set():
    from rag_mag.precision import cpu_kind
    assert cpu_kind(frozenset({"avx2", "avx512f", "amx_bf16", "avx512_bf16"})) == "amx"
    assert cpu_kind(frozenset({"avx2", "avx512f", "avx512_bf16"})) == "avx512_bf16"
    assert cpu_kind(frozenset({"avx2", "avx512f"})) == "avx512"
    assert cpu_kind(frozenset({"sse4_2", "avx2"})) == "avx2"
    assert cpu_kind(frozenset()) not in ("amx", "avx512_bf16", "avx512", "avx2")
