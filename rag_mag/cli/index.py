"""``rag-mag index``: embed a corpus with a trained retriever and save a FAISS inner-product index.

Resumable and shardable (rag_mag.serving.indexing): vectors go to memory-mapped chunk files in a work
folder, a rerun after a kill goes on from the last finished chunk, ``--shard K/N`` (or torchrun) splits the
corpus across processes or machines, and the last shard to finish merges them into the index folder.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rag_mag.cli import DefaultsHelpFormatter


def add_parser(subparsers) -> argparse.ArgumentParser:
    from rag_mag.components.faiss_index import AUTO_APPROXIMATE_FROM, INDEX_TYPES
    from rag_mag.models import REPO_ROOT, default_retriever_dir
    from rag_mag.serving.indexing import DEFAULT_CHUNK_SIZE
    from rag_mag.serving.pipelines import default_index_dir

    parser = subparsers.add_parser(
        "index", help="embed a corpus and save a FAISS index (resumable, shardable across processes/machines)",
        description="Embed every passage of a corpus JSONL ({id, title, text}) with a retriever checkpoint, under "
                    "its similarity strategy, and save a FAISS inner-product index folder. Vectors are written in "
                    "chunks to memory-mapped files in a work folder (default OUT.work): rerun the same command "
                    "after an interruption and it goes on from the last finished chunk. With --shard K/N (or "
                    "under torchrun) each process encodes one of N shards; the one that finishes last merges "
                    "them. The same result as pipelines/indexing.yaml (`rag-mag run`), which holds everything "
                    "in memory.",
        formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--retriever", default=str(default_retriever_dir()),
                        help="retriever checkpoint folder (written by `rag-mag train`)")
    parser.add_argument("--corpus", default=str(REPO_ROOT / "data" / "sample" / "corpus.jsonl"),
                        help="corpus JSONL or JSONL.gz with {id, title, text}")
    parser.add_argument("--out", default=str(default_index_dir()), help="index folder to write")
    parser.add_argument("--batch-size", type=int, default=32, help="passages encoded at once")
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE,
                        help="passages per chunk: the unit of progress that a rerun does not repeat")
    parser.add_argument("--index-type", choices=INDEX_TYPES, default="flat",
                        help="flat is exact; hnsw (graph search on inner product), ivf and hnsw_mips (graph "
                             "search over the MIPS-to-L2 reduction) are approximate; auto: flat below "
                             f"{AUTO_APPROXIMATE_FROM:,} passages, hnsw from there (eval/README.md, 'Approximate "
                             "search')")
    parser.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                        help="encoding precision: auto uses bf16 only where the CPU/GPU computes it natively")
    parser.add_argument("--shard", metavar="K/N",
                        help="encode only shard K of N (0-based); default: RANK/WORLD_SIZE under torchrun, else 0/1. "
                             "Every shard must see the same --work-dir (a shared folder, or copy the shard-*-of-N "
                             "folders together and rerun any shard to merge)")
    parser.add_argument("--work-dir", help="folder of the encoded chunks (default: OUT.work next to --out)")
    parser.add_argument("--restart", action="store_true",
                        help="discard chunks already encoded in the work folder and start again")
    parser.add_argument("--keep-work", action="store_true", help="keep the work folder after the merge")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing index at --out")
    parser.add_argument("--verify", metavar="INDEX_DIR",
                        help="check an existing index folder instead of building one: every file against its size "
                             "and sha256 in the manifest, the ids' count and order, documents against ids; exits 2 "
                             "on any mismatch")
    return parser


def run(args: argparse.Namespace) -> int:
    from rag_mag.components.faiss_index import verify_folder
    from rag_mag.serving.indexing import IndexJob, parse_shard, run_index_job, shard_lock

    if args.verify:
        print(json.dumps(verify_folder(Path(args.verify)), indent=2))
        return 0
    job = IndexJob(corpus=Path(args.corpus), retriever=Path(args.retriever), out=Path(args.out),
                   index_type=args.index_type, chunk_size=args.chunk_size, batch_size=args.batch_size,
                   precision=args.precision)
    shard, work_dir = parse_shard(args.shard), Path(args.work_dir) if args.work_dir else None
    with shard_lock(job.out, shard, work_dir):  # before the model loads; the other shards run on
        summary = run_index_job(job, shard, work_dir, overwrite=args.overwrite, restart=args.restart,
                                keep_work=args.keep_work)
    print(json.dumps(summary, indent=2))
    return 0
