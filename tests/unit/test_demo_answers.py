"""The demo's answers without a model server: a stand-in for vLLM's generator streams scripted replies through the
real pipeline (tiny retriever, one-passage index), and /api/ask, /api/ask/stream and /v1/chat/completions carry
``answerable``; an abstention shows as "The documents do not say.", never as the reader's raw "unanswerable".

(The same routes against the real vLLM server: tests/integration/test_demo_api.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient
from haystack.dataclasses import ChatMessage, StreamingChunk

from rag_mag.components.answer_builder import ABSTENTION_TEXT
from rag_mag.demo.app import create_app
from rag_mag.demo.indexes import IndexSpec
from rag_mag.demo.loading import LoadedIndex, load_index
from rag_mag.demo.runs import ReplyGate
from rag_mag.demo.service import DemoService
from rag_mag.serving.pipelines import PIPELINES_DIR, apply_overrides, read_pipeline_dict
from tests.local import closed_port_url
from tests.tiny import paris_index

RAG = PIPELINES_DIR / "rag.yaml"
ASK = {"question": "What is the capital of France?"}
RAW = "unanswerable"  # the reader's abstention reply, which no user should see


def pipeline_file(path: Path, overrides: dict[str, object]) -> Path:
    """pipelines/rag.yaml with ``overrides`` written into it (the demo takes a pipeline file, not overrides)."""
    path.write_text(yaml.safe_dump(apply_overrides(read_pipeline_dict(RAG), overrides)))
    return path


@pytest.fixture(scope="module")
def service(tmp_path_factory) -> DemoService:
    """Three indexes over one passage: rag.yaml as shipped (``auto``), with a score floor no passage reaches
    (``floor``), and with ``abstain: off`` (``off``)."""
    root = tmp_path_factory.mktemp("demo-answers")
    index = paris_index(root)
    url = closed_port_url()
    pipelines = {"auto": RAG, "floor": pipeline_file(root / "floor.yaml", {"min_score": 1e9}),
                 "off": pipeline_file(root / "off.yaml", {"abstain": "off"})}
    loaded = [load_index(IndexSpec(name, index, root / "retriever-qnorm"), path, url)
              for name, path in pipelines.items()]
    demo = DemoService(loaded, url)

    async def reachable() -> list[str]:
        return []

    demo.check_llm = reachable
    return demo


@pytest.fixture(scope="module")
def client(service):
    with TestClient(create_app(service), base_url="http://127.0.0.1") as test_client:
        yield test_client


def script(monkeypatch, loaded: LoadedIndex, *pieces: str) -> None:
    """The index's vLLM generator streams ``pieces`` and replies with their concatenation."""
    generator = loaded.pipeline.get_component(loaded.answer_generators[0])

    async def run_async(messages, streaming_callback=None, generation_kwargs=None, **kwargs):
        for piece in pieces:
            await streaming_callback(StreamingChunk(content=piece))
        return {"replies": [ChatMessage.from_assistant("".join(pieces),
                                                       meta={"model": "scripted", "finish_reason": "stop"})]}

    monkeypatch.setattr(generator, "run_async", run_async)


def events_of(text: str) -> list[tuple[str, dict]]:
    """The (event, data) pairs of a server-sent event stream."""
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((fields["event"], json.loads(fields["data"])))
    return events


def streamed(client, index: str) -> tuple[list[str], dict, str]:
    response = client.post("/api/ask/stream", json={**ASK, "index": index})
    assert response.status_code == 200, response.text
    events = events_of(response.text)
    assert events[0][0] == "sources" and events[-1][0] == "done"
    tokens = [data["text"] for kind, data in events if kind == "token"]
    return tokens, events[-1][1], response.text


# ------------------------------------------------------------------------------------------ /api/ask/stream
@pytest.mark.parametrize("pieces", [("un", "answer", "able"), (" Unanswerable", "."), ("unanswerable", "\n", "x"),
                                    ("",)])
def test_an_abstention_streams_as_the_documents_do_not_say(client, service, monkeypatch, pieces):
    script(monkeypatch, service.indexes["auto"], *pieces)
    tokens, done, text = streamed(client, "auto")
    assert tokens == [ABSTENTION_TEXT]  # held back while it could be the abstention, then the notice
    assert done["answerable"] is False and done["abstained_by"] == "reader" and done["answer"] == ABSTENTION_TEXT
    assert done["sources"] and all(source["answer_span"] is None for source in done["sources"])
    assert RAW not in text.lower()


@pytest.mark.parametrize("pieces, shown", [
    (("Par", "is"), ["Par", "is"]),  # nothing like the abstention: streamed as it comes
    (("un", "til 1990"), ["until 1990"]),  # held while it began like it, then sent at once
    (("Answer:", " Paris"), ["Answer: Paris"]),
])
def test_an_answer_streams_as_it_comes(client, service, monkeypatch, pieces, shown):
    script(monkeypatch, service.indexes["auto"], *pieces)
    tokens, done, _ = streamed(client, "auto")
    assert tokens == shown
    assert done["answerable"] is True and "abstained_by" not in done and done["answer"] == "".join(pieces)


def test_under_a_score_floor_nothing_shows_before_the_verdict(client, service, monkeypatch):
    script(monkeypatch, service.indexes["floor"], "Par", "is")
    tokens, done, text = streamed(client, "floor")
    assert tokens == [ABSTENTION_TEXT] and "Par" not in "".join(tokens)
    assert done["answerable"] is False and done["abstained_by"] == "score" and done["answer"] == ABSTENTION_TEXT
    assert done["sources"][0]["text"] == "paris is in france"  # the closest source, still listed


def test_with_abstain_off_the_reply_is_the_answer_whatever_it_is(client, service, monkeypatch):
    script(monkeypatch, service.indexes["off"], "unans", "werable")
    tokens, done, _ = streamed(client, "off")
    assert "".join(tokens) == RAW and done["answer"] == RAW and done["answerable"] is True


# ------------------------------------------------------------------------------------------ /api/ask
def test_the_whole_answer_carries_answerable(client, service, monkeypatch):
    script(monkeypatch, service.indexes["auto"], RAW)
    body = client.post("/api/ask", json=ASK).json()
    assert body["answerable"] is False and body["abstained_by"] == "reader" and body["answer"] == ABSTENTION_TEXT
    assert body["sources"] and body["index"] == "auto"
    script(monkeypatch, service.indexes["auto"], "Paris")
    body = client.post("/api/ask", json=ASK).json()
    assert body["answerable"] is True and body["answer"] == "Paris" and "abstained_by" not in body


# ------------------------------------------------------------------------------------------ /v1/chat/completions
def chat(question: str = ASK["question"], **extra) -> dict:
    return {"model": "auto", "messages": [{"role": "user", "content": question}], **extra}


def test_the_openai_answer_says_the_documents_do_not_say(client, service, monkeypatch):
    script(monkeypatch, service.indexes["auto"], "unans", "werable")
    body = client.post("/v1/chat/completions", json=chat()).json()
    assert body["choices"][0]["message"]["content"] == ABSTENTION_TEXT
    assert body["rag_mag"]["answerable"] is False and body["rag_mag"]["abstained_by"] == "reader"
    assert body["rag_mag"]["sources"]
    script(monkeypatch, service.indexes["auto"], "Paris")
    body = client.post("/v1/chat/completions", json=chat()).json()
    assert body["choices"][0]["message"]["content"] == "Paris"
    assert body["rag_mag"]["answerable"] is True and "abstained_by" not in body["rag_mag"]


@pytest.mark.parametrize("pieces, content, answerable", [(("unans", "werable"), ABSTENTION_TEXT, False),
                                                          (("Par", "is"), "Paris", True)])
def test_the_openai_stream_carries_answerable_in_its_last_chunk(client, service, monkeypatch, pieces, content,
                                                                answerable):
    script(monkeypatch, service.indexes["auto"], *pieces)
    response = client.post("/v1/chat/completions", json=chat(stream=True))
    assert response.status_code == 200, response.text
    lines = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line.strip()]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    assert "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks) == content
    extras = [chunk["rag_mag"] for chunk in chunks if "rag_mag" in chunk]
    assert len(extras) == 1 and chunks[-1]["rag_mag"] is extras[0]  # the final chunk's
    assert extras[0]["answerable"] is answerable
    assert (extras[0].get("abstained_by") == "reader") is not answerable
    assert RAW not in response.text.lower()


# ------------------------------------------------------------------------------------------ the gate itself
def test_the_gate_holds_what_may_be_an_abstention_and_never_takes_text_back():
    gate = ReplyGate()
    assert [gate.pass_on(piece) for piece in ("un", "ans", "wered", " question")] == ["", "", "unanswered", " question"]
    assert gate.rest({"answerable": True}) == "" and gate.rest({"answerable": False}) == ""  # shown: not taken back
    held = ReplyGate()
    assert held.pass_on("unanswer") == "" and held.rest({"answerable": True}) == "unanswer"
    assert held.rest({"answerable": False}) == ABSTENTION_TEXT
    everything = ReplyGate(hold_all=True)
    assert everything.pass_on("Paris") == "" and everything.rest({"answerable": True}) == "Paris"
