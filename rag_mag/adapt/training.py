"""Training one strategy on the train split, selecting on the validation split: ``DIR/runs/<strategy>/``.

The run is the retriever trainer's own (``Trainer(TrainConfig(...)).train()``) under the default recipe, with
the splits as its data; it resumes from ``last/`` and keeps ``best/`` by validation (never by test).
``adapt_run.json`` beside them records the settings and the splits' digest: a finished run with the same
settings and splits is not trained again (unless ``resume`` is off: then every run starts over), and a run of
other splits starts over (its ``last/`` trained on other files). More ``steps`` continue a finished run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rag_mag import durable
from rag_mag.errors import ConfigError
from rag_mag.retriever.strategies import Strategy
from rag_mag.retriever.training.config import TrainConfig, make_config
from rag_mag.retriever.training.resume import RESUMABLE_CHANGES

logger = logging.getLogger(__name__)

STRATEGIES = tuple(strategy.value for strategy in Strategy)
DEFAULT_STRATEGIES = ("cosine", "qnorm")
RUN_RECORD = "adapt_run.json"
# set by adapt itself: a training settings file may not name them
OWNED_FIELDS = ("strategy", "train_data", "val_data", "val_corpus", "out")


def parse_strategies(text: str | list[str]) -> list[str]:
    """``"cosine,qnorm"`` -> ``["cosine", "qnorm"]``: known names, each once, in the order given."""
    names = [part.strip().lower() for part in (text.split(",") if isinstance(text, str) else text) if part.strip()]
    if not names:
        raise ConfigError(f"no strategy given; name one or more of: {', '.join(STRATEGIES)}")
    unknown = [name for name in names if name not in STRATEGIES]
    if unknown:
        raise ConfigError(f"unknown strateg{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; valid "
                          f"strategies are: {', '.join(STRATEGIES)}")
    return list(dict.fromkeys(names))


def train_config(strategy: str, splits_dir: Path, run_dir: Path, settings: Mapping[str, Any],
                 corpus: Path | None = None) -> TrainConfig:
    """TrainConfig's defaults, then ``settings`` (steps, batch_size, base_model, precision, ...), then the
    splits and the run folder. With ``corpus`` (every chunk), validation ranks the whole corpus for each
    validation question, as the test does: the validation triples' own passages alone are too easy a pool to
    tell checkpoints apart (a round-trip-checked question's chunk is already in the base's top 20 of all)."""
    owned = [name for name in OWNED_FIELDS if name in settings]
    if owned:
        raise ConfigError(f"adapt sets {', '.join(owned)} itself; leave {'it' if len(owned) == 1 else 'them'} out of "
                          "the training settings")
    values = {**settings, "strategy": strategy, "train_data": str(splits_dir / "train.jsonl"),
              "val_data": str(splits_dir / "val.jsonl"), "out": str(run_dir),
              "val_corpus": str(corpus) if corpus is not None else ""}
    return make_config(TrainConfig, values, source="adapt training settings")


def run_identity(config: TrainConfig, splits_sha256: str) -> dict:
    """What decides a run's result: its settings except how it runs (and the data paths: the splits' digest
    stands for them)."""
    settings = {name: value for name, value in config.to_dict().items()
                if name not in RESUMABLE_CHANGES or name in ("steps", "val_corpus")}
    return {"settings": settings, "splits_sha256": splits_sha256}


def read_record(run_dir: Path) -> dict:
    path = run_dir / RUN_RECORD
    try:
        record = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        record = {}
    return record if isinstance(record, dict) else {}


def train_strategy(config: TrainConfig, splits_sha256: str) -> dict:
    """Train (or reuse, or resume) one run; returns its record: ``{"settings", "splits_sha256", "finished",
    "step", "best_validation", "best_dir", "reused"}``."""
    from rag_mag.retriever.training.trainer import Trainer

    run_dir = Path(config.out)
    identity = run_identity(config, splits_sha256)
    record = read_record(run_dir)
    best_dir = run_dir / "best"
    if config.resume and record.get("finished") and {k: record.get(k) for k in identity} == identity and \
            (best_dir / "rag_mag.json").is_file():
        logger.info("train %s: reusing the finished run in %s (step %s)", config.strategy, run_dir, record.get("step"))
        return {**record, "reused": True}
    if record and record.get("splits_sha256") != splits_sha256 and config.resume:
        logger.warning("train %s: the splits changed since %s was trained; starting it over", config.strategy,
                       run_dir)
        config.resume = False
    durable.write_text(run_dir / RUN_RECORD, json.dumps({**identity, "finished": False}, indent=2) + "\n")
    logger.info("train %s: %d steps of %d queries into %s", config.strategy, config.steps, config.batch_size, run_dir)
    result = Trainer(config).train()
    record = {**identity, "finished": True, "step": result.step,
              "best_validation": result.best_metrics, "best_dir": str(result.best_dir)}
    durable.write_text(run_dir / RUN_RECORD, json.dumps(record, indent=2) + "\n")
    return {**record, "reused": False}
