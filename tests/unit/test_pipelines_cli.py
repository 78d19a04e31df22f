"""rag-mag index / ask / run from the command line (tiny checkpoint, no LLM server)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rag_mag.cli.ask import format_report
from rag_mag.cli.main import main
from rag_mag.serving.answers import answer_report
from rag_mag.serving.pipelines import PIPELINES_DIR
from tests.local import closed_port_url
from tests.tiny import tiny_encoder

INDEXING, RAG = str(PIPELINES_DIR / "indexing.yaml"), str(PIPELINES_DIR / "rag.yaml")


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli")
    checkpoint = tiny_encoder(root / "tok", "dnorm").save(root / "ckpt")
    corpus = root / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"id": f"p{i}", "title": t, "text": f"{t} is the capital"})
                                for i, t in enumerate(["paris", "rome", "berlin", "london", "france"])) + "\n")
    return {"root": root, "checkpoint": checkpoint, "corpus": corpus}




def test_index_writes_an_index_and_refuses_to_clobber(setup, capsys):
    out = setup["root"] / "index"
    args = ["index", "--retriever", str(setup["checkpoint"]), "--corpus", str(setup["corpus"]), "--out", str(out),
            "--batch-size", "2"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["encoding"]["encoded_now"] == 5 and summary["count"] == 5 and summary["strategy"] == "dnorm"
    assert summary["index_type"] == "flat" and summary["dim"] == 32 and summary["merged"]
    assert main(args) == 2
    assert "--overwrite" in capsys.readouterr().err
    smaller = setup["root"] / "smaller.jsonl"
    smaller.write_text("".join(setup["corpus"].read_text().splitlines(keepends=True)[:3]))
    assert main(["index", "--retriever", str(setup["checkpoint"]), "--corpus", str(smaller), "--out", str(out),
                 "--overwrite"]) == 0
    assert json.loads(capsys.readouterr().out)["count"] == 3
    foreign = setup["root"] / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("x")
    assert main(args[:-3] + [str(foreign)]) == 2
    assert "not a rag-mag index folder" in capsys.readouterr().err
    assert main(args[:-1] + ["0"]) == 2
    assert "--batch-size" in capsys.readouterr().err


def test_ask_errors_are_clear_and_fast(setup, capsys):
    index = setup["root"] / "ask-index"
    assert main(["index", "--retriever", str(setup["checkpoint"]), "--corpus", str(setup["corpus"]),
                 "--out", str(index)]) == 0
    capsys.readouterr()
    assert main(["ask", "   "]) == 2
    assert "the question is empty" in capsys.readouterr().err
    started = time.perf_counter()
    assert main(["ask", "capital of france", "--index", str(index), "--retriever", str(setup["checkpoint"]),
                 "--llm-url", closed_port_url()]) == 2
    err = capsys.readouterr().err
    assert time.perf_counter() - started < 5.0
    assert "no vLLM server" in err and "rag-mag serve-llm" in err and "Traceback" not in err
    assert main(["ask", "q", "--top-k", "0"]) == 2
    assert "--top-k" in capsys.readouterr().err


def test_run_prints_json_outputs_and_validates_inputs(setup, capsys):
    out = setup["root"] / "run-index"
    assert main(["run", INDEXING, "--set", f"corpus={setup['corpus']}",
                 "--set", f"retriever={setup['checkpoint']}", "--set", f"out={out}",
                 "--set", "embedder.progress_bar=false"]) == 0
    assert json.loads(capsys.readouterr().out) == {"writer": {"documents_written": 5}}
    assert main(["run", RAG, "--input", "[1, 2]"]) == 2
    assert "JSON object" in capsys.readouterr().err
    assert main(["run", RAG, "--input", "{bad"]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert main(["run", RAG, "--input", "@/nonexistent.json"]) == 2
    assert main(["run", RAG, "--set", "retriever.bogus=1"]) == 2
    assert "no parameter 'bogus'" in capsys.readouterr().err
    assert main(["run", RAG, "--no-preflight", "--set", f"index={out}", "--set",
                 f"retriever={setup['checkpoint']}", "--input", '{"question": " "}']) == 2
    assert "the question is empty" in capsys.readouterr().err


def test_report_format_shows_the_score_parts():
    from haystack import Document
    from haystack.dataclasses import GeneratedAnswer

    document = Document(id="p1", content="Paris is the capital of France.", score=2.0,
                        meta={"title": "Paris", "cosine": 0.5, "query_norm": 1.0, "document_norm": 4.0,
                              "query_raw_norm": 5.1, "document_raw_norm": 4.0, "hop": 2})
    answer = GeneratedAnswer(data=" Paris ", query="q", documents=[document])
    report = answer_report("q", answer, ["q", "follow-up"])
    assert report["answer"] == "Paris" and report["sources"][0]["cosine"] == 0.5
    text = format_report(report)
    assert "Answer: Paris" in text and "score 2.000 = 0.500 x 1.000 x 4.000" in text
    assert "[round 2]" in text and "2. follow-up" in text and "query 5.10" in text
    assert "[[Paris]] is the capital" in text  # the answer marked in the excerpt
    # a fused score (reciprocal rank fusion) is not called a product of the dense parts
    fused = Document(id="p2", content="Rome.", score=0.03, meta={**document.meta, "hop": None})
    keyword = Document(id="p3", content="Berlin.", score=0.02, meta={"title": "Berlin"})
    text = format_report(answer_report("q", GeneratedAnswer(data="Rome", query="q", documents=[fused, keyword])))
    assert "score 0.030 (fused rank score); dense score 0.500 x 1.000 x 4.000" in text
    assert "score 0.020 (fused rank score); a keyword hit" in text
