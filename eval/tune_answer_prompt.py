"""Tune the answer prompt for short answers, on TRAINING questions only, with the gold passages given.

    .venv/bin/python eval/tune_answer_prompt.py --llm-url http://127.0.0.1:8000/v1 --questions 60

Questions: the first N HotpotQA training triples (query, answers, positive passages) and the first N
NQ-open dev "oracle" questions (one gold passage each) whose normalized text is not in any benchmark
evaluation file (nq_test1000, TriviaQA, HotpotQA dev, MuSiQue, 2Wiki). The few-shot examples are other
HotpotQA training triples (never tuning questions). Each prompt variant runs through pipelines/reader.yaml (its prompt
replaced with --set prompt_builder.template=...) and is scored with the benchmark's EM, F1 and answer
accuracy (a gold alias occurs in the answer), after the benchmark's ``clean_answer``. The results are
recorded in eval/README.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PASSAGES = """Passages:
{%- for document in documents %}
[{{ loop.index }}] {{ document.meta.get("title", "") }}: {{ document.content | truncate(700) }}
{%- endfor %}

Question: {{ question }}
Answer:"""


def system(text: str) -> str:
    return '{% message role="system" %}\n' + text + "\n{% endmessage %}\n"


def user(text: str) -> str:
    return '{% message role="user" %}\n' + text + "\n{% endmessage %}\n"


def assistant(text: str) -> str:
    return '{% message role="assistant" %}\n' + text + "\n{% endmessage %}\n"


def shots(examples: list[dict]) -> str:
    """Worked examples as earlier chat turns: passages and question, then the short answer."""
    turns = ""
    for example in examples:
        passages = "\n".join(f"[{i}] {p['title']}: {p['text'][:300]}" for i, p in enumerate(example["positives"], 1))
        turns += user(f"Passages:\n{passages}\n\nQuestion: {example['query']}\nAnswer:")
        turns += assistant(example["answers"][0])
    return turns


BASE = "You answer questions briefly from these passages. Reply with the answer only, in a few words."
STRICT = ("Answer the question with the shortest exact phrase from the passages: a name, a place, a date, a "
          "number, or yes or no. Do not write a sentence. Do not explain.")


QUESTION_FIRST = """Question: {{ question }}

Passages:
{%- for document in documents %}
[{{ loop.index }}] {{ document.meta.get("title", "") }}: {{ document.content | truncate(700) }}
{%- endfor %}

Answer the question in at most five words."""


def variants(examples: list[dict]) -> dict[str, str]:
    short = [e for e in examples if e["answers"][0].lower() not in ("yes", "no")]
    return {
        "current (rag.yaml)": system(BASE) + user(PASSAGES),
        "strict phrase": system(STRICT) + user(PASSAGES),
        "current + 2 examples": system(BASE) + shots(examples[:2]) + user(PASSAGES),
        "strict + 2 examples": system(STRICT) + shots(examples[:2]) + user(PASSAGES),
        "question first, at most five words": system(BASE) + user(QUESTION_FIRST),
        f"question first + {len(short)} short-answer examples": system(BASE) + shots(short) + user(QUESTION_FIRST),
    }


def load_questions(data_root: Path, count: int) -> tuple[list[dict], list[dict]]:
    from rag_mag.metrics.answers import normalize_answer

    held_out = set()
    for path in ("nq_open/nq_test1000_eval.jsonl", "triviaqa/triviaqa_test1000_eval.jsonl",
                 "hotpotqa/hotpotqa_dev500_eval.jsonl", "musique/musique_train100_closed_eval.jsonl",
                 "2wikimultihopqa/original/r1searcher_2wiki_dev_500_qa_only.jsonl"):
        with open(data_root / path, encoding="utf-8") as handle:
            held_out.update(normalize_answer(json.loads(line)["question"]) for line in handle if line.strip())
    with gzip.open(data_root / "hotpotqa" / "hotpotqa_train_triples.jsonl.gz", "rt", encoding="utf-8") as handle:
        triples = [json.loads(line) for line in handle if line.strip()]
    triples = [t for t in triples if normalize_answer(t["query"]) not in held_out]
    # the two last triples, then the last ones whose answer is 1 to 3 words (examples are never tuning questions)
    short = [t for t in triples[count:] if len(t["answers"][0].split()) <= 3][-3:]
    examples, hotpot = triples[-2:] + [t for t in short if t not in triples[-2:]], triples[:count]
    with open(data_root / "nq_open" / "nq_open_oracle_eval.jsonl", encoding="utf-8") as handle:
        oracle = [json.loads(line) for line in handle if line.strip()]
    oracle = [o for o in oracle if normalize_answer(o["question"]) not in held_out][:count]
    questions = [{"question": t["query"], "answers": t["answers"], "passages": t["positives"], "set": "hotpot_train"}
                 for t in hotpot]
    questions += [{"question": o["question"], "answers": o["answers"], "passages": o["contexts"],
                   "set": "nq_oracle_dev"} for o in oracle]
    return questions, examples


def main() -> None:
    from haystack import Document

    from rag_mag.bench.datasets import data_root
    from rag_mag.bench.generation import BenchPipeline, GenerationCache, clean_answer
    from rag_mag.metrics import contains_answer, score_answers
    from rag_mag.serving.pipelines import PIPELINES_DIR

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llm-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--questions", type=int, default=60, help="per source (HotpotQA train, NQ dev oracle)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--cache", default="/tmp/rag_mag_prompt_tuning.jsonl")
    args = parser.parse_args()
    questions, examples = load_questions(data_root(), args.questions)
    inputs = [{"question": q["question"], "documents": [Document(id=p["id"], content=p["text"],
                                                                 meta={"title": p["title"]}) for p in q["passages"]]}
              for q in questions]
    golds = [q["answers"] for q in questions]
    print(f"{len(questions)} training questions; few-shot examples: {[(e['query'], e['answers']) for e in examples]}")
    print("| prompt | set | EM | F1 | accuracy | mean answer words |")
    print("|---|---|---|---|---|---|")
    for name, template in variants(examples).items():
        pipeline = BenchPipeline(PIPELINES_DIR / "reader.yaml", {
            "prompt_builder.template": template, "max_tokens": args.max_tokens, "llm.api_base_url": args.llm_url,
            "llm.timeout": 600.0, "llm.max_retries": 3}, GenerationCache(Path(args.cache)), concurrency=16)
        replies = pipeline.run_many(inputs, lambda outputs: outputs["answers"][0].data or "", progress=name)
        answers = [clean_answer(reply) for reply in replies]
        for subset in ("hotpot_train", "nq_oracle_dev", "all"):
            chosen = [i for i, q in enumerate(questions) if subset in ("all", q["set"])]
            scores = score_answers([answers[i] for i in chosen], [golds[i] for i in chosen])
            accuracy = np.mean([contains_answer(answers[i], golds[i]) for i in chosen])
            words = np.mean([len(answers[i].split()) for i in chosen])
            print(f"| {name} | {subset} | {100 * scores.em_per_example.mean():.1f} | "
                  f"{100 * scores.f1_per_example.mean():.1f} | {100 * accuracy:.1f} | {words:.1f} |", flush=True)


if __name__ == "__main__":
    main()
