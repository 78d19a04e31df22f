"""Document norm against passage length on the Wikipedia sets, for every retriever given (issue 60).

The real-documents benchmark (`rag-mag bench eval/configs/realdocs.yaml`) reports how the norm follows chunk length in
indexes of real files; this does the same for the corpora of the Wikipedia sets, whose passages are about 100 words
each, and for each checkpoint fits the law that `length_calibration` takes out (rag_mag/retriever/length.py).

    .venv/bin/python eval/norm_by_length.py --retriever artifacts/retriever-default artifacts/retriever-cosine

Prints one JSON line per (retriever, corpus) and a table; `--out FILE` writes them as JSON too.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CORPORA = {"trivia_qa": "triviaqa/triviaqa_test1000_corpus.jsonl", "nq_open": "nq_open/nq_test1000_corpus.jsonl",
           "hotpot_qa": "hotpotqa/hotpotqa_dev500_corpus.jsonl"}


def main() -> int:
    from rag_mag import durable
    from rag_mag.bench.datasets import data_root
    from rag_mag.components.checkpoints import load_checkpoint
    from rag_mag.components.document_embedder import document_text
    from rag_mag.data import iter_corpus
    from rag_mag.metrics.files import norm_by_length
    from rag_mag.precision import use_bf16
    from rag_mag.retriever.length import fit_length, length_crops

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--retriever", nargs="+", required=True, help="retriever checkpoint folders")
    parser.add_argument("--passages", type=int, default=2000, help="passages sampled from each corpus (seed 0)")
    parser.add_argument("--data-root", default=None, help="default: RAG_MAG_DATA_ROOT or ../shared/data")
    parser.add_argument("--out", default=None, help="also write the results here as JSON")
    args = parser.parse_args()
    root = data_root(args.data_root)
    if root is None:
        parser.error("no data root: pass --data-root or set RAG_MAG_DATA_ROOT")
    results = []
    for folder in args.retriever:
        loaded = load_checkpoint(folder)
        encoder = loaded.encoder
        bf16 = use_bf16("auto", encoder.device)
        for name, relative in CORPORA.items():
            passages = list(iter_corpus(root / relative))
            sample = random.Random(0).sample(passages, min(args.passages, len(passages)))
            texts = [document_text_of(p, document_text) for p in sample]
            raw = encoder.encode(texts, side="document", batch_size=64, treated=False, bf16=bf16)
            figures = norm_by_length(np.linalg.norm(raw, axis=1), [len(t.split()) for t in texts])
            crops, words = length_crops([p.text for p in sample])
            crop_norms = np.linalg.norm(encoder.encode(crops, side="document", batch_size=64, treated=False,
                                                       bf16=bf16), axis=1)
            fit = fit_length(crop_norms, words)
            row = {"retriever": folder, "strategy": loaded.strategy, "corpus": name, "passages": len(sample),
                   "median_words": float(np.median([len(t.split()) for t in texts])), **figures,
                   "crop_fit": fit.to_dict()}
            results.append(row)
            print(json.dumps(row), flush=True)
    print("\n| retriever | corpus | median words | rho (norm, words) | 15-40 | 40-80 | 80+ | crop-fit slope |")
    print("|---|---|---|---|---|---|---|---|")
    for row in results:
        bands = {band["words"]: band["relative_norm"] for band in row["bands"]}
        cells = " | ".join("-" if bands.get(b) is None else f"{bands[b]:.2f}" for b in ("15-40", "40-80", "80+"))
        print(f"| {Path(row['retriever']).name} ({row['strategy']}) | {row['corpus']} | {row['median_words']:.0f} | "
              f"{row['spearman']:+.2f} | {cells} | {row['crop_fit']['slope']:+.3f} |")
    if args.out:
        durable.write_text(args.out, json.dumps(results, indent=1))
    return 0


def document_text_of(passage, document_text) -> str:
    from haystack import Document

    return document_text(Document(content=passage.text, meta={"title": passage.title}))


if __name__ == "__main__":
    raise SystemExit(main())
