"""``llm_server.running_server``: use a running vLLM server, or start one and stop it afterwards (no process is
started here: check_server, start_server and stop_server are replaced by recorders)."""

from __future__ import annotations

import pytest

from rag_mag.errors import ServerNotRunningError
from rag_mag.serving.llm import records as llm_records
from rag_mag.serving.llm import server as llm_server

URL = "http://127.0.0.1:8123/v1"


@pytest.fixture
def calls(monkeypatch):
    calls: dict[str, list] = {"start": [], "stop": [], "extra_args": []}
    state = {"up": False}

    def check_server(url, **kwargs):
        if not state["up"]:
            raise ServerNotRunningError(f"no vLLM server at {url}")
        return ["model"]

    def start_server(model=None, *, host="127.0.0.1", port, **kwargs):
        calls["start"].append((host, port) if model is None else (model, host, port))
        calls["extra_args"].append(tuple(kwargs.get("extra_args", ())))
        return llm_records.ServerRecord(pid=1, host=host, port=port, model="m", served_model_name="model",
                                        log_path="log", started_at=0.0)

    monkeypatch.setattr(llm_server, "check_server", check_server)
    monkeypatch.setattr(llm_server, "start_server", start_server)
    monkeypatch.setattr(llm_server, "stop_server", lambda port, **kwargs: calls["stop"].append(port))
    calls["state"] = state
    return calls


def test_a_running_server_is_used_and_left_running(calls):
    calls["state"]["up"] = True
    with llm_server.running_server(URL) as url:
        assert url == URL
    assert calls["start"] == [] and calls["stop"] == []


def test_a_down_server_is_started_and_stopped_afterwards(calls):
    with llm_server.running_server(URL) as url:
        assert url == URL
        assert calls["start"] == [("127.0.0.1", 8123)] and calls["stop"] == []
    assert calls["stop"] == [8123]


def test_the_started_server_is_stopped_when_the_block_fails(calls):
    with pytest.raises(KeyError), llm_server.running_server(URL):
        raise KeyError("boom")
    assert calls["stop"] == [8123]


def test_keep_leaves_the_started_server_running(calls):
    with llm_server.running_server(URL, keep=True):
        pass
    assert calls["start"] and calls["stop"] == []


def test_without_start_a_down_server_is_an_error_with_the_hint(calls):
    with pytest.raises(ServerNotRunningError, match="no vLLM server at .*; or pass --start-llm"), \
            llm_server.running_server(URL, start=False, not_running_hint="; or pass --start-llm"):
        pytest.fail("the block must not run")
    assert calls["start"] == []


def test_a_server_error_inside_the_block_is_not_taken_for_a_down_server(calls):
    calls["state"]["up"] = True
    with pytest.raises(ServerNotRunningError, match="lost it"), llm_server.running_server(URL):
        raise ServerNotRunningError("lost it")
    assert calls["start"] == []


def test_a_second_reader_gets_a_server_of_its_own_on_a_free_port(calls, monkeypatch):
    calls["state"]["up"] = True  # a server already answers at the default URL: the second reader does not use it
    monkeypatch.setattr(llm_server, "find_free_port", lambda host="127.0.0.1": 8555)
    with llm_server.running_server(model="smollm2-135m-instruct", free_port=True) as url:
        assert url == "http://127.0.0.1:8555/v1"
    assert calls["start"] == [("smollm2-135m-instruct", "127.0.0.1", 8555)] and calls["stop"] == [8555]
    with pytest.raises(ServerNotRunningError, match="starting one is off"), \
            llm_server.running_server(model="m", free_port=True, start=False):
        pass


def test_extra_args_reach_a_started_server_only(calls):
    with llm_server.running_server(URL, extra_args=llm_server.EAGER_ARGS):
        pass
    assert calls["extra_args"] == [("--enforce-eager",)]
    calls["state"]["up"] = True  # a running server is used as it runs: nothing is started with them
    with llm_server.running_server(URL, extra_args=llm_server.EAGER_ARGS):
        pass
    assert calls["extra_args"] == [("--enforce-eager",)]
