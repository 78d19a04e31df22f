"""The rag-mag Haystack components on their own: embedders, corpus reader, multi-hop state, follow-up query,
the answer builder that says when the documents do not answer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from haystack import Document
from haystack.dataclasses import ChatMessage

from rag_mag.components import (
    CorpusReader,
    FollowUpQuery,
    HopAccumulator,
    RagMagDocumentEmbedder,
    RagMagTextEmbedder,
)
from rag_mag.components.answer_builder import RagMagAnswerBuilder, may_be_no_answer
from rag_mag.components.checkpoints import checkpoint_fingerprint, load_checkpoint
from rag_mag.components.document_embedder import document_text
from rag_mag.errors import CheckpointError, ConfigError, DataError
from tests.tiny import tiny_encoder


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ckpt")
    encoder = tiny_encoder(root / "tok", "qnorm", seed=3)
    encoder.config.document_norm_scale = 2.5
    return encoder.save(root / "qnorm")


def test_document_embedder_applies_the_document_treatment(checkpoint):
    documents = [Document(id="a", content="paris is the capital of france", meta={"title": "Paris"}),
                 Document(id="b", content="the river in germany")]
    embedder = RagMagDocumentEmbedder(model=str(checkpoint), batch_size=1, progress_bar=False, precision="fp32")
    out = embedder.run(documents)["documents"]
    encoder = load_checkpoint(checkpoint).encoder
    texts = ["Paris\nparis is the capital of france", "the river in germany"]
    assert [document_text(d) for d in documents] == texts
    expected = encoder.encode(texts, side="document", treated=True)
    raw = encoder.encode(texts, side="document", treated=False)
    np.testing.assert_allclose(np.array([d.embedding for d in out]), expected, rtol=1e-5, atol=1e-6)
    for document, raw_vector in zip(out, raw, strict=True):
        assert document.meta["embedding_raw_norm"] == pytest.approx(np.linalg.norm(raw_vector), rel=1e-5)
        assert document.meta["embedding_strategy"] == "qnorm"
        assert document.meta["embedding_checkpoint"] == checkpoint_fingerprint(checkpoint)
        # qnorm keeps the document magnitude, divided by the calibrated scale
        assert np.linalg.norm(document.embedding) == pytest.approx(np.linalg.norm(raw_vector) / 2.5, rel=1e-4)
    assert documents[0].embedding is None and "embedding_raw_norm" not in documents[0].meta  # inputs untouched
    assert out[0].meta["title"] == "Paris" and out[0].id == "a"


def test_document_embedder_errors(checkpoint, tmp_path):
    with pytest.raises(ValueError, match="batch_size"):
        RagMagDocumentEmbedder(model=str(checkpoint), batch_size=0)
    with pytest.raises(ValueError, match="model"):
        RagMagDocumentEmbedder(model="")
    embedder = RagMagDocumentEmbedder(model=str(checkpoint), progress_bar=False)
    with pytest.raises(TypeError, match="RagMagTextEmbedder"):
        embedder.run("a string")
    with pytest.raises(DataError, match="'empty'"):
        embedder.run([Document(id="empty", content="  ")])
    with pytest.raises(CheckpointError, match="does not exist"):
        RagMagDocumentEmbedder(model=str(tmp_path / "missing")).warm_up()


def test_text_embedder_applies_the_query_treatment(checkpoint):
    embedder = RagMagTextEmbedder(model=str(checkpoint))
    with pytest.raises(RuntimeError, match="warm_up"):
        _ = embedder.checkpoint
    out = embedder.run("capital of france")
    encoder = load_checkpoint(checkpoint).encoder
    np.testing.assert_allclose(out["embedding"], encoder.encode(["capital of france"], "query")[0], rtol=1e-5,
                               atol=1e-6)
    assert np.linalg.norm(out["embedding"]) == pytest.approx(1.0, rel=1e-5)  # qnorm normalizes the query
    raw = encoder.encode(["capital of france"], "query", treated=False)[0]
    assert out["meta"]["raw_norm"] == pytest.approx(np.linalg.norm(raw), rel=1e-5)
    assert out["meta"]["norm"] == pytest.approx(1.0, rel=1e-5)
    assert out["meta"]["strategy"] == "qnorm" and out["meta"]["checkpoint"] == checkpoint_fingerprint(checkpoint)
    with pytest.raises(DataError, match="empty"):
        embedder.run("   ")
    with pytest.raises(TypeError):
        embedder.run(["a list"])


def test_checkpoint_cache_reloads_changed_folders(checkpoint, tmp_path):
    assert load_checkpoint(checkpoint) is load_checkpoint(checkpoint)
    copy = tiny_encoder(tmp_path / "tok", "dot", seed=1).save(tmp_path / "ckpt")
    first = load_checkpoint(copy)
    tiny_encoder(tmp_path / "tok", "dot", seed=2).save(tmp_path / "ckpt")  # retrained in place
    second = load_checkpoint(copy)
    assert second is not first and second.fingerprint != first.fingerprint


def test_training_output_folder_uses_its_best_checkpoint(checkpoint, tmp_path):
    run_folder = tmp_path / "run"
    tiny_encoder(tmp_path / "tok", "dnorm").save(run_folder / "best")
    assert load_checkpoint(run_folder).strategy == "dnorm"


def test_corpus_reader(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps(r) for r in [{"id": "p1", "title": "Paris", "text": "capital"},
                                                        {"id": "p2", "title": "", "text": "river"},
                                                        {"id": "p3", "title": "Rome", "text": "italy"}]))
    documents = CorpusReader(path=str(corpus)).run()["documents"]
    assert [(d.id, d.content, d.meta) for d in documents] == [("p1", "capital", {"title": "Paris"}),
                                                             ("p2", "river", {}), ("p3", "italy", {"title": "Rome"})]
    assert len(CorpusReader(path=str(corpus), limit=2).run()["documents"]) == 2
    assert len(CorpusReader().run(path=str(corpus), limit=1)["documents"]) == 1
    with pytest.raises(ConfigError, match="path"):
        CorpusReader().run()
    with pytest.raises(DataError, match="does not exist"):
        CorpusReader(path=str(tmp_path / "nope.jsonl")).run()
    with pytest.raises(ValueError, match="limit"):
        CorpusReader(limit=0)


def _docs(*ids: str) -> list[Document]:
    return [Document(id=i, content=i, score=1.0) for i in ids]


def test_hop_accumulator_merges_rounds_and_counts():
    hops = HopAccumulator(max_hops=3, max_new_per_hop=2)
    first = hops.run(documents=_docs("a", "b", "c"), query="q1")
    assert [d.id for d in first["documents"]] == ["a", "b", "c"]  # the cap applies to later rounds only
    assert first["hop"] == 1 and first["remaining_hops"] == 2 and first["queries"] == ["q1"]
    assert all(d.meta["hop"] == 1 and d.meta["hop_query"] == "q1" for d in first["documents"])
    second = hops.run(documents=_docs("b", "d", "e", "f"), query="q2", previous_documents=first["documents"],
                      previous_queries=first["queries"])
    assert [d.id for d in second["documents"]] == ["a", "b", "c", "d", "e"]
    assert [d.meta["hop"] for d in second["documents"]] == [1, 1, 1, 2, 2]
    assert second["hop"] == 2 and second["remaining_hops"] == 1 and second["queries"] == ["q1", "q2"]
    assert HopAccumulator(max_hops=1).run(documents=_docs("a"), query="q")["remaining_hops"] == 0
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="max_hops"):
            HopAccumulator(max_hops=bad)


@pytest.mark.parametrize("reply, expected", [
    ("Query: birthplace of Ernest Jones", "birthplace of Ernest Jones"),
    ('"Ernest Jones birthplace"\nBecause the passage...', "Ernest Jones birthplace"),
    ("\n\n  search query - Freud museum founder  ", "Freud museum founder"),
    ("", "Who founded it?"),
    ("who founded it?", "Who founded it?"),  # a repeat of the question falls back to the question
])
def test_followup_query_cleaning(reply, expected):
    out = FollowUpQuery().run(replies=[ChatMessage.from_assistant(reply)], question="Who founded it?")
    assert out["query"] == expected


def test_followup_query_options():
    reply = [ChatMessage.from_assistant("x" * 500)]
    assert FollowUpQuery(max_chars=10).run(replies=reply, question="q")["query"] == "x" * 10
    combined = FollowUpQuery(include_question=True).run(replies=[ChatMessage.from_assistant("Jones")],
                                                        question="Who?")
    assert combined["query"] == "Who? Jones"
    assert FollowUpQuery().run(replies=[], question="Who?")["query"] == "Who?"
    with pytest.raises(ValueError, match="max_chars"):
        FollowUpQuery(max_chars=0)


@pytest.mark.parametrize("component", [
    RagMagDocumentEmbedder(model="some/ckpt", batch_size=8, progress_bar=False, title_key="name"),
    RagMagTextEmbedder(model="some/ckpt"),
    CorpusReader(path="c.jsonl", limit=5),
    HopAccumulator(max_hops=3, max_new_per_hop=1),
    FollowUpQuery(include_question=True, max_chars=50),
    RagMagAnswerBuilder(abstain="off", min_score=0.25),
], ids=lambda c: type(c).__name__)
def test_components_serialize_round_trip(component):
    data = component.to_dict()
    again = type(component).from_dict(data)
    assert again.to_dict() == data
    assert set(data["init_parameters"]) == {name for name in vars(component) if not name.startswith("_")}


# ------------------------------------------------------------------------------------------ the answer builder
def _built(builder: RagMagAnswerBuilder, reply: str, scores: tuple[float | None, ...] = (0.9, 0.4)):
    documents = [Document(id=f"d{i}", content=f"passage {i}", score=score) for i, score in enumerate(scores)]
    answers = builder.run(query="Who?", replies=[ChatMessage.from_assistant(reply)], documents=documents)["answers"]
    assert len(answers) == 1
    return answers[0]


@pytest.mark.parametrize("reply", ["unanswerable", " Unanswerable.", "Answer: unanswerable", "UNANSWERABLE\nno", ""])
def test_the_reader_abstaining_is_no_answer(reply):
    answer = _built(RagMagAnswerBuilder(), reply)
    assert answer.meta["answerable"] is False and answer.meta["abstained_by"] == "reader"
    assert answer.data == "unanswerable" and answer.meta["reply"] == reply
    assert [document.id for document in answer.documents] == ["d0", "d1"]  # the closest passages stay


@pytest.mark.parametrize("reply", ["Paris", "unanswerable question", "the unanswerable riddle of Paris"])
def test_a_reply_is_an_answer(reply):
    answer = _built(RagMagAnswerBuilder(), reply)
    assert answer.meta["answerable"] is True and "abstained_by" not in answer.meta
    assert answer.data == reply and answer.meta["reply"] == reply and answer.query == "Who?"


def test_a_score_floor_turns_a_reply_into_no_answer():
    floor = RagMagAnswerBuilder(min_score=0.5)
    assert _built(floor, "Paris", (0.9, 0.1)).meta["answerable"] is True  # the best passage counts
    answer = _built(floor, "Paris", (0.3, 0.2))
    assert answer.meta["answerable"] is False and answer.meta["abstained_by"] == "score"
    assert answer.data == "unanswerable" and answer.meta["reply"] == "Paris"
    assert _built(floor, "Paris", (None,)).meta["abstained_by"] == "score"  # no score: nothing to trust
    assert _built(floor, "Paris", ()).meta["abstained_by"] == "score"  # no passage at all
    assert _built(floor, "unanswerable", (0.9,)).meta["abstained_by"] == "reader"
    assert _built(RagMagAnswerBuilder(min_score=-1), "Paris", (-0.5,)).meta["answerable"] is True


@pytest.mark.parametrize("abstain", ["off", False])  # False: YAML's reading of a bare `off`
def test_abstain_off_keeps_every_reply_as_the_answer(abstain):
    builder = RagMagAnswerBuilder(abstain=abstain, min_score=0.5)
    assert builder.abstain == "off"
    for reply, scores in (("unanswerable", (0.9,)), ("Paris", (0.1,)), ("", (0.9,))):
        answer = _built(builder, reply, scores)
        assert answer.meta["answerable"] is True and answer.data == reply and "abstained_by" not in answer.meta


@pytest.mark.parametrize("values, message", [
    ({"abstain": "bogus"}, "abstain must be one of auto, off, got 'bogus'"),
    ({"abstain": True}, "abstain must be one of auto, off, got True"),
    ({"min_score": float("nan")}, "min_score must be a finite number or null, got nan"),
    ({"min_score": float("inf")}, "min_score must be a finite number or null, got inf"),
    ({"min_score": "0.5"}, "min_score must be a finite number or null, got '0.5'"),
    ({"min_score": True}, "min_score must be a finite number or null, got True"),
])
def test_answer_builder_settings_are_checked(values, message):
    with pytest.raises(ValueError, match=message):
        RagMagAnswerBuilder(**values)


def test_answer_builder_round_trips_its_settings():
    builder = RagMagAnswerBuilder(abstain=False, min_score=1)
    data = builder.to_dict()
    assert data["init_parameters"] == {"abstain": "off", "min_score": 1.0}
    again = RagMagAnswerBuilder.from_dict(data)
    assert (again.abstain, again.min_score) == ("off", 1.0)
    assert RagMagAnswerBuilder.from_dict(RagMagAnswerBuilder().to_dict()).min_score is None


@pytest.mark.parametrize("start, may", [
    ("", True), ("  ", True), ("u", True), (" Unans", True), ("unanswerable", True), ("Unanswerable.", True),
    ("Ans", True), ("Answer: unan", True), ("unanswerable\nbecause", True),
    ("P", False), ("un til", False), ("unanswerable question", False), ("Paris\n", False), ("The documents", False),
])
def test_a_reply_may_be_no_answer_while_it_begins_like_one(start, may):
    assert may_be_no_answer(start) is may
