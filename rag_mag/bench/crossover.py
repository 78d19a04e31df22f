"""The crossover study: where (if anywhere) does a one-sided strategy overtake cosine?

One YAML config (``eval/configs/crossover.yaml``) lists training runs: strategies x seeds x lengths,
a data-size axis (a seeded share of the training pairs), and an optional tuning grid. Each run trains
once; at its ``checkpoints`` steps the same run is measured on the fixed validation file (held-out
training queries) and on the test sets (each dataset's questions against its own corpus, nDCG@10).
So every point of a curve comes from a checkpoint of one run, never from a separate shorter run.

Runs are cells: a finished run is saved as ``<out>/cells/<label>.json`` with the key of everything it
depends on, and a run's points are appended to ``curve.jsonl`` as they are measured, so an interrupted
study resumes (the trainer resumes from its ``last/`` checkpoint). ``--time-budget`` stops cleanly
between runs. A finished main run's published checkpoint is not committed (only its cell is): on another
machine ``--rebuild`` trains it again to the selected step and checks it against the cell. The study only
needs torch and transformers at training time (no Haystack, FAISS or vLLM), so it also runs on a GPU
machine (``device: auto``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rag_mag import durable
from rag_mag.bench.config import fingerprint
from rag_mag.bench.crossover_report import selected_point
from rag_mag.bench.dataset_specs import load_registry
from rag_mag.bench.datasets import EvalDataset, data_root
from rag_mag.data import iter_jsonl, read_corpus, read_eval, read_triples, write_jsonl
from rag_mag.errors import CheckpointError, ConfigError
from rag_mag.metrics.retrieval import score_retrieval
from rag_mag.models import REPO_ROOT, artifacts_dir
from rag_mag.precision import cpu_kind
from rag_mag.retriever.config import TrainConfig, make_config, read_config_file
from rag_mag.retriever.strategies import Strategy

logger = logging.getLogger(__name__)
CELL_FORMAT = 1
# Settings that change how fast a run goes on this machine, not what it learns: not part of a cell's key.
MACHINE_SETTINGS = ("threads", "device", "log_every")


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


def load_crossover_config(path: str | Path) -> CrossoverConfig:
    return make_config(CrossoverConfig, read_config_file(path), source="crossover config")


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


class CrossoverRunner:
    def __init__(self, config: CrossoverConfig, config_path: str) -> None:
        self.config = config
        self.config_path = config_path
        self.out = config.out_dir()
        self.cells_dir = self.out / "cells"
        self.work = artifacts_dir() / "crossover"
        self._clock = time.monotonic()  # the running run's start, less the seconds of its earlier processes

    def _train_file(self, spec: RunSpec) -> Path:
        """The training triples of a run: a source filter and a seeded fraction of the shared file."""
        source = Path(self.config.train_data)
        if not spec.sources and spec.fraction >= 1:
            return source
        digest = fingerprint(str(source), self.config.ablation_data, spec.sources, spec.fraction, source.stat().st_size)
        target = self.work / "train" / f"{digest}.jsonl"
        if target.is_file():
            return target
        files = [source, Path(self.config.ablation_data)] if spec.sources and self.config.ablation_data else [source]
        rows = [row for path in files for _, row in iter_jsonl(path)]
        if spec.sources:
            rows = [row for row in rows if row.get("source") in spec.sources]
        if spec.fraction < 1:
            order = np.random.default_rng(1234).permutation(len(rows))  # nested: 25% is inside 50%
            rows = [rows[i] for i in sorted(order[: max(1, int(len(rows) * spec.fraction))])]
        if not rows:
            raise ConfigError(f"run {spec.label}: no training triples left (sources {spec.sources})")
        write_jsonl(target, rows)
        return target

    def _train_config(self, spec: RunSpec, train_file: Path, run_dir: Path) -> TrainConfig:
        values = {**self.config.train, **spec.tuned, **spec.overrides, "strategy": spec.strategy, "seed": spec.seed,
                  "steps": spec.steps, "train_data": str(train_file), "val_data": self.config.val_data,
                  "out": str(run_dir)}
        values.setdefault("save_every", max(1, min(100, spec.steps)))
        values.setdefault("eval_every", max(1, min(100, spec.steps)))  # best/ is chosen among these (selection)
        return make_config(TrainConfig, values, source=f"crossover run {spec.label}")

    def run(self, time_budget_s: float = 0.0, poll_s: float = 30.0, only: list[str] | None = None,
            rebuild: bool = False, rebuild_tolerance: float = 0.5) -> dict:
        """Train every unfinished run (resuming where a run was interrupted); return ``collect()``.

        ``only``: train just the runs with these labels (e.g. ``main_dot_s0_400``), in the config's order.

        ``rebuild``: a finished main run whose ``best/`` this machine lacks (a fresh clone holds the cells,
        not the checkpoints) is trained again up to the step its cell selected, and published only if its
        validation nDCG@10 there is within ``rebuild_tolerance`` points of the cell's (see ``_rebuild``).

        Several processes may run the same config at once (``rag-mag crossover --workers N``): each claims a
        run with a lock before training it, and runs that wait for the tuning runs or for another worker are
        retried every ``poll_s`` seconds.
        """
        started = time.monotonic()
        tests = load_test_sets(self.config)
        validation = read_triples(self.config.val_data)[:300]
        self.cells_dir.mkdir(parents=True, exist_ok=True)
        specs = self.config.run_specs()
        chosen = specs
        if only:
            labels = [spec.label for spec in specs]
            unknown = [label for label in only if label not in labels]
            if unknown:
                raise ConfigError(f"--only: no run labelled {', '.join(unknown)} in this config; its runs are: "
                                  + ", ".join(labels))
            chosen = [spec for spec in specs if spec.label in only]
        while True:
            waiting, trained = 0, False
            for spec in chosen:
                if spec.group != "tuning" and self.config.tuned:
                    tuned = self._with_tuned(spec, specs)
                    if tuned is None:  # its tuning runs are not finished yet
                        waiting += 1
                        continue
                    spec = tuned
                train_file = self._train_file(spec)
                key = self._key(spec, train_file)
                run_dir = self.work / "runs" / key
                if self._finished(spec, key) and not (rebuild and self._lacks_best(spec, run_dir)) \
                        and not self._lacks_published_point(spec, run_dir):
                    self._publish(spec, run_dir)
                    continue
                if time_budget_s and time.monotonic() - started > time_budget_s:
                    logger.warning("time budget spent; run the same command again to continue")
                    return self.collect()
                with self._claim(key) as claimed:
                    if not claimed:  # another worker trains it
                        waiting += 1
                        continue
                    if not self._finished(spec, key):
                        self._train_run(spec, key, train_file, run_dir, tests, validation)
                        trained = True
                    elif rebuild and self._lacks_best(spec, run_dir):
                        self._rebuild(spec, key, train_file, run_dir, validation, rebuild_tolerance)
                        trained = True
                    if self._lacks_published_point(spec, run_dir):
                        self._measure_published(spec, run_dir, tests, validation)
                        trained = True
            if not waiting:
                return self.collect()
            if not trained:
                logger.info("waiting for %d runs (held by other workers, or waiting for the tuning runs)", waiting)
                time.sleep(poll_s)

    def _key(self, spec: RunSpec, train_file: Path) -> str:
        settings = {k: v for k, v in self.config.train.items() if k not in (*MACHINE_SETTINGS, "selection")}
        last_only = ["test_last_only"] if spec.group in self.config.test_last_only else []  # older keys unchanged
        # a main run publishes best/, which the selection rule chooses (the other groups' keys are unchanged)
        selection = ["selection", self.config.train.get("selection", TrainConfig.selection)] \
            if spec.group == "main" else []
        return fingerprint(CELL_FORMAT, asdict(spec), settings, self.config.checkpoints,
                           spec.group in self.config.test_groups, self.config.datasets, self.config.max_questions,
                           train_file.stat().st_size, Path(self.config.val_data).stat().st_size, *last_only,
                           *selection)

    def _cell(self, label: str) -> dict:
        """A run's finished cell ({} if there is none)."""
        path = self.cells_dir / f"{label}.json"
        return json.loads(path.read_text().splitlines()[0]) if path.is_file() else {}

    def _finished(self, spec: RunSpec, key: str) -> bool:
        return self._cell(spec.label).get("key") == key

    @contextlib.contextmanager
    def _claim(self, key: str) -> Iterator[bool]:
        """An exclusive lock on one run, so that several workers (``--workers``) never train the same one;
        the operating system releases it when a worker dies."""
        path = self.work / "locks" / f"{key}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _train_run(self, spec: RunSpec, key: str, train_file: Path, run_dir: Path, tests: list[EvalDataset],
                   validation: list) -> None:
        from rag_mag.retriever.trainer import Trainer

        curve_path = run_dir / "curve.jsonl"
        checkpoints = {s for s in self.config.checkpoints if s <= spec.steps} | {spec.steps}
        trainer = Trainer(self._train_config(spec, train_file, run_dir))
        # the run's clock goes on from where its earlier processes stopped (or were last measured, after a kill)
        clock_path = run_dir / "seconds"
        self._clock = time.monotonic() - (float(clock_path.read_text()) if clock_path.is_file() else 0.0)
        trainer.on_step = functools.partial(self._measure, spec, trainer, curve_path, checkpoints, tests, validation)
        kinds = self._record_cpu_kind(run_dir)
        try:
            result = trainer.train()
        finally:
            self._save_clock(run_dir)
        points = _curve_points(curve_path)
        log = [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines()]
        losses = [r for r in log if "loss" in r]
        cell = {"key": key, "run": asdict(spec), "label": spec.label, "curve": [points[s] for s in sorted(points)],
                "final_loss": losses[-1]["loss"] if losses else None,
                "final_norms": {k: losses[-1][k] for k in ("query_norm_mean", "query_norm_cv",
                                                             "document_norm_mean", "document_norm_cv")}
                if losses else {},
                "train_size": sum(1 for _ in iter_jsonl(train_file)),
                "seconds": round(time.monotonic() - self._clock),
                "device": str(trainer.device), "cpu_kinds": kinds, "bf16": trainer.bf16, "steps_done": result.step,
                "selection": trainer.config.selection, "selected_step": result.best_metrics.get("step")}
        write_jsonl(self.cells_dir / f"{spec.label}.json", [cell])
        self._publish(spec, run_dir)

    @staticmethod
    def _lacks_best(spec: RunSpec, run_dir: Path) -> bool:
        return spec.group == "main" and not (run_dir / "best").is_dir()

    def _rebuild(self, spec: RunSpec, key: str, train_file: Path, run_dir: Path, validation: list,
                 tolerance: float) -> None:
        """Re-create a finished main run's published checkpoint on a machine that lacks it.

        The run trains again under its own config (the learning-rate schedule is the full run's), in the
        precision its cell records (a bf16 run in fp32 where the CPU would emulate bf16), and stops at the
        step the cell selected. That checkpoint's validation
        nDCG@10 must be within ``tolerance`` points of the cell's at the same step (training is
        deterministic for one precision and kernel set; another CPU's kernels may round differently);
        then it becomes ``best/``, ``rebuilt.json`` records the comparison and ``train_log.jsonl`` the rebuild's
        own training log (to the selected step). Otherwise nothing is published.
        """
        from rag_mag.retriever.trainer import Trainer

        cell = self._cell(spec.label)
        step = cell.get("selected_step")
        original = selected_point(cell)
        if original is None:
            raise CheckpointError(f"{spec.label}: its cell records no selected step with a validation point, "
                                  "so its best/ cannot be rebuilt; train it again (delete its cell)")
        # emulated bf16 took 2 to 19 times an fp32 step in eval/reports/precision/
        trainer = Trainer(replace(self._train_config(spec, train_file, self.work / "rebuilds" / key),
                                  precision="auto" if cell.get("bf16") else "fp32"))
        precision = "bf16" if trainer.bf16 else "fp32"
        kinds, here = cell.get("cpu_kinds"), cpu_kind()
        trained_on = (f"trained on {' and '.join(kinds)} CPUs" if kinds
                      else "its cell does not say which CPUs trained it")
        if kinds and kinds != [here]:
            logger.warning("%s was %s, this one is %s: torch's kernels round differently on another kind, so "
                           "the rebuild may not reproduce it; the validation check decides", spec.label, trained_on,
                           here)
        if cell.get("bf16") and not trainer.bf16:
            logger.warning("%s trained in bf16, which this CPU does not compute natively: rebuilding it in fp32, "
                           "which cannot match it bit for bit; the validation check decides", spec.label)
        logger.info("rebuilding %s in %s: %d of its %d steps, to re-create its best/", spec.label, precision,
                    step, spec.steps)
        started = time.monotonic()

        def stop_at_selected(at: int, encoder) -> None:
            if at < step:
                return
            metrics, per_query = trainer.validation_scores(encoder, validation)
            before = original["validation"]["ndcg@10"]
            recorded = original.get("validation_per_query")
            changed = sum(abs(a - b) > 1e-6 for a, b in zip(per_query, recorded, strict=True)) if recorded else None
            record = {"label": spec.label, "key": key, "step": step, "precision": precision,
                      "cell_precision": "bf16" if cell.get("bf16") else "fp32",
                      "validation_ndcg@10": {"cell": before, "rebuilt": metrics["ndcg@10"]},
                      "queries_changed": changed, "tolerance": tolerance,
                      "seconds": round(time.monotonic() - started)}
            if abs(metrics["ndcg@10"] - before) > tolerance:
                raise CheckpointError(
                    f"{spec.label}: the rebuilt step {step} scores validation nDCG@10 {metrics['ndcg@10']:.2f}, "
                    f"its cell {before:.2f} (more than {tolerance} points apart): "
                    f"not published. This CPU ({here}) does not reproduce the run ({trained_on}); train it again "
                    "here (delete its cell) or rebuild it on a CPU of the kind that trained it")
            encoder.save(run_dir / "best")
            # the rebuilt checkpoint's own history, to the selected step's validation (this hook runs before the
            # trainer logs that step); the benchmark report shows it
            earlier = trainer.log_path.read_text() if trainer.log_path.is_file() else ""
            durable.write_text(run_dir / "train_log.jsonl", earlier + json.dumps(
                {"step": step, "validation": metrics, "best": True, "rebuilt": True}) + "\n")
            durable.write_text(run_dir / "rebuilt.json", json.dumps(record, indent=2))
            logger.info("%s: rebuilt step %d, validation nDCG@10 %.2f (cell %.2f; queries changed: %s)",
                        spec.label, step, metrics["ndcg@10"], before, changed)
            raise _Rebuilt

        trainer.on_step = stop_at_selected
        try:
            trainer.train()
        except _Rebuilt:
            shutil.rmtree(trainer.out, ignore_errors=True)  # its resumable state is no longer needed
        else:
            raise CheckpointError(f"{spec.label}: training ended before step {step}")
        self._publish(spec, run_dir)

    def _lacks_published_point(self, spec: RunSpec, run_dir: Path) -> bool:
        """A finished main run whose cell has no measurement of the step it published, and whose best/ is here."""
        cell = self._cell(spec.label)
        return (spec.group == "main" and bool(cell) and cell.get("selected_step") is not None
                and selected_point(cell) is None and (run_dir / "best").is_dir())

    def _measure_published(self, spec: RunSpec, run_dir: Path, tests: list[EvalDataset], validation: list) -> None:
        """Measure a main run's best/ where it is not one of the curve's checkpoints.

        The trainer chooses best/ among its validation steps (every 100), the curve measures only the
        config's checkpoints, so a run may publish, say, step 300, which the curve never tested. Its
        validation (per query, which ``--rebuild`` compares against) and test nDCG@10 go into the cell as
        ``published``; the curves and the verdict keep to the checkpoints every run shares.
        """
        from rag_mag.precision import use_bf16
        from rag_mag.retriever.encoder import MagnitudeEncoder
        from rag_mag.retriever.trainer import validation_scores

        cell = self._cell(spec.label)
        step = cell["selected_step"]
        bf16 = bool(cell.get("bf16")) and use_bf16("auto")  # a bf16 run is measured in fp32 where bf16 is emulated
        encoder = MagnitudeEncoder.load(run_dir / "best")
        logger.info("%s: measuring its published best/ (step %d, not a curve checkpoint)", spec.label, step)
        metrics, per_query = validation_scores(encoder, validation, bf16=bf16)
        point: dict[str, Any] = {"step": step, "validation": metrics, "validation_per_query": per_query,
                                 "test": {}, "bf16": bf16}
        for dataset in tests if spec.group in self.config.test_groups else ():
            mean, per_example = test_ndcg(encoder, dataset, bf16)
            point["test"][dataset.name] = {"ndcg@10": mean, "per_example": per_example}
        write_jsonl(self.cells_dir / f"{spec.label}.json", [{**cell, "published": point}])
        logger.info("%s published step %d: val nDCG@10 %.1f, test %s", spec.label, step, metrics["ndcg@10"],
                    " ".join(f"{k}={v['ndcg@10']:.1f}" for k, v in point["test"].items()))

    @staticmethod
    def _record_cpu_kind(run_dir: Path) -> list[str]:
        """The kinds of CPU (``precision.cpu_kind``) that trained this run, over all its processes
        (``run_dir/cpu_kinds``): a run resumed on another kind cannot be rebuilt bit for bit."""
        path, here = run_dir / "cpu_kinds", cpu_kind()
        kinds = json.loads(path.read_text()) if path.is_file() else []
        if here not in kinds:
            kinds.append(here)
            run_dir.mkdir(parents=True, exist_ok=True)
            durable.write_text(path, json.dumps(kinds))
        return kinds

    def _save_clock(self, run_dir: Path) -> None:
        """The running run's seconds so far, across its processes (``run_dir/seconds``)."""
        if run_dir.is_dir():
            durable.write_text(run_dir / "seconds", f"{time.monotonic() - self._clock:.1f}")

    def _publish(self, spec: RunSpec, run_dir: Path) -> None:
        """``artifacts/crossover/retrievers/<label>``: a stable name for a finished main run's folder, so a
        benchmark config can score its best/ checkpoint (``retrievers:``) without training it again."""
        if spec.group != "main" or not (run_dir / "best").is_dir():
            return
        link = self.work / "retrievers" / spec.label
        link.parent.mkdir(parents=True, exist_ok=True)
        staging = link.with_name(f".{spec.label}.tmp")
        staging.unlink(missing_ok=True)
        staging.symlink_to(Path("..") / "runs" / run_dir.name)
        staging.replace(link)

    def _with_tuned(self, spec: RunSpec, specs: list[RunSpec]) -> RunSpec | None:
        """The run with the ``tuned`` fields set from the finished tuning cells (validation only); None while
        a tuning run it depends on is unfinished: its own strategy's, or every one for a strategy that has
        none (it takes the values best on average)."""
        tuning_specs = [s for s in specs if s.group == "tuning"]
        if not tuning_specs:
            raise ConfigError(f"`tuned` names {', '.join(self.config.tuned)}, but the config has no tuning runs; "
                              "add a run with group: tuning and a grid, or remove `tuned`")
        tuning_specs = [s for s in tuning_specs if s.strategy == spec.strategy] or tuning_specs
        wanted = [s.label for s in tuning_specs]
        cells = []
        for tuning in tuning_specs:
            cell = self._cell(tuning.label)
            if cell.get("key") == self._key(tuning, self._train_file(tuning)):  # not one of an earlier recipe
                cells.append(cell)
        if set(wanted) - {c["label"] for c in cells}:
            return None
        tuned = {}
        for name in self.config.tuned:
            if name in spec.overrides:
                continue
            scores: dict[str, dict[Any, float]] = {}
            for cell in cells:
                if name in cell["run"]["overrides"]:
                    best = max(point["validation"]["ndcg@10"] for point in cell["curve"])
                    scores.setdefault(cell["run"]["strategy"], {})[cell["run"]["overrides"][name]] = best
            if not scores:
                raise ConfigError(f"`tuned` names {name!r}, but no tuning run varies it")
            if spec.strategy in scores:
                tuned[name] = max(scores[spec.strategy], key=scores[spec.strategy].get)
            else:
                values = set.intersection(*(set(v) for v in scores.values()))
                tuned[name] = max(values, key=lambda v: np.mean([scores[s][v] for s in scores]))
        return RunSpec(**{**asdict(spec), "tuned": tuned})

    def _measure(self, spec: RunSpec, trainer, curve_path: Path, checkpoints: set[int], tests: list[EvalDataset],
                 validation: list, step: int, encoder) -> None:
        """The trainer's step hook: at a checkpoint step, append validation (and test) nDCG@10 to the curve
        (once: a run resumed after a kill may replay a step it had measured)."""
        if step not in checkpoints or step in _curve_points(curve_path):
            return
        metrics, per_query = trainer.validation_scores(encoder, validation)
        point: dict[str, Any] = {"step": step, "validation": metrics, "validation_per_query": per_query, "test": {}}
        tested = spec.group in self.config.test_groups and \
            (spec.group not in self.config.test_last_only or step == spec.steps)
        for dataset in tests if tested else ():
            point["test"][dataset.name] = self._test_point(step, trainer, encoder, dataset)
        point["g"] = list(encoder.degrees.as_floats())
        point["seconds"] = round(time.monotonic() - self._clock)
        curve_path.parent.mkdir(parents=True, exist_ok=True)
        with curve_path.open("a") as handle:
            handle.write(json.dumps(point) + "\n")
        self._save_clock(curve_path.parent)
        logger.info("%s step %d: val nDCG@10 %.1f, test %s", spec.label, step, point["validation"]["ndcg@10"],
                    " ".join(f"{k}={v['ndcg@10']:.1f}" for k, v in point["test"].items()))

    def _test_point(self, step: int, trainer, encoder, dataset: EvalDataset) -> dict:
        """Test nDCG@10 of one checkpoint on one dataset.

        Step 0 is the untrained encoder, and a positive scale per side (the norm calibration) changes no
        ranking, so its test scores are the same for every run that starts from the same encoder under the
        same treatment (strategy and degrees): measured once, then read from ``artifacts/crossover/step0/``.
        """
        cache = None
        if step == 0:
            config = trainer.config
            key = fingerprint(encoder.config.strategy, encoder.degrees.as_floats(), config.base_model,
                              config.pooling, config.query_max_length, config.document_max_length, trainer.bf16,
                              dataset.name, [r.id for r in dataset.records], [p.id for p in dataset.corpus])
            cache = self.work / "step0" / f"{key}.json"
            if cache.is_file():
                return json.loads(cache.read_text())
        mean, per_example = test_ndcg(encoder, dataset, trainer.bf16)
        result = {"ndcg@10": mean, "per_example": per_example}
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            durable.write_text(cache, json.dumps(result))
        return result

    def collect(self) -> dict:
        """The finished cells of this config's runs, each only if its key matches what the run would be now
        (cells of runs no longer in the config, or trained on other data or settings, are left out: after
        the recipe changes, an old cell is never reported, nor does it tune a new run).

        Without the training data (a fresh clone) keys cannot be checked; the cells are reported as they
        are, with a warning."""
        specs = self.config.run_specs()
        checkable = all(Path(path).is_file() for path in (self.config.train_data, self.config.val_data))
        if not checkable:
            logger.warning("cannot check the finished cells against the training data (%s or %s is missing): "
                           "reporting them as they are", self.config.train_data, self.config.val_data)
        cells, stale = [], []
        for spec in sorted(specs, key=lambda spec: spec.label):
            cell = self._cell(spec.label)
            if not cell:
                continue
            if checkable and cell.get("key") != self._current_key(spec, specs):
                stale.append(spec.label)
            else:
                cells.append(cell)
        if stale:
            logger.warning("%d finished cells were trained on other data or settings and are left out (they "
                           "train again): %s", len(stale), ", ".join(stale))
        done = {cell["label"] for cell in cells}
        return {"config": asdict(self.config), "cells": cells, "planned": len(specs),
                "pending": [spec.label for spec in specs if spec.label not in done]}

    def _current_key(self, spec: RunSpec, specs: list[RunSpec]) -> str | None:
        """The key ``spec`` would train under now; None while its tuning runs are unfinished."""
        if spec.group != "tuning" and self.config.tuned:
            spec = self._with_tuned(spec, specs)
            if spec is None:
                return None
        return self._key(spec, self._train_file(spec))


class _Rebuilt(Exception):
    """Ends a rebuild's training at the selected step."""


def _curve_points(curve_path: Path) -> dict[int, dict]:
    """A run's measured points by step (none before its first)."""
    points: dict[int, dict] = {}
    if not curve_path.is_file():
        return points
    for line in curve_path.read_text().splitlines():
        try:
            point = json.loads(line)
        except json.JSONDecodeError:  # a line torn by a kill in the middle of a write
            continue
        points[point["step"]] = point  # a resumed run may have measured a step twice: keep the last
    return points
