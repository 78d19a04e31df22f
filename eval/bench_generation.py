"""Answer-generation throughput: the vLLM server (N concurrent requests) against in-process transformers.

Both systems generate with the same model (SmolLM2-135M-Instruct converted to a safetensors folder, served
in bfloat16 by vLLM and loaded in float32, its fastest CPU dtype, by ``TransformersChatGenerator`` of the
transformers-haystack integration), the same
RAG-style chat prompts (a TriviaQA question + its first 3 retrieved passages), greedy decoding and the
same ``max_tokens``. vLLM is reached through vllm-haystack's ``VLLMChatGenerator`` (``run_async``, at most
``--concurrency`` requests in flight); transformers answers one prompt after another, as it would in a
pipeline. Printed: answers/s and generated tokens/s of each, the ratio, the exact match of each against
the TriviaQA aliases, and how often the two answers agree (a check that both ran the same model).

    .venv/bin/python eval/bench_generation.py --start-server          # starts and stops its own server
    .venv/bin/python eval/bench_generation.py --url http://127.0.0.1:8000/v1 --prompts 32 --max-tokens 32

``--reserved-cpus 1,0`` instead compares vLLM servers alone, one per value of vLLM's
``VLLM_CPU_NUM_OF_RESERVED_CPU`` (the cores its CPU worker leaves to the API front end; vLLM reserves 1 by
default, which on 2 cores leaves the model one core): each server is started, given the same prompts at
``--concurrency``, and stopped; printed are answers/s and the ratio of each to the first value's.
``--eager`` compares, the same way, the server as rag-mag starts it with one started with ``--enforce-eager``
(vLLM then skips compiling the model at start): the start's seconds against the answers/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import time
from pathlib import Path

# Haystack is imported before rag_mag here, so its telemetry is turned off here too (see rag_mag/__init__.py).
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack.dataclasses import ChatMessage

from rag_mag import durable
from rag_mag.data import EvalRecord, read_eval
from rag_mag.metrics.answers import exact_match
from rag_mag.models import default_reader_dir
from rag_mag.serving.llm.preflight import check_server
from rag_mag.serving.llm.server import EAGER_ARGS, start_server, stop_server
from rag_mag.serving.llm.settings import DEFAULT_SERVED_MODEL_NAME, default_api_base_url
from rag_mag.serving.processes import find_free_port

DEFAULT_DATA = Path("/work/shared/data/triviaqa/triviaqa_test1000_eval.jsonl")
SYSTEM_PROMPT = "Answer the question using the passages. Reply with a short answer only, a few words."


def build_prompts(records: list[EvalRecord], passages: int, passage_words: int) -> list[list[ChatMessage]]:
    prompts = []
    for record in records:
        lines = []
        for number, context in enumerate(record.contexts[:passages], start=1):
            text = " ".join(context.text.split()[:passage_words])
            lines.append(f"Passage {number} ({context.title}): {text}")
        user = "\n".join(lines) + f"\n\nQuestion: {record.question}\nAnswer:"
        prompts.append([ChatMessage.from_system(SYSTEM_PROMPT), ChatMessage.from_user(user)])
    return prompts


def run_vllm(prompts: list[list[ChatMessage]], url: str, model: str, max_tokens: int,
             concurrency: int) -> tuple[float, list[str]]:
    from haystack_integrations.components.generators.vllm import VLLMChatGenerator

    generator = VLLMChatGenerator(model=model, api_base_url=url, timeout=300.0, max_retries=0,
                                  generation_kwargs={"max_tokens": max_tokens, "temperature": 0.0})

    async def answer_all() -> tuple[float, list[ChatMessage]]:
        limit = asyncio.Semaphore(concurrency)

        async def answer(messages: list[ChatMessage]) -> ChatMessage:
            async with limit:
                return (await generator.run_async(messages=messages))["replies"][0]

        await generator.run_async(messages=prompts[0])  # warm-up: client, prefix cache, first-request costs
        started = time.perf_counter()
        replies = await asyncio.gather(*(answer(messages) for messages in prompts))
        seconds = time.perf_counter() - started
        await generator.close_async()
        return seconds, replies

    seconds, replies = asyncio.run(answer_all())
    return seconds, [reply.text or "" for reply in replies]


def run_transformers(prompts: list[list[ChatMessage]], model_dir: Path, max_tokens: int,
                     dtype: str) -> tuple[float, list[str]]:
    from haystack_integrations.components.generators.transformers import TransformersChatGenerator

    generator = TransformersChatGenerator(
        model=str(model_dir), task="text-generation",
        generation_kwargs={"max_new_tokens": max_tokens, "do_sample": False},
        huggingface_pipeline_kwargs={"dtype": dtype},
    )
    generator.warm_up()
    generator.run(messages=prompts[0])  # warm-up
    started = time.perf_counter()
    replies = [generator.run(messages=messages)["replies"][0] for messages in prompts]
    seconds = time.perf_counter() - started
    return seconds, [reply.text or "" for reply in replies]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="eval JSONL with contexts (TriviaQA)")
    parser.add_argument("--prompts", type=int, default=32, help="number of questions")
    parser.add_argument("--passages", type=int, default=3, help="passages per prompt")
    parser.add_argument("--passage-words", type=int, default=60, help="words kept of each passage")
    parser.add_argument("--max-tokens", type=int, default=32, help="generated tokens at most per answer")
    parser.add_argument("--concurrency", type=int, default=16, help="vLLM requests in flight at once")
    parser.add_argument("--url", default=None, help="vLLM base URL (default $RAG_MAG_VLLM_URL or :8000/v1)")
    parser.add_argument("--model", default=DEFAULT_SERVED_MODEL_NAME, help="served model name")
    parser.add_argument("--model-dir", type=Path, default=None, help="the same model as a folder, for transformers")
    parser.add_argument("--dtype", default="float32",
                        help="dtype of the transformers baseline: float32, its fastest on CPU (eager bfloat16 "
                             "generate measured 30x slower here); vLLM serves bfloat16")
    parser.add_argument("--start-server", action="store_true", help="start a vLLM server on a free port, stop it after")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures to this JSON file")
    parser.add_argument("--reserved-cpus", default=None, metavar="N,M,...",
                        help="compare vLLM servers started with these VLLM_CPU_NUM_OF_RESERVED_CPU values "
                             "(the first is the baseline) instead of vLLM against transformers")
    parser.add_argument("--eager", action="store_true",
                        help="compare a vLLM server started as rag-mag starts it (the baseline) with one started "
                             "with --enforce-eager (no torch.compile at start) instead of vLLM against "
                             "transformers: the start's seconds and answers/s of each")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "haystack", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    records = [r for r in read_eval(args.data) if len(r.contexts) >= args.passages][: args.prompts]
    prompts = build_prompts(records, args.passages, args.passage_words)
    model_dir = args.model_dir or default_reader_dir()
    load_before = os.getloadavg()[0]
    if args.reserved_cpus is not None:
        try:
            values = [int(v) for v in args.reserved_cpus.split(",")]
        except ValueError:
            raise SystemExit(f"--reserved-cpus takes whole numbers separated by commas, not {args.reserved_cpus!r}") \
                from None
        compare_servers(args, prompts, load_before, [
            (f"VLLM_CPU_NUM_OF_RESERVED_CPU={value}", {"VLLM_CPU_NUM_OF_RESERVED_CPU": str(value)}, [])
            for value in values])
        return
    if args.eager:
        compare_servers(args, prompts, load_before, [("as rag-mag starts it", {}, []),
                                                     ("--enforce-eager", {}, list(EAGER_ARGS))])
        return
    started_port = None
    if args.start_server:
        started_port = find_free_port()
        url = start_server(port=started_port).api_base_url
    else:
        url = args.url or default_api_base_url()
        check_server(url, model=args.model)
    try:
        vllm_runs = {level: run_vllm(prompts, url, args.model, args.max_tokens, level)
                     for level in sorted({1, args.concurrency})}
    finally:
        if started_port is not None:
            stop_server(started_port)
    hf_seconds, hf_answers = run_transformers(prompts, model_dir, args.max_tokens, args.dtype)

    golds = [record.answers for record in records]
    n = len(prompts)
    # Generated tokens are counted the same way for both: the answer text re-encoded by the model's tokenizer.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def summary(label: str, seconds: float, answers: list[str]) -> dict:
        tokens = sum(len(tokenizer.encode(answer, add_special_tokens=False)) for answer in answers)
        return {"label": label, "seconds": seconds, "answers_per_s": n / seconds, "tokens_per_s": tokens / seconds,
                "tokens": tokens, "em": 100 * sum(map(exact_match, answers, golds)) / n,
                "identical_to_transformers": sum(a.strip() == b.strip() for a, b in
                                                 zip(answers, hf_answers, strict=True)) / n}

    rows = {"transformers": summary("in-process transformers, sequential", hf_seconds, hf_answers)}
    for level, (seconds, answers) in vllm_runs.items():
        rows[f"vllm_c{level}"] = summary(f"vLLM server, {level} concurrent", seconds, answers)
    best = rows[f"vllm_c{args.concurrency}"]
    figures = {
        "prompts": n, "max_tokens": args.max_tokens, "concurrency": args.concurrency, "cpu_count": os.cpu_count(),
        "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]}, "rows": rows,
        "speedup": best["answers_per_s"] / rows["transformers"]["answers_per_s"],
    }
    print(f"{n} RAG prompts ({args.passages} passages of <= {args.passage_words} words), max_tokens {args.max_tokens}; "
          f"load average {load_before:.1f} before, {figures['load_average_1min']['after']:.1f} after, "
          f"on {os.cpu_count()} cores shared with other work")
    for row in rows.values():
        print(f"  {row['label']:38s} {row['answers_per_s']:6.2f} answers/s  {row['tokens_per_s']:7.1f} tokens/s  "
              f"({row['seconds']:.1f} s, {row['tokens']} tokens)  EM {row['em']:.1f}  "
              f"same answer as transformers {100 * row['identical_to_transformers']:.0f}%")
    print(f"  speed-up of vLLM ({args.concurrency} concurrent) over transformers: {figures['speedup']:.2f}x answers/s")
    best_answers = vllm_runs[args.concurrency][1]
    for record, vllm_answer, hf_answer in list(zip(records, best_answers, hf_answers, strict=True))[:3]:
        print(f"  e.g. {record.question[:60]!r}: vLLM {vllm_answer[:40]!r} | transformers {hf_answer[:40]!r}")
    if args.out:
        durable.write_text(args.out, json.dumps(figures, indent=2) + "\n")


def compare_servers(args: argparse.Namespace, prompts: list[list[ChatMessage]], load_before: float,
                    variants: list[tuple[str, dict[str, str], list[str]]]) -> None:
    """Each variant (label, environment, extra vLLM arguments) started fresh, given the same prompts at
    ``--concurrency`` and stopped; the first is the baseline."""
    rows = []
    for label, env, extra_args in variants:
        saved = {name: os.environ.get(name) for name in env}
        os.environ.update(env)  # read by the server start_server launches
        port = find_free_port()
        started = time.perf_counter()
        try:
            url = start_server(port=port, extra_args=extra_args).api_base_url
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        start_s = time.perf_counter() - started
        try:
            seconds, answers = run_vllm(prompts, url, args.model, args.max_tokens, args.concurrency)
        finally:
            stop_server(port)
        rows.append({"server": label, "env": env, "args": extra_args, "start_s": round(start_s, 1),
                     "seconds": round(seconds, 1), "answers_per_s": len(prompts) / seconds, "answers": answers})
    baseline = rows[0]
    print(f"{len(prompts)} RAG prompts ({args.passages} passages of <= {args.passage_words} words), max_tokens "
          f"{args.max_tokens}, {args.concurrency} concurrent; load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after, on {os.cpu_count()} cores")
    for row in rows:
        same = sum(a == b for a, b in zip(row["answers"], baseline["answers"], strict=True)) / len(prompts)
        row["same_answers_as_baseline"] = same
        print(f"  {row['server']}: {row['answers_per_s']:.2f} answers/s ({row['seconds']:.1f} s; server start "
              f"{row['start_s']:.0f} s, {row['start_s'] / baseline['start_s']:.2f}x the first's), "
              f"{row['answers_per_s'] / baseline['answers_per_s']:.2f}x the first's answers/s, "
              f"same answers {100 * same:.0f}%")
    if args.out:
        durable.write_text(args.out, json.dumps({"prompts": len(prompts), "concurrency": args.concurrency,
                                                 "cpu_count": os.cpu_count(), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
