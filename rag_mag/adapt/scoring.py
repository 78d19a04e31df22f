"""Scoring retrievers on the test split: every test question ranks the whole chunk corpus.

A test pair's one relevant passage is the chunk its question was written from (``positives[0].id``); each
system ranks every chunk of every file (``corpus.jsonl``) and is judged on its top ``TOP_K`` with
``judge_supporting``: nDCG@10 and recall@1/5/20 per question, in [0, 1]. Dense systems are searched exactly, by
inner product of the vectors each encoder's strategy treats (``encode(..., "query"|"document")``) in a FAISS flat
index; BM25 ranks with ``BM25Index``.

A system's per-question values are cached in ``DIR/scores/NAME.json``, keyed by what they depend on: the model
(a checkpoint's content digest, or the base model's files), the test split file and the corpus (sha256), so a
rerun scores only what changed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rag_mag import durable
from rag_mag.adapt.splits import ids_digest, read_pair_records, source_chunk
from rag_mag.data import Passage, read_corpus
from rag_mag.metrics.retrieval import judge_supporting, score_retrieval

logger = logging.getLogger(__name__)

TOP_K = 20
METRICS = ("ndcg@10", "recall@1", "recall@5", "recall@20")
SCORE_VERSION = 1  # raise when the way a system is scored changes: cached scores are then recomputed
BASE, BM25, TRAINED = "base", "bm25", "trained"
# the files of a model folder that decide what it computes
_MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "rag_mag.json")


@dataclass(frozen=True)
class TestSplit:
    """The questions scored: ids, questions and source chunks, in the order of ``test.jsonl``."""

    ids: tuple[str, ...]
    queries: tuple[str, ...]
    gold: tuple[str, ...]
    sha256: str  # of test.jsonl
    ids_sha256: str  # of the sorted ids (splits.ids_digest)


@dataclass(frozen=True)
class Corpus:
    passages: tuple[Passage, ...]
    sha256: str


@dataclass(frozen=True)
class System:
    """One ranked system: the untrained base encoder (cosine), BM25, or a trained strategy's ``best/``."""

    name: str
    kind: str  # BASE, BM25 or TRAINED
    model: str = ""  # the base model (empty: the packaged MiniLM) or the checkpoint folder

    def identity(self) -> str:
        """What the system's scores depend on besides the data."""
        from rag_mag.retriever.encoder import checkpoint_digest

        if self.kind == BM25:
            return "bm25"
        if self.kind == TRAINED:
            return "checkpoint:" + checkpoint_digest(self.model)
        return "base:" + model_digest(self.model)


def model_digest(model: str) -> str:
    """A base model's content digest (its weights, config and tokenizer files), or its name for a hub id."""
    from rag_mag.models import default_retriever_base

    folder = Path(model or default_retriever_base())
    if not folder.is_dir():
        return "hub:" + str(model)
    digest = hashlib.sha256()
    files = sorted(folder.glob("*.safetensors")) + [folder / name for name in _MODEL_FILES]
    for file in (f for f in files if f.is_file()):
        digest.update(f"{file.name}\t{durable.sha256_of(file)}\n".encode())
    return digest.hexdigest()


def load_test_split(path: Path) -> TestSplit:
    records = read_pair_records(path)
    ids = tuple(record["id"] for record in records)
    return TestSplit(ids=ids, queries=tuple(record["query"] for record in records),
                     gold=tuple(source_chunk(record) for record in records), sha256=durable.sha256_of(path),
                     ids_sha256=ids_digest(ids))


def load_corpus(path: Path) -> Corpus:
    return Corpus(passages=tuple(read_corpus(path)), sha256=durable.sha256_of(path))


# ------------------------------------------------------------------------------------------------ ranking
def rank_dense(encoder, passages: Sequence[Passage], queries: Sequence[str], bf16: bool = False,
               top_k: int = TOP_K, progress: bool = False) -> list[list[str]]:
    """The ids of each query's top ``top_k`` passages by exact inner product of the treated vectors."""
    import faiss

    documents = encoder.encode([p.content for p in passages], "document", batch_size=64, show_progress=progress,
                               bf16=bf16)
    index = faiss.IndexFlatIP(documents.shape[1])
    index.add(np.ascontiguousarray(documents, dtype=np.float32))
    query_vectors = encoder.encode(list(queries), "query", batch_size=64, bf16=bf16)
    _, rows = index.search(np.ascontiguousarray(query_vectors, dtype=np.float32), min(top_k, len(passages)))
    return [[passages[i].id for i in row if i >= 0] for row in rows]


def rank_bm25(passages: Sequence[Passage], queries: Sequence[str], top_k: int = TOP_K) -> list[list[str]]:
    from rag_mag.retriever.bm25 import BM25Index

    indices, _ = BM25Index(passages).search(queries, top_k)
    return [[passages[i].id for i in row] for row in indices]


def judge(ranked: Sequence[Sequence[str]], gold: Sequence[str]) -> dict[str, list[float]]:
    """Per-question ``METRICS`` in [0, 1], the source chunk as the one relevant passage."""
    judgements = [judge_supporting(ids, [chunk]) for ids, chunk in zip(ranked, gold, strict=True)]
    scores = score_retrieval(judgements, ks=(1, 5, 20), ndcg_k=10)
    return {metric: [float(v) for v in scores.per_example[metric]] for metric in METRICS}


def load_encoder(system: System, device: str = "auto"):
    """The system's encoder for inference, on ``device``: a trained checkpoint, or the base model under cosine."""
    from rag_mag.precision import resolve_device
    from rag_mag.retriever.encoder import MagnitudeEncoder

    if system.kind == TRAINED:
        encoder = MagnitudeEncoder.load(system.model)
    else:
        encoder = MagnitudeEncoder.build(system.model or None, strategy="cosine")
    encoder.to(resolve_device(device))
    encoder.eval()
    return encoder


def rank(system: System, corpus: Corpus, test: TestSplit, precision: str = "auto", device: str = "auto",
         progress: bool = False) -> list[list[str]]:
    if system.kind == BM25:
        return rank_bm25(corpus.passages, test.queries)
    from rag_mag.precision import use_bf16

    encoder = load_encoder(system, device)
    return rank_dense(encoder, corpus.passages, test.queries, bf16=use_bf16(precision, encoder.device),
                      progress=progress)


# ------------------------------------------------------------------------------------------------ cached scores
def score_key(system: System, corpus: Corpus, test: TestSplit) -> str:
    parts = {"version": SCORE_VERSION, "top_k": TOP_K, "system": system.identity(), "test": test.sha256,
             "corpus": corpus.sha256}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def score_system(system: System, corpus: Corpus, test: TestSplit, cache_dir: Path, precision: str = "auto",
                 device: str = "auto", progress: bool = False) -> dict:
    """``{"system", "kind", "key", "split", "ids", "ids_sha256", "per_query": {metric: [...]}, "seconds"}``, from
    the cache when its key matches, else scored and cached."""
    key = score_key(system, corpus, test)
    path = cache_dir / f"{system.name}.json"
    if path.is_file():
        try:
            cached = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            cached = {}
        if cached.get("key") == key and tuple(cached.get("ids", ())) == test.ids:
            logger.info("score %s: reusing %s", system.name, path)
            return cached
    logger.info("score %s: ranking %d chunks for %d test questions", system.name, len(corpus.passages),
                len(test.ids))
    started = time.perf_counter()
    per_query = judge(rank(system, corpus, test, precision, device, progress), test.gold)
    result = {"system": system.name, "kind": system.kind, "model": system.model, "key": key, "split": "test",
              "ids": list(test.ids), "ids_sha256": test.ids_sha256, "per_query": per_query,
              "seconds": round(time.perf_counter() - started, 2)}
    durable.write_text(path, json.dumps(result) + "\n")
    return result
