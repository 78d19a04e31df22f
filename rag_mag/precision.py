"""Where rag-mag computes (device) and in which precision: one home for ``auto``.

``precision: auto`` means bfloat16 autocast only where the hardware computes bfloat16 natively:

* on CUDA, GPUs that support bf16 (Ampere and later);
* on CPU, processors with ``avx512_bf16`` or ``amx_bf16`` in ``/proc/cpuinfo``, unless oneDNN is
  capped below them with ``ONEDNN_MAX_CPU_ISA`` (then torch emulates bf16 and it is slower than fp32).

Measured (eval/README.md, ``eval/bench_precision.py``): on an AMD EPYC with avx512_bf16, bf16 training
is faster than fp32; with bf16 emulated (same CPU, oneDNN capped at AVX512_CORE), fp32 is faster, and
on an AVX2 CPU without bf16 fp32 is 19x faster to train and vLLM in float32 5.3x faster to generate.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING

from rag_mag.errors import ConfigError

if TYPE_CHECKING:  # torch is imported where it is used: `serve-llm --status` should not pay for it
    import torch

PRECISIONS = ("auto", "bf16", "fp32")
DEVICES = ("auto", "cpu", "cuda")
NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) under which bf16 matrix products still run natively.
BF16_ISA_CAPS = ("ALL", "DEFAULT", "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX",
                 "AVX512_CORE_AMX_FP16", "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16",
                 "AVX10_2_512", "AVX10_2_512_AMX_2")


def parse_precision(value: str) -> str:
    value = str(value).strip().lower()
    if value not in PRECISIONS:
        raise ConfigError(f"unknown precision {value!r}; valid precisions are: {', '.join(PRECISIONS)}")
    return value


def parse_device(value: str) -> str:
    value = str(value).strip().lower()
    if value not in DEVICES and not value.startswith("cuda:"):
        raise ConfigError(f"unknown device {value!r}; valid devices are: {', '.join(DEVICES)} or cuda:N")
    return value


def resolve_device(value: str = "auto") -> torch.device:
    """``auto``: the first CUDA GPU when torch sees one, else the CPU."""
    import torch

    value = parse_device(value)
    if value == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if value.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {value!r} asked for, but torch sees no CUDA GPU; use --device cpu or auto")
    return torch.device(value)


@functools.lru_cache(maxsize=1)
def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_kind(flags: frozenset[str] | None = None) -> str:
    """The widest vector instruction set of this CPU (``amx``, ``avx512_bf16``, ``avx512``, ``avx2`` or the
    machine's architecture): torch's CPU kernels choose their code by it, so fp32 results, bit for bit,
    are reproducible only on CPUs of one kind."""
    flags = cpu_flags() if flags is None else flags
    for kind, flag in (("amx", "amx_bf16"), ("avx512_bf16", "avx512_bf16"), ("avx512", "avx512f"), ("avx2", "avx2")):
        if flag in flags:
            return kind
    return platform.machine() or "unknown"


def cpu_has_native_bf16(flags: frozenset[str] | None = None, isa_cap: str | None = None) -> bool:
    """True where this CPU computes bfloat16 matrix products in hardware (and oneDNN may use it)."""
    flags = cpu_flags() if flags is None else flags
    isa_cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "") if isa_cap is None else isa_cap
    if isa_cap and isa_cap.strip().upper() not in BF16_ISA_CAPS:
        return False
    return any(flag in flags for flag in NATIVE_BF16_CPU_FLAGS)


def use_bf16(precision: str, device: torch.device | str = "cpu") -> bool:
    """Whether to run under bfloat16 autocast: ``bf16`` always, ``fp32`` never, ``auto`` where native."""
    import torch

    precision = parse_precision(precision)
    if precision != "auto":
        return precision == "bf16"
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return cpu_has_native_bf16()


def autocast(device: torch.device | str, enabled: bool) -> torch.autocast:
    """bfloat16 autocast on the device's type (a no-op context when not enabled)."""
    import torch

    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=enabled)


def has_nvidia_gpu() -> bool:
    """Whether an NVIDIA GPU is visible (where a CUDA build of vLLM would run)."""
    return Path("/dev/nvidia0").exists() or Path("/proc/driver/nvidia/version").exists()


def vllm_dtype(precision: str, cuda: bool | None = None) -> str:
    """The vLLM server's ``--dtype`` for a precision.

    ``auto``: on a GPU, vLLM's own ``auto`` (the model's dtype; bfloat16 for the packaged SmolLM2);
    on a CPU, ``bfloat16`` where the CPU computes it natively and ``float32`` otherwise (emulated bf16
    made the server 5-10x slower on an AVX-512 Xeon without avx512_bf16, issue 8).
    """
    precision = parse_precision(precision)
    if precision == "auto":
        if has_nvidia_gpu() if cuda is None else cuda:
            return "auto"
        return "bfloat16" if cpu_has_native_bf16() else "float32"
    return "bfloat16" if precision == "bf16" else "float32"


def describe(precision: str, device: torch.device | str = "cpu") -> str:
    """One line for logs and reports: what ``precision`` became on this machine, and why."""
    import torch

    device = torch.device(device)
    chosen = "bf16" if use_bf16(precision, device) else "fp32"
    if device.type == "cuda":
        return f"{chosen} on {device} (precision={precision})"
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA")
    native = "native bf16" if cpu_has_native_bf16() else "no native bf16"
    return f"{chosen} on cpu (precision={precision}; CPU: {native}{f', ONEDNN_MAX_CPU_ISA={cap}' if cap else ''})"
