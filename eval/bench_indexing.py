"""rag-mag index on the wiki_pool corpus: a real kill -9 mid-encoding, the resume, and peak memory by corpus size.

1. Peak memory (max RSS of the process, from getrusage) of ``rag-mag index`` at two corpus sizes: the
   first ``--small`` passages of wiki_pool, and all of it (33,063). Beside it, in the same run, the
   in-memory path (``rag-mag run pipelines/indexing.yaml``, which holds every embedded Document) at
   ``--small`` / 4 and ``--small`` passages, as the baseline. Growth is compared per 1,000 passages.
2. The full-size run is killed with SIGKILL once ``--kill-after`` passages are encoded, rerun with the same
   command, and checked: it resumes after the last finished chunk, and the index it writes verifies
   (``rag-mag index --verify``) and holds every passage.

    .venv/bin/python eval/bench_indexing.py            # ~12 min on 2 cores with native bf16

Prints one JSON object and writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CORPUS = REPO_ROOT.parent / "shared" / "data" / "wiki_pool" / "wiki_pool_corpus.jsonl.gz"
RETRIEVER = REPO_ROOT / "artifacts" / "retriever-default"
OUT = REPO_ROOT / "eval" / "reports" / "indexing" / "results.json"
PEAK = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
        "print('PEAK_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, code)")


def measured(command: list[str], env: dict, kill_when=None) -> dict:
    """Run ``command`` under a wrapper that reports its peak RSS; ``kill_when()`` true -> SIGKILL it."""
    started = time.perf_counter()
    wrapper = subprocess.Popen([sys.executable, "-c", PEAK, *command], cwd=REPO_ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    killed = False
    if kill_when is not None:
        while wrapper.poll() is None and not kill_when():
            time.sleep(0.5)
        if wrapper.poll() is None:
            for pid in subprocess.run(["pgrep", "-P", str(wrapper.pid)], capture_output=True,
                                      text=True).stdout.split():
                os.kill(int(pid), signal.SIGKILL)  # the indexer itself, not the wrapper
            killed = True
    stdout, stderr = wrapper.communicate()
    peak = [line.split() for line in stdout.splitlines() if line.startswith("PEAK_KB")]
    if not peak:
        sys.exit(f"{command} failed:\n{stderr[-3000:]}")
    code = int(peak[-1][2])
    if code and not killed:
        sys.exit(f"{command} exited {code}:\n{stderr[-3000:]}")
    body = stdout[:stdout.rfind("PEAK_KB")]
    try:
        summary = json.loads(body[body.find("{"):])
    except ValueError:
        summary = {}
    return {"peak_rss_mb": round(int(peak[-1][1]) / 1024, 1), "seconds": round(time.perf_counter() - started, 1),
            "exit": code, "killed": killed, "summary": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--retriever", type=Path, default=RETRIEVER)
    parser.add_argument("--small", type=int, default=8000, help="passages in the smaller corpus")
    parser.add_argument("--kill-after", type=int, default=8192, help="SIGKILL the full run after this many rows")
    parser.add_argument("--chunk-size", type=int, default=2048)
    parser.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                        help="also measure the in-memory pipeline path at both sizes")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    rag_mag = [sys.executable, "-m", "rag_mag.cli.main"]
    result: dict = {"corpus": str(args.corpus), "retriever": str(args.retriever), "chunk_size": args.chunk_size}
    with tempfile.TemporaryDirectory(prefix="bench-indexing-") as tmp:
        small = Path(tmp) / "small.jsonl"
        with gzip.open(args.corpus, "rt", encoding="utf-8") as source, open(small, "w", encoding="utf-8") as target:
            for _, line in zip(range(args.small), source, strict=False):
                target.write(line)
        with gzip.open(args.corpus, "rt", encoding="utf-8") as source:
            full_count = sum(1 for line in source if line.strip())
        result["sizes"] = [args.small, full_count]
        tiny = Path(tmp) / "tiny.jsonl"
        tiny.write_text("".join(small.read_text(encoding="utf-8").splitlines(keepends=True)[:args.small // 4]),
                        encoding="utf-8")

        def index_command(corpus: Path, out: Path) -> list[str]:
            return [*rag_mag, "index", "--retriever", str(args.retriever), "--corpus", str(corpus), "--out", str(out),
                    "--chunk-size", str(args.chunk_size)]

        # 1 + 2: the full run, killed mid-encoding, then resumed
        out = Path(tmp) / "full"
        progress = Path(tmp) / "full.work" / "shard-0-of-1" / "progress.json"

        def enough() -> bool:
            try:
                return json.loads(progress.read_text())["rows_done"] >= args.kill_after
            except (OSError, ValueError, KeyError):
                return False

        killed = measured(index_command(args.corpus, out), env, kill_when=enough)
        rows_at_kill = json.loads(progress.read_text())["rows_done"]
        resumed = measured(index_command(args.corpus, out), env)
        verify = subprocess.run([*rag_mag, "index", "--verify", str(out)], cwd=REPO_ROOT, env=env,
                                capture_output=True, text=True)
        result["kill_and_resume"] = {
            "killed": killed["killed"], "rows_done_at_kill": rows_at_kill,
            "resumed_after": resumed["summary"]["encoding"]["resumed_after"],
            "encoded_after_resume": resumed["summary"]["encoding"]["encoded_now"],
            "count": resumed["summary"]["count"], "verify_exit": verify.returncode,
            "seconds_before_kill": killed["seconds"], "seconds_after_resume": resumed["seconds"]}
        result["chunked"] = {full_count: {"peak_rss_mb": max(killed["peak_rss_mb"], resumed["peak_rss_mb"]),
                                          "passages_per_s": resumed["summary"]["encoding"]["passages_per_s"]}}
        run = measured(index_command(small, Path(tmp) / "small-index"), env)
        result["chunked"][args.small] = {"peak_rss_mb": run["peak_rss_mb"],
                                         "passages_per_s": run["summary"]["encoding"]["passages_per_s"]}
        if args.baseline:
            result["pipeline"] = {}
            for count, corpus in ((args.small // 4, tiny), (args.small, small)):
                command = [*rag_mag, "run", str(REPO_ROOT / "pipelines" / "indexing.yaml"), "--set",
                           f"corpus={corpus}", "--set", f"retriever={args.retriever}", "--set",
                           f"out={Path(tmp) / f'pipeline-{count}'}"]
                run = measured(command, env)
                result["pipeline"][count] = {"peak_rss_mb": run["peak_rss_mb"], "seconds": run["seconds"]}
    def per_1000(runs: dict) -> float:
        (low, first), (high, second) = sorted(runs.items())
        return round((second["peak_rss_mb"] - first["peak_rss_mb"]) / (high - low) * 1000, 2)

    result["peak_growth_mb_per_1000_passages"] = {"chunked": per_1000(result["chunked"]),
                                                  "index_vectors_alone": round(1000 * 384 * 4 / 2**20, 2)}
    if "pipeline" in result:
        result["peak_growth_mb_per_1000_passages"]["pipeline"] = per_1000(result["pipeline"])
    text = json.dumps(result, indent=2)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
