"""JSONL readers and the CLI's promised errors."""

import gzip
import json

import numpy as np
import pytest

from rag_mag.cli.main import main
from rag_mag.data import read_corpus, read_eval, read_pairs, read_triples, write_jsonl
from rag_mag.errors import DataError
from tests.tiny import tiny_encoder


def test_readers_accept_the_shared_schema_and_gzip(tmp_path):
    with gzip.open(tmp_path / "t.jsonl.gz", "wt") as handle:
        handle.write(json.dumps({"query": "q", "positives": [{"id": "p", "title": "T", "text": "x"}],
                                 "hard_negatives": ["plain string negative"], "answers": ["a"]}) + "\n")
    triple = read_triples(tmp_path / "t.jsonl.gz")[0]
    assert triple.positives[0].content == "T\nx" and triple.hard_negatives[0].text == "plain string negative"
    write_jsonl(tmp_path / "e.jsonl", [{"id": 1, "question": "q?", "answers": ["a", "b"],
                                        "contexts": [{"id": "c", "title": "", "text": "t", "is_supporting": True}]}])
    assert read_eval(tmp_path / "e.jsonl")[0].supporting_ids == ("c",)
    write_jsonl(tmp_path / "p.jsonl", [{"idx": 7, "question": "q?", "answer": "a"}])
    assert read_pairs(tmp_path / "p.jsonl")[0].answers == ("a",)


@pytest.mark.parametrize("content, message", [
    ('{"id": "1", "title": "t", "text": "x"}\nnot json\n', r"c.jsonl:2: not valid JSON"),
    ('{"id": "1", "title": "t"}\n', r"c.jsonl:1: missing field 'text'"),
    ('[1, 2]\n', r"c.jsonl:1: expected a JSON object"),
    ('{"id": "1", "text": "x"}\n{"id": "1", "text": "y"}\n', r"c.jsonl:2: duplicate passage id"),
    ('', r"holds no passages"),
])
def test_corpus_errors_name_file_and_line(tmp_path, content, message):
    (tmp_path / "c.jsonl").write_text(content)
    with pytest.raises(DataError, match=message):
        read_corpus(tmp_path / "c.jsonl")


def test_cli_reports_bad_paths_and_strategies_without_traceback(tmp_path, capsys):
    assert main(["train", "--strategy", "cosin", "--train-data", "x", "--out", "y"]) == 2
    assert "valid strategies are: cosine, dot, qnorm, dnorm, learnable" in capsys.readouterr().err
    assert main(["train", "--train-data", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "missing.jsonl does not exist" in capsys.readouterr().err
    assert main(["encode", "--retriever", str(tmp_path / "none"), "--text", "x", "--out", "o"]) == 2
    assert "rag-mag train" in capsys.readouterr().err
    assert main(["crossover", "eval/configs/crossover.yaml", "--rebuild", "--rebuild-tolerance", "-1"]) == 2
    assert "--rebuild-tolerance must be 0 or more points, got -1.0" in capsys.readouterr().err


def test_train_reads_a_yaml_config_and_flags_override_it(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("strategy: dnorm\nsteps: 0\n")
    assert main(["train", "--config", str(tmp_path / "c.yaml"), "--train-data", "x", "--out", "y"]) == 2
    assert "steps must be a positive integer" in capsys.readouterr().err
    (tmp_path / "bad.yaml").write_text("strategy: dnorm\nstepz: 3\n")
    assert main(["train", "--config", str(tmp_path / "bad.yaml")]) == 2
    assert "unknown training config field(s): stepz" in capsys.readouterr().err


def test_encode_writes_treated_vectors_and_raw_norms(tmp_path):
    tiny_encoder(tmp_path, "qnorm").save(tmp_path / "ck")
    write_jsonl(tmp_path / "corpus.jsonl", [{"id": "a", "title": "paris", "text": "the capital of france"},
                                            {"id": "b", "title": "", "text": "a river"}])
    assert main(["encode", "--retriever", str(tmp_path / "ck"), "--text", "who wrote the book",
                 "--out", str(tmp_path / "q")]) == 0
    queries = np.load(tmp_path / "q.npz")
    np.testing.assert_allclose(np.linalg.norm(queries["embeddings"], axis=1), 1.0, rtol=1e-5)  # qnorm: unit query
    assert main(["encode", "--retriever", str(tmp_path / "ck"), "--corpus", str(tmp_path / "corpus.jsonl"),
                 "--out", str(tmp_path / "d.npz")]) == 0
    documents = np.load(tmp_path / "d.npz")
    assert list(documents["ids"]) == ["a", "b"]
    np.testing.assert_allclose(np.linalg.norm(documents["embeddings"], axis=1), documents["norms"], rtol=1e-5)


def test_train_help_states_each_default_once(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "(default: None)" not in text
    assert "optimizer steps (default: 200)" in text and "(default: 'one_se')" in text
    assert "earliest within one standard error" in text


@pytest.mark.parametrize("command", ["mine", "build-data", "encode", "index", "export-index", "ask", "run", "bench",
                                     "crossover", "serve", "serve-llm", "quickstart"])
def test_every_help_states_a_default_at_most_once_and_never_none(capsys, command: str):
    import re

    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in text
    # one entry per flag: from one "  --flag" to the next
    for entry in re.split(r" (?=--?[a-z][a-z-]* )", text):
        assert entry.count("(default") <= 1, entry


@pytest.mark.parametrize("command", ["crossover", "bench"])
def test_only_takes_several_names_after_one_flag_or_repeated(command):
    import argparse
    import importlib

    parser = argparse.ArgumentParser()
    importlib.import_module(f"rag_mag.cli.{command}").add_parser(parser.add_subparsers())
    both = parser.parse_args([command, "c.yaml", "--only", "a", "b", "--only", "c"])
    assert both.only == ["a", "b", "c"]  # a repeated flag adds to the list, it does not replace it
    assert parser.parse_args([command, "c.yaml"]).only is None
