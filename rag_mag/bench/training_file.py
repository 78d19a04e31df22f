"""The benchmark's training file: the config's training files (and mined triples) in one JSONL, without any
question of the evaluation sets."""

from __future__ import annotations

import logging
from pathlib import Path

from rag_mag.bench.config import BenchConfig, file_digest, fingerprint, resolve_path
from rag_mag.bench.dataset_specs import parse_dataset_arg
from rag_mag.bench.datasets import EvalDataset, load_eval_dataset
from rag_mag.data import read_triples, write_jsonl
from rag_mag.errors import ConfigError
from rag_mag.models import artifacts_dir

logger = logging.getLogger("rag_mag.bench.runner")  # the runner's log lines keep their name


def prepare_training_data(config: BenchConfig, datasets: dict[str, EvalDataset], root: Path | None) -> Path:
    """Concatenate the training files (and mined triples), checking none holds an evaluation question."""
    from rag_mag.metrics.answers import normalize_answer

    files = [resolve_path(f, root) for f in config.train_files()]
    if not files:
        raise ConfigError("the benchmark config has no train.train_data")
    mined = mine_training_data(config, root) if config.mine else None
    parts = files + ([mined] if mined else [])
    key = fingerprint([file_digest(p) for p in parts])
    target = artifacts_dir() / "bench" / "train" / f"train-{key}.jsonl"
    if target.is_file():
        return target
    evaluation = {normalize_answer(r.question) for d in datasets.values() for r in d.records}
    rows, dropped = [], 0
    for path in parts:
        for triple in read_triples(path):
            if normalize_answer(triple.query) in evaluation:
                dropped += 1
                continue
            rows.append({"id": triple.id, "query": triple.query, "answers": list(triple.answers),
                         "positives": [vars(p) for p in triple.positives],
                         "hard_negatives": [vars(p) for p in triple.hard_negatives]})
    if dropped:
        logger.warning("dropped %d training queries that are also evaluation questions", dropped)
    write_jsonl(target, rows)
    logger.info("training data: %d triples from %s", len(rows), ", ".join(p.name for p in parts))
    return target


def mine_training_data(config: BenchConfig, root: Path | None) -> Path:
    """Triples mined as the config's ``mine:`` section says, excluding every question of the evaluation files."""
    from rag_mag.bench.config import MineConfig
    from rag_mag.data import read_corpus, read_pairs
    from rag_mag.retriever.data.mining import evaluation_keys, mine_triples
    from rag_mag.retriever.training.config import make_config

    mine = make_config(MineConfig, config.mine, source="mine config")
    pairs_path, corpus_path = resolve_path(mine.pairs, root), resolve_path(mine.corpus, root)
    # Exclude every question of the evaluation files, not only the benchmark's first N.
    full = [load_eval_dataset(parse_dataset_arg(t), data_root_dir=root) for t in config.datasets]
    key = fingerprint(vars(mine), file_digest(pairs_path), file_digest(corpus_path),
                      sorted(r.id for d in full for r in d.records))
    target = artifacts_dir() / "bench" / "train" / f"mined-{key}.jsonl"
    if not target.is_file():
        ids, questions = evaluation_keys(r for d in full for r in d.records)
        triples, stats = mine_triples(read_pairs(pairs_path), read_corpus(corpus_path), ids, questions,
                                      top_k=mine.top_k, max_positives=mine.max_positives,
                                      hard_negatives=mine.hard_negatives)
        write_jsonl(target, triples)
        logger.info("mined %d triples (%s)", len(triples), {k: v for k, v in vars(stats).items()
                                                            if k != "examples_excluded"})
    return target
