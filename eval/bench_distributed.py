"""Training throughput on 1 and on N processes: the real trainer under ``torchrun --nproc_per_node``.

The default recipe: the packaged all-MiniLM-L6-v2, 32 queries per process per step (so the global batch
is 32 * N), one positive and one hard negative each, from the same triples file, 1 CPU thread per
process, no validation. Rank 0 times the steps after the warm-up (``Trainer``'s step hook runs after every
optimizer step) and prints seconds per step and pairs (queries) per second of the global batch.

    .venv/bin/python eval/bench_distributed.py --processes 1 2 --steps 4 --warmup 1

On one machine with C cores, N processes of 1 thread cannot go faster than min(N, C) times one process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rag_mag import durable

DEFAULT_DATA = Path(__file__).resolve().parents[1] / "data" / "sample" / "train_triples.jsonl"
RESULTS = Path(__file__).resolve().parents[1] / "eval" / "reports" / "distributed" / "results.json"


def child(args: argparse.Namespace) -> None:
    """One rank of the timed run (started by torchrun)."""
    from rag_mag.retriever.training.config import TrainConfig
    from rag_mag.retriever.training.trainer import Trainer

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    config = TrainConfig(strategy=args.strategy, train_data=args.data, out=args.out,
                         batch_size=args.batch_size * world_size, hard_negatives=1, steps=args.warmup + args.steps,
                         precision=args.precision, val_fraction=0.0, calibrate_norms=False, threads=args.threads,
                         save_every=10_000, log_every=10_000, resume=False)
    stamps: dict[int, float] = {}
    result = Trainer(config, on_step=lambda step, encoder: stamps.setdefault(step, time.perf_counter())).train()
    if int(os.environ.get("RANK", "0")) == 0:
        seconds = (stamps[result.step] - stamps[args.warmup]) / args.steps
        print("RESULT " + json.dumps({"processes": world_size, "global_batch": config.batch_size,
                                      "seconds_per_step": seconds, "pairs_per_second": config.batch_size / seconds}))


def run(args: argparse.Namespace, processes: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-distributed-") as out:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                   str(processes), __file__, "--child", "--out", out, "--data", args.data,
                   "--strategy", args.strategy, "--steps", str(args.steps), "--warmup", str(args.warmup),
                   "--batch-size", str(args.batch_size), "--threads", str(args.threads),
                   "--precision", args.precision]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(args.threads)}
        output = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = [line for line in output.stdout.splitlines() if line.startswith("RESULT ")]
    if output.returncode or not lines:
        sys.exit(f"{processes} processes failed:\n{output.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2], help="process counts to time")
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="training triples JSONL")
    parser.add_argument("--strategy", default="qnorm", choices=["cosine", "dot", "qnorm", "dnorm", "learnable"])
    parser.add_argument("--steps", type=int, default=4, help="timed steps")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--batch-size", type=int, default=32, help="queries per process per step")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per process")
    parser.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the rows are written (JSON)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    load_before = os.getloadavg()[0]
    rows = []
    for processes in args.processes:
        rows.append(run(args, processes))
        print(f"{processes} process(es), global batch {rows[-1]['global_batch']}: "
              f"{rows[-1]['seconds_per_step']:.2f} s/step, {rows[-1]['pairs_per_second']:.1f} pairs/s", flush=True)
    print(f"strategy {args.strategy}, {args.batch_size} queries + positives + hard negatives per process, "
          f"{args.threads} thread(s) per process, precision {args.precision}, {args.steps} timed steps after "
          f"{args.warmup} warm-up; {os.cpu_count()} CPUs, load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after")
    for row in rows[1:]:
        print(f"{row['processes']} processes / {rows[0]['processes']}: "
              f"{row['pairs_per_second'] / rows[0]['pairs_per_second']:.2f}x pairs/s")
    settings = {"strategy": args.strategy, "batch_size": args.batch_size, "threads": args.threads,
                "precision": args.precision, "steps": args.steps, "warmup": args.warmup, "cpus": os.cpu_count(),
                "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2)}
    durable.write_text(args.results, json.dumps({"settings": settings, "rows": rows}, indent=1))
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
