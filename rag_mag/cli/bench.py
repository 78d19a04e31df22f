"""``rag-mag bench CONFIG.yaml``: the EM/F1 and retrieval benchmark for every strategy and baseline."""

from __future__ import annotations

import argparse
import shlex
import sys

from rag_mag import durable, stopping, writable
from rag_mag.cli import DefaultsHelpFormatter


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "bench", help="train, index, retrieve, generate and score every strategy; write a report",
        description="Run the benchmark described by CONFIG (see eval/configs/): train one retriever per strategy "
                    "and seed (cached), index each dataset's corpus, run every listed pipeline YAML (rag.yaml, "
                    "rag_multihop.yaml, your own) with every retriever, answering with the vLLM server (started "
                    "if needed), score EM/F1 and retrieval, and write report.md, results.json and plots under "
                    "eval/reports/<name>/. Interrupted runs resume: finished cells and generations are reused.",
        formatter_class=DefaultsHelpFormatter)
    parser.add_argument("config", help="benchmark YAML, e.g. eval/configs/quick.yaml; a config that lists "
                                       "`collections:` (eval/configs/realdocs.yaml) is the real-documents benchmark: "
                                       "folders of files with questions, scored by file@k, page@k and hubness")
    parser.add_argument("--output-dir", help="write the report here instead of eval/reports/<name>")
    parser.add_argument("--llm-url", help="use this vLLM server (default: RAG_MAG_VLLM_URL or 127.0.0.1:8000)")
    parser.add_argument("--max-questions", type=int, help="override max_questions for every dataset (the questions "
                                                          "ranked)")
    parser.add_argument("--answer-questions", type=int, help="override answer_questions: every row answers the "
                                                             "first N questions of each dataset")
    parser.add_argument("--pipeline", action="append", metavar="FILE",
                        help="score this pipeline YAML instead of the config's pipelines (repeat for several); its "
                             "rows are named FILE-STEM:SYSTEM")
    parser.add_argument("--data-root", help="folder of the shared datasets (default: RAG_MAG_DATA_ROOT or "
                                            "../shared/data)")
    parser.add_argument("--only", action="extend", nargs="+", metavar="SYSTEM",
                        help="score just these systems' cells (a strategy such as cosine, or a baseline such as "
                             "base_cosine; list several after one --only or repeat it) and write no report: to "
                             "finish a long benchmark piece by piece, e.g. each retriever right after it is "
                             "trained. Configured retrievers that are not trained yet are skipped")
    parser.add_argument("--pg-url", default=None, help="PostgreSQL URL for pipelines on pgvector (rag_hybrid.yaml; "
                        "default: $RAG_MAG_PG_URL, else the server of `rag-mag db start`, started if none runs and "
                        "stopped at the end)")
    parser.add_argument("--split", choices=["validation", "test"], default=None,
                        help="real-documents benchmark: the questions to score (default: the config's split; "
                             "settings are chosen on validation, test is scored once for the README)")
    return parser


def _config_kind(path: str) -> str:
    """``folders`` (a config with collections:), ``abstention`` (with abstention:) or ``wiki``."""
    import yaml

    try:
        data = yaml.safe_load(open(path, encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return "wiki"  # load_bench_config says what is wrong with it
    if isinstance(data, dict) and "abstention" in data:
        return "abstention"
    return "folders" if isinstance(data, dict) and "collections" in data else "wiki"


def run_abstention(args: argparse.Namespace) -> int:
    from rag_mag.bench.abstention.runner import load_abstention_config
    from rag_mag.bench.abstention.runner import run as run_benchmark
    from rag_mag.bench.datasets import data_root
    from rag_mag.errors import ConfigError

    wrong = [flag for flag, value in (("--max-questions", args.max_questions), ("--split", args.split),
                                      ("--answer-questions", args.answer_questions), ("--pipeline", args.pipeline),
                                      ("--pg-url", args.pg_url), ("--only", args.only or None)) if value is not None]
    if wrong:
        raise ConfigError(f"{', '.join(wrong)}: not options of the abstention benchmark ({args.config})")
    root = data_root(args.data_root)
    config = load_abstention_config(args.config, root)
    if args.output_dir or args.llm_url:
        from dataclasses import replace

        config = replace(config, output_dir=args.output_dir or config.output_dir, llm_url=args.llm_url or None)
    writable.check_writable(config.out_dir(), f"the benchmark folder {config.out_dir()}")
    with durable.job_lock(durable.lock_path(config.out_dir()), f"the benchmark folder {config.out_dir()}"):
        try:
            out = run_benchmark(config, root)
        except KeyboardInterrupt:
            raise stopping.interrupted(f"the answers generated so far are in {config.out_dir() / 'cache'}: run the "
                                       "same command again to resume from them") from None
    print(f"report: {out / 'report.md'}")
    return 0


def run_folders(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rag_mag.bench.datasets import data_root
    from rag_mag.bench.folders.runner import FoldersRunner, load_folders_config
    from rag_mag.errors import ConfigError

    wrong = [flag for flag, value in (("--llm-url", args.llm_url), ("--max-questions", args.max_questions),
                                      ("--answer-questions", args.answer_questions), ("--pipeline", args.pipeline),
                                      ("--pg-url", args.pg_url)) if value is not None]
    if wrong:
        raise ConfigError(f"{', '.join(wrong)}: not options of the real-documents benchmark ({args.config})")
    overrides = {key: value for key, value in (("output_dir", args.output_dir), ("split", args.split)) if value}
    if args.split and not args.output_dir:
        overrides["name"] = f"{Path(args.config).stem}-{args.split}"
    config = load_folders_config(args.config, overrides)
    root = data_root(args.data_root)
    if root is None:
        raise ConfigError("no data root for the real-document collections: pass --data-root or set "
                          "RAG_MAG_DATA_ROOT to the folder that holds realdocs/")
    writable.check_writable(config.out_dir(), f"the benchmark folder {config.out_dir()}")
    with durable.job_lock(durable.lock_path(config.out_dir()), f"the benchmark folder {config.out_dir()}"):
        try:
            out = FoldersRunner(config, root, only=args.only).run()
        except KeyboardInterrupt:
            raise stopping.interrupted(f"the finished cells are in {config.out_dir() / 'cells'}: run the same "
                                       "command again to resume from them") from None
    print(f"cells: {out / 'cells'}" if args.only else f"report: {out / 'report.md'}")
    return 0


def run(args: argparse.Namespace) -> int:
    from rag_mag.bench.config import load_bench_config
    from rag_mag.bench.runner import BenchRunner

    kind = _config_kind(args.config)
    if kind == "abstention":
        return run_abstention(args)
    if kind == "folders":
        return run_folders(args)
    if args.split:
        from rag_mag.errors import ConfigError

        raise ConfigError(f"--split is for the real-documents benchmark (a config with collections:), not "
                          f"{args.config}")

    overrides = {key: value for key, value in (("output_dir", args.output_dir), ("llm_url", args.llm_url),
                                               ("data_root", args.data_root)) if value}
    if args.pipeline:
        overrides.update(pipelines=list(args.pipeline), pipeline=None)
    if args.max_questions is not None:
        overrides.update(max_questions=args.max_questions, dataset_max_questions={})
    if args.answer_questions is not None:
        overrides.update(answer_questions=args.answer_questions)
    config = load_bench_config(args.config, overrides)
    writable.check_writable(config.out_dir(), f"the benchmark folder {config.out_dir()}")  # before any model loads
    # the whole report folder: cells, retrievers.json and the generation cache are shared by every system
    with durable.job_lock(durable.lock_path(config.out_dir()), f"the benchmark folder {config.out_dir()}"):
        try:
            out = BenchRunner(config, args.config, shlex.join(["rag-mag", *sys.argv[1:]]), only=args.only,
                              pg_url=args.pg_url).run()
        except KeyboardInterrupt:  # finished cells and every answer generated so far are on disk already
            raise stopping.interrupted(f"the finished cells are in {config.out_dir() / 'cells'} and the answers "
                                       f"generated so far in {config.out_dir() / 'cache'}: run the same command "
                                       "again to resume from them") from None
    if args.only:
        print(f"cells: {out / 'cells'} (no report with --only: run without it once every system is scored)")
    else:
        print(f"report: {out / 'report.md'}")
    return 0
