"""Shared fixtures. Tests never reach a model hub."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# ------------------------------------------------------------------------------------- the fault suite's tally
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _pg_url_stays_put(monkeypatch):
    """The PostgreSQL commands export the URL they used as RAG_MAG_PG_URL for their pipelines: a test that points
    them at a server of its own must not leave it to the tests after it."""
    monkeypatch.setenv("RAG_MAG_PG_URL", os.environ.get("RAG_MAG_PG_URL", ""))

_FAULT_TALLY = {"tried": 0, "survived": 0, "clear_error": 0}


class FaultCase:
    """What one fault test reports once its assertions passed: the run survived with nothing lost, or the
    fault was refused with one clear error."""

    def __init__(self) -> None:
        _FAULT_TALLY["tried"] += 1

    def survived(self) -> None:
        _FAULT_TALLY["survived"] += 1

    def clear_error(self) -> None:
        _FAULT_TALLY["clear_error"] += 1


@pytest.fixture
def fault_case() -> FaultCase:
    return FaultCase()


def pytest_terminal_summary(terminalreporter) -> None:
    if _FAULT_TALLY["tried"]:
        failed = _FAULT_TALLY["tried"] - _FAULT_TALLY["survived"] - _FAULT_TALLY["clear_error"]
        terminalreporter.write_line(
            f"fault suite: {_FAULT_TALLY['tried']} cases tried, {_FAULT_TALLY['survived']} survived with nothing "
            f"lost, {_FAULT_TALLY['clear_error']} clear errors, {failed} failed or skipped")


# ------------------------------------------------------------------------------------- the real vLLM server
# Here rather than in tests/integration/: the fault suite's demo cases use the same session server.
import logging  # noqa: E402
from collections.abc import Iterator  # noqa: E402

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
    from rag_mag.serving import processes
    from rag_mag.serving.llm import preflight as llm_preflight
    from rag_mag.serving.llm import readers as llm_readers
    from rag_mag.serving.llm import records as llm_records
    from rag_mag.serving.llm import server as llm_server
    from rag_mag.serving.llm import settings as llm_settings

    given = os.environ.get(TEST_URL_ENV)
    if given:
        url = llm_settings.normalize_api_base_url(given)
        llm_preflight.check_server(url, model=llm_settings.DEFAULT_SERVED_MODEL_NAME, timeout=10.0)
        yield url
        return
    llm_readers.prepare_readers()
    port = processes.find_free_port()
    record = llm_server.start_server(port=port, timeout=START_TIMEOUT_S)
    logger.info("test vLLM server ready at %s (log %s)", record.api_base_url, record.log_path)
    try:
        yield record.api_base_url
    finally:
        llm_server.stop_server(port)
    # Each session uses a new port: drop its log once the server stopped cleanly (start-up errors quote it).
    llm_records.log_path(port).unlink(missing_ok=True)
