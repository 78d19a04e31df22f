"""The crossover study's config: its runs (``RunSpec``, one per label) and ``CrossoverConfig``, read from YAML."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_mag.errors import ConfigError
from rag_mag.models import REPO_ROOT
from rag_mag.retriever.strategies import Strategy
from rag_mag.retriever.training.config import TrainConfig, make_config, read_config_file


@dataclass
class RunSpec:
    strategy: str
    seed: int = 0
    steps: int = 800
    fraction: float = 1.0          # share of the training triples (the data-size axis)
    group: str = "main"            # main, data_size, tuning or ablation
    sources: list[str] = field(default_factory=list)   # train only on these sources (empty: all)
    overrides: dict[str, Any] = field(default_factory=dict)  # TrainConfig fields for this run only
    tuned: dict[str, Any] = field(default_factory=dict)      # fields chosen by the tuning runs (not in the label)

    @property
    def label(self) -> str:
        parts = [self.group, self.strategy, f"s{self.seed}", f"{self.steps}"]
        if self.fraction < 1:
            parts.append(f"f{self.fraction:g}")
        if self.sources:
            parts.append("+".join(self.sources))
        parts += [f"{k}{v:g}" if isinstance(v, float) else f"{k}{v}" for k, v in sorted(self.overrides.items())]
        return "_".join(str(p) for p in parts).replace("/", "-")


@dataclass
class CrossoverConfig:
    name: str = "crossover"
    train_data: str = "data/train_default/train.jsonl.gz"   # the frozen build of `rag-mag build-data`
    val_data: str = "data/train_default/val.jsonl.gz"
    # Triples of ablation-only sources (e.g. unfiltered mined pairs); runs that name them in `sources` use them.
    ablation_data: str = ""
    datasets: list[str] = field(default_factory=lambda: ["trivia_qa", "nq_open", "hotpot_qa", "musique"])
    max_questions: int = 500
    data_root: str | None = None
    train: dict[str, Any] = field(default_factory=dict)     # TrainConfig fields shared by every run
    checkpoints: list[int] = field(default_factory=lambda: [0, 100, 200, 400, 800])
    # Groups whose checkpoints are also measured on the test sets; the others (tuning, ablation) are
    # judged on validation only, which is all their choice may use, and they cost no corpus encoding.
    test_groups: list[str] = field(default_factory=lambda: ["main", "data_size"])
    # Groups of test_groups measured on the test sets at their last step only (their comparison uses the
    # final checkpoint, e.g. the data-size axis); each skipped test evaluation saves a corpus encoding.
    test_last_only: list[str] = field(default_factory=list)
    # TrainConfig fields that the tuning runs choose for every other run: per strategy, the grid value
    # with the best validation nDCG@10 (at any checkpoint); a strategy without tuning runs takes the
    # value with the best mean over the tuned strategies. The tuning runs therefore go first.
    tuned: list[str] = field(default_factory=list)
    runs: list[dict] = field(default_factory=list)
    output_dir: str = ""

    def __post_init__(self) -> None:
        if not self.runs:
            raise ConfigError("the crossover config lists no runs")
        if sorted(set(self.checkpoints)) != list(self.checkpoints) or min(self.checkpoints) < 0:
            raise ConfigError(f"checkpoints must be increasing step numbers >= 0, got {self.checkpoints}")

    def run_specs(self) -> list[RunSpec]:
        specs = []
        for entry in self.runs:
            entry = dict(entry)
            seeds = entry.pop("seeds", [entry.pop("seed", 0)])
            strategies = entry.pop("strategies", [entry.pop("strategy", None)])
            fractions = entry.pop("fractions", [entry.pop("fraction", 1.0)])
            grid = entry.pop("grid", {}) or {}
            combos = [{}]
            for key, values in grid.items():
                combos = [{**c, key: v} for c in combos for v in values]
            for strategy in strategies:
                for seed in seeds:
                    for fraction in fractions:
                        for combo in combos:
                            try:
                                spec = RunSpec(strategy=Strategy.parse(strategy).value, seed=int(seed),
                                               fraction=float(fraction),
                                               overrides={**entry.get("overrides", {}), **combo},
                                               **{k: v for k, v in entry.items() if k != "overrides"})
                            except TypeError as error:
                                raise ConfigError(f"invalid crossover run {entry}: {error}") from None
                            specs.append(spec)
        return specs

    def out_dir(self) -> Path:
        return Path(self.output_dir) if self.output_dir else REPO_ROOT / "eval" / "reports" / self.name

    def train_config(self, spec: RunSpec, train_file: Path, run_dir: Path) -> TrainConfig:
        """The ``TrainConfig`` of one run: the shared ``train`` fields, then its tuned values and overrides."""
        values = {**self.train, **spec.tuned, **spec.overrides, "strategy": spec.strategy, "seed": spec.seed,
                  "steps": spec.steps, "train_data": str(train_file), "val_data": self.val_data,
                  "out": str(run_dir)}
        values.setdefault("save_every", max(1, min(100, spec.steps)))
        values.setdefault("eval_every", max(1, min(100, spec.steps)))  # best/ is chosen among these (selection)
        return make_config(TrainConfig, values, source=f"crossover run {spec.label}")


def load_crossover_config(path: str | Path) -> CrossoverConfig:
    return make_config(CrossoverConfig, read_config_file(path), source="crossover config")

