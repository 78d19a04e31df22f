"""Is `precision: auto` the faster choice on both kinds of CPU? Training steps, encoding and the vLLM server.

    .venv/bin/python eval/bench_precision.py                 # training + encoding, about 6 minutes on 2 cores
    .venv/bin/python eval/bench_precision.py --vllm          # also the vLLM server (about 8 more minutes)
    .venv/bin/python eval/bench_precision.py --setup         # also the set-up's training (quickstart --train-only)

Up to two CPU kinds are measured on one machine (``--kinds``):

* native: the CPU as it is (with or without avx512_bf16 / amx_bf16, recorded in the row's ``cpu``);
* emulated: only on a CPU with native bf16: the same CPU with oneDNN capped at
  ``ONEDNN_MAX_CPU_ISA=AVX512_CORE`` (AVX-512 without the bf16 instructions), which is how torch runs on
  an AVX-512 Xeon without avx512_bf16: bf16 is emulated. On a CPU without native bf16 the cap changes
  nothing, so only ``native`` is measured there, and it is the real thing.

The results file keeps one row per (CPU, kind): a run on another machine adds its rows beside the
earlier machines' rows instead of replacing them.

Each (kind, precision) cell runs in a fresh subprocess (oneDNN reads the cap once, at start-up):

* training: real `Trainer` steps of the default recipe (MiniLM, batch 32, one hard negative, 32/128
  tokens) on the training data of `rag-mag build-data`; the median step time after 2 warm-up steps;
* encoding: the first --passages passages of the TriviaQA corpus, batch 64, passages/s;
* vLLM (--vllm): the packaged SmolLM2 served with --dtype float32 and bfloat16; 16 concurrent chat
  requests of 32 new tokens each, generated tokens/s. vLLM's CPU kernels choose their instructions
  themselves; whether the oneDNN cap reaches them is reported, not assumed (compare the rows).

For every kind the script prints which precision `auto` picks there and whether that is the faster one,
and writes eval/reports/precision/results.json. Stop other work (vLLM servers, tests) first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KINDS = {"native": {}, "emulated": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}}


def child_training(precision: str, steps: int, train_data: str) -> dict:
    from rag_mag.retriever.training.config import TrainConfig
    from rag_mag.retriever.training.trainer import Trainer

    stamps: list[float] = []
    with tempfile.TemporaryDirectory() as out:
        config = TrainConfig(strategy="qnorm", train_data=train_data, out=out, steps=steps, batch_size=32,
                             hard_negatives=1, precision=precision, eval_every=0, save_every=steps + 1,
                             val_fraction=0.0, log_every=steps, calibrate_norms=False)
        trainer = Trainer(config, on_step=lambda step, encoder: stamps.append(time.perf_counter()))
        trainer.train()
    durations = [b - a for a, b in zip(stamps, stamps[1:], strict=False)][2:]  # skip 2 warm-up steps
    return {"train_s_per_step": statistics.median(durations), "train_steps_timed": len(durations),
            "bf16_used": trainer.bf16}


def child_encoding(precision: str, passages: int) -> dict:
    from rag_mag.bench.datasets import data_root
    from rag_mag.data import read_corpus
    from rag_mag.precision import use_bf16
    from rag_mag.retriever.encoder import MagnitudeEncoder

    texts = [p.content for p in read_corpus(data_root() / "triviaqa" / "triviaqa_test1000_corpus.jsonl")[:passages]]
    encoder = MagnitudeEncoder.build(strategy="qnorm")
    bf16 = use_bf16(precision, "cpu")
    encoder.encode(texts[:64], "document", bf16=bf16)  # warm-up
    started = time.perf_counter()
    encoder.encode(texts, "document", batch_size=64, bf16=bf16)
    return {"encode_passages_per_s": len(texts) / (time.perf_counter() - started)}


def child(args: argparse.Namespace) -> None:
    from rag_mag.precision import describe, use_bf16

    result = {"precision": args.precision, "auto_picks_bf16": use_bf16("auto", "cpu"),
              "describe": describe(args.precision, "cpu")}
    result.update(child_training(args.precision, args.steps, args.train_data))
    result.update(child_encoding(args.precision, args.passages))
    print("RESULT " + json.dumps(result), flush=True)


def cpu_identity() -> dict:
    """Which CPU a row was measured on: its model name and the flags that decide bf16 and the kernels."""
    from rag_mag.precision import NATIVE_BF16_CPU_FLAGS, cpu_flags, cpu_has_native_bf16

    model = ""
    with contextlib.suppress(OSError):
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    flags = cpu_flags()
    return {"model": model, "native_bf16": cpu_has_native_bf16(isa_cap=""), "cores": os.cpu_count(),
            "flags": sorted(f for f in flags if f in (*NATIVE_BF16_CPU_FLAGS, "avx2", "avx512f", "avx512_vnni"))}


def merge_rows(old: list[dict], new: list[dict]) -> list[dict]:
    """Earlier rows of other CPUs (or other kinds) stay; a row of the same CPU and kind is replaced."""
    def slot(row: dict) -> tuple:
        cpu = row.get("cpu", {})
        return cpu.get("model"), tuple(cpu.get("flags", ())), row["kind"]
    replaced = {slot(row) for row in new}
    return [row for row in old if slot(row) not in replaced] + new


def run_child(kind: str, precision: str, args: argparse.Namespace) -> dict:
    env = {**os.environ, **KINDS[kind]}
    command = [sys.executable, __file__, "--child", "--precision", precision, "--steps", str(args.steps),
               "--passages", str(args.passages), "--train-data", args.train_data]
    print(f"[{kind}] {precision}: training {args.steps} steps, encoding {args.passages} passages ...", flush=True)
    output = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in output.stdout.splitlines() if line.startswith("RESULT ")]
    if output.returncode != 0 or not lines:
        sys.exit(f"the {kind}/{precision} run failed:\n{output.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def measure_vllm(kind: str, dtype_precision: str, port: int) -> dict:
    """Start vLLM with one dtype under the kind's environment; 16 concurrent requests of 32 new tokens."""
    from concurrent.futures import ThreadPoolExecutor

    from openai import OpenAI

    from rag_mag.precision import vllm_dtype
    from rag_mag.serving.llm import server as llm_server

    saved = dict(os.environ)
    os.environ.update(KINDS[kind])
    try:
        started = time.perf_counter()
        record = llm_server.start_server(port=port, timeout=900, precision=dtype_precision)
        start_s = time.perf_counter() - started
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        from rag_mag.serving.llm import records as llm_records

        client = OpenAI(base_url=record.api_base_url, api_key=llm_records.api_key(), timeout=900)  # the server's key
        questions = [f"Question {i}: name a famous river in Europe and say where it flows." for i in range(16)]

        def ask(text: str):
            return client.chat.completions.create(model=record.served_model_name, max_tokens=32, temperature=0,
                                                  messages=[{"role": "user", "content": text}]).usage

        ask(questions[0])  # warm-up
        started = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            usages = list(pool.map(ask, questions))
        seconds = time.perf_counter() - started
    finally:
        llm_server.stop_server(port)
    return {"dtype": vllm_dtype(dtype_precision), "start_s": round(start_s, 1), "seconds": round(seconds, 1),
            "generated_tokens_per_s": sum(u.completion_tokens for u in usages) / seconds,
            "prompt_tokens_per_s": sum(u.prompt_tokens for u in usages) / seconds}


def measure_setup(kind: str) -> float:
    """Wall seconds of `rag-mag quickstart --train-only` (the set-up's retrievers and indexes) from scratch."""
    with tempfile.TemporaryDirectory() as artifacts:
        env = {**os.environ, **KINDS[kind], "RAG_MAG_ARTIFACTS": artifacts}
        print(f"[{kind}] set-up: rag-mag quickstart --train-only ...", flush=True)
        started = time.perf_counter()
        subprocess.run([str(REPO / ".venv" / "bin" / "rag-mag"), "quickstart", "--train-only"], env=env, check=True,
                       capture_output=True)
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8, help="training steps per cell (2 are warm-up)")
    parser.add_argument("--passages", type=int, default=512, help="passages encoded per cell")
    parser.add_argument("--train-data", default=str(REPO / "data" / "train_default" / "train.jsonl.gz"),
                        help="training triples (default: the committed build of `rag-mag build-data`)")
    parser.add_argument("--kinds", nargs="+", choices=sorted(KINDS), default=None,
                        help="CPU kinds to measure (default: native, plus emulated where the CPU has native bf16)")
    parser.add_argument("--vllm", action="store_true", help="also measure the vLLM server in both dtypes")
    parser.add_argument("--setup", action="store_true",
                        help="also time the set-up's retriever training and indexing (quickstart --train-only)")
    parser.add_argument("--port", type=int, default=8391, help="port for the --vllm servers")
    parser.add_argument("--out", default=str(REPO / "eval" / "reports" / "precision" / "results.json"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.steps < 4 or args.passages < 64:
        sys.exit("--steps must be at least 4 and --passages at least 64")
    if not Path(args.train_data).is_file():
        sys.exit(f"{args.train_data} does not exist; pass --train-data, or rebuild it with "
                 "`rag-mag build-data eval/configs/train_data.yaml`")
    cpu = cpu_identity()
    kinds = args.kinds or (list(KINDS) if cpu["native_bf16"] else ["native"])
    if "emulated" in kinds and not cpu["native_bf16"]:
        sys.exit("--kinds emulated needs a CPU with native bf16 (this one has none, so `native` already is the "
                 "no-bf16 case); drop `emulated`")
    print(f"CPU: {cpu['model'] or 'unknown'} ({', '.join(cpu['flags']) or 'no AVX2'}), "
          f"native bf16: {'yes' if cpu['native_bf16'] else 'no'}; kinds: {', '.join(kinds)}", flush=True)
    rows = []
    for kind in kinds:
        cells = {precision: run_child(kind, precision, args) for precision in ("fp32", "bf16")}
        auto = "bf16" if cells["fp32"]["auto_picks_bf16"] else "fp32"
        row = {"kind": kind, "cpu": cpu, "measured": time.strftime("%Y-%m-%d"), "env": KINDS[kind],
               "auto_picks": auto, "cells": cells}
        for measure, faster_is in (("train_s_per_step", min), ("encode_passages_per_s", max)):
            best = faster_is(cells, key=lambda p, m=measure: cells[p][m])
            row[f"{measure}_faster"] = best
            row[f"{measure}_auto_is_faster"] = best == auto
        if args.setup:
            row["setup_train_only_s"] = round(measure_setup(kind), 1)
        if args.vllm:
            row["vllm"] = {p: measure_vllm(kind, p, args.port) for p in ("fp32", "bf16")}
            best = max(row["vllm"], key=lambda p: row["vllm"][p]["generated_tokens_per_s"])
            row["vllm_faster"] = best
            row["vllm_auto_is_faster"] = best == auto
        rows.append(row)
    print()
    print("| CPU kind | auto picks | train s/step fp32 | bf16 | encode passages/s fp32 | bf16 | auto is faster |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        c = row["cells"]
        verdict = "yes" if row["train_s_per_step_auto_is_faster"] and row["encode_passages_per_s_auto_is_faster"] \
            else "NO"
        train = {p: c[p]["train_s_per_step"] for p in c}
        print(f"| {row['kind']} | {row['auto_picks']} | {train['fp32']:.2f} | "
              f"{train['bf16']:.2f} ({train['fp32'] / train['bf16']:.2f}x the fp32 speed)"
              f" | {c['fp32']['encode_passages_per_s']:.0f} | {c['bf16']['encode_passages_per_s']:.0f} "
              f"({c['bf16']['encode_passages_per_s'] / c['fp32']['encode_passages_per_s']:.2f}x the fp32 speed) "
              f"| {verdict} |")
    if args.setup:
        print()
        for row in rows:
            print(f"set-up retrievers and indexes on the {row['kind']} CPU (auto = {row['auto_picks']}): "
                  f"{row['setup_train_only_s']:.0f} s")
    if args.vllm:
        print()
        print("| CPU kind | vLLM generated tokens/s float32 | bfloat16 | auto picks | auto is faster |")
        print("|---|---|---|---|---|")
        for row in rows:
            v = row["vllm"]
            print(f"| {row['kind']} | {v['fp32']['generated_tokens_per_s']:.1f} | "
                  f"{v['bf16']['generated_tokens_per_s']:.1f} | {row['auto_picks']} | "
                  f"{'yes' if row['vllm_auto_is_faster'] else 'NO'} |")
    from rag_mag import durable
    from rag_mag.bench.report.environment import collect_environment

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    environment = collect_environment("eval/bench_precision.py")
    run_args = {k: v for k, v in vars(args).items() if k != "child"}
    for row in rows:
        row.update(args=run_args, environment=environment)
    earlier = json.loads(out.read_text())["rows"] if out.is_file() else []
    durable.write_text(out, json.dumps({"rows": merge_rows(earlier, rows)}, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
