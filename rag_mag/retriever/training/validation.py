"""Validation of a training run: scoring a checkpoint on the held-out queries, and keeping ``best/`` by the rule.

``best/`` is the validated checkpoint the ``selection`` rule chooses: by default the earliest one within one
standard error of the best validation nDCG@10, step 0 included (``selection.py``); ``validated/step-N/``
holds the validated checkpoints that rule may still choose (the others are deleted).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from rag_mag import durable
from rag_mag.data import Passage, Triple
from rag_mag.errors import CheckpointError
from rag_mag.metrics.retrieval import judge_supporting, score_retrieval
from rag_mag.retriever.encoder import MagnitudeEncoder
from rag_mag.retriever.training.selection import within_one_standard_error


@torch.inference_mode()
def validation_scores(encoder: MagnitudeEncoder, validation: list[Triple], distractors: Sequence[Passage] = (),
                      bf16: bool = False) -> tuple[dict[str, float], list[float]]:
    """Rank one pool for every validation query: recall@1/5/20 and nDCG@10 means, and each query's nDCG@10
    (in percent). The pool is every validation query's positives and hard negatives, plus ``distractors``
    (``eval/probe_validation.py`` widens it with the training passages); a query's positives are relevant."""
    pool: dict[str, Passage] = {}
    for passage in (*(p for triple in validation for p in (*triple.positives, *triple.hard_negatives)),
                    *distractors):
        pool.setdefault(passage.id, passage)
    ids = list(pool)
    documents = encoder.encode([pool[i].content for i in ids], "document", bf16=bf16)
    queries = encoder.encode([t.query for t in validation], "query", bf16=bf16)
    top = np.argsort(-(queries @ documents.T), axis=1)[:, :20]
    judgements = [judge_supporting([ids[j] for j in row], [p.id for p in triple.positives])
                  for row, triple in zip(top, validation, strict=True)]
    scores = score_retrieval(judgements, ks=(1, 5, 20))
    per_query = [round(100.0 * float(v), 2) for v in scores.per_example["ndcg@10"]]
    return {name: scores.means[name] for name in ("recall@1", "recall@5", "recall@20", "ndcg@10")}, per_query


def keep_highest(encoder: MagnitudeEncoder, step: int, metrics: dict[str, float], best_metrics: dict,
                 best_dir: Path, log: Callable[[dict], None]) -> dict:
    """The max rule: save this checkpoint to ``best_dir`` when its nDCG@10 beats every earlier one; log the
    validation, and return the best metrics with their ``step``."""
    improved = metrics["ndcg@10"] > best_metrics.get("ndcg@10", -1.0)
    log({"step": step, "validation": metrics, "best": improved})
    if improved:
        encoder.save(best_dir)
        return {**metrics, "step": step}
    return best_metrics


def keep_within_one_standard_error(encoder: MagnitudeEncoder, step: int, metrics: dict[str, float],
                                   per_query: list[float], candidates: dict[str, dict], best_dir: Path,
                                   validated_dir: Path, log: Callable[[dict], None]) -> tuple[dict, dict[str, dict]]:
    """The one_se rule (``selection.py``): keep this checkpoint in ``validated_dir`` while the rule may still
    choose it, drop those it no longer may, and copy the chosen one to ``best_dir`` (every time, so a kill
    between the copy and the next ``last/`` cannot leave ``best/`` out of step with the resumed state).

    ``candidates`` are the earlier checkpoints the rule may still choose, by step: ``{"metrics": {...},
    "per_query": [nDCG@10 ...]}``. Returns the chosen checkpoint's metrics with its ``step``, and the
    candidates kept (this one included while it may be chosen)."""
    candidates = {**candidates, str(step): {"metrics": metrics, "per_query": per_query}}
    chosen, band = within_one_standard_error({int(s): c["per_query"] for s, c in candidates.items()})
    if step in band:
        encoder.save(validated_dir / f"step-{step}")
    kept = {str(s): candidates[str(s)] for s in band}
    for folder in validated_dir.glob("step-*") if validated_dir.is_dir() else ():
        if folder.name.removeprefix("step-") not in kept:
            shutil.rmtree(folder, ignore_errors=True)
    chosen_dir = validated_dir / f"step-{chosen}"
    if not chosen_dir.is_dir():  # resumed from a checkpoint written before validated/ existed
        raise CheckpointError(f"{chosen_dir} is missing, so best/ cannot be set to step {chosen}; pass "
                              "--no-resume to start over, or --selection max")
    durable.copy_dir(chosen_dir, best_dir, f"the checkpoint {best_dir}")
    log({"step": step, "validation": metrics, "best": chosen == step, "chosen": chosen, "band": band})
    return {**candidates[str(chosen)]["metrics"], "step": chosen}, kept
