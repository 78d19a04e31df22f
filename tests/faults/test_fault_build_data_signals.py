"""SIGTERM to `rag-mag build-data`: before its outputs are written, and in the middle of replacing them.

build-data keeps no partial state (it starts over), so the promise is about its output folder: it holds one
whole build, the previous one or the new one, never train.jsonl of one build beside val.jsonl of another.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rag_mag.data import write_jsonl
from rag_mag.models import REPO_ROOT
from rag_mag.retriever.data.build import write_outputs
from tests.tiny import capital_triples

pytestmark = pytest.mark.faults


@pytest.fixture
def spec(tmp_path) -> Path:
    write_jsonl(tmp_path / "train.jsonl", capital_triples())
    path = tmp_path / "spec.yaml"
    path.write_text(f"out: {tmp_path / 'data'}\nval_queries: 6\nsources: [{{name: t, kind: triples, path: "
                    f"{tmp_path / 'train.jsonl'}}}]\n")
    return path


def build_data(spec: Path, out: Path, kill_at: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAG_MAG_KILL_AT": kill_at, "RAG_MAG_FAULT_SIGNAL": "SIGTERM"}
    return subprocess.run([sys.executable, "-m", "rag_mag.cli.main", "build-data", str(spec), "--out", str(out)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)


def contents(out: Path) -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(out.iterdir()) if not path.name.endswith(".lock")}


def previous_build(out: Path) -> dict[str, str]:
    write_outputs(out, {"train.jsonl": [{"id": "old-train"}], "val.jsonl": [{"id": "old-val"}]}, {"old": True})
    return contents(out)


def test_sigterm_before_the_outputs_are_written_keeps_the_previous_build(spec, tmp_path, fault_case):
    out = tmp_path / "data"
    before = previous_build(out)
    stopped = build_data(spec, out, "data:built")
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr
    assert f"rag-mag build-data: stopped by SIGTERM; {out} holds a whole build" in stopped.stderr
    assert contents(out) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".data.")] == []
    fault_case.survived()


def test_sigterm_between_two_replaced_files_finishes_the_swap(spec, tmp_path, fault_case):
    out = tmp_path / "data"
    before = previous_build(out)
    stopped = build_data(spec, out, "data:replaced#1")  # after the first of the three files is replaced
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr
    after = contents(out)
    assert set(after) == set(before) and all(after[name] != before[name] for name in before)  # all new
    assert json.loads(after["stats.json"])["train"] + json.loads(after["stats.json"])["val"] == 24
    rebuilt = build_data(spec, tmp_path / "again", "")
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    again = contents(tmp_path / "again")  # the build the signal let finish is the whole build (stats name out)
    assert {name: again[name] for name in ("train.jsonl", "val.jsonl")} == \
        {name: after[name] for name in ("train.jsonl", "val.jsonl")}
    fault_case.survived()
