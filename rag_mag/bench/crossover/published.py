"""A main run's published checkpoint (``best/``): linked for ``bench``, measured off the curve, rebuilt where absent."""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rag_mag import durable
from rag_mag.bench.crossover.config import RunSpec
from rag_mag.bench.crossover.held_out import test_ndcg
from rag_mag.bench.crossover.report import selected_point
from rag_mag.bench.crossover.store import CrossoverStore
from rag_mag.bench.datasets import EvalDataset
from rag_mag.errors import CheckpointError
from rag_mag.precision import cpu_kind

logger = logging.getLogger(__name__)


def publish(store: CrossoverStore, spec: RunSpec, run_dir: Path) -> None:
    """``artifacts/crossover/retrievers/<label>``: a stable name for a finished main run's folder, so a
    benchmark config can score its best/ checkpoint (``retrievers:``) without training it again."""
    if spec.group != "main" or not (run_dir / "best").is_dir():
        return
    link = store.work / "retrievers" / spec.label
    link.parent.mkdir(parents=True, exist_ok=True)
    staging = link.with_name(f".{spec.label}.tmp")
    staging.unlink(missing_ok=True)
    staging.symlink_to(Path("..") / "runs" / run_dir.name)
    staging.replace(link)


def lacks_best(spec: RunSpec, run_dir: Path) -> bool:
    return spec.group == "main" and not (run_dir / "best").is_dir()


def lacks_published_point(store: CrossoverStore, spec: RunSpec, run_dir: Path) -> bool:
    """A finished main run whose cell has no measurement of the step it published, and whose best/ is here."""
    cell = store.cell(spec.label)
    return (spec.group == "main" and bool(cell) and cell.get("selected_step") is not None
            and selected_point(cell) is None and (run_dir / "best").is_dir())


def measure_published(store: CrossoverStore, spec: RunSpec, run_dir: Path, tests: list[EvalDataset],
                      validation: list) -> None:
    """Measure a main run's best/ where it is not one of the curve's checkpoints.

    The trainer chooses best/ among its validation steps (every 100), the curve measures only the
    config's checkpoints, so a run may publish, say, step 300, which the curve never tested. Its
    validation (per query, which ``--rebuild`` compares against) and test nDCG@10 go into the cell as
    ``published``; the curves and the verdict keep to the checkpoints every run shares.
    """
    from rag_mag.precision import use_bf16
    from rag_mag.retriever.encoder import MagnitudeEncoder
    from rag_mag.retriever.training.validation import validation_scores

    cell = store.cell(spec.label)
    step = cell["selected_step"]
    bf16 = bool(cell.get("bf16")) and use_bf16("auto")  # a bf16 run is measured in fp32 where bf16 is emulated
    encoder = MagnitudeEncoder.load(run_dir / "best")
    logger.info("%s: measuring its published best/ (step %d, not a curve checkpoint)", spec.label, step)
    metrics, per_query = validation_scores(encoder, validation, bf16=bf16)
    point: dict[str, Any] = {"step": step, "validation": metrics, "validation_per_query": per_query,
                             "test": {}, "bf16": bf16}
    for dataset in tests if spec.group in store.config.test_groups else ():
        mean, per_example = test_ndcg(encoder, dataset, bf16)
        point["test"][dataset.name] = {"ndcg@10": mean, "per_example": per_example}
    store.write_cell(spec.label, {**cell, "published": point})
    logger.info("%s published step %d: val nDCG@10 %.1f, test %s", spec.label, step, metrics["ndcg@10"],
                " ".join(f"{k}={v['ndcg@10']:.1f}" for k, v in point["test"].items()))


class _Rebuilt(Exception):
    """Ends a rebuild's training at the selected step."""


def rebuild_checkpoint(store: CrossoverStore, spec: RunSpec, key: str, train_file: Path, run_dir: Path,
                       validation: list, tolerance: float) -> None:
    """Re-create a finished main run's published checkpoint on a machine that lacks it.

    The run trains again under its own config (the learning-rate schedule is the full run's), in the
    precision its cell records (a bf16 run in fp32 where the CPU would emulate bf16), and stops at the
    step the cell selected. That checkpoint's validation
    nDCG@10 must be within ``tolerance`` points of the cell's at the same step (training is
    deterministic for one precision and kernel set; another CPU's kernels may round differently);
    then it becomes ``best/``, ``rebuilt.json`` records the comparison and ``train_log.jsonl`` the rebuild's
    own training log (to the selected step). Otherwise nothing is published.
    """
    from rag_mag.precision import resolve_device, use_bf16
    from rag_mag.retriever.training.trainer import Trainer

    cell = store.cell(spec.label)
    step = cell.get("selected_step")
    original = selected_point(cell)
    if original is None:
        raise CheckpointError(f"{spec.label}: its cell records no selected step with a validation point, "
                              "so its best/ cannot be rebuilt; train it again (delete its cell)")
    # emulated bf16 took 2 to 19 times an fp32 step in eval/reports/precision/
    trainer = Trainer(replace(store.config.train_config(spec, train_file, store.work / "rebuilds" / key),
                              precision="auto" if cell.get("bf16") else "fp32"))
    # the trainer decides its precision inside train(); the same rule, decided here for the messages and the record
    bf16 = use_bf16(trainer.config.precision, resolve_device(trainer.config.device))
    precision = "bf16" if bf16 else "fp32"
    here = cpu_kind()
    trained_on = _warn_unreproducible(spec, cell, here, bf16)
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
        _save_rebuilt(trainer, encoder, run_dir, metrics, record)
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
    publish(store, spec, run_dir)


def _warn_unreproducible(spec: RunSpec, cell: dict, here: str, bf16: bool) -> str:
    """Which CPUs trained the run, as the cell says (for the messages); warns where this CPU (``here``) or
    this precision (``bf16``) cannot reproduce it bit for bit."""
    kinds = cell.get("cpu_kinds")
    trained_on = (f"trained on {' and '.join(kinds)} CPUs" if kinds
                  else "its cell does not say which CPUs trained it")
    if kinds and kinds != [here]:
        logger.warning("%s was %s, this one is %s: torch's kernels round differently on another kind, so "
                       "the rebuild may not reproduce it; the validation check decides", spec.label, trained_on,
                       here)
    if cell.get("bf16") and not bf16:
        logger.warning("%s trained in bf16, which this CPU does not compute natively: rebuilding it in fp32, "
                       "which cannot match it bit for bit; the validation check decides", spec.label)
    return trained_on


def _save_rebuilt(trainer, encoder, run_dir: Path, metrics: dict, record: dict) -> None:
    """The rebuilt checkpoint as ``best/``, with ``rebuilt.json`` (``record``) and its own training history."""
    encoder.save(run_dir / "best")
    # the rebuilt checkpoint's own history, to the selected step's validation (this hook runs before the
    # trainer logs that step); the benchmark report shows it
    earlier = trainer.log_path.read_text() if trainer.log_path.is_file() else ""
    durable.write_text(run_dir / "train_log.jsonl", earlier + json.dumps(
        {"step": record["step"], "validation": metrics, "best": True, "rebuilt": True}) + "\n")
    durable.write_text(run_dir / "rebuilt.json", json.dumps(record, indent=2))
