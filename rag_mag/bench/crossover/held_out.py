"""The crossover study's test sets: each dataset's questions against its own corpus, ranked and scored (nDCG@10)."""

from __future__ import annotations

import numpy as np
import torch

from rag_mag.bench.crossover.config import CrossoverConfig
from rag_mag.bench.dataset_specs import load_registry
from rag_mag.bench.datasets import EvalDataset, data_root
from rag_mag.data import read_corpus, read_eval
from rag_mag.errors import ConfigError
from rag_mag.metrics.retrieval import score_retrieval
from rag_mag.models import REPO_ROOT


def load_test_sets(config: CrossoverConfig) -> list[EvalDataset]:
    """Each dataset's first ``max_questions`` questions and its own corpus (local unified-schema files)."""
    registry, root = load_registry(), data_root(config.data_root)
    sets = []
    for name in config.datasets:
        spec = registry.get(name)
        if spec is None or spec.local is None:
            raise ConfigError(f"crossover dataset {name!r} needs local files in data/datasets.yaml")
        base = REPO_ROOT if spec.local.root == "repo" else root
        if base is None:
            raise ConfigError("no data root found; set RAG_MAG_DATA_ROOT")
        records = read_eval(base / spec.local.eval, limit=config.max_questions)
        sets.append(EvalDataset(name=name, records=records, corpus=read_corpus(base / spec.local.corpus),
                                source=str(base / spec.local.eval), relevance=spec.relevance))
    return sets


@torch.inference_mode()
def rank_test_set(encoder, dataset: EvalDataset, bf16: bool = False, top_k: int = 20,
                  ) -> tuple[list[list[int]], list[float]]:
    """Each question's top ``top_k`` corpus positions (exact inner-product search) and its nDCG@10 (0 to 1)."""
    documents = torch.from_numpy(encoder.encode([p.content for p in dataset.corpus], "document", batch_size=256,
                                                bf16=bf16)).to(encoder.device)
    queries = torch.from_numpy(encoder.encode([r.question for r in dataset.records], "query", batch_size=256,
                                              bf16=bf16)).to(encoder.device)
    top = torch.topk(queries @ documents.T, k=min(top_k, documents.shape[0]), dim=1).indices.cpu().tolist()
    ids = [p.id for p in dataset.corpus]
    scores = score_retrieval(dataset.judge_all([[ids[j] for j in row] for row in top]))
    return top, [float(v) for v in scores.per_example["ndcg@10"]]


def test_ndcg(encoder, dataset: EvalDataset, bf16: bool, top_k: int = 20) -> tuple[float, list[float]]:
    """nDCG@10 of the dataset's questions against its corpus, in percent: the mean and each question's."""
    per_example = rank_test_set(encoder, dataset, bf16, top_k)[1]
    return 100.0 * float(np.mean(per_example)), [round(100.0 * v, 2) for v in per_example]
