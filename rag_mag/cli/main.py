"""Entry point of the ``rag-mag`` command.

Each subcommand lives in its own module of this package and exposes
``add_parser(subparsers) -> argparse.ArgumentParser`` and ``run(args) -> int``.
Errors a user can cause (``RagMagError``) are printed as one line, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from rag_mag import __version__, durable, stopping, writable
from rag_mag.errors import RagMagError

# subcommand name -> module in rag_mag.cli (imported lazily so `rag-mag --help` stays fast)
COMMANDS = {
    "train": "train",
    "train-reader": "train_reader",
    "interpolate": "interpolate",
    "mine": "mine",
    "build-data": "build_data",
    "encode": "encode",
    "index": "index",
    "export-index": "export_index",
    "ask": "ask",
    "run": "run_pipeline",
    "serve-llm": "serve_llm",
    "db": "db",
    "serve": "serve",
    "keys": "keys",
    "bench": "bench",
    "crossover": "crossover",
    "adapt": "adapt",
    "synth": "synth",
    "quickstart": "quickstart",
}


def _offline_defaults() -> None:
    # No model hub is needed at run time: everything defaults to local files. Users can override.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rag-mag", description=(
        "Retrieval-augmented QA with magnitude-aware dense retrieval: train a retriever under a "
        "similarity strategy (cosine, dot, qnorm, dnorm, learnable), index with FAISS, answer with vLLM."))
    parser.add_argument("--version", action="version", version=f"rag-mag {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMANDS.values():
        module = importlib.import_module(f"rag_mag.cli.{module_name}")
        sub = module.add_parser(subparsers)
        sub.set_defaults(handler=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    _offline_defaults()
    stopping.install()  # `kill` ends a run like Ctrl-C does; training loops finish their step first
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # its per-load "Loading weights" bars drown our own progress
    for noisy in ("httpx", "httpx2", "openai", "urllib3", "haystack", "transformers", "datasets", "filelock", "bm25s"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))  # httpx2, openai: a line per vLLM request
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args) or 0)
    except RagMagError as error:
        print(f"rag-mag {args.command}: error: {error}", file=sys.stderr)
        return 2
    except stopping.Stopped as stopped:  # at a step boundary, its resumable state saved
        print(f"rag-mag {args.command}: {stopped}", file=sys.stderr)
        return stopping.exit_code(stopped.signum)
    except KeyboardInterrupt:
        signum = stopping.last_signal()
        print(f"rag-mag {args.command}: interrupted by {stopping.signal_name(signum)}", file=sys.stderr)
        return stopping.exit_code(signum)
    except Exception as error:  # a read-only filesystem, a denied permission or a full disk no writer translated
        refused = writable.not_writable(error, getattr(error, "filename", None) or "its output", "an output")
        if refused is None and not durable.is_disk_full(error):
            raise
        print(f"rag-mag {args.command}: error: {refused or _disk_full(error)}", file=sys.stderr)
        return 2


def _disk_full(error: BaseException) -> str:
    """The one line for a full disk met where no writer named it (a library's own wrapper of ENOSPC included)."""
    where = getattr(error, "filename", None) or os.getcwd()
    return (f"the disk filled up ({error}); {durable.free_bytes(where):,} bytes are free on the filesystem of "
            f"{where}. Free some space and run the same command again")


if __name__ == "__main__":
    sys.exit(main())
