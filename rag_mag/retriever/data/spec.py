"""The spec of ``rag-mag build-data`` (sources and options, validated, read from YAML) and its per-source counts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_mag.errors import ConfigError
from rag_mag.precision import parse_precision

SOURCE_KINDS = ("triples", "gold", "mined")
NEGATIVE_MINERS = ("bm25", "dense", "mixed")
POSITIVE_CHOICES = ("all", "linked")


@dataclass
class SourceSpec:
    name: str
    kind: str
    path: str
    corpus: str = ""        # mined: the corpus searched for positives
    limit: int = 0          # use only the first N records (0: all)
    fraction: float = 1.0   # use a seeded share of the records (the data-size axis)
    filters: bool = True    # mined: the answer-specificity filters (off: any answer-bearing passage in the top 100)
    ablation_only: bool = False  # written to ablation.jsonl for ablation runs, never to train.jsonl

    def __post_init__(self) -> None:
        if self.kind not in SOURCE_KINDS:
            raise ConfigError(f"source {self.name!r}: unknown kind {self.kind!r}; valid kinds are: "
                              f"{', '.join(SOURCE_KINDS)}")
        if self.kind == "mined" and not self.corpus:
            raise ConfigError(f"source {self.name!r}: a mined source needs a corpus to search")
        if not 0.0 < float(self.fraction) <= 1.0:
            raise ConfigError(f"source {self.name!r}: fraction must be in (0, 1], got {self.fraction}")
        if int(self.limit) < 0:
            raise ConfigError(f"source {self.name!r}: limit must be 0 or more, got {self.limit}")


@dataclass
class DataSpec:
    out: str
    sources: list[SourceSpec]
    exclude: list[str] = field(default_factory=list)    # evaluation JSONL files (their questions never train)
    negatives_corpus: str = ""                           # where missing hard negatives are mined from
    hard_negatives: int = 4
    negative_miner: str = "bm25"                         # the training rows' negatives: bm25, dense or mixed
    dense_model: str = ""                                # dense/mixed: a rag-mag checkpoint or base model folder
    precision: str = "auto"                              # dense/mixed: the encoder's precision (auto, bf16, fp32)
    positives: str = "all"                               # training rows: all positives, or question-linked ones
    negative_top_k: int = 50
    positive_top_k: int = 20
    max_answer_passages: int = 20
    min_answer_chars: int = 2
    val_queries: int = 300
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.sources:
            raise ConfigError("the data spec lists no sources")
        names = [source.name for source in self.sources]
        if len(set(names)) != len(names):
            raise ConfigError(f"source names must be unique, got {names}")
        for name in ("hard_negatives", "val_queries"):
            if int(getattr(self, name)) < 0:
                raise ConfigError(f"{name} must be 0 or more, got {getattr(self, name)}")
        for name in ("negative_top_k", "positive_top_k", "max_answer_passages", "min_answer_chars"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.negative_miner not in NEGATIVE_MINERS:
            raise ConfigError(f"negative_miner must be one of {', '.join(NEGATIVE_MINERS)}, "
                              f"got {self.negative_miner!r}")
        if self.positives not in POSITIVE_CHOICES:
            raise ConfigError(f"positives must be one of {', '.join(POSITIVE_CHOICES)}, got {self.positives!r}")
        self.precision = parse_precision(self.precision)
        if self.negative_miner != "bm25" and not self.negatives_corpus:
            raise ConfigError(f"negative_miner {self.negative_miner!r} needs a negatives_corpus to search")


def load_data_spec(path: str | Path, data_root: Path | None, overrides: dict[str, Any] | None = None) -> DataSpec:
    """Read a data spec YAML; ``{data_root}`` in paths is replaced by the shared data folder."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"data spec {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"data spec {path} is not valid YAML: {error}") from None
    raw.update(overrides or {})

    def resolve(value: str) -> str:
        if "{data_root}" in value and data_root is None:
            raise ConfigError(f"{path} refers to {{data_root}}, but no data root was found; set RAG_MAG_DATA_ROOT")
        return value.replace("{data_root}", str(data_root))

    try:
        sources = [SourceSpec(**{k: resolve(v) if isinstance(v, str) else v for k, v in source.items()})
                   for source in raw.pop("sources", [])]
        raw["exclude"] = [resolve(p) for p in raw.get("exclude", [])]
        raw["negatives_corpus"] = resolve(raw.get("negatives_corpus", ""))
        raw["dense_model"] = resolve(raw.get("dense_model", ""))
        return DataSpec(sources=sources, **raw)
    except TypeError as error:
        raise ConfigError(f"invalid data spec {path}: {error}") from None


@dataclass
class SourceStats:
    records: int = 0
    excluded_eval_overlap: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    negatives_with_answer_dropped: int = 0
    dense_negatives: int = 0   # training rows' negatives that the dense miner found
    unlinked_positives_dropped: int = 0  # positives: linked
    written: int = 0

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
