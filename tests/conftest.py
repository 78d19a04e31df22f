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
