"""The YAML pipelines end to end: the sample corpus indexed with the real MiniLM, answers from the real
vLLM server (SmolLM2-135M-Instruct)."""

from __future__ import annotations

import json
import re
import socket
import string
import time
from pathlib import Path

import pytest

from rag_mag.cli.main import main
from rag_mag.data import read_eval
from rag_mag.errors import ServerNotRunningError
from rag_mag.models import REPO_ROOT
from rag_mag.retriever.encoder import MagnitudeEncoder
from rag_mag.serving.pipelines import PIPELINES_DIR, load_pipeline, named_outputs, question_inputs, run_pipeline

pytestmark = pytest.mark.integration

SAMPLE = REPO_ROOT / "data" / "sample"
# An easy TriviaQA question of the sample: the retriever finds the passage naming the actress, and
# even the 135M-parameter generator copies her name from it.
EASY_ID = "test_9826"
MULTIHOP_IDS = ["5a8cd381554299653c1aa12b", "2hop__65690_85374"]


def normalize(text: str) -> str:
    text = "".join(char for char in text.lower() if char not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def mentions(text: str, answers) -> bool:
    return any(normalize(answer) and f" {normalize(answer)} " in f" {normalize(text)} " for answer in answers)


@pytest.fixture(scope="module")
def questions():
    return {record.id: record for record in read_eval(SAMPLE / "questions.jsonl")}


@pytest.fixture(scope="module")
def minilm_index(tmp_path_factory) -> dict[str, Path]:
    """The bundled sample corpus indexed by `rag-mag index` with the packaged MiniLM (cosine, untrained)."""
    root = tmp_path_factory.mktemp("minilm")
    retriever = MagnitudeEncoder.build(strategy="cosine").save(root / "retriever")
    index = root / "index"
    assert main(["index", "--retriever", str(retriever), "--corpus", str(SAMPLE / "corpus.jsonl"),
                 "--out", str(index), "--batch-size", "32"]) == 0
    return {"retriever": retriever, "index": index}


def overrides(minilm_index, url: str | None = None, **extra) -> dict:
    values = {"index": str(minilm_index["index"]), "retriever": str(minilm_index["retriever"]), **extra}
    if url:
        values["llm_url"] = url
    return values


def test_the_sample_index(minilm_index):
    manifest = json.loads((minilm_index["index"] / "manifest.json").read_text())
    assert manifest["count"] == 455 and manifest["dim"] == 384 and manifest["strategy"] == "cosine"


def test_rag_answers_with_sources(minilm_index, vllm_server, questions):
    pipeline = load_pipeline(PIPELINES_DIR / "rag.yaml", overrides(minilm_index, vllm_server))
    for question_id in ["test_10379", "5a7b7ff75542995eb53be93d", EASY_ID]:
        record = questions[question_id]
        answer = named_outputs(pipeline, run_pipeline(pipeline, question_inputs(pipeline, record.question)))[
            "answers"][0]
        assert answer.data.strip(), record.question
        assert answer.query == record.question
        assert len(answer.documents) == 5
        for document in answer.documents:
            meta = document.meta
            assert document.score == pytest.approx(meta["cosine"] * meta["query_norm"] * meta["document_norm"],
                                                   rel=1e-4)
            assert meta["query_norm"] == pytest.approx(1.0, rel=1e-5)  # cosine: both sides normalized
            assert meta["document_raw_norm"] > 0 and meta["query_raw_norm"] > 0


def test_an_easy_question_is_answered_correctly(minilm_index, vllm_server, questions):
    record = questions[EASY_ID]
    pipeline = load_pipeline(PIPELINES_DIR / "rag.yaml", overrides(minilm_index, vllm_server))
    answer = named_outputs(pipeline, run_pipeline(pipeline, question_inputs(pipeline, record.question)))["answers"][0]
    assert any(mentions(document.content, record.answers) for document in answer.documents)
    assert mentions(answer.data, record.answers), f"{record.question!r} -> {answer.data!r}, gold {record.answers}"


def test_multihop_answers_after_two_rounds(minilm_index, vllm_server, questions):
    pipeline = load_pipeline(PIPELINES_DIR / "rag_multihop.yaml", overrides(minilm_index, vllm_server))
    for question_id in MULTIHOP_IDS:
        record = questions[question_id]
        outputs = named_outputs(pipeline, run_pipeline(pipeline, question_inputs(pipeline, record.question)))
        assert len(outputs["queries"]) == 2 and outputs["queries"][0] == record.question
        assert outputs["queries"][1].strip()
        answer = outputs["answers"][0]
        assert answer.data.strip() and answer.query == record.question
        hops = [document.meta["hop"] for document in answer.documents]
        assert hops[:3] == [1, 1, 1] and hops == sorted(hops) and len(hops) <= 6
        assert len({document.id for document in answer.documents}) == len(answer.documents)


def test_ask_prints_the_answer_and_explained_sources(minilm_index, vllm_server, questions, capsys):
    record = questions[EASY_ID]
    assert main(["ask", record.question, "--index", str(minilm_index["index"]), "--retriever",
                 str(minilm_index["retriever"]), "--llm-url", vllm_server, "--top-k", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["answer"] and len(report["sources"]) == 2
    assert report["sources"][0]["score"] >= report["sources"][1]["score"]
    assert all(source["cosine"] is not None and source["document_norm"] is not None for source in report["sources"])


def test_ask_says_so_when_no_passage_reaches_the_score_floor(minilm_index, vllm_server, questions, capsys):
    """A --min-score over every cosine makes any question one the documents do not answer, whatever the reader
    replies; --abstain off gives the reader's reply back."""
    record = questions[EASY_ID]
    ask = ["ask", record.question, "--index", str(minilm_index["index"]), "--retriever",
           str(minilm_index["retriever"]), "--llm-url", vllm_server, "--top-k", "2", "--min-score", "2"]
    assert main(ask + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["answerable"] is False and report["abstained_by"] == "score"
    assert report["answer"] == "The documents do not say." and len(report["sources"]) == 2
    assert all(source["answer_span"] is None for source in report["sources"])
    assert main(ask) == 0
    text = capsys.readouterr().out
    assert text.startswith("Answer: The documents do not say.\n") and "Closest sources (the best one scores" in text
    assert main(ask + ["--abstain", "off", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["answerable"] is True and report["answer"] != "The documents do not say."


def test_server_down_is_reported_quickly_and_clearly(minilm_index, questions):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    pipeline = load_pipeline(PIPELINES_DIR / "rag_multihop.yaml", overrides(minilm_index, url))
    started = time.perf_counter()
    with pytest.raises(ServerNotRunningError) as error:
        run_pipeline(pipeline, question_inputs(pipeline, questions[EASY_ID].question))
    assert time.perf_counter() - started < 5.0
    assert url in str(error.value) and "rag-mag serve-llm" in str(error.value)
