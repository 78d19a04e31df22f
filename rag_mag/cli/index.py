"""``rag-mag index``: embed a corpus with a trained retriever and save a FAISS inner-product index."""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from rag_mag.errors import ConfigError

logger = logging.getLogger(__name__)


def add_parser(subparsers) -> argparse.ArgumentParser:
    from rag_mag.models import REPO_ROOT, default_retriever_dir
    from rag_mag.serving.pipelines import default_index_dir, default_pipeline

    parser = subparsers.add_parser(
        "index", help="embed a corpus and save a FAISS index (runs pipelines/indexing.yaml)",
        description="Embed every passage of a corpus JSONL ({id, title, text}) with a retriever checkpoint, under "
                    "its similarity strategy, and save an exact FAISS inner-product index folder. Runs the indexing "
                    "pipeline (pipelines/indexing.yaml) with these flags as overrides.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--retriever", default=str(default_retriever_dir()),
                        help="retriever checkpoint folder (written by `rag-mag train`)")
    parser.add_argument("--corpus", default=str(REPO_ROOT / "data" / "sample" / "corpus.jsonl"),
                        help="corpus JSONL or JSONL.gz with {id, title, text}")
    parser.add_argument("--out", default=str(default_index_dir()), help="index folder to write")
    parser.add_argument("--batch-size", type=int, default=32, help="passages encoded at once")
    parser.add_argument("--index-type", choices=["flat", "hnsw", "ivf"], default="flat",
                        help="flat is exact; hnsw and ivf are approximate and lose recall on un-normalized vectors")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing index at --out")
    parser.add_argument("--pipeline", default=str(default_pipeline("indexing")), help="indexing pipeline YAML")
    parser.add_argument("--verify", metavar="INDEX_DIR",
                        help="check an existing index folder instead of building one: every file against its size "
                             "and sha256 in the manifest, the ids' count and order, documents against ids; exits 2 "
                             "on any mismatch")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="NAME.PARAM=VALUE",
                        help="extra override of a component parameter (repeatable)")
    return parser


def run(args: argparse.Namespace) -> int:
    from rag_mag.components.faiss_index import is_index_folder, verify_folder
    from rag_mag.serving.pipelines import load_pipeline, parse_overrides, run_pipeline

    if args.verify:
        print(json.dumps(verify_folder(Path(args.verify)), indent=2))
        return 0
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1, got {args.batch_size}")
    out = Path(args.out)
    if out.exists():
        if not out.is_dir() or (any(out.iterdir()) and not is_index_folder(out)):
            raise ConfigError(f"--out {out} exists and is not a rag-mag index folder; choose a new or empty folder")
        if is_index_folder(out) and not args.overwrite:
            raise ConfigError(f"an index already exists at {out}; pass --overwrite to replace it, or choose "
                              "another --out")
    overrides = {"corpus": args.corpus, "retriever": args.retriever, "out": str(out),
                 "batch_size": args.batch_size, "index_type": args.index_type}
    overrides.update(parse_overrides(args.overrides))
    pipeline = load_pipeline(args.pipeline, overrides)
    started = time.perf_counter()
    result = run_pipeline(pipeline, {})
    elapsed = time.perf_counter() - started
    manifest = json.loads((out / "manifest.json").read_text()) if is_index_folder(out) else {}
    written = result.get("writer", {}).get("documents_written")
    print(json.dumps({"out": str(out), "documents_written": written, "count": manifest.get("count"),
                      "dim": manifest.get("dim"), "index_type": manifest.get("index_type"),
                      "strategy": manifest.get("strategy"), "checkpoint": manifest.get("checkpoint"),
                      "seconds": round(elapsed, 1)}, indent=2))
    return 0
