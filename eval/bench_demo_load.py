"""A bounded load test of the QA demo on loopback: N questions, C at a time, against a running `rag-mag serve`.

Two phases on the same server in the same run: a baseline of questions asked one at a time, then the load
(``--requests`` questions, ``--concurrency`` in flight). Questions cycle through data/sample/questions.jsonl
and the indexes the demo serves (POST /api/ask). Printed per phase: the client-side latency p50 / p95 /
max, the server-side parts (queue wait, time to first token), throughput, and the error count. The exit
code is 1 if any request failed (a non-200 answer, an empty answer, or a transport error).

    .venv/bin/rag-mag serve &                                   # the demo, on http://127.0.0.1:7860
    .venv/bin/python eval/bench_demo_load.py --requests 50 --concurrency 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = REPO_ROOT / "data" / "sample" / "questions.jsonl"


@dataclass
class Outcome:
    ok: bool
    seconds: float
    status: int | None
    server: dict
    error: str = ""


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile (no interpolation): the smallest value with ``fraction`` of them at or below it."""
    ordered = sorted(values)
    rank = max(1, int(-(-fraction * len(ordered) // 1)))
    return ordered[rank - 1]


async def ask(client: httpx.AsyncClient, url: str, body: dict) -> Outcome:
    started = time.perf_counter()
    try:
        response = await client.post(f"{url}/api/ask", json=body)
    except httpx.HTTPError as error:
        return Outcome(False, time.perf_counter() - started, None, {}, f"{type(error).__name__}: {error}")
    seconds = time.perf_counter() - started
    try:
        data = response.json()
    except ValueError:
        return Outcome(False, seconds, response.status_code, {}, f"not JSON: {response.text[:200]}")
    if response.status_code != 200:
        return Outcome(False, seconds, response.status_code, {}, (data.get("error") or {}).get("message", ""))
    if not str(data.get("answer", "")).strip() or not data.get("sources"):
        return Outcome(False, seconds, 200, data, "empty answer or no sources")
    return Outcome(True, seconds, 200, data)


async def phase(url: str, bodies: list[dict], concurrency: int, timeout: float) -> tuple[list[Outcome], float]:
    slots = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0), limits=limits) as client:
        async def bounded(body: dict) -> Outcome:
            async with slots:
                return await ask(client, url, body)

        started = time.perf_counter()
        outcomes = await asyncio.gather(*(bounded(body) for body in bodies))
    return list(outcomes), time.perf_counter() - started


def summary(name: str, outcomes: list[Outcome], wall: float, concurrency: int) -> dict:
    latencies = [o.seconds * 1000 for o in outcomes]
    served = [o.server for o in outcomes if o.ok]
    return {
        "phase": name, "requests": len(outcomes), "concurrency": concurrency,
        "errors": sum(not o.ok for o in outcomes),
        "p50_ms": round(percentile(latencies, 0.50), 1), "p95_ms": round(percentile(latencies, 0.95), 1),
        "max_ms": round(max(latencies), 1), "mean_ms": round(statistics.fmean(latencies), 1),
        "throughput_rps": round(len(outcomes) / wall, 3), "wall_s": round(wall, 2),
        "server_queue_p50_ms": round(percentile([s["queue_ms"] for s in served], 0.5), 1) if served else None,
        "server_first_token_p50_ms": round(percentile([s["first_token_ms"] for s in served if s.get(
            "first_token_ms") is not None] or [0.0], 0.5), 1) if served else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:7860", help="the running demo (rag-mag serve)")
    parser.add_argument("--requests", type=int, default=50, help="questions in the load phase")
    parser.add_argument("--concurrency", type=int, default=8, help="questions in flight at once in the load phase")
    parser.add_argument("--baseline", type=int, default=5, help="questions asked one at a time first (0: none)")
    parser.add_argument("--top-k", type=int, default=5, help="passages per question")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.concurrency < 1 or args.baseline < 0:
        parser.error("--requests and --concurrency must be at least 1, --baseline at least 0")

    try:
        indexes = [info["name"] for info in httpx.get(f"{args.url}/api/indexes", timeout=10).json()["indexes"]]
        health = httpx.get(f"{args.url}/health", timeout=10)
    except httpx.HTTPError as error:
        print(f"bench_demo_load: no demo at {args.url} ({error}); start it with `rag-mag serve`", file=sys.stderr)
        return 2
    if health.status_code != 200:
        print(f"bench_demo_load: the demo is not healthy: {health.text}", file=sys.stderr)
        return 2
    questions = [json.loads(line)["question"] for line in QUESTIONS.read_text().splitlines() if line.strip()]
    bodies = [{"question": questions[n % len(questions)], "index": indexes[n % len(indexes)], "top_k": args.top_k}
              for n in range(args.baseline + args.requests + 1)]

    asyncio.run(phase(args.url, bodies[:1], 1, args.timeout))  # warm-up, not counted
    results = []
    if args.baseline:
        outcomes, wall = asyncio.run(phase(args.url, bodies[1:1 + args.baseline], 1, args.timeout))
        results.append((summary("baseline (one at a time)", outcomes, wall, 1), outcomes))
    outcomes, wall = asyncio.run(phase(args.url, bodies[1 + args.baseline:], args.concurrency, args.timeout))
    results.append((summary(f"load ({args.concurrency} at a time)", outcomes, wall, args.concurrency), outcomes))

    print(f"demo {args.url}: indexes {', '.join(indexes)}; top_k {args.top_k}")
    header = f"{'phase':<26}{'requests':>9}{'errors':>8}{'p50 ms':>10}{'p95 ms':>10}{'max ms':>10}{'req/s':>8}" \
             f"{'queue p50':>11}{'1st tok p50':>13}"
    print(header)
    for row, _ in results:
        print(f"{row['phase']:<26}{row['requests']:>9}{row['errors']:>8}{row['p50_ms']:>10.0f}{row['p95_ms']:>10.0f}"
              f"{row['max_ms']:>10.0f}{row['throughput_rps']:>8.2f}{row['server_queue_p50_ms'] or 0:>11.0f}"
              f"{row['server_first_token_p50_ms'] or 0:>13.0f}")
    if len(results) == 2:
        base, load = results[0][0], results[1][0]
        print(f"throughput under load: {load['throughput_rps'] / base['throughput_rps']:.2f}x the one-at-a-time "
              f"baseline; p50 latency {load['p50_ms'] / base['p50_ms']:.2f}x")
    failures = [o for _, outcomes in results for o in outcomes if not o.ok]
    for failure in failures[:5]:
        print(f"error: HTTP {failure.status}: {failure.error}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps([row for row, _ in results], indent=2) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
