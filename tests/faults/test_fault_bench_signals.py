"""SIGTERM to `rag-mag bench` between two cells: one line that says where the finished cells and the answers
generated so far are, exit 143, and the same command then reuses them and completes. Real vLLM server."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rag_mag.models import REPO_ROOT

pytestmark = [pytest.mark.faults, pytest.mark.integration]

CONFIG = """name: sigterm
datasets: [sample]
max_questions: 4
answer_questions: 4
strategies: []
baselines: [bm25, closed_book]
base_reader_rows: []
concurrency: 2
train:
  train_data: {root}/data/sample/train_triples.jsonl
"""


def bench(config, out, llm_url: str, kill_at: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "RAG_MAG_KILL_AT": kill_at, "RAG_MAG_FAULT_SIGNAL": "SIGTERM"}
    return subprocess.run([sys.executable, "-m", "rag_mag.cli.main", "bench", str(config), "--output-dir", str(out),
                           "--llm-url", llm_url], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_sigterm_between_two_cells_keeps_the_first_and_the_rerun_completes(tmp_path, vllm_server, fault_case):
    config = tmp_path / "sigterm.yaml"
    config.write_text(CONFIG.format(root=REPO_ROOT))
    out = tmp_path / "report"
    stopped = bench(config, out, vllm_server, kill_at="bench:cell#1")
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr
    assert f"rag-mag bench: stopped by SIGTERM; the finished cells are in {out / 'cells'} and the answers " \
           f"generated so far in {out / 'cache'}: run the same command again" in stopped.stderr, stopped.stderr[-3000:]
    first = sorted(path.name for path in (out / "cells").iterdir())
    assert len(first) == 1 and not (out / "report.md").exists()
    saved = (out / "cells" / first[0]).read_text()
    resumed = bench(config, out, vllm_server)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "done earlier, reused" in resumed.stderr
    assert (out / "cells" / first[0]).read_text() == saved  # reused, not scored again
    assert len(list((out / "cells").iterdir())) == 2 and (out / "report.md").is_file()
    systems = {row["system"] for row in json.loads((out / "results.json").read_text())["results"]}
    assert systems == {"bm25", "closed_book"}
    fault_case.survived()
