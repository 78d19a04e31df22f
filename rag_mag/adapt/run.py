"""``adapt(settings)``: a retriever trained for one folder of documents, published only where its test split
shows it better than the base. ``rag-mag adapt`` (rag_mag/cli/adapt.py) is the command.

The stages, each resumable (a rerun of the same command reuses what is finished):

1. **pairs**: the folder's synthetic question/chunk pairs, from ``--pairs`` or written by
   ``rag_mag.adapt.synth.synthesize`` into ``DIR/pairs`` (which resumes itself);
2. **splits**: by file into ``DIR/splits/{train,val,test}.jsonl`` (``splits.py``; reused while the pairs are);
3. **train**: every strategy on the train split, ``best/`` chosen on the validation split (``training.py``);
4. **score**: the untrained base, BM25 and every trained ``best/`` on the test split alone (``scoring.py``;
   per-question values cached by checkpoint and test split);
5. **publish**: the best trained strategy by test nDCG@10, copied to ``DIR/retriever`` only if it beats the base
   significantly (``decision.py``); otherwise no ``DIR/retriever`` (one left by an earlier run is withdrawn);
6. **reindex**: with ``--index``, the folder re-embedded with the published retriever (incremental indexing; a
   new checkpoint means every file is encoded again);
7. **report**: ``DIR/report.json`` and ``DIR/report.md`` (``report.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_mag import durable
from rag_mag.adapt.decision import METRIC, Decision, decide
from rag_mag.adapt.report import build_report, summary_line, write_report
from rag_mag.adapt.scoring import BASE, BM25, TRAINED, System, load_corpus, load_test_split, score_system
from rag_mag.adapt.splits import (
    DEFAULT_MIN_PAIRS,
    DEFAULT_TEST_FRACTION,
    DEFAULT_VAL_FRACTION,
    SPLITS,
    PairsFolder,
    build_splits,
    check_fractions,
)
from rag_mag.adapt.training import DEFAULT_STRATEGIES, parse_strategies, train_config, train_strategy
from rag_mag.errors import ConfigError

logger = logging.getLogger(__name__)

@dataclass
class AdaptSettings:
    source: str  # the documents folder (or index) the pairs come from, and the folder re-embedded with --index
    out: Path
    pairs: Path | None = None  # an existing pairs folder; None: synthesize into out/pairs
    strategies: list[str] = field(default_factory=lambda: list(DEFAULT_STRATEGIES))
    training: dict[str, Any] = field(default_factory=dict)  # TrainConfig fields (steps, batch_size, base_model, ...)
    index: Path | None = None  # re-embed the source folder into this index with the published retriever
    chunks: int | None = None  # chunks synthesis writes a question for (None: its default)
    val_fraction: float = DEFAULT_VAL_FRACTION
    test_fraction: float = DEFAULT_TEST_FRACTION
    min_pairs: int = DEFAULT_MIN_PAIRS
    progress: bool = True
    command: str = ""

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        self.pairs = Path(self.pairs) if self.pairs is not None else None
        self.index = Path(self.index) if self.index is not None else None
        self.strategies = parse_strategies(self.strategies)
        check_fractions(self.val_fraction, self.test_fraction)
        if self.chunks is not None and self.chunks < 1:
            raise ConfigError(f"--chunks must be at least 1, got {self.chunks}")
        if self.min_pairs < 1:
            raise ConfigError(f"--min-pairs must be at least 1, got {self.min_pairs}")
        for strategy in self.strategies:  # every training setting checked before anything runs
            train_config(strategy, self.out / "splits", self.out / "runs" / strategy, self.training)
        if self.index is not None:
            self._check_reindex()

    def _check_reindex(self) -> None:
        from rag_mag.components.faiss_index import is_index_folder

        source = Path(self.source)
        if not source.exists():
            raise ConfigError(f"--index re-embeds the documents of {source}, which does not exist")
        if source.is_dir() and is_index_folder(source):
            raise ConfigError(f"--index re-embeds a documents folder, and {source} is an index; give the folder of "
                              "documents it was built from")


@dataclass(frozen=True)
class AdaptResult:
    report: dict
    report_json: Path
    summary: str
    published: Path | None


@contextlib.contextmanager
def stage(name: str, seconds: dict[str, float]) -> Iterator[None]:
    """Log a stage's start and end and add its wall time to ``seconds``."""
    logger.info("stage %s: started", name)
    started = time.perf_counter()
    yield
    seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - started
    logger.info("stage %s: done in %.1f s", name, seconds[name])


def adapt(settings: AdaptSettings) -> AdaptResult:
    """Run the stages of the module docstring; returns the report and the one-line summary."""
    out, seconds = settings.out, {}
    out.mkdir(parents=True, exist_ok=True)
    with stage("pairs", seconds):
        pairs = obtain_pairs(settings)
    with stage("splits", seconds):
        manifest, _ = build_splits(pairs, out / "splits", settings.val_fraction, settings.test_fraction,
                                   settings.min_pairs)
    with stage("train", seconds):
        training = train_all(settings, splits_digest(manifest), pairs.corpus)
    with stage("score", seconds):
        test = load_test_split(out / "splits" / "test.jsonl")
        corpus = load_corpus(pairs.corpus)
        scores = {system.name: score_system(system, corpus, test, out / "scores",
                                            precision=settings.training.get("precision", "auto"),
                                            device=settings.training.get("device", "auto"), progress=settings.progress)
                  for system in systems(settings)}
    decision = decide(scores["base"]["per_query"][METRIC],
                      {name: scores[name]["per_query"][METRIC] for name in settings.strategies})
    logger.info("decision: %s", decision.reason)
    with stage("publish", seconds):
        published = publish(decision, out / "runs", out / "retriever")
    with stage("reindex", seconds):
        reindex = reembed(settings, published)
    synth = read_synth_manifest(pairs)
    report = build_report(command=settings.command, source=settings.source, pairs_dir=pairs.path, manifest=manifest,
                          test=test, corpus_chunks=len(corpus.passages), scores=scores, decision=decision,
                          retriever_dir=published, training=training, reindex=reindex, stage_seconds=seconds,
                          synth=synth)
    json_path, _ = write_report(out, report)
    return AdaptResult(report=report, report_json=json_path, summary=summary_line(report, json_path),
                       published=published)


def obtain_pairs(settings: AdaptSettings) -> PairsFolder:
    if settings.pairs is not None:
        logger.info("pairs: reading %s", settings.pairs)
        return PairsFolder(settings.pairs).check()
    from rag_mag.adapt.synth import SynthSettings, synthesize

    synth_settings = SynthSettings(**({"chunks": settings.chunks} if settings.chunks else {}),
                                   base_model=str(settings.training.get("base_model") or ""))
    logger.info("pairs: synthesizing questions for %d chunks of %s into %s", synth_settings.chunks, settings.source,
                settings.out / "pairs")
    folder = synthesize(settings.source, settings.out / "pairs", settings=synth_settings, progress=settings.progress)
    return PairsFolder(Path(folder)).check()


def read_synth_manifest(pairs: PairsFolder) -> dict | None:
    """``synth.json`` as synthesis wrote it (copied into the report), or None when there is none."""
    if not pairs.manifest.is_file():
        return None
    try:
        return json.loads(pairs.manifest.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        logger.warning("%s is not valid JSON; the report goes without it", pairs.manifest)
        return None


def splits_digest(manifest: dict) -> str:
    """One digest of the three split files (what a training run depends on)."""
    return hashlib.sha256("".join(manifest["splits"][name]["sha256"] for name in SPLITS).encode()).hexdigest()


def train_all(settings: AdaptSettings, splits_sha256: str, corpus: Path) -> dict[str, dict]:
    """Every strategy's run record, trained one after another (each resumable), validated on the whole corpus."""
    configs = {strategy: train_config(strategy, settings.out / "splits", settings.out / "runs" / strategy,
                                      settings.training, corpus) for strategy in settings.strategies}
    return {strategy: train_strategy(config, splits_sha256) for strategy, config in configs.items()}


def systems(settings: AdaptSettings) -> list[System]:
    """The untrained base (cosine), BM25, and every trained strategy's ``best/``."""
    base = System("base", BASE, str(settings.training.get("base_model") or ""))
    return [base, System("bm25", BM25)] + [System(name, TRAINED, str(settings.out / "runs" / name / "best"))
                                           for name in settings.strategies]


def publish(decision: Decision, runs_dir: Path, target: Path) -> Path | None:
    """Copy the published strategy's ``best/`` to ``target`` (atomically; reused when it is already there), or,
    when the base is kept, make sure no ``target`` is left from an earlier run. Returns ``target`` or None."""
    from rag_mag.retriever.encoder import checkpoint_digest

    durable.recover_dir(target)
    if decision.published is None:
        if target.exists():
            withdraw(target)
        logger.info("publish: base kept, %s not written", target)
        return None
    best = runs_dir / decision.published / "best"
    if target.is_dir() and (target / "rag_mag.json").is_file() and checkpoint_digest(target) == checkpoint_digest(best):
        logger.info("publish: %s already holds %s's best checkpoint", target, decision.published)
        return target
    durable.copy_dir(best, target, f"the retriever {target}")
    logger.info("publish: %s's best checkpoint copied to %s", decision.published, target)
    return target


def withdraw(target: Path) -> None:
    """Remove a retriever an earlier run published: renamed to a staging name first (which ``recover_dir``
    removes if this process dies), so it is gone from ``target`` at once."""
    aside = target.with_name(f".{target.name}.{durable.STAGING_MARK}withdrawn")
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(target, aside)
    durable.fsync_dir(target.parent)
    shutil.rmtree(aside, ignore_errors=True)
    logger.warning("publish: removed %s, which an earlier run published: this run keeps the base", target)


def reembed(settings: AdaptSettings, retriever: Path | None) -> dict | None:
    """With ``--index``: the source folder indexed with the published retriever (incremental; unchanged when the
    index already holds it). Nothing when no retriever was published."""
    if settings.index is None:
        return None
    if retriever is None:
        logger.info("reindex: skipped, no retriever was published")
        return {"index": str(settings.index), "skipped": "base kept", "line": "not re-embedded: the base was kept"}
    from rag_mag.ingestion.file_indexing import index_files

    with durable.job_lock(durable.lock_path(settings.index), f"the index {settings.index}"):
        summary = index_files([settings.source], settings.index, retriever, progress=settings.progress)
    for path, reason in summary.plan.skipped:
        logger.warning("reindex: skipped %s: %s", path, reason)
    logger.info("reindex: %s", summary.line())
    return {"index": str(settings.index), "line": summary.line(), **summary.to_dict()}
