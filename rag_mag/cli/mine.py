"""``rag-mag mine``: training triples from question/answer pairs + a corpus (BM25, DPR-style)."""

from __future__ import annotations

import argparse
import json
import logging

from rag_mag import durable
from rag_mag.cli import DefaultsHelpFormatter
from rag_mag.data import read_corpus, read_eval, read_pairs, write_jsonl

logger = logging.getLogger(__name__)


def _count(minimum: int):
    """An argparse type: a whole number of at least ``minimum`` (a clear one-line error otherwise)."""
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number of at least {minimum}, got {number}")
        return number
    return parse


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "mine", help="mine training triples from question/answer pairs and a corpus",
        description="For each question, BM25 ranks the corpus: the best passages containing a gold answer become "
                    "positives, the best passages containing none become hard negatives. Questions found in any "
                    "--exclude evaluation file (by id or normalized text) are dropped.",
        formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--pairs", required=True, help="JSONL of {question, answer|answers} (.gz is fine)")
    parser.add_argument("--corpus", required=True, help="corpus JSONL {id, title, text} (.gz is fine)")
    parser.add_argument("--out", required=True, help="output triples JSONL")
    parser.add_argument("--exclude", action="append", default=[], metavar="EVAL_JSONL",
                        help="evaluation file whose questions must not be mined (repeatable)")
    parser.add_argument("--top-k", type=_count(1), default=100, help="BM25 candidates per question")
    parser.add_argument("--max-positives", type=_count(1), default=1, help="positives kept per question")
    parser.add_argument("--hard-negatives", type=_count(0), default=4, help="hard negatives kept per question")
    parser.add_argument("--limit", type=_count(0), default=0, help="mine only the first N pairs (0: all)")
    return parser


def run(args: argparse.Namespace) -> int:
    with durable.job_lock(durable.lock_path(args.out), f"the triples file {args.out}"):
        return _mine(args)


def _mine(args: argparse.Namespace) -> int:
    from rag_mag.retriever.data.mining import evaluation_keys, mine_triples

    pairs = read_pairs(args.pairs)
    if args.limit:
        pairs = pairs[: args.limit]
    corpus = read_corpus(args.corpus)
    excluded_ids, excluded_questions = set(), set()
    for path in args.exclude:
        ids, questions = evaluation_keys(read_eval(path))
        excluded_ids |= ids
        excluded_questions |= questions
    triples, stats = mine_triples(pairs, corpus, excluded_ids, excluded_questions, top_k=args.top_k,
                                  max_positives=args.max_positives, hard_negatives=args.hard_negatives)
    write_jsonl(args.out, triples)
    summary = {k: v for k, v in vars(stats).items() if k != "examples_excluded"}
    logger.info("excluded for overlap with evaluation questions, e.g.: %s", stats.examples_excluded[:3])
    print(json.dumps({"out": args.out, **summary}, indent=2))
    return 0
