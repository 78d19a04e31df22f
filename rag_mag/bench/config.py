"""The benchmark configuration: one YAML file (see eval/configs/*.yaml)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from rag_mag.config import TrainConfig, make_config, read_config_file
from rag_mag.errors import ConfigError
from rag_mag.models import REPO_ROOT
from rag_mag.strategies import Strategy

BASELINES = ("bm25", "base_cosine", "closed_book")


@dataclass
class MineConfig:
    """Optional: mine extra triples from question/answer pairs before training (rag-mag mine)."""

    pairs: str = ""
    corpus: str = ""
    top_k: int = 100
    max_positives: int = 1
    hard_negatives: int = 4


@dataclass
class BenchConfig:
    name: str = "bench"
    datasets: list[str] = field(default_factory=list)  # registry names or NAME=EVAL[,CORPUS]
    max_questions: int | None = None  # per dataset (None: all); the first N, in file order
    dataset_max_questions: dict[str, int] = field(default_factory=dict)  # per-dataset override
    data_root: str | None = None
    strategies: list[str] = field(default_factory=lambda: [s.value for s in Strategy])
    seeds: list[int] = field(default_factory=lambda: [0])
    extra_seeds: dict[str, list[int]] = field(default_factory=dict)  # e.g. {cosine: [1], qnorm: [1]}
    baselines: list[str] = field(default_factory=lambda: list(BASELINES))
    train: dict[str, Any] = field(default_factory=dict)  # TrainConfig fields; train_data may be a list
    mine: dict[str, Any] = field(default_factory=dict)  # MineConfig fields (empty: no mining)
    retrieval_top_k: int = 20
    encode_bf16: bool = False  # encode corpora under bfloat16 autocast (faster on avx512_bf16 CPUs)
    rag_top_k: int = 3
    pipeline: str = "pipelines/rag.yaml"  # its prompt_builder and llm generate the answers
    llm_url: str | None = None  # default: RAG_MAG_VLLM_URL or http://127.0.0.1:8000/v1
    start_llm: bool = True  # start the vLLM server if it is not running (stopped again at the end)
    max_tokens: int = 24
    concurrency: int = 16
    bootstrap_resamples: int = 2000
    fisher_examples: int = 64
    output_dir: str = ""  # default: eval/reports/<name>
    in_domain: list[str] = field(default_factory=list)  # datasets from the training distribution
    notes: list[str] = field(default_factory=list)  # printed in the report

    def __post_init__(self) -> None:
        if not self.datasets:
            raise ConfigError("the benchmark config lists no datasets; add `datasets: [trivia_qa, ...]`")
        self.strategies = [Strategy.parse(s).value for s in self.strategies]
        unknown = sorted(set(self.baselines) - set(BASELINES))
        if unknown:
            raise ConfigError(f"unknown baseline(s) {unknown}; valid baselines are: {', '.join(BASELINES)}")
        for strategy in self.extra_seeds:
            if Strategy.parse(strategy).value not in self.strategies:
                raise ConfigError(f"extra_seeds names {strategy!r}, which is not in strategies")
        for name in ("retrieval_top_k", "rag_top_k", "max_tokens", "concurrency", "bootstrap_resamples"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.rag_top_k > self.retrieval_top_k:
            raise ConfigError("rag_top_k cannot exceed retrieval_top_k")
        self.train_config(0, "cosine")  # validate the training fields early
        if self.mine:
            make_config(MineConfig, self.mine, source="mine config")

    # ---- derived
    def seeds_of(self, strategy: str) -> list[int]:
        return sorted(set(self.seeds) | set(self.extra_seeds.get(strategy, [])))

    def questions_for(self, dataset: str) -> int | None:
        return self.dataset_max_questions.get(dataset, self.max_questions)

    def out_dir(self) -> Path:
        return resolve_path(self.output_dir) if self.output_dir else REPO_ROOT / "eval" / "reports" / self.name

    def train_config(self, seed: int, strategy: str, train_data: str = "", out: str = "") -> TrainConfig:
        values = {k: v for k, v in self.train.items() if k != "train_data"}
        values.update(seed=seed, strategy=strategy, train_data=train_data, out=out)
        return make_config(TrainConfig, values, source="train section of the benchmark config")

    def train_files(self) -> list[str]:
        files = self.train.get("train_data", [])
        return [files] if isinstance(files, str) else list(files)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve_path(path: str | Path, data_root: Path | None = None) -> Path:
    """``{data_root}`` is replaced by the dataset root; a relative path is tried from the working directory,
    then from the repository root."""
    text = str(path)
    if "{data_root}" in text:
        if data_root is None:
            raise ConfigError(f"{text} needs the data root: set data_root in the config or RAG_MAG_DATA_ROOT")
        text = text.replace("{data_root}", str(data_root))
    candidate = Path(text).expanduser()
    if candidate.is_absolute() or candidate.exists():
        return candidate.resolve()
    return (REPO_ROOT / candidate).resolve()


def load_bench_config(path: str | Path, overrides: dict[str, Any] | None = None) -> BenchConfig:
    values = read_config_file(path)
    values.update(overrides or {})
    known = {spec.name for spec in fields(BenchConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown benchmark field(s) {', '.join(unknown)}; valid fields are: "
                          f"{', '.join(sorted(known))}")
    return make_config(BenchConfig, values, source=f"benchmark config {path}")


def fingerprint(*parts: Any) -> str:
    """A short stable hash of JSON-able parts (config sections, file digests)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]
