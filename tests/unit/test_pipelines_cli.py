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


def _abstention(by: str = "reader"):
    from haystack import Document
    from haystack.dataclasses import GeneratedAnswer

    documents = [Document(id="p1", content="Paris is the capital of France, on the Seine.", score=0.31,
                          meta={"title": "Paris", "cosine": 0.31, "query_norm": 1.0, "document_norm": 1.0}),
                 Document(id="p2", content="Unanswerable riddles of Rome.", score=0.2, meta={"title": "Rome"})]
    return GeneratedAnswer(data="unanswerable", query="q", documents=documents,
                           meta={"answerable": False, "abstained_by": by, "reply": "unanswerable"})


def test_an_abstention_is_reported_as_the_documents_do_not_say():
    from rag_mag.components.answer_builder import ABSTENTION_TEXT

    report = answer_report("Who painted the ceiling?", _abstention())
    assert report["answerable"] is False and report["abstained_by"] == "reader"
    assert report["answer"] == ABSTENTION_TEXT == "The documents do not say."
    assert [source["id"] for source in report["sources"]] == ["p1", "p2"]  # the closest sources, still listed
    assert all(source["answer_span"] is None for source in report["sources"])  # no answer marked in them
    assert json.loads(json.dumps(report))["answerable"] is False  # what ask --json prints
    text = format_report(report)
    assert text.startswith("Answer: The documents do not say.\n")
    assert "Closest sources (the reader found no answer in them; score = cosine x query norm x document norm):" in text
    assert "\nSources (" not in text and "[[" not in text and "unanswerable" not in text.split("\n")[0]
    floor = format_report(answer_report("q", _abstention("score")))
    assert "Closest sources (the best one scores under the pipeline's min_score;" in floor


def test_an_answer_is_reported_as_answerable():
    from haystack.dataclasses import GeneratedAnswer

    answered = _abstention()
    answered = GeneratedAnswer(data="Paris", query="q", documents=answered.documents,
                               meta={"answerable": True, "reply": "Paris"})
    report = answer_report("q", answered)
    assert report["answerable"] is True and report["answer"] == "Paris" and "abstained_by" not in report
    assert report["sources"][0]["answer_span"] is not None
    assert format_report(report).splitlines()[2].startswith("Sources (score")
    # an answer from Haystack's own AnswerBuilder (no meta): answerable
    plain = answer_report("q", GeneratedAnswer(data="Rome", query="q", documents=[], meta={}))
    assert plain["answerable"] is True and plain["answer"] == "Rome"


def test_ask_sets_abstain_and_min_score_where_the_pipeline_declares_them(setup, tmp_path, capsys, monkeypatch):
    import yaml

    import rag_mag.serving.pipelines as pipelines

    seen = []  # the overrides `ask` gives load_pipeline, recorded where they are applied
    real_apply = pipelines.apply_overrides
    monkeypatch.setattr(pipelines, "apply_overrides", lambda data, overrides: seen.append(dict(overrides)) or
                        real_apply(data, overrides))
    args = ["ask", "capital of france", "--retriever", str(setup["checkpoint"]), "--llm-url", closed_port_url()]
    assert main(args + ["--abstain", "off", "--min-score", "0.25"]) == 2
    assert "no vLLM server" in capsys.readouterr().err  # the flags were accepted; the server is what is missing
    assert seen[-1]["abstain"] == "off" and seen[-1]["min_score"] == 0.25
    assert main(args) == 2 and "abstain" not in seen[-1] and "min_score" not in seen[-1]  # the pipeline's own
    assert main(args + ["--abstain", "off", "--set", "abstain=auto"]) == 2
    assert seen[-1]["abstain"] == "auto"  # --set comes last, as for --top-k
    capsys.readouterr()
    data = yaml.safe_load(Path(RAG).read_text())
    del data["metadata"]["rag_mag"]["parameters"]["abstain"]
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump(data))
    calls = len(seen)
    assert main(args + ["--pipeline", str(tmp_path / "plain.yaml"), "--abstain", "off"]) == 2
    err = capsys.readouterr().err
    assert "--abstain needs a pipeline that declares the short name 'abstain'" in err and "plain.yaml" in err
    assert len(seen) == calls  # refused before the pipeline was built
