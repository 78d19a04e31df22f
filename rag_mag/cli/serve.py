"""``rag-mag serve``: the question-answering demo (web page, JSON API, OpenAI-compatible endpoint) on localhost.

Who may use it (``access_policy``): with keys in the key file (``rag-mag keys add``), every API request needs one.
Without keys it serves anyone only on loopback, saying so at start; bound to another address it refuses to start
unless ``--no-auth`` says that anyone who reaches it may read and write.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
from pathlib import Path

from rag_mag.errors import ConfigError

logger = logging.getLogger(__name__)

DEFAULT_PORT = 7860


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a number of at least 1, got {number}")
    return number


def _megabytes(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of megabytes, got {value!r}") from None
    if not number > 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of megabytes, got {value}")
    return number


def _port(value: str) -> int:
    port = _positive(value)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"invalid port {port}: expected a number from 1 to 65535")
    return port


def add_parser(subparsers) -> argparse.ArgumentParser:
    from rag_mag.demo.service import DEFAULT_MAX_TOP_K, DEFAULT_MAX_UPLOAD_MB
    from rag_mag.models import default_retriever_dir
    from rag_mag.serving.db.pgvector import DEFAULT_TABLE
    from rag_mag.serving.pipelines import default_pipeline

    parser = subparsers.add_parser(
        "serve", help=f"the question-answering demo in the browser (http://127.0.0.1:{DEFAULT_PORT})",
        description="Serve the QA demo: a page that streams the answer and shows why each source ranked where it "
                    "did (score = cosine x query norm x document norm), cosine and qnorm side by side; a JSON API "
                    "(POST /api/ask) and an OpenAI-compatible endpoint (POST /v1/chat/completions, model = index). "
                    "By default it serves every index built under artifacts/, named by strategy; beside the "
                    "quickstart's qnorm index it first trains and indexes cosine on the bundled sample, once (a "
                    "minute or two on 2 cores), for the comparison. With a pipeline on PostgreSQL "
                    "(--pipeline pipelines/rag_pgvector.yaml or rag_hybrid.yaml) it serves one table instead "
                    f"(--table, default {DEFAULT_TABLE}, which `rag-mag export-index INDEX_DIR --pgvector` and "
                    "`rag-mag index PATH --store pgvector` write), on the server of `rag-mag db start` (started "
                    "with the demo and stopped with it when none runs) or --pg-url; the documents panel then lists "
                    "the table's files, and files are added with `rag-mag index PATH --store pgvector`. Once the key "
                    "file holds a key (`rag-mag keys add`), every API request needs one; without keys only a loopback "
                    "address is served, unless --no-auth.")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default %(default)s); another address needs keys (`rag-mag keys add`) "
                             "or --no-auth")
    parser.add_argument("--port", type=_port, default=DEFAULT_PORT, help="port to bind (default %(default)s)")
    parser.add_argument("--pipeline", default=str(default_pipeline("rag")),
                        help="RAG pipeline YAML, loaded once per index (default pipelines/rag.yaml; e.g. "
                             "pipelines/rag_multihop.yaml)")
    parser.add_argument("--index", dest="indexes", action="append", default=[],
                        metavar="NAME=INDEX_DIR:RETRIEVER_DIR",
                        help="an index to serve and the retriever that built it (repeatable; default: every "
                             "index-X folder under artifacts/ with its retriever-X); for pipelines on a FAISS index")
    parser.add_argument("--table", default=None,
                        help=f"PostgreSQL table to serve, for pipelines on pgvector (default {DEFAULT_TABLE})")
    parser.add_argument("--pg-url", default=None,
                        help="PostgreSQL URL for pipelines on pgvector (default: $RAG_MAG_PG_URL, else the server "
                             "of `rag-mag db start`, started with the demo if none runs and stopped with it)")
    parser.add_argument("--retriever", default=None,
                        help="retriever checkpoint the table was filled with, for pipelines on pgvector (default: the "
                             "one under artifacts/ whose fingerprint the table's tag records, else "
                             f"{default_retriever_dir()}); the table's tag must name it")
    parser.add_argument("--llm-url", default=None,
                        help="vLLM server base URL (default: $RAG_MAG_VLLM_URL, else http://127.0.0.1:8000/v1)")
    parser.add_argument("--max-concurrency", type=_positive, default=8,
                        help="questions answered at once, so requests in flight to vLLM (default %(default)s); "
                             "more wait")
    parser.add_argument("--max-waiting", type=_positive, default=256,
                        help="questions that may wait for a slot (default %(default)s); beyond that the demo "
                             "answers 503 busy")
    parser.add_argument("--max-top-k", type=_positive, default=DEFAULT_MAX_TOP_K,
                        help="largest top_k a request may ask for (default %(default)s; the prompt must fit the "
                             "model's context)")
    parser.add_argument("--max-upload-mb", type=_megabytes, default=DEFAULT_MAX_UPLOAD_MB,
                        help="largest file the page's documents panel accepts, in MB (default %(default)g); larger "
                             "uploads are refused with 413")
    parser.add_argument("--allowed-host", dest="allowed_hosts", action="append", default=[], metavar="NAME",
                        help="a host name the demo answers to in Host and Origin headers, besides localhost, "
                             "127.0.0.1 and ::1 (repeatable; needed when --host binds another address and the page "
                             "is opened under that name; '*' turns the check off)")
    parser.add_argument("--start-llm", action="store_true",
                        help="start the vLLM server if it is not running (and stop it when the demo stops)")
    _add_access_flags(parser)
    return parser


def _add_access_flags(parser: argparse.ArgumentParser) -> None:
    from rag_mag.demo.access import DEFAULT_RATE_PER_MINUTE, MAX_FAILURES_PER_MINUTE
    from rag_mag.demo.keys import KEYS_FILE_ENV

    parser.add_argument("--keys-file", default=None, metavar="PATH",
                        help=f"the key file of `rag-mag keys` (default: ${KEYS_FILE_ENV}, else "
                             "artifacts/demo-keys.json). Once it holds a key, every /api/ and /v1/ request needs one "
                             "(Authorization: Bearer KEY), on any address; the page asks for it once")
    parser.add_argument("--no-auth", action="store_true",
                        help="serve without keys even on an address other machines reach (anyone who reaches the "
                             "port can ask, upload and delete); without keys and without this flag, only a loopback "
                             "address (127.0.0.1, the default) is served")
    parser.add_argument("--rate-limit", type=_positive, default=DEFAULT_RATE_PER_MINUTE, metavar="N",
                        help=f"requests a minute per key (default %(default)s); beyond it 429 with Retry-After. A "
                             f"client address that sends {MAX_FAILURES_PER_MINUTE} wrong keys within a minute is "
                             "refused (429) for that minute")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only (127.0.0.0/8, ::1, localhost); 0.0.0.0 and :: are not."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any address
        return False


def access_policy(args: argparse.Namespace):
    """The demo's ``Access``: keys once the key file holds one; none on loopback without keys (said at start); a
    refusal on another address without keys, unless ``--no-auth``."""
    from rag_mag.demo.access import OPEN_WARNING, Access
    from rag_mag.demo.keys import KeyStore, default_keys_file

    path = Path(args.keys_file).expanduser().resolve() if args.keys_file else default_keys_file()
    if args.no_auth:
        logger.warning("WARNING: %s, on %s:%d", OPEN_WARNING, args.host, args.port)
        return Access("off", rate_per_minute=args.rate_limit)
    store = KeyStore(path)  # a key file others may read, or a malformed one, is refused here
    if len(store):
        logger.info("keys required: %d key(s) in %s (%s)", len(store), path, ", ".join(store.names()))
        return Access("keys", store, rate_per_minute=args.rate_limit)
    if not is_loopback(args.host):
        raise ConfigError(f"--host {args.host} lets other machines reach the demo, and {path} holds no key: make one "
                          "with `rag-mag keys add NAME --role read` (or --role write) and send it as Authorization: "
                          "Bearer KEY, or pass --no-auth to let anyone who reaches the port read, upload and delete")
    logger.warning("no keys in %s: anyone on this machine (other users too: loopback is shared) can ask, upload and "
                   "delete; `rag-mag keys add NAME --role write` makes the demo ask for a key", path)
    return Access("local")


def _warn_unserved_grants(access, served: list[str]) -> None:
    for record in access.store.records() if access.store is not None else ():
        unknown = [name for name in record.indexes or () if name not in served]
        if unknown:
            logger.warning("key %r is granted %s, which this demo does not serve (it serves %s)", record.name,
                           ", ".join(unknown), ", ".join(served))


def resolve_indexes(specs_text: list[str]):
    from rag_mag.demo.indexes import check_unique, discover_indexes, parse_index_spec
    from rag_mag.models import artifacts_dir

    specs = [parse_index_spec(text) for text in specs_text] or discover_indexes(artifacts_dir())
    if not specs:
        raise ConfigError(f"no index to serve: none was found under {artifacts_dir()} (index-X beside retriever-X); "
                          "build the default one with `rag-mag quickstart --train-only`, or pass "
                          "--index NAME=INDEX_DIR:RETRIEVER_DIR")
    return check_unique(specs)


def allowed_hosts(args: argparse.Namespace) -> list[str]:
    """localhost, the bound address (unless it is a wildcard) and every --allowed-host."""
    from rag_mag.demo.guards import LOCAL_HOSTS

    bound = [] if args.host in ("0.0.0.0", "::", "") else [args.host]
    return [*LOCAL_HOSTS, *bound, *args.allowed_hosts]


def uses_table(args: argparse.Namespace) -> bool:
    """Whether the pipeline reads a PostgreSQL table; the flags of the other kind of index are refused."""
    from rag_mag.serving.db import pgvector
    from rag_mag.serving.pipelines import read_pipeline_dict

    on_table = bool(pgvector.pipeline_stores(read_pipeline_dict(args.pipeline)))
    if on_table and args.indexes:
        raise ConfigError(f"{args.pipeline} reads a PostgreSQL table, not an index folder: pass --table NAME (and "
                          "--retriever DIR) instead of --index")
    wrong = [flag for flag, value in (("--table", args.table), ("--pg-url", args.pg_url),
                                      ("--retriever", args.retriever)) if value is not None]
    if not on_table and wrong:
        raise ConfigError(f"{' and '.join(wrong)} are for pipelines on PostgreSQL, and {args.pipeline} reads FAISS "
                          "index folders (--index); serve a table with --pipeline pipelines/rag_pgvector.yaml")
    return on_table


def run(args: argparse.Namespace) -> int:
    import contextlib

    import uvicorn

    from rag_mag.demo.app import create_app
    from rag_mag.demo.loading import load_index
    from rag_mag.demo.service import DemoService
    from rag_mag.demo.tables import load_table
    from rag_mag.models import default_retriever_dir
    from rag_mag.serving.db import pgvector
    from rag_mag.serving.llm import preflight as llm_preflight
    from rag_mag.serving.llm import server as llm_server
    from rag_mag.serving.processes import port_in_use

    on_table = uses_table(args)
    if port_in_use(args.host, args.port):
        raise ConfigError(f"port {args.port} on {args.host} is already in use (another demo?); stop it or choose "
                          "another with --port")
    access = access_policy(args)
    if not on_table and not args.indexes:
        from rag_mag.cli.quickstart import ensure_comparison

        ensure_comparison()
    specs = [] if on_table else resolve_indexes(args.indexes)
    if on_table:
        pgvector.check_table_name(pgvector.DEFAULT_TABLE if args.table is None else args.table)
    with contextlib.ExitStack() as stack:
        if on_table:  # a server started here is stopped when the demo stops
            from rag_mag.demo.tables import table_spec

            pg_url = stack.enter_context(pgvector.using_server(args.pg_url))
            table = pgvector.DEFAULT_TABLE if args.table is None else args.table
            retriever = args.retriever
            if retriever is None:  # the table's own retriever where it is under artifacts/
                from rag_mag.serving.retrievers import retriever_for

                tag = pgvector.check_table(pg_url, pgvector.check_table_name(table), None)
                retriever = retriever_for(tag.get("checkpoint")) or default_retriever_dir()
            specs = [table_spec(table, retriever, pg_url)]
        url = stack.enter_context(llm_server.running_server(
            args.llm_url, start=args.start_llm, not_running_hint="; or pass --start-llm to start it with the demo"))
        loaded = [(load_table if spec.table is not None else load_index)(spec, args.pipeline, url) for spec in specs]
        llm_preflight.check_pipeline_servers(loaded[0].pipeline)  # the served model is the one the pipeline names
        service = DemoService(loaded, url, max_concurrency=args.max_concurrency, max_waiting=args.max_waiting,
                              max_top_k=args.max_top_k, max_upload_mb=args.max_upload_mb)
        logger.info("serving %s with %s; generation at %s", ", ".join(
            f"{item.spec.name} ({item.strategy}, {item.documents} passages"
            f"{f', table {item.spec.table}' if item.spec.table else ''})" for item in loaded), args.pipeline, url)
        _warn_unserved_grants(access, list(service.indexes))
        logger.info("open http://%s:%d in a browser (Ctrl-C stops the demo); %s", args.host, args.port, {
            "keys": "every API request needs a key", "off": "NO KEYS ASKED (--no-auth)",
            "local": "no key asked (loopback, no keys)"}[access.mode])
        app = create_app(service, allowed_hosts=allowed_hosts(args), access=access)
        uvicorn.run(app, host=args.host, port=args.port, log_config=None, access_log=False,
                    timeout_graceful_shutdown=5)
    return 0
