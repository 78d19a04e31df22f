"""The committed build of the default recipe (data/train_default/): intact, split cleanly, and free of
every evaluation question the recipe excludes."""

from __future__ import annotations

import hashlib

import pytest

from rag_mag.bench.datasets import data_root
from rag_mag.data import iter_jsonl, read_eval
from rag_mag.metrics.answers import normalize_answer
from rag_mag.models import REPO_ROOT
from rag_mag.retriever.data.spec import load_data_spec

FOLDER = REPO_ROOT / "data" / "train_default"
RECIPE = REPO_ROOT / "eval" / "configs" / "train_data.yaml"


def rows(name: str) -> list[dict]:
    return [row for _, row in iter_jsonl(FOLDER / f"{name}.jsonl.gz")]


def test_the_files_match_their_checksums():
    listed = dict(reversed(line.split()) for line in (FOLDER / "SHA256SUMS").read_text().splitlines())
    assert sorted(listed) == ["ablation.jsonl.gz", "train.jsonl.gz", "val.jsonl.gz"]
    assert sum(path.stat().st_size for path in FOLDER.iterdir()) < 8_000_000   # kept small enough to clone
    for name, digest in listed.items():
        assert hashlib.sha256((FOLDER / name).read_bytes()).hexdigest() == digest, name


def test_validation_is_held_out_and_every_row_trains_on_answer_free_negatives():
    train, val = rows("train"), rows("val")
    assert (len(train), len(val)) == (3058, 300)
    assert not {r["id"] for r in train} & {r["id"] for r in val}
    assert not {normalize_answer(r["query"]) for r in train} & {normalize_answer(r["query"]) for r in val}
    assert all(row["positives"] and len(row["hard_negatives"]) == 4 for row in train)


@pytest.mark.skipif(data_root() is None or not (data_root() / "hotpotqa").is_dir(), reason="shared data not present")
def test_no_evaluation_question_is_in_the_committed_data():
    spec = load_data_spec(RECIPE, data_root())
    evaluation = {normalize_answer(record.question) for path in spec.exclude for record in read_eval(path)}
    assert len(evaluation) > 3000
    for name in ("train", "val", "ablation"):
        assert not {normalize_answer(row["query"]) for row in rows(name)} & evaluation, name
