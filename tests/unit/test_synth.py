"""``rag-mag synth``'s logic on a tiny folder, with a tiny random BERT as the base retriever and the two generation
steps given as functions (the integration tier runs the real writer and reader on vLLM)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rag_mag.adapt.synth import SynthSettings, synthesize
from rag_mag.errors import ConfigError
from tests.tiny import tiny_encoder

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()


def make_folder(root: Path, files: int = 6) -> Path:
    folder = root / "docs"
    folder.mkdir()
    for number in range(files):
        paragraphs = []
        for part in range(2):
            name = f"{WORDS[number]}{part}"
            paragraphs.append(f"# {name}\n\n" + " ".join(f"{name} was born in the year {1900 + number * 10 + part} "
                                                            f"in the city of {WORDS[-1 - number]}." for _ in range(6)))
        (folder / f"file{number}.md").write_text("\n\n".join(paragraphs) + "\n")
    return folder


def passage_of(messages: list[dict]) -> str:
    return messages[-1]["content"]


class Writer:
    """Writes "when was NAME born?" / the year; for one chunk an unparsable reply, for another a foreign answer."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, prompts: list[list[dict]]) -> list[str]:
        self.calls += len(prompts)
        replies = []
        for messages in prompts:
            text = passage_of(messages)
            name, year = re.search(r"(\w+) was born in the year (\d+)", text).groups()
            if name == "alpha0":
                replies.append("I cannot write a question.")
            elif name == "bravo0":
                replies.append(f"Question: when was {name} born?\nAnswer: 1066")
            else:
                replies.append(f"Question: when was {name} born?\nAnswer: {year}")
        return replies


def reader(prompts: list[list[dict]]) -> list[str]:
    """Answers with the year in the passage, except for charlie0's question (a different span)."""
    answers = []
    for messages in prompts:
        text = passage_of(messages)
        answers.append("the city" if "when was charlie0" in text else re.search(r"year (\d+)", text).group(1))
    return answers


@pytest.fixture()
def corpus(tmp_path):
    base = tiny_encoder(tmp_path / "tok", "cosine", seed=1).save(tmp_path / "base")
    return make_folder(tmp_path), base


def test_synth_keeps_round_trips_only_and_records_provenance(tmp_path, corpus):
    folder, base = corpus
    settings = SynthSettings(chunks=100, min_words=10, base_top_k=1000, base_model=str(base))
    out = synthesize(str(folder), tmp_path / "pairs", settings=settings, progress=False,
                     writer_generate=Writer(), reader_generate=reader)
    manifest = json.loads((out / "synth.json").read_text())
    counts = manifest["counts"]
    assert counts["sampled"] == 12 and counts["chunks"] == 12
    assert counts["unparsed"] == 1 and counts["answer_not_in_chunk"] == 1 and counts["reader_disagrees"] == 1
    assert counts["kept"] == 9
    pairs = [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]
    corpus_rows = {row["id"]: row for row in map(json.loads, (out / "corpus.jsonl").read_text().splitlines())}
    assert len(pairs) == 9 and len(corpus_rows) == 12
    for pair in pairs:
        chunk = corpus_rows[pair["chunk_id"]]
        assert pair["positives"][0]["id"] == pair["chunk_id"] and pair["file"] == chunk["file"]
        assert pair["answers"][0] in chunk["text"] and pair["checks"]["reader_answer"] == pair["answers"][0]
        assert all(n["id"] != pair["chunk_id"] and pair["answers"][0] not in n["text"]
                   for n in pair["hard_negatives"])
        assert len(pair["hard_negatives"]) == 4
    assert not any("alpha0" in p["query"] or "bravo0" in p["query"] or "charlie0" in p["query"] for p in pairs)


def test_synth_resumes_without_asking_again_and_refuses_other_settings(tmp_path, corpus, monkeypatch):
    folder, base = corpus
    settings = SynthSettings(chunks=100, min_words=10, base_top_k=1000, base_model=str(base))
    writer = Writer()
    synthesize(str(folder), tmp_path / "pairs", settings=settings, progress=False, writer_generate=writer,
               reader_generate=reader)
    assert writer.calls == 12
    def pairs_read() -> list[tuple]:
        rows = map(json.loads, (tmp_path / "pairs" / "pairs.jsonl").read_text().splitlines())
        return [(row["id"], row["query"], row["chunk_id"], row["checks"]["reader_answer"]) for row in rows]

    pairs = pairs_read()

    def no_server(*args, **kwargs):
        raise AssertionError("a server was started although every question was written and answered")

    monkeypatch.setattr("rag_mag.adapt.synth.served", no_server)
    synthesize(str(folder), tmp_path / "pairs", settings=settings, progress=False)
    assert pairs_read() == pairs  # the same pairs, nothing asked again
    with pytest.raises(ConfigError, match="other settings"):
        synthesize(str(folder), tmp_path / "pairs", settings=SynthSettings(chunks=5, min_words=10,
                                                                             base_model=str(base)),
                   progress=False, writer_generate=writer, reader_generate=reader)


def test_synth_base_rank_check_rejects_chunks_the_base_cannot_find(tmp_path, corpus):
    folder, base = corpus
    settings = SynthSettings(chunks=100, min_words=10, base_top_k=1, base_model=str(base))
    out = synthesize(str(folder), tmp_path / "pairs", settings=settings, progress=False,
                     writer_generate=Writer(), reader_generate=reader)
    counts = json.loads((out / "synth.json").read_text())["counts"]
    pairs = [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]
    assert counts["base_rank_beyond_k"] >= 1  # a random tiny BERT does not put every chunk first
    assert all(pair["checks"]["base_rank"] == 1 for pair in pairs)
    assert counts["kept"] + counts["base_rank_beyond_k"] + counts["reader_disagrees"] == 10  # 2 failed earlier


def test_synth_settings_refuse_bad_values():
    with pytest.raises(ConfigError, match="min_agreement"):
        SynthSettings(min_agreement=1.5)
    with pytest.raises(ConfigError, match="chunks"):
        SynthSettings(chunks=0)
