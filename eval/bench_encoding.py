"""Corpus encoding speed: fp32 against bfloat16 autocast, and how far bf16 embeddings move.

    .venv/bin/python eval/bench_encoding.py --passages 640

Same encoder (packaged all-MiniLM-L6-v2), same passages (the first N of the TriviaQA corpus, or
--corpus), same batch size; the two precisions alternate --rounds times and the median is kept.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from rag_mag.bench.datasets import data_root
from rag_mag.data import read_corpus
from rag_mag.retriever.encoder import MagnitudeEncoder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", help="corpus JSONL (default: TriviaQA's from the shared data)")
    parser.add_argument("--passages", type=int, default=640)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    corpus = args.corpus or str(data_root() / "triviaqa" / "triviaqa_test1000_corpus.jsonl")
    texts = [p.content for p in read_corpus(corpus)[: args.passages]]
    encoder = MagnitudeEncoder.build(strategy="qnorm")
    encoder.encode(texts[:64], "document")  # warm-up
    seconds: dict[bool, list[float]] = {False: [], True: []}
    vectors = {}
    for _ in range(args.rounds):
        for bf16 in (False, True):
            started = time.perf_counter()
            vectors[bf16] = encoder.encode(texts, "document", batch_size=args.batch_size, treated=False, bf16=bf16)
            seconds[bf16].append(time.perf_counter() - started)
    full, half = vectors[False], vectors[True]
    cosines = (full * half).sum(1) / (np.linalg.norm(full, axis=1) * np.linalg.norm(half, axis=1))
    norm_change = np.abs(np.linalg.norm(half, axis=1) / np.linalg.norm(full, axis=1) - 1)
    rates = {bf16: len(texts) / statistics.median(values) for bf16, values in seconds.items()}
    print(f"{len(texts)} passages, batch {args.batch_size}, median of {args.rounds} alternating rounds")
    print(f"fp32: {rates[False]:.1f} passages/s")
    print(f"bf16: {rates[True]:.1f} passages/s  ({rates[True] / rates[False]:.2f}x fp32)")
    print(f"bf16 vs fp32 embeddings: min cosine {cosines.min():.6f}, max norm change {100 * norm_change.max():.2f}%")


if __name__ == "__main__":
    main()
