"""``rag-mag keys add | list | revoke``: the keys of ``rag-mag serve`` (rag_mag/demo/keys.py).

A package rather than ``cli/keys.py``: ``rag_mag/cli/`` holds the 20 modules a folder may hold
(tests/unit/test_layers.py). It is imported as ``rag_mag.cli.keys`` like every other command.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rag_mag.cli import DefaultsHelpFormatter


def add_parser(subparsers) -> argparse.ArgumentParser:
    from rag_mag.demo.keys import KEYS_FILE_ENV, ROLES

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--keys-file", default=None, metavar="PATH",
                        help=f"the key file (default: ${KEYS_FILE_ENV}, else artifacts/demo-keys.json); "
                             "`rag-mag serve --keys-file` reads the same")
    parser = subparsers.add_parser(
        "keys", help="keys and roles for `rag-mag serve` (add, list, revoke)",
        description="Keys for the demo and its API. A read key may ask (the page, /api/ask, /v1/chat/completions); "
                    "a write key may also upload and delete documents. `add` prints the new key once, as the last "
                    "line; the file keeps only its SHA-256, with mode 0600 (a file others may read is refused). "
                    "Once the file holds a key, `rag-mag serve` asks every API request for one "
                    "(Authorization: Bearer KEY; the page asks once per browser session); a revoke applies from "
                    "the next request on, without a restart.",
        formatter_class=DefaultsHelpFormatter)
    actions = parser.add_subparsers(dest="keys_action", metavar="ACTION", required=True)
    add = actions.add_parser("add", parents=[common], help="make a key and print it once",
                             description="Make a key, store its SHA-256 and print the key once, as the last line.",
                             formatter_class=DefaultsHelpFormatter)
    add.add_argument("name", help="who or what holds the key (letters, digits, '.', '_', '-'), e.g. alice")
    add.add_argument("--role", required=True, choices=ROLES,
                     help="read: ask questions; write: also upload and delete documents")
    add.add_argument("--index", dest="indexes", action="append", default=None, metavar="NAME",
                     help="an index the key may use, as the demo names it (e.g. qnorm, cosine, or the NAME of "
                          "serve --index NAME=...); repeatable; default: every index")
    actions.add_parser("list", parents=[common], help="names, roles, indexes, created and last used (no key)",
                       formatter_class=DefaultsHelpFormatter)
    revoke = actions.add_parser("revoke", parents=[common], help="revoke a key (a running demo refuses it at once)",
                                formatter_class=DefaultsHelpFormatter)
    revoke.add_argument("name", help="the key's name, as `rag-mag keys list` shows it")
    return parser


def _when(timestamp: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp)) if timestamp else "never"


def format_keys(records, last_used: dict[str, float]) -> str:
    rows = [("NAME", "ROLE", "INDEXES", "CREATED", "LAST USED")] + [
        (record.name, record.role, ",".join(record.indexes) if record.indexes else "all", _when(record.created),
         _when(last_used.get(record.id))) for record in records]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


def run(args: argparse.Namespace) -> int:
    from rag_mag.demo import keys

    path = Path(args.keys_file).expanduser().resolve() if args.keys_file else keys.default_keys_file()
    if args.keys_action == "add":
        record, key = keys.add_key(path, args.name, args.role, args.indexes)
        print(f"added key {record.name!r} (role {record.role}, indexes: "
              f"{', '.join(record.indexes) if record.indexes else 'all'}) to {path}")
        print("it is shown this once and not stored; send it as the header Authorization: Bearer KEY (the page asks "
              "for it once). The key:")
        print(key)
    elif args.keys_action == "list":
        records = keys.read_records(path)
        print(format_keys(records, keys.read_last_used(path)) if records else
              f"no keys in {path}; make one with `rag-mag keys add NAME --role read|write`")
    else:
        record = keys.revoke_key(path, args.name)
        print(f"revoked key {record.name!r} ({record.role}); a running `rag-mag serve` refuses it from its next "
              "request on")
    return 0
