"""The reader on its own: EM/F1 of the trained reader against the untrained SmolLM2, on the same questions.

    .venv/bin/python eval/bench_reader.py --questions 200            # writes eval/reports/reader/

For every dataset, the first N evaluation questions are answered through ``pipelines/reader.yaml`` (the
benchmark's reader pipeline, with its one prompt) in three ways: with the gold passages (``oracle``: supporting
passages where the data names them, else up to 3 answer-bearing contexts), with the untrained MiniLM's top 3
of the dataset's corpus (``retrieved``), and with none (``closed_book``). Each reader is served by vLLM in turn
(the trained one as ``smollm2-135m-reader``, the base as ``smollm2-135m-instruct``), 16 questions in flight;
nothing else should run beside it. The report gives EM and F1 with 95% bootstrap intervals, the trained
reader's gain with a paired permutation p, answers per second and prompt tokens per second.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rag_mag import durable  # noqa: E402
from rag_mag.bench.cells import answer_result, gold_documents  # noqa: E402
from rag_mag.bench.datasets import data_root, load_eval_dataset  # noqa: E402
from rag_mag.bench.generation import BenchPipeline, GenerationCache, generator_overrides, resolve_pipeline  # noqa: E402
from rag_mag.bench.stats import bootstrap_ci, paired_permutation_test  # noqa: E402
from rag_mag.components.answer_prompt import answer_messages  # noqa: E402
from rag_mag.metrics.answers import clean_answer, score_answers  # noqa: E402
from rag_mag.precision import cpu_flags, cpu_kind  # noqa: E402
from rag_mag.serving.llm import readers as llm_readers  # noqa: E402
from rag_mag.serving.llm import server as llm_server  # noqa: E402
from rag_mag.serving.llm import settings as llm_settings  # noqa: E402

logger = logging.getLogger("bench_reader")
CONDITIONS = ("oracle", "retrieved", "closed_book")
READERS = (llm_settings.DEFAULT_SERVED_MODEL_NAME, llm_settings.BASE_SERVED_MODEL_NAME)


def passages_for(datasets: list[str], questions: int, top_k: int) -> dict[str, dict]:
    """Per dataset: its records, and for each condition the Documents each question is given."""
    from haystack import Document

    from rag_mag.reader.examples import dense_retriever

    prepared = {}
    for name in datasets:
        dataset = load_eval_dataset(name, data_root(None))
        view = replace(dataset, records=dataset.records[:questions])
        gold = gold_documents(view, top_k)
        ranked = dense_retriever("", dataset.corpus, "auto")([r.question for r in view.records], top_k)
        retrieved = [[Document(id=p.id, content=p.text, meta={"title": p.title}) for p in row] for row in ranked]
        prepared[name] = {"records": view.records, "oracle": gold, "retrieved": retrieved,
                          "closed_book": [[] for _ in view.records]}
    return prepared


def prompt_tokens(tokenizer, question: str, documents: list) -> int:
    messages = answer_messages(question, [(d.meta.get("title", ""), d.content) for d in documents])
    if not documents:
        from rag_mag.components.answer_prompt import AnswerPromptBuilder

        built = AnswerPromptBuilder().run(question=question, documents=[])["prompt"]
        messages = [{"role": m.role.value, "content": m.text} for m in built]
    return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                             return_dict=False))


def run_reader(reader: str, prepared: dict, cache: GenerationCache, port: int, concurrency: int,
               tokenizer) -> dict:
    record = llm_server.start_server(reader, port=port, timeout=900.0)
    try:
        path = resolve_pipeline("pipelines/reader.yaml")
        overrides = generator_overrides(path, record.api_base_url, 900.0, 3)
        overrides["llm_model"] = reader
        overrides["max_tokens"] = 16
        pipeline = BenchPipeline(path, overrides, cache, concurrency=concurrency, retry_waits=[30, 120])
        cells = {}
        for name, data in prepared.items():
            for condition in CONDITIONS:
                inputs = [{"question": r.question, "documents": list(docs)}
                          for r, docs in zip(data["records"], data[condition], strict=True)
                          if condition != "oracle" or docs]
                records = [r for r, docs in zip(data["records"], data[condition], strict=True)
                           if condition != "oracle" or docs]
                started = time.monotonic()
                replies = pipeline.run_many(inputs, answer_result, progress=f"{reader}/{name}/{condition}")
                seconds = time.monotonic() - started
                answers = [clean_answer(r["reply"]) for r in replies]
                scores = score_answers(answers, [r.answers for r in records])
                tokens = sum(prompt_tokens(tokenizer, i["question"], i["documents"]) for i in inputs)
                em, f1 = scores.em_per_example * 100, scores.f1_per_example * 100
                cells[f"{name}/{condition}"] = {
                    "n": scores.n, "em": scores.em, "f1": scores.f1, "em_ci": list(bootstrap_ci(em)),
                    "f1_ci": list(bootstrap_ci(f1)), "em_per_question": em.tolist(), "f1_per_question": f1.tolist(),
                    "answer_words": float(np.mean([len(a.split()) for a in answers])) if answers else 0.0,
                    "seconds": seconds, "prompt_tokens": tokens, "samples": answers[:5]}
        return cells
    finally:
        llm_server.stop_server(port)


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {len(__import__('os').sched_getaffinity(0))} cores"
    return "unknown CPU"


def markdown(results: dict) -> str:
    trained, base = READERS
    lines = [f"# The reader: {trained} against {base}", "",
             f"Generated by `{results['command']}` on {results['date']} ({results['cpu']}, CPU kind "
             f"{results['cpu_kind']}); total wall time {results['wall_seconds']:.0f} s.", "",
             f"First {results['questions']} questions per set (MuSiQue has 100); `oracle` leaves out questions "
             "without gold passages. EM and F1 in points with 95% bootstrap intervals; gain = trained - base, "
             "paired permutation p.", "",
             "| set | passages | n | base EM | trained EM | EM gain (p) | base F1 | trained F1 | answer words base / "
             "trained |", "|---|---|---|---|---|---|---|---|---|"]
    for key in results["cells"][trained]:
        t, b = results["cells"][trained][key], results["cells"][base][key]
        p = paired_permutation_test(t["em_per_question"], b["em_per_question"])
        name, condition = key.split("/")
        lines.append(f"| {name} | {condition} | {t['n']} | {b['em']:.1f} [{b['em_ci'][0]:.1f}, {b['em_ci'][1]:.1f}] | "
                     f"{t['em']:.1f} [{t['em_ci'][0]:.1f}, {t['em_ci'][1]:.1f}] | {t['em'] - b['em']:+.1f} "
                     f"({p:.3f}) | {b['f1']:.1f} | {t['f1']:.1f} | {b['answer_words']:.1f} / {t['answer_words']:.1f} |")
    lines += ["", "| reader | answers | seconds | answers/s | prompt tokens/s |", "|---|---|---|---|---|"]
    for reader in READERS:
        cells = results["cells"][reader].values()
        answers, seconds = sum(c["n"] for c in cells), sum(c["seconds"] for c in cells)
        tokens = sum(c["prompt_tokens"] for c in cells)
        lines.append(f"| {reader} | {answers} | {seconds:.0f} | {answers / seconds:.2f} | {tokens / seconds:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["trivia_qa", "nq_open", "hotpot_qa", "musique"])
    parser.add_argument("--questions", type=int, default=200, help="first N questions per set (default %(default)s)")
    parser.add_argument("--top-k", type=int, default=3, help="passages per question (default %(default)s)")
    parser.add_argument("--port", type=int, default=8031)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", default="eval/reports/reader")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from transformers import AutoTokenizer

    started = time.monotonic()
    folders = llm_readers.prepare_readers()
    tokenizer = AutoTokenizer.from_pretrained(folders[llm_settings.BASE_SERVED_MODEL_NAME])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prepared = passages_for(args.datasets, args.questions, args.top_k)
    cache = GenerationCache(out / "cache" / "generations.jsonl")
    cells = {reader: run_reader(reader, prepared, cache, args.port, args.concurrency, tokenizer)
             for reader in READERS}
    from rag_mag.models import shipped_reader_adapter
    from rag_mag.reader.merge import verify_adapter

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    results = {"command": "python eval/bench_reader.py " + " ".join(sys.argv[1:]), "commit": commit.stdout.strip(),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_model(),
               "cpu_kind": cpu_kind(cpu_flags()), "questions": args.questions, "top_k": args.top_k,
               "readers": {llm_settings.DEFAULT_SERVED_MODEL_NAME: verify_adapter(shipped_reader_adapter()),
                           llm_settings.BASE_SERVED_MODEL_NAME: "untrained"},
               "wall_seconds": time.monotonic() - started, "cells": cells}
    durable.write_text(out / "results.json", json.dumps(results, indent=1) + "\n")
    durable.write_text(out / "report.md", markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
