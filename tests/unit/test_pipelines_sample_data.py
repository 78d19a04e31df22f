"""The bundled sample in data/sample: readable, small, self-consistent, and no training leak."""

from __future__ import annotations

import re
import string
import subprocess
import sys
from pathlib import Path

import pytest

from rag_mag.data import read_corpus, read_eval, read_triples
from rag_mag.models import REPO_ROOT

SAMPLE = REPO_ROOT / "data" / "sample"
SHARED = Path("/work/shared/data")


def normalize(text: str) -> str:
    text = "".join(char for char in text.lower() if char not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def test_sample_files_are_readable_and_small():
    corpus = read_corpus(SAMPLE / "corpus.jsonl")
    questions = read_eval(SAMPLE / "questions.jsonl")
    triples = read_triples(SAMPLE / "train_triples.jsonl")
    assert 300 <= len(corpus) <= 600 and 30 <= len(questions) <= 50 and 200 <= len(triples) <= 600
    assert sum(p.stat().st_size for p in SAMPLE.rglob("*") if p.is_file()) < 3_000_000
    assert (REPO_ROOT / "data" / "README.md").read_text().count("CC BY-SA") >= 2
    corpus_ids = {p.id for p in corpus}
    assert all(context.id in corpus_ids for record in questions for context in record.contexts)
    assert all(triple.positives and triple.hard_negatives for triple in triples)


def test_training_rows_do_not_overlap_the_sample_questions():
    questions = read_eval(SAMPLE / "questions.jsonl")
    triples = read_triples(SAMPLE / "train_triples.jsonl")
    assert not {r.id for r in questions} & {t.id for t in triples}
    assert not {normalize(r.question) for r in questions} & {normalize(t.query) for t in triples}


@pytest.mark.skipif(not SHARED.is_dir(), reason="the full data (shared/data) is not on this machine")
def test_the_cutting_script_reproduces_the_sample(tmp_path):
    subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "make_sample_data.py"), "--shared", str(SHARED),
                    "--out", str(tmp_path)], check=True, capture_output=True)
    for name in ("corpus.jsonl", "questions.jsonl", "train_triples.jsonl"):
        assert (tmp_path / name).read_bytes() == (SAMPLE / name).read_bytes(), name
