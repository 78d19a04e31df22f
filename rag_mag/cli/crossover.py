"""``rag-mag crossover``: nDCG@10 curves against training steps and data size, for every strategy."""

from __future__ import annotations

import argparse
import logging
import sys

from rag_mag import writable
from rag_mag.cli import DefaultsHelpFormatter

logger = logging.getLogger(__name__)
WORKER_SAVE_WAIT_S = 300  # a worker in a validation pass finishes it before it saves


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "crossover", help="train every strategy once per config run; curves of validation and test nDCG@10",
        description="Runs the crossover study of a config (eval/configs/crossover.yaml): each run trains once and "
                    "is measured at its checkpoint steps on held-out training queries and on the test sets. "
                    "Finished runs are cached as cells; run the same command again to resume. Reads the "
                    "config's training data (eval/configs/crossover.yaml: data/train_default/, the committed "
                    "build of `rag-mag build-data eval/configs/train_data.yaml`).",
        formatter_class=DefaultsHelpFormatter)
    parser.add_argument("config", help="crossover config YAML")
    parser.add_argument("--time-budget", type=float, default=0.0, metavar="SECONDS",
                        help="start no new run after this many seconds (0: no limit); the report covers what is done")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="train N runs at once in N processes (each with the config's train.threads); their "
                             "logs go to artifacts/crossover/worker-K.log")
    parser.add_argument("--only", action="extend", nargs="+", metavar="LABEL",
                        help="train only these runs, e.g. main_dot_s0_400, in the config's order (labels as in the "
                             "report's cells/; list several after one --only or repeat it; an unknown label is "
                             "refused with the list of valid ones)")
    parser.add_argument("--rebuild", action="store_true",
                        help="for finished main runs whose best/ checkpoint this machine lacks (a fresh clone "
                             "holds the cells, not the checkpoints): train each again up to the step its cell "
                             "selected, check its validation nDCG@10 there against the cell's, and publish it "
                             "for `bench` (artifacts/crossover/retrievers/LABEL); pick runs with --only")
    parser.add_argument("--rebuild-tolerance", type=float, default=0.5, metavar="POINTS",
                        help="largest difference of validation nDCG@10 (points) between a rebuilt checkpoint and "
                             "its cell that still counts as the same run")
    parser.add_argument("--report-only", action="store_true", help="write the report from the finished cells")
    parser.add_argument("--output-dir", default=None, help="report folder (default: eval/reports/<name>)")
    return parser


def _run_workers(args: argparse.Namespace, runner) -> None:
    """Start N worker processes of the same study (they share the work through per-run locks) and wait."""
    import subprocess

    from rag_mag.errors import RagMagError

    runner.store.work.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "rag_mag.cli.main", "crossover", args.config, "--time-budget",
               str(args.time_budget)] + (["--output-dir", args.output_dir] if args.output_dir else []) \
        + (["--only", *args.only] if args.only else []) \
        + (["--rebuild", "--rebuild-tolerance", str(args.rebuild_tolerance)] if args.rebuild else [])
    workers = []
    for index in range(args.workers):
        log = runner.store.work / f"worker-{index}.log"
        with log.open("a") as handle:
            workers.append(subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT))
        logger.info("worker %d (pid %d): log %s", index, workers[-1].pid, log)
    try:
        codes = [worker.wait() for worker in workers]
    except KeyboardInterrupt:
        _stop_workers(workers)
        raise
    if any(codes):
        raise RagMagError(f"crossover workers exited with {codes}; see {runner.store.work}/worker-*.log")


def _stop_workers(workers: list) -> None:
    """Pass the stop on (SIGTERM) and wait while each worker finishes its step and saves ``last/``; a worker
    still running after ``WORKER_SAVE_WAIT_S`` is killed (its run resumes from its last periodic save)."""
    import subprocess

    running = [worker for worker in workers if worker.poll() is None]
    for worker in running:
        worker.terminate()
    logger.warning("waiting up to %d s for %d worker(s) to save their step", WORKER_SAVE_WAIT_S, len(running))
    for worker in running:
        try:
            worker.wait(timeout=WORKER_SAVE_WAIT_S)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def run(args: argparse.Namespace) -> int:
    from rag_mag.bench.crossover.config import load_crossover_config
    from rag_mag.bench.crossover.report import write
    from rag_mag.bench.crossover.runner import CrossoverRunner
    from rag_mag.errors import ConfigError

    if args.time_budget < 0:
        raise ConfigError(f"--time-budget must be 0 or more seconds, got {args.time_budget}")
    config = load_crossover_config(args.config)
    if args.output_dir:
        config.output_dir = args.output_dir
    if args.workers < 1:
        raise ConfigError(f"--workers must be 1 or more, got {args.workers}")
    if not args.rebuild_tolerance >= 0:
        raise ConfigError(f"--rebuild-tolerance must be 0 or more points, got {args.rebuild_tolerance}")
    if not args.report_only:
        writable.check_writable(config.out_dir(), f"the crossover folder {config.out_dir()}")  # before any model
    runner = CrossoverRunner(config, args.config)
    if args.workers > 1 and not args.report_only:
        _run_workers(args, runner)
        result = runner.collect()
    else:
        result = runner.collect() if args.report_only else runner.run(
            args.time_budget, only=args.only, rebuild=args.rebuild, rebuild_tolerance=args.rebuild_tolerance)
    if not result["cells"]:
        logger.warning("no finished runs yet; nothing to report")
        return 1
    path = write(result, config.out_dir(), "rag-mag " + " ".join(sys.argv[1:]))
    print(f"report: {path}")
    return 0
