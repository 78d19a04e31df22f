"""``rag-mag export-index``: copy a FAISS index folder into a PostgreSQL table (pgvector) or a Qdrant collection."""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

from rag_mag import durable
from rag_mag.cli import DefaultsHelpFormatter
from rag_mag.errors import CheckpointError


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "export-index", help="copy a FAISS index into PostgreSQL/pgvector or Qdrant",
        description="Write every passage of a rag-mag index folder, with its stored (treated) vector, into a "
                    "PostgreSQL table searched by pgvector's inner product (--pgvector [TABLE]: COPY in one "
                    "transaction, the table replaced; the server of `rag-mag db start`, started if none runs, or "
                    "$RAG_MAG_PG_URL), or into a Qdrant "
                    "collection with dot-product similarity, embedded in a local folder (--qdrant) or on a Qdrant "
                    "server (--url; the API key, if any, is read from $QDRANT_API_KEY). Needs the vectordb extra: "
                    "pip install 'rag-mag[vectordb]'.",
        formatter_class=DefaultsHelpFormatter)
    parser.add_argument("index", metavar="INDEX_DIR", help="index folder (from `rag-mag index`)")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--pgvector", nargs="?", const="rag_mag_default", metavar="TABLE",
                        help="PostgreSQL table (default: rag_mag_default, the table pipelines/rag_pgvector.yaml "
                             "reads)")
    target.add_argument("--qdrant", metavar="DIR", help="folder of an embedded Qdrant (created if missing)")
    target.add_argument("--url", help="Qdrant server, e.g. http://localhost:6333")
    parser.add_argument("--collection", default="Document", help="Qdrant collection")
    parser.add_argument("--recreate", action="store_true",
                        help="drop the collection first (otherwise passages of the same id are overwritten and "
                             "others are kept)")
    return parser


def run(args: argparse.Namespace) -> int:
    if args.pgvector:
        return _export_pgvector(args)
    # a local Qdrant folder is ours while we write it (a server's collection is the server's to guard)
    lock = durable.job_lock(durable.lock_path(args.qdrant), f"the Qdrant folder {args.qdrant}") \
        if args.qdrant else contextlib.nullcontext()
    with lock:
        return _export(args)


def _export(args: argparse.Namespace) -> int:
    from haystack.utils import Secret

    from rag_mag.components.faiss_index import MANIFEST, is_index_folder
    from rag_mag.components.index_export import export_index, qdrant_store

    index = Path(args.index)
    if not is_index_folder(index):
        raise CheckpointError(f"no index at {index}; build one with `rag-mag index --out {index}`")
    manifest = json.loads((index / MANIFEST).read_text(encoding="utf-8"))  # checked in full by export_index
    if args.qdrant and is_index_folder(Path(args.qdrant)):
        raise CheckpointError(f"--qdrant {args.qdrant} is a FAISS index folder; give a new folder for Qdrant")
    api_key = Secret.from_env_var("QDRANT_API_KEY", strict=False) if args.url else None
    store = qdrant_store(manifest["dim"], path=args.qdrant, url=args.url, index=args.collection,
                         recreate=args.recreate, api_key=api_key)
    try:
        written = export_index(index, store)
        total = store.count_documents()
    finally:
        store.close()
    print(json.dumps({"exported": written, "collection": args.collection, "documents_in_collection": total,
                      "target": args.qdrant or args.url, "strategy": manifest.get("strategy")}, indent=2))
    return 0


def _export_pgvector(args: argparse.Namespace) -> int:
    from rag_mag.components.faiss_index import is_index_folder
    from rag_mag.serving.db import pgvector

    index = Path(args.index)
    if not is_index_folder(index):
        raise CheckpointError(f"no index at {index}; build one with `rag-mag index --out {index}`")
    table = pgvector.check_table_name(args.pgvector)
    with pgvector.using_server() as url, pgvector.table_lock(url, table):
        summary = pgvector.copy_index(index, table)
    print(json.dumps(summary, indent=2))
    return 0
