"""``rag-mag index``: embed files or a corpus with a trained retriever and save a FAISS inner-product index.

Files and folders (``rag-mag index docs/ --out DIR``) go through pipelines/index_files.yaml, incrementally
(rag_mag.ingestion.file_indexing). A JSONL corpus (``--corpus``) is encoded in full, resumable and shardable
(rag_mag.ingestion.indexing): vectors go to memory-mapped chunk files in a work folder, a rerun after a kill
goes on from the last finished chunk, ``--shard K/N`` (or torchrun) splits the corpus across processes or
machines, and the last shard to finish merges them into the index folder.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rag_mag import writable
from rag_mag.cli import DefaultsHelpFormatter
from rag_mag.errors import ConfigError


def add_parser(subparsers) -> argparse.ArgumentParser:
    from rag_mag.components.faiss_index import AUTO_APPROXIMATE_FROM, INDEX_TYPES
    from rag_mag.ingestion.file_indexing import EXIT_SKIPPED
    from rag_mag.ingestion.files import supported_types
    from rag_mag.ingestion.indexing import DEFAULT_CHUNK_SIZE
    from rag_mag.models import REPO_ROOT, default_retriever_dir, files_retriever_dir
    from rag_mag.serving.pipelines import default_index_dir

    parser = subparsers.add_parser(
        "index", help="index your files (.txt .md .html .pdf .docx, incrementally) or a JSONL corpus into FAISS",
        description="With PATHs: convert, split and embed files and folders through pipelines/index_files.yaml "
                    f"({supported_types()}). Run again on the same --out, only new and changed files are "
                    "encoded, and files deleted from a folder lose their chunks; a different --retriever "
                    "re-embeds everything. Ends with one summary line; exit code 0 when every file went in, "
                    f"{EXIT_SKIPPED} when some were skipped (each named with its reason on stderr), 2 on a usage "
                    "error. Without PATHs: embed every passage of a corpus JSONL ({id, title, text}) with a "
                    "retriever checkpoint, under "
                    "its similarity strategy, and save a FAISS inner-product index folder. Vectors are written in "
                    "chunks to memory-mapped files in a work folder (default OUT.work): rerun the same command "
                    "after an interruption and it goes on from the last finished chunk. With --shard K/N (or "
                    "under torchrun) each process encodes one of N shards; the one that finishes last merges "
                    "them. The same result as pipelines/indexing.yaml (`rag-mag run`), which holds everything "
                    "in memory.",
        formatter_class=DefaultsHelpFormatter)
    _add_file_arguments(parser)
    parser.add_argument("--retriever", default=None,
                        help="retriever checkpoint folder (written by `rag-mag train`). Default for PATHs: the one "
                             "that built the index at --out, else the cosine retriever "
                             f"({files_retriever_dir()}, measured best on real documents; trained on the bundled "
                             "sample the first time, about 2 minutes); for a corpus: "
                             f"{default_retriever_dir()} (qnorm)")
    parser.add_argument("--corpus", default=None,
                        help="corpus JSONL or JSONL.gz with {id, title, text}, encoded in full (default without "
                             f"PATHs: {REPO_ROOT / 'data' / 'sample' / 'corpus.jsonl'})")
    parser.add_argument("--out", default=None, help="index folder to write (default: artifacts/index-docs for "
                        f"PATHs, {default_index_dir()} for a corpus)")
    parser.add_argument("--batch-size", type=int, default=32, help="passages encoded at once")
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE,
                        help="passages per chunk: the unit of progress that a rerun does not repeat")
    parser.add_argument("--index-type", choices=INDEX_TYPES, default="flat",
                        help="flat is exact; hnsw (graph search on inner product), ivf and hnsw_mips (graph "
                             "search over the MIPS-to-L2 reduction) are approximate; auto: flat below "
                             f"{AUTO_APPROXIMATE_FROM:,} passages, hnsw from there (eval/README.md, 'Approximate "
                             "search')")
    parser.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                        help="encoding precision: auto uses bf16 only where the CPU/GPU computes it natively")
    parser.add_argument("--shard", metavar="K/N",
                        help="encode only shard K of N (0-based); default: RANK/WORLD_SIZE under torchrun, else 0/1. "
                             "Every shard must see the same --work-dir (a shared folder, or copy the shard-*-of-N "
                             "folders together and rerun any shard to merge)")
    parser.add_argument("--work-dir", help="folder of the encoded chunks (default: OUT.work next to --out)")
    parser.add_argument("--restart", action="store_true",
                        help="discard chunks already encoded in the work folder and start again")
    parser.add_argument("--keep-work", action="store_true", help="keep the work folder after the merge")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing index at --out")
    parser.add_argument("--verify", metavar="INDEX_DIR",
                        help="check an existing index folder instead of building one: every file against its size "
                             "and sha256 in the manifest, the ids' count and order, documents against ids; exits 2 "
                             "on any mismatch")
    return parser


def _add_file_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of the files path (PATHs)."""
    from rag_mag.ingestion.files import DEFAULT_MAX_FILE_MB

    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help="files and folders to index (folders recursively; dot files are left out)")
    parser.add_argument("--include", action="append", default=[], metavar="GLOB",
                        help="index only files whose path (relative to its folder) or name matches (repeatable)")
    parser.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                        help="leave out files whose path or name matches (repeatable)")
    parser.add_argument("--split-length", type=int, default=None,
                        help="most words in a chunk, cut at sentence ends (default: the pipeline's, 100)")
    parser.add_argument("--split-overlap", type=int, default=None,
                        help="words a chunk repeats from the one before, whole sentences (default: the pipeline's, 20)")
    parser.add_argument("--max-file-mb", type=float, default=DEFAULT_MAX_FILE_MB,
                        help="larger files are skipped with a line")
    parser.add_argument("--dry-run", action="store_true", help="print what would be added, changed and removed; "
                        "write nothing")
    parser.add_argument("--watch", type=float, metavar="SECONDS", default=None,
                        help="keep running: check the files every SECONDS and index what changed, with the encoder "
                             "kept loaded (Ctrl-C or SIGTERM stops)")
    parser.add_argument("--remove", nargs="+", metavar="FILE",
                        help="drop these files (their names in the index, or globs) from the index at --out")
    parser.add_argument("--store", choices=["faiss", "pgvector"], default="faiss",
                        help="for PATHs: a FAISS index folder (--out), or a PostgreSQL table (--table; one "
                             "transaction per file; the server of `rag-mag db start`, started if none runs, or "
                             "$RAG_MAG_PG_URL / --pg-url)")
    parser.add_argument("--table", default=None, help="PostgreSQL table for --store pgvector (default: "
                        "rag_mag_default, the one pipelines/rag_pgvector.yaml reads)")
    parser.add_argument("--pg-url", default=None, help="PostgreSQL URL for --store pgvector (default: "
                        "$RAG_MAG_PG_URL, else the server of `rag-mag db start`)")
    parser.add_argument("--pipeline", default=None, help="indexing pipeline YAML for PATHs (default: "
                        "pipelines/index_files.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="NAME.PARAM=VALUE",
                        help="override a component parameter of the files pipeline (repeatable)")
    parser.add_argument("--json", action="store_true", help="for PATHs: print the summary as JSON as well")
    parser.add_argument("--no-hubness", action="store_true",
                        help="for PATHs into a FAISS index: skip the hubness line of the summary (200 sampled "
                             "chunks asked as questions, a few seconds; only after a run that changed the index)")


def run(args: argparse.Namespace) -> int:
    from rag_mag.components.faiss_index import verify_folder
    from rag_mag.ingestion.indexing import IndexJob, default_work_dir, parse_shard, run_index_job, shard_lock
    from rag_mag.models import REPO_ROOT
    from rag_mag.serving.pipelines import default_index_dir

    if args.verify:
        print(json.dumps(verify_folder(Path(args.verify)), indent=2))
        return 0
    if args.out is None:
        files = args.paths or args.remove
        args.out = str(default_index_dir().with_name("index-docs") if files else default_index_dir())
    if args.remove:
        return run_remove(args)
    if args.paths:
        return run_files(args)
    if args.corpus is None:
        args.corpus = str(REPO_ROOT / "data" / "sample" / "corpus.jsonl")
    if args.retriever is None:
        args.retriever = str(default_retriever(args))
    job = IndexJob(corpus=Path(args.corpus), retriever=Path(args.retriever), out=Path(args.out),
                   index_type=args.index_type, chunk_size=args.chunk_size, batch_size=args.batch_size,
                   precision=args.precision)
    shard, work_dir = parse_shard(args.shard), Path(args.work_dir) if args.work_dir else None
    writable.check_writable(job.out, f"the index {job.out}")  # before the model loads; the shard lock checks its
    writable.check_writable(work_dir or default_work_dir(job.out), "the index's work folder")  # work folder
    with shard_lock(job.out, shard, work_dir):  # before the model loads; the other shards run on
        summary = run_index_job(job, shard, work_dir, overwrite=args.overwrite, restart=args.restart,
                                keep_work=args.keep_work)
    print(json.dumps(summary, indent=2))
    return 0


def default_retriever(args: argparse.Namespace) -> Path:
    """For files: the retriever that built the FAISS index at --out, else the files default (``FILES_STRATEGY``,
    trained on the bundled sample once when it is missing); for a corpus: the default (qnorm) retriever."""
    from rag_mag.models import FILES_STRATEGY, default_retriever_dir, files_retriever_dir
    from rag_mag.serving.retrievers import own_retriever

    if not args.paths:
        return default_retriever_dir()
    folder = files_retriever_dir()
    if args.store == "faiss":
        folder = own_retriever(Path(args.out), folder)
    if not (folder / "rag_mag.json").is_file() and folder == files_retriever_dir():
        from rag_mag.cli.quickstart import ensure_retriever

        ensure_retriever(FILES_STRATEGY, folder)
    return folder


def _target(args: argparse.Namespace):
    """The lock and the place a files run writes: the index folder --out, or a PostgreSQL table (--store
    pgvector; the table's own advisory lock keeps other writers out, on any machine)."""
    import contextlib

    from rag_mag import durable
    from rag_mag.serving.db import pgvector

    if args.store == "pgvector":
        table = pgvector.check_table_name(pgvector.DEFAULT_TABLE if args.table is None else args.table)
        return pgvector.using_server(args.pg_url), table
    if args.table is not None or args.pg_url is not None:
        raise ConfigError("--table and --pg-url are for --store pgvector")
    out = Path(args.out)
    if not args.dry_run:
        writable.check_writable(out, f"the index {out}")  # before the model loads
    return contextlib.ExitStack() if args.dry_run else durable.job_lock(durable.lock_path(out),
                                                                        f"the index {out}"), None


def run_files(args: argparse.Namespace) -> int:
    """``rag-mag index PATH... --out DIR`` (or ``--store pgvector``): the incremental files path."""
    import sys

    from rag_mag.ingestion.file_indexing import index_files
    from rag_mag.serving.pipelines import parse_overrides

    if args.corpus:
        raise ConfigError("give either PATHs (files and folders) or --corpus (a JSONL corpus), not both")
    corpus_only = [flag for flag, given in (("--shard", args.shard), ("--work-dir", args.work_dir),
                                            ("--restart", args.restart), ("--keep-work", args.keep_work),
                                            ("--overwrite", args.overwrite)) if given]
    if corpus_only:
        raise ConfigError(f"{', '.join(corpus_only)} {'is' if len(corpus_only) == 1 else 'are'} for --corpus; a "
                          "files index is updated in place (see --dry-run, --remove)")
    overrides = parse_overrides(args.overrides)
    if args.precision != "auto":
        overrides["embedder.precision"] = args.precision
    for name in ("split_length", "split_overlap", "batch_size"):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    if args.index_type != "flat":
        overrides["index_type"] = args.index_type
    context, table = _target(args)
    if args.retriever is None:  # after every check that needs no model: training one takes minutes
        for path in args.paths:
            if not Path(path).exists():
                raise ConfigError(f"{path} does not exist; give files or folders to index")
        args.retriever = str(default_retriever(args))
    with context as url:
        settings = {"include": args.include, "exclude": args.exclude, "overrides": overrides,
                    "max_file_mb": args.max_file_mb, "pipeline_path": args.pipeline, "table": table,
                    "pg_url": url if table else None}
        if args.watch is not None:
            return _watch(args, settings)
        summary = index_files(args.paths, Path(args.out), Path(args.retriever), dry_run=args.dry_run, **settings)
    for path, reason in summary.plan.skipped:
        print(f"skipped {path}: {reason}", file=sys.stderr)
    if args.dry_run:
        for label, names in (("add", [f.name for f in summary.plan.added]),
                             ("re-embed (changed)", [f.name for f in summary.plan.changed]),
                             ("remove", summary.plan.removed)):
            for name in names:
                print(f"would {label}: {name}")
    figures = None
    changed = summary.chunks_encoded or summary.chunks_removed
    if not (args.dry_run or args.no_hubness or table or not changed):
        from rag_mag.ingestion.hubness import hubness_line, index_hubness

        figures = index_hubness(Path(args.out), Path(args.retriever))
    if args.json:
        print(json.dumps({**summary.to_dict(), "hubness": figures}, indent=2, ensure_ascii=False))
    print(summary.line())
    if figures:
        print(hubness_line(figures))
    return summary.exit_code


def _watch(args: argparse.Namespace, settings: dict) -> int:
    """``--watch SECONDS``: index, then follow the folder until Ctrl-C or SIGTERM; a line for each pass that
    changed something, and for each skipped file the first time it is seen."""
    import sys

    from rag_mag.ingestion.file_indexing import watch_files

    if args.dry_run:
        raise ConfigError("--watch and --dry-run do not go together")
    told: set[tuple[str, str]] = set()

    def on_pass(summary) -> None:
        for skipped in summary.plan.skipped:
            if skipped not in told:
                print(f"skipped {skipped[0]}: {skipped[1]}", file=sys.stderr)
                told.add(skipped)
        plan = summary.plan
        if not passes or plan.added or plan.changed or plan.removed:  # the first pass, then only changes
            print(summary.line(), flush=True)
        passes.append(summary)

    passes: list = []
    print(f"watching {', '.join(args.paths)} every {args.watch:g} s; Ctrl-C stops", file=sys.stderr)
    try:
        watch_files(args.paths, Path(args.out), Path(args.retriever), interval=args.watch, on_pass=on_pass,
                    progress=False, **settings)
    except KeyboardInterrupt:
        print("stopped watching; the index holds every pass that finished", file=sys.stderr)
    return 0


def run_remove(args: argparse.Namespace) -> int:
    """``rag-mag index --remove FILE... --out DIR`` (or ``--store pgvector [--table T]``)."""
    from rag_mag.ingestion.file_indexing import remove_files

    context, table = _target(args)
    with context as url:
        names, chunks = remove_files(Path(args.out), args.remove, table=table, pg_url=url if table else None)
    print(f"removed {len(names)} file(s) and {chunks} chunks from {f'table {table}' if table else args.out}: "
          f"{', '.join(names)}")
    return 0
