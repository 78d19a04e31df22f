r"""Length calibration on the Wikipedia sets: does it cost retrieval where passages are uniform and clean? (issue 60)

For each retriever and each set, the corpus is embedded by `RagMagDocumentEmbedder` twice, as the benchmark
embeds it and with `length_calibration: true`, and every question (the first `--questions`) is ranked against both
with exact inner-product search; recall@5, recall@20 and nDCG@10 under the benchmark's relevance rule (answer recall,
or supporting passages for HotpotQA), with the paired difference, its 95% bootstrap interval and the permutation p.

    .venv/bin/python eval/bench_length_wiki.py --retriever artifacts/retriever-default \
        --out eval/reports/realdocs/wiki_length.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SETS = ("trivia_qa", "nq_open", "hotpot_qa")


def rank(dataset, embedder, questions, top_k: int = 20) -> list[list[str]]:
    from haystack import Document

    from rag_mag.components.text_embedder import RagMagTextEmbedder

    documents = [Document(id=p.id, content=p.text, meta={"title": p.title}) for p in dataset.corpus]
    embedded = embedder.run(documents)["documents"]
    matrix = np.array([d.embedding for d in embedded], dtype=np.float32)  # (n_passages, dim)
    ids = [d.id for d in embedded]
    query_embedder = RagMagTextEmbedder(model=embedder.model)
    query_embedder.warm_up()
    queries = np.array([query_embedder.run(r.question)["embedding"] for r in questions], dtype=np.float32)
    scores = queries @ matrix.T  # (n_questions, n_passages): the strategy's score, vectors treated
    return [[ids[i] for i in np.argsort(-row, kind="stable")[:top_k]] for row in scores]


def main() -> int:
    from rag_mag import durable
    from rag_mag.bench.datasets import load_eval_dataset
    from rag_mag.bench.stats import compare_paired
    from rag_mag.components.document_embedder import RagMagDocumentEmbedder
    from rag_mag.metrics.retrieval import ndcg_at_k, recall_at_k

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--retriever", nargs="+", required=True, help="retriever checkpoint folders")
    parser.add_argument("--questions", type=int, default=500, help="first N questions of each set")
    parser.add_argument("--out", default=None, help="also write the results here as JSON")
    args = parser.parse_args()
    results = []
    for folder in args.retriever:
        for name in SETS:
            dataset = load_eval_dataset(name, limit=args.questions)
            per = {}
            for calibrated in (False, True):
                embedder = RagMagDocumentEmbedder(model=folder, batch_size=64, progress_bar=False,
                                                  length_calibration=calibrated)
                embedder.warm_up()
                judgements = [dataset.judge(record, ranking)
                              for record, ranking in zip(dataset.records, rank(dataset, embedder, dataset.records),
                                                         strict=True)]
                per[calibrated] = {"recall@5": [recall_at_k(j, 5) for j in judgements],
                                   "recall@20": [recall_at_k(j, 20) for j in judgements],
                                   "ndcg@10": [ndcg_at_k(j, 10) for j in judgements]}
            row = {"retriever": folder, "set": name, "questions": len(dataset.records)}
            for metric in ("recall@5", "recall@20", "ndcg@10"):
                row[metric] = compare_paired(per[True][metric], per[False][metric]).to_dict(scale=100)
            results.append(row)
            print(json.dumps(row), flush=True)
    print("\n| retriever | set | metric | as benchmarked | length-calibrated | difference [95% CI] | p |")
    print("|---|---|---|---|---|---|---|")
    for row in results:
        for metric in ("recall@5", "ndcg@10"):
            data = row[metric]
            print(f"| {Path(row['retriever']).name} | {row['set']} | {metric} | {data['mean_b']:.1f} | "
                  f"{data['mean_a']:.1f} | {data['delta']:+.1f} [{data['delta_ci'][0]:+.1f}, "
                  f"{data['delta_ci'][1]:+.1f}] | {data['p_value']:.3f} |")
    if args.out:
        durable.write_text(args.out, json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
