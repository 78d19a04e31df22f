"""``rag-mag adapt FOLDER`` on a folder of a few hundred files, timed as a user runs it (issue 49).

The folder: ``--files`` documents (default 300) made from the shared wiki_pool passages, ``--passages-per-file``
consecutive passages each (default 4), written in turn as Markdown, HTML and PDF, as ``bench_ingest.py`` makes
them. Then, in a process of its own, the one command a user runs, with its defaults:

    rag-mag adapt FOLDER --out OUT

(synthetic questions through vLLM, started and stopped by the command; cosine and qnorm trained; the base, BM25
and both scored on the held-out files; the best published only if it beats the base there with p < 0.05).

    .venv/bin/python eval/bench_adapt_folder.py          # stop the vLLM server first; resumable (adapt resumes)

Prints one JSON object and writes it to ``--result``: the wall time, the CPU, the decision and the test figures.
A rerun resumes the command and keeps the first run's time unless ``--retime``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ingest import make_folder  # noqa: E402

from rag_mag import durable  # noqa: E402
from rag_mag.precision import cpu_kind  # noqa: E402

RESULT = REPO_ROOT / "eval" / "reports" / "adapt" / "folder.json"


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=300)
    parser.add_argument("--passages-per-file", type=int, default=4)
    parser.add_argument("--work", type=Path, default=REPO_ROOT / "artifacts" / "bench_adapt_folder")
    parser.add_argument("--result", type=Path, default=RESULT)
    parser.add_argument("--retime", action="store_true", help="record this run's time even if one is recorded")
    args = parser.parse_args()
    folder, out = args.work / "docs", args.work / "runs" / "docs"
    if not folder.is_dir():
        make_folder(folder, args.files, args.passages_per_file)
    seconds_path = args.work / "seconds.json"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rag_mag.cli.main", "adapt", str(folder), "--out", str(out)],
                   check=True, cwd=REPO_ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    took = round(time.perf_counter() - started, 1)
    recorded = json.loads(seconds_path.read_text()) if seconds_path.is_file() and not args.retime else {}
    recorded.setdefault("adapt", took)
    durable.write_text(seconds_path, json.dumps(recorded, indent=2) + "\n")
    report = json.loads((out / "report.json").read_text())
    result = {"files": len(list(folder.iterdir())), "passages_per_file": args.passages_per_file,
              "command": f"rag-mag adapt {folder.relative_to(REPO_ROOT)} --out {out.relative_to(REPO_ROOT)}",
              "wall_seconds": recorded["adapt"], "this_run_seconds": took, "cpu": cpu_model(),
              "cpu_kind": cpu_kind(), "cores": os.cpu_count(), "decision": report.get("decision"),
              "stage_seconds": report.get("stage_seconds"), "test": report.get("systems"),
              "synth": (report.get("synth") or {}).get("counts")}
    args.result.parent.mkdir(parents=True, exist_ok=True)
    durable.write_text(args.result, json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
