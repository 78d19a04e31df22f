"""``rag-mag encode``: embed texts or a corpus to a file, for inspection."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from rag_mag import durable
from rag_mag.cli import DefaultsHelpFormatter
from rag_mag.errors import ConfigError


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "encode", help="embed texts or a corpus with a trained retriever (writes .npz)",
        description="Embed texts with a retriever checkpoint and write OUT.npz with `ids`, `embeddings` (treated "
                    "as the strategy serves them unless --raw) and `norms` (raw L2 norms), and print a summary.",
        formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--retriever", required=True, help="checkpoint folder (or a training output folder)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", help="corpus JSONL {id, title, text}; encoded as documents")
    source.add_argument("--questions", help="eval JSONL {id, question, ...}; encoded as queries")
    source.add_argument("--text", action="append", help="a text to encode (repeatable); see --side")
    parser.add_argument("--side", choices=["query", "document"], default="query", help="side used for --text")
    parser.add_argument("--out", required=True, help="output .npz file")
    parser.add_argument("--raw", action="store_true", help="store raw pooled vectors instead of treated ones")
    parser.add_argument("--batch-size", type=int, default=64)
    return parser


def run(args: argparse.Namespace) -> int:
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1, got {args.batch_size}")
    out = Path(args.out if args.out.endswith(".npz") else args.out + ".npz")
    with durable.job_lock(durable.lock_path(out), f"the vectors file {out}"):  # before the model loads
        return _encode(args, out)


def _encode(args: argparse.Namespace, out: Path) -> int:
    from rag_mag.data import read_corpus, read_eval
    from rag_mag.retriever.encoder import MagnitudeEncoder

    encoder = MagnitudeEncoder.load(args.retriever, inference=True)
    if args.corpus:
        passages = read_corpus(args.corpus)
        ids, texts, side = [p.id for p in passages], [p.content for p in passages], "document"
    elif args.questions:
        records = read_eval(args.questions)
        ids, texts, side = [r.id for r in records], [r.question for r in records], "query"
    else:
        ids, texts, side = [str(i) for i in range(len(args.text))], args.text, args.side
    raw = encoder.encode(texts, side, batch_size=args.batch_size, treated=False, show_progress=True)
    treatment = encoder.query_treatment() if side == "query" else encoder.document_treatment()
    import torch

    from rag_mag.retriever.diagnostics import coefficient_of_variation

    embeddings = raw if args.raw else treatment.apply(torch.from_numpy(raw)).numpy()
    norms = np.linalg.norm(raw, axis=1)
    with durable.atomic_write(out, "wb") as handle:
        np.savez(handle, ids=np.array(ids), embeddings=embeddings.astype(np.float32), norms=norms.astype(np.float32))
    print(json.dumps({"out": str(out), "count": len(ids), "dim": int(raw.shape[1]), "side": side,
                      "strategy": encoder.config.strategy, "degree": treatment.degree,
                      "raw_norm_mean": float(norms.mean()), "raw_norm_cv": coefficient_of_variation(norms)},
                     indent=2))
    return 0
