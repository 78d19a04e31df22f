"""Fixtures of the integration tier: the real vLLM server, started once per test session."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest

from rag_mag.serving import llm_preflight, llm_readers, llm_records, llm_server, llm_settings

logger = logging.getLogger(__name__)

TEST_URL_ENV = "RAG_MAG_TEST_VLLM_URL"
START_TIMEOUT_S = 900.0  # ~80 s alone on 2 cores; much more while other work competes for them


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[str]:
    """Base URL (``http://127.0.0.1:PORT/v1``) of a real vLLM server serving the trained reader (SmolLM2 with
    the shipped adapter merged in) as ``llm_settings.DEFAULT_SERVED_MODEL_NAME``.

    With ``$RAG_MAG_TEST_VLLM_URL`` set, that running server is used (and left running). Otherwise the
    packaged readers are prepared if needed, a server is started on a free port, and stopped after the session.
    """
    given = os.environ.get(TEST_URL_ENV)
    if given:
        url = llm_settings.normalize_api_base_url(given)
        llm_preflight.check_server(url, model=llm_settings.DEFAULT_SERVED_MODEL_NAME, timeout=10.0)
        yield url
        return
    llm_readers.prepare_readers()
    port = llm_records.find_free_port()
    record = llm_server.start_server(port=port, timeout=START_TIMEOUT_S)
    logger.info("test vLLM server ready at %s (log %s)", record.api_base_url, record.log_path)
    try:
        yield record.api_base_url
    finally:
        llm_server.stop_server(port)
    # Each session uses a new port: drop its log once the server stopped cleanly (start-up errors quote it).
    llm_records.log_path(port).unlink(missing_ok=True)
