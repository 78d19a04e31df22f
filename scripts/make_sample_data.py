#!/usr/bin/env python
"""Cut the small bundled sample in data/sample/ from the full files in shared/data (seeded, reproducible).

    .venv/bin/python scripts/make_sample_data.py [--shared /work/shared/data] [--out data/sample] [--seed 13]

Writes three files in the schemas of shared/data (see data/README.md):

* questions.jsonl: TriviaQA test questions whose own passages hold an answer, HotpotQA dev questions
  (no yes/no) whose supporting paragraph holds the answer, and a few MuSiQue questions;
* corpus.jsonl: every passage of those questions plus extra TriviaQA passages of other questions
  as distractors;
* train_triples.jsonl: HotpotQA training triples (2 positives, up to 3 hard negatives), none of which
  shares an id or a question text with questions.jsonl.

Running it twice with the same seed gives byte-identical files.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import string
from pathlib import Path

from rag_mag import durable

TRIVIAQA_QUESTIONS = 25
HOTPOTQA_QUESTIONS = 15
MUSIQUE_QUESTIONS = 5
DISTRACTOR_PASSAGES = 120
TRAIN_ROWS = 400
HARD_NEGATIVES_PER_ROW = 3
MAX_PASSAGE_CHARS = 1200


def read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def write_jsonl(path: Path, records: list[dict]) -> None:
    with durable.atomic_write(path) as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def normalize(text: str) -> str:
    """SQuAD-style normalization: lower case, no punctuation, no articles, single spaces."""
    text = "".join(char for char in text.lower() if char not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def answer_in(text: str, answers: list[str]) -> bool:
    haystack = f" {normalize(text)} "
    return any(normalize(answer) and f" {normalize(answer)} " in haystack for answer in answers)


def short_enough(record: dict) -> bool:
    return all(len(context["text"]) <= MAX_PASSAGE_CHARS for context in record["contexts"])


def pick_triviaqa(records: list[dict], rng: random.Random) -> list[dict]:
    candidates = [r for r in records if short_enough(r) and any(c.get("has_answer") for c in r["contexts"])
                  and len(r["question"]) <= 160]
    return rng.sample(candidates, TRIVIAQA_QUESTIONS)


def pick_hotpotqa(records: list[dict], rng: random.Random) -> list[dict]:
    def usable(record: dict) -> bool:
        if {normalize(a) for a in record["answers"]} & {"yes", "no"}:
            return False
        supporting = [c["text"] for c in record["contexts"] if c.get("is_supporting")]
        return short_enough(record) and any(answer_in(text, record["answers"]) for text in supporting)

    return rng.sample([r for r in records if usable(r)], HOTPOTQA_QUESTIONS)


def pick_musique(records: list[dict], rng: random.Random) -> list[dict]:
    return rng.sample([r for r in records if short_enough(r)], MUSIQUE_QUESTIONS)


def build_corpus(questions: list[dict], triviaqa: list[dict], rng: random.Random) -> list[dict]:
    corpus: dict[str, dict] = {}
    for record in questions:
        for context in record["contexts"]:
            corpus.setdefault(context["id"], {"id": context["id"], "title": context["title"],
                                              "text": context["text"]})
    chosen = {r["id"] for r in questions}
    pool = sorted({c["id"]: c for r in triviaqa if r["id"] not in chosen for c in r["contexts"]
                   if c["id"] not in corpus and len(c["text"]) <= MAX_PASSAGE_CHARS}.values(),
                  key=lambda c: c["id"])
    for context in rng.sample(pool, DISTRACTOR_PASSAGES):
        corpus[context["id"]] = {"id": context["id"], "title": context["title"], "text": context["text"]}
    return sorted(corpus.values(), key=lambda passage: passage["id"])


def build_triples(triples: list[dict], questions: list[dict], rng: random.Random) -> list[dict]:
    held_out_ids = {r["id"] for r in questions}
    held_out_texts = {normalize(r["question"]) for r in questions}
    usable = [t for t in triples if t["id"] not in held_out_ids and normalize(t["query"]) not in held_out_texts
              and len(t["positives"]) >= 1 and t["hard_negatives"]]
    rows = []
    for triple in rng.sample(usable, TRAIN_ROWS):
        rows.append({"id": triple["id"], "query": triple["query"], "answers": triple["answers"],
                     "positives": triple["positives"],
                     "hard_negatives": triple["hard_negatives"][:HARD_NEGATIVES_PER_ROW],
                     "type": triple.get("type"), "level": triple.get("level"), "source": triple.get("source")})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", type=Path, default=Path("/work/shared/data"), help="shared/data folder")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "data" / "sample")
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    triviaqa = read_jsonl(args.shared / "triviaqa" / "triviaqa_test1000_eval.jsonl")
    hotpotqa = read_jsonl(args.shared / "hotpotqa" / "hotpotqa_dev500_eval.jsonl")
    musique = read_jsonl(args.shared / "musique" / "musique_train100_closed_eval.jsonl")
    triples = read_jsonl(args.shared / "hotpotqa" / "hotpotqa_train_triples.jsonl.gz")

    questions = []
    for dataset, picked in (("triviaqa", pick_triviaqa(triviaqa, rng)), ("hotpotqa", pick_hotpotqa(hotpotqa, rng)),
                            ("musique", pick_musique(musique, rng))):
        for record in sorted(picked, key=lambda r: r["id"]):
            questions.append({"id": record["id"], "question": record["question"], "answers": record["answers"],
                              "contexts": record["contexts"], "source": dataset})
    corpus = build_corpus(questions, triviaqa, rng)
    rows = build_triples(triples, questions, rng)

    write_jsonl(args.out / "questions.jsonl", questions)
    write_jsonl(args.out / "corpus.jsonl", corpus)
    write_jsonl(args.out / "train_triples.jsonl", rows)
    print(f"wrote {len(questions)} questions, {len(corpus)} passages, {len(rows)} training rows to {args.out}")


if __name__ == "__main__":
    main()
