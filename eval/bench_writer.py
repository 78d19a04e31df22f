"""The question writer against the untrained SmolLM2 prompted for the same task, on passages no training saw.

    .venv/bin/python eval/bench_writer.py --passages 200          # writes eval/reports/writer/; stop vLLM first

Two sets of passages:

* ``nq_heldout``: the gold passages of the writer's held-out validation questions (NQ-open oracle, chosen by
  ``eval/configs/writer.yaml``'s seed before any example was built; the real questions are not used);
* ``triviaqa_corpus``: ``--passages`` passages of at least 30 words drawn (seeded) from the TriviaQA evaluation
  corpus, another domain's text. Only passages are read, never its questions.

Each writer (``smollm2-135m-writer``, then ``smollm2-135m-instruct``, the base) is served by vLLM in turn and writes
one question per passage with the QuestionPromptBuilder prompt (greedy), exactly as ``rag-mag synth`` asks it;
then the trained reader answers every parsed question from its passage alone. A passage counts as
**answerable and answered** when the reply parses as a question and an answer, the answer occurs in the passage,
and the reader's answer agrees with it (token F1 at least 0.5): ``rag-mag synth``'s reader check. The report
gives each rate with a 95% bootstrap interval and the writer's gain with a paired permutation p.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rag_mag import durable  # noqa: E402
from rag_mag.adapt.chunks import Chunk  # noqa: E402
from rag_mag.adapt.synth import (  # noqa: E402
    SynthSettings,
    answer_questions,
    reader_agrees,
    served,
    write_questions,
)
from rag_mag.bench.datasets import data_root  # noqa: E402
from rag_mag.bench.stats import bootstrap_ci, paired_permutation_test  # noqa: E402
from rag_mag.data import read_corpus  # noqa: E402
from rag_mag.metrics.answers import contains_answer, normalize_answer  # noqa: E402
from rag_mag.precision import cpu_kind  # noqa: E402
from rag_mag.serving.llm import settings as llm_settings  # noqa: E402

logger = logging.getLogger("bench_writer")
WRITERS = (llm_settings.WRITER_SERVED_MODEL_NAME, llm_settings.BASE_SERVED_MODEL_NAME)
OUT = REPO / "eval" / "reports" / "writer"


def heldout_passages(work: Path) -> list[Chunk]:
    """The gold passages of the writer's validation questions, rebuilt from eval/configs/writer.yaml."""
    import yaml

    from rag_mag.reader.config import ReaderConfig
    from rag_mag.reader.trainer import ReaderTrainer

    settings = yaml.safe_load((REPO / "eval" / "configs" / "writer.yaml").read_text())
    trainer = ReaderTrainer(ReaderConfig(**{**settings, "out": str(work / "writer_examples")}), data_root(None))
    _, validation, _ = trainer.examples()
    return [Chunk(example.id, title, text, example.id, None)
            for example in validation for (title, text) in example.passages]


def corpus_passages(count: int, seed: int) -> list[Chunk]:
    passages = [p for p in read_corpus(data_root(None) / "triviaqa" / "triviaqa_test1000_corpus.jsonl")
                if len(p.text.split()) >= 30]
    drawn = random.Random(seed).sample(passages, min(count, len(passages)))
    return [Chunk(p.id, p.title, p.text, p.title, None) for p in drawn]


def judge_one(chunk: Chunk, written: dict, answered: dict) -> dict[str, float]:
    parsed = bool(written.get("question"))
    in_passage = parsed and contains_answer(chunk.text, [written["answer"]])
    reader_answer = answered.get("reader_answer", "")
    answered_ok = in_passage and reader_agrees(chunk.text, written["answer"], reader_answer, 0.5)
    leaks = parsed and normalize_answer(written["answer"]) in normalize_answer(written["question"])
    return {"parsed": float(parsed), "answer_in_passage": float(in_passage), "answered": float(answered_ok),
            "answer_in_question": float(leaks)}


def summarize(values: list[float]) -> dict:
    low, high = bootstrap_ci(values)
    return {"rate": 100.0 * sum(values) / len(values), "ci": [100.0 * low, 100.0 * high]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passages", type=int, default=200, help="passages drawn from the TriviaQA corpus")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=REPO / "artifacts" / "bench_writer")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "openai"):  # a line per request
        logging.getLogger(noisy).setLevel(logging.WARNING)
    started = time.perf_counter()
    sets = {"nq_heldout": heldout_passages(args.work), "triviaqa_corpus": corpus_passages(args.passages, args.seed)}
    settings = SynthSettings()
    written: dict[tuple[str, str], dict] = {}
    for writer in WRITERS:
        with served(writer, None, None, max_tokens=64) as generate:
            for name, chunks in sets.items():
                folder = args.work / writer / name
                folder.mkdir(parents=True, exist_ok=True)
                written[writer, name] = write_questions(chunks, folder, generate, settings)
    answered = {}
    with served(llm_settings.DEFAULT_SERVED_MODEL_NAME, None, None, max_tokens=32) as generate:
        for (writer, name), records in written.items():
            by_id = {chunk.id: chunk for chunk in sets[name]}
            answered[writer, name] = answer_questions(records, by_id, args.work / writer / name, generate, settings)
    results = {"machine": cpu_kind(), "seed": args.seed, "sets": {}}
    for name, chunks in sets.items():
        per_writer = {writer: [judge_one(c, written[writer, name][c.id], answered[writer, name].get(c.id, {}))
                               for c in chunks] for writer in WRITERS}
        row = {"passages": len(chunks)}
        for writer, judged in per_writer.items():
            row[writer] = {metric: summarize([j[metric] for j in judged]) for metric in judged[0]}
            row[writer]["samples"] = [{"passage": c.text[:200], **written[writer, name][c.id],
                                       **answered[writer, name].get(c.id, {})} for c in chunks[:8]]
        trained, base = ([j["answered"] for j in per_writer[w]] for w in WRITERS)
        row["answered_gain"] = 100.0 * (sum(trained) - sum(base)) / len(chunks)
        row["answered_gain_p"] = paired_permutation_test(trained, base)
        results["sets"][name] = row
    results["wall_seconds"] = round(time.perf_counter() - started, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    durable.write_text(args.out / "results.json", json.dumps(results, indent=2) + "\n")
    for name, row in results["sets"].items():
        print(name, {w: round(row[w]["answered"]["rate"], 1) for w in WRITERS},
              f"gain {row['answered_gain']:.1f} p {row['answered_gain_p']:.4f}")


if __name__ == "__main__":
    main()
