"""``rag-mag serve``: the question-answering demo (web page, JSON API, OpenAI-compatible endpoint) on localhost."""

from __future__ import annotations

import argparse
import logging

from rag_mag.errors import ConfigError, ServerNotRunningError

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


def _port(value: str) -> int:
    port = _positive(value)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"invalid port {port}: expected a number from 1 to 65535")
    return port


def add_parser(subparsers) -> argparse.ArgumentParser:
    from rag_mag.demo.service import DEFAULT_MAX_TOP_K
    from rag_mag.pipelines import default_pipeline

    parser = subparsers.add_parser(
        "serve", help=f"the question-answering demo in the browser (http://127.0.0.1:{DEFAULT_PORT})",
        description="Serve the QA demo: a page that streams the answer and shows why each source ranked where it "
                    "did (score = cosine x query norm x document norm), cosine and qnorm side by side; a JSON API "
                    "(POST /api/ask) and an OpenAI-compatible endpoint (POST /v1/chat/completions, model = index). "
                    "By default it serves every index built under artifacts/ (rag-mag quickstart --train-only "
                    "builds qnorm and cosine), named by strategy.")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    parser.add_argument("--port", type=_port, default=DEFAULT_PORT, help="port to bind (default %(default)s)")
    parser.add_argument("--pipeline", default=str(default_pipeline("rag")),
                        help="RAG pipeline YAML, loaded once per index (default pipelines/rag.yaml; e.g. "
                             "pipelines/rag_multihop.yaml)")
    parser.add_argument("--index", dest="indexes", action="append", default=[],
                        metavar="NAME=INDEX_DIR:RETRIEVER_DIR",
                        help="an index to serve and the retriever that built it (repeatable; default: every "
                             "index-X folder under artifacts/ with its retriever-X)")
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
    parser.add_argument("--start-llm", action="store_true",
                        help="start the vLLM server if it is not running (and stop it when the demo stops)")
    return parser


def resolve_indexes(specs_text: list[str]):
    from rag_mag.demo.indexes import check_unique, discover_indexes, parse_index_spec
    from rag_mag.models import artifacts_dir

    specs = [parse_index_spec(text) for text in specs_text] or discover_indexes(artifacts_dir())
    if not specs:
        raise ConfigError(f"no index to serve: none was found under {artifacts_dir()} (index-X beside retriever-X); "
                          "build the default ones with `rag-mag quickstart --train-only`, or pass "
                          "--index NAME=INDEX_DIR:RETRIEVER_DIR")
    return check_unique(specs)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from rag_mag import llm_server
    from rag_mag.demo.app import create_app
    from rag_mag.demo.loading import load_index
    from rag_mag.demo.service import DemoService

    specs = resolve_indexes(args.indexes)
    for noisy in ("httpx2", "openai"):  # one line per vLLM request otherwise
        logging.getLogger(noisy).setLevel(max(logging.getLogger().level, logging.WARNING))
    if llm_server.port_in_use(args.host, args.port):
        raise ConfigError(f"port {args.port} on {args.host} is already in use (another demo?); stop it or choose "
                          "another with --port")
    url = llm_server.normalize_api_base_url(args.llm_url or llm_server.default_api_base_url())
    started = None
    try:
        llm_server.check_server(url)
    except ServerNotRunningError as error:
        if not args.start_llm:
            raise ServerNotRunningError(f"{error}; or pass --start-llm to start it with the demo") from None
        address = llm_server.parse_api_base_url(url)
        logger.info("starting the vLLM server at %s (about a minute and a half on CPU)", url)
        started = llm_server.start_server(host=address.host, port=address.port)
    try:
        loaded = [load_index(spec, args.pipeline, url) for spec in specs]
        llm_server.check_pipeline_servers(loaded[0].pipeline)  # the served model is the one the pipeline names
        service = DemoService(loaded, url, max_concurrency=args.max_concurrency, max_waiting=args.max_waiting,
                              max_top_k=args.max_top_k)
        logger.info("serving %s with %s; generation at %s", ", ".join(
            f"{item.spec.name} ({item.strategy}, {item.documents} passages)" for item in loaded), args.pipeline, url)
        logger.info("open http://%s:%d in a browser (Ctrl-C stops the demo)", args.host, args.port)
        uvicorn.run(create_app(service), host=args.host, port=args.port, log_config=None, access_log=False,
                    timeout_graceful_shutdown=5)
    finally:
        if started is not None:
            llm_server.stop_server(started.port)
    return 0
