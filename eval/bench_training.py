"""Training throughput and peak memory: rag-mag's trainer against sentence-transformers' MNRL.

Both train the same model (packaged all-MiniLM-L6-v2, without its Normalize module) on the same
HotpotQA triples (one positive + one hard negative per query), with the same batch size, max
lengths, thread count, precision and similarity (the strategy is given to MNRL as its
``similarity_fct``; scale = 1 / temperature). Each system runs in its own subprocess so that peak
memory (max RSS) is its own. Printed: seconds per step, pairs per second, peak RSS, and the ratios.
"rag-mag-unbucketed" is rag-mag with ``length_bucket_size=0`` (one padded batch per side), to show what the buckets buy.

    .venv/bin/python eval/bench_training.py --steps 8 --warmup 2 --batch-size 32
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

SYSTEMS = ("sentence-transformers", "rag-mag", "rag-mag-unbucketed")
DEFAULT_DATA = Path(__file__).resolve().parents[1] / "data" / "sample" / "train_triples.jsonl"


def run_rag_mag(args: argparse.Namespace) -> dict:
    import torch

    from rag_mag.retriever.encoder import MagnitudeEncoder
    from rag_mag.retriever.loss import InfoNCELoss
    from rag_mag.retriever.training.batches import load_training_data
    from rag_mag.retriever.training.config import TrainConfig
    from rag_mag.retriever.training.optimizer import build_optimizer
    from rag_mag.retriever.training.trainer import Trainer

    config = TrainConfig(strategy=args.strategy, train_data=args.data, out="/tmp/bench-training-unused",
                         batch_size=args.batch_size, hard_negatives=1, steps=args.steps + args.warmup,
                         query_max_length=args.query_max_length, document_max_length=args.document_max_length,
                         precision="bf16" if args.bf16 else "fp32", val_fraction=0.0, calibrate_norms=False,
                         length_bucket_size=0 if args.system == "rag-mag-unbucketed" else args.bucket_size)
    trainer = Trainer(config)
    train, _ = load_training_data(config)
    encoder = MagnitudeEncoder.build(None, config.strategy, "mean", config.query_max_length,
                                     config.document_max_length, config.temperature)
    optimizer, scheduler = build_optimizer(encoder, config)
    loss_fn = InfoNCELoss(config.temperature)
    encoder.train()
    times = []
    for step in range(args.warmup + args.steps):
        started = time.perf_counter()
        trainer._step(encoder, loss_fn, optimizer, scheduler, train, step)
        times.append(time.perf_counter() - started)
    return {"seconds_per_step": sum(times[args.warmup:]) / args.steps, "threads": torch.get_num_threads()}


def run_sentence_transformers(args: argparse.Namespace) -> dict:
    import torch
    from sentence_transformers import SentenceTransformer, losses, util

    from rag_mag.models import default_retriever_base
    from rag_mag.retriever.training.batches import load_training_data, make_batch
    from rag_mag.retriever.training.config import TrainConfig

    config = TrainConfig(strategy=args.strategy, train_data=args.data, out="/tmp/bench-training-unused",
                         batch_size=args.batch_size, hard_negatives=1, steps=args.steps + args.warmup,
                         val_fraction=0.0)
    train, _ = load_training_data(config)
    model = SentenceTransformer(default_retriever_base(), device="cpu")
    # Drop the Normalize module (magnitude must survive) and use one max length, as ST has only one.
    modules = [module for module in model if type(module).__name__ != "Normalize"]
    model = SentenceTransformer(modules=modules, device="cpu")
    model.max_seq_length = args.document_max_length
    similarity = {"cosine": util.cos_sim, "dot": util.dot_score,
                  "qnorm": lambda a, b: util.dot_score(torch.nn.functional.normalize(a, dim=-1), b),
                  "dnorm": lambda a, b: util.dot_score(a, torch.nn.functional.normalize(b, dim=-1))}[args.strategy]
    loss_fn = losses.MultipleNegativesRankingLoss(model, scale=1.0 / config.temperature, similarity_fct=similarity)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, betas=(0.9, 0.98),
                                  weight_decay=config.weight_decay)
    model.train()
    times = []
    for step in range(args.warmup + args.steps):
        batch = make_batch(train, step, config)  # the very same examples rag-mag sees at this step
        started = time.perf_counter()
        features = [model.tokenize([triple.query for triple, _, _ in batch]),
                    model.tokenize([positive.content for _, positive, _ in batch]),
                    model.tokenize([negatives[0].content for _, _, negatives in batch])]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = loss_fn(features, None)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        times.append(time.perf_counter() - started)
    return {"seconds_per_step": sum(times[args.warmup:]) / args.steps, "threads": torch.get_num_threads()}


def child(args: argparse.Namespace) -> None:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    result = (run_sentence_transformers if args.system == "sentence-transformers" else run_rag_mag)(args)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result))


def run_child(args: argparse.Namespace, system: str, precision: str) -> dict:
    command = [sys.executable, __file__, "--system", system, "--data", args.data, "--strategy", args.strategy,
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch-size", str(args.batch_size),
               "--query-max-length", str(args.query_max_length),
               "--document-max-length", str(args.document_max_length), "--threads", str(args.threads),
               "--bucket-size", str(args.bucket_size)]
    if precision == "bf16":
        command.append("--bf16")
    output = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    lines = [line for line in output.stdout.splitlines() if line.startswith("RESULT ")]
    if output.returncode or not lines:
        sys.exit(f"{system} ({precision}) failed:\n{output.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="training triples JSONL")
    parser.add_argument("--strategy", default="qnorm", choices=["cosine", "dot", "qnorm", "dnorm"])
    parser.add_argument("--steps", type=int, default=8, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--query-max-length", type=int, default=128,
                        help="rag-mag's query cap; 128 matches ST's single max length (rag-mag's default is 32)")
    parser.add_argument("--document-max-length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", choices=["fp32", "bf16", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=2,
                        help="alternate the two systems this many times and keep each one's median (noisy CPU)")
    parser.add_argument("--bucket-size", type=int, default=16, help="rag-mag's length_bucket_size")
    parser.add_argument("--system", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--bf16", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.system:
        child(args)
        return
    precisions = ["fp32", "bf16"] if args.precision == "both" else [args.precision]
    rows = []
    for precision in precisions:
        for system in SYSTEMS:
            rows.append({"system": system, "precision": precision, "runs": []})
        for _ in range(args.rounds):  # ABCABC: drift in machine load hits every system alike
            for row in rows[-len(SYSTEMS):]:
                result = run_child(args, row["system"], precision)
                row["runs"].append(result)
                print(f"{row['system']:>22} {precision}: {result['seconds_per_step']:.2f} s/step, "
                      f"peak RSS {result['peak_rss_mb']:.0f} MB", flush=True)
        for row in rows[-len(SYSTEMS):]:
            row["seconds_per_step"] = statistics.median(r["seconds_per_step"] for r in row["runs"])
            row["peak_rss_mb"] = max(r["peak_rss_mb"] for r in row["runs"])
            row["pairs_per_second"] = args.batch_size / row["seconds_per_step"]
    print(f"\nstrategy {args.strategy}, batch {args.batch_size} queries + {args.batch_size} positives + "
          f"{args.batch_size} hard negatives, max lengths {args.query_max_length}/{args.document_max_length}, "
          f"{args.threads} threads, {args.steps} timed steps after {args.warmup} warm-up")
    for precision in precisions:
        theirs = next(r for r in rows if r["system"] == "sentence-transformers" and r["precision"] == precision)
        for system in SYSTEMS[1:]:
            ours = next(r for r in rows if r["system"] == system and r["precision"] == precision)
            print(f"{precision}: {system} / sentence-transformers throughput ratio = "
                  f"{ours['pairs_per_second'] / theirs['pairs_per_second']:.2f}x, "
                  f"peak memory ratio = {ours['peak_rss_mb'] / theirs['peak_rss_mb']:.2f}x "
                  f"({ours['pairs_per_second']:.1f} vs {theirs['pairs_per_second']:.1f} pairs/s)")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
