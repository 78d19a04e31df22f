"""The vLLM server for the benchmark: use a running one, or start one and stop it afterwards."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from rag_mag.bench.config import BenchConfig
from rag_mag.errors import ServerNotRunningError

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def llm_server(config: BenchConfig) -> Iterator[str]:
    from rag_mag import llm_server as server

    url = config.llm_url or server.default_api_base_url()
    try:
        server.check_server(url)
        yield url
        return
    except ServerNotRunningError:
        if not config.start_llm:
            raise
    address = server.parse_api_base_url(url)
    logger.info("no vLLM server at %s: starting one (about a minute and a half on CPU)", url)
    record = server.start_server(host=address.host, port=address.port)
    try:
        yield record.api_base_url
    finally:
        server.stop_server(record.port)
