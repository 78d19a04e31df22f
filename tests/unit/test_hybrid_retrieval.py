"""An index of files is searched by meaning and by keywords, fused by reciprocal rank (issue 60); each result keeps
its dense score; a corpus of passages stays dense unless asked."""

from __future__ import annotations

import numpy as np
import pytest
from haystack import Document

from rag_mag.components.faiss_document_store import FAISSDocumentStore
from rag_mag.components.faiss_retriever import RRF_K, FAISSEmbeddingRetriever
from rag_mag.components.keyword_index import file_keyword_texts, keyword_text
from rag_mag.retriever.bm25 import TextBM25


def _store(meta_key: str | None = "file") -> FAISSDocumentStore:
    """Three chunks: the dense side prefers n1 and n2; only k1 holds the question's rare words."""
    rows = [("n1", "General remarks about the product and its users.", [1.0, 0.0]),
            ("n2", "More general remarks about the product.", [0.95, 0.1]),
            ("k1", "The vacuum pump model VX-9 runs at 4200 rpm.", [0.3, 0.9])]
    store = FAISSDocumentStore()
    store.write_documents([Document(id=i, content=text, embedding=vector,
                                    meta={meta_key: f"{i}.txt"} if meta_key else {}) for i, text, vector in rows])
    return store


QUESTION = "At what rpm does the vacuum pump VX-9 run?"


def test_keyword_hits_find_the_rare_words_and_nothing_without_them():
    hits = _store().keyword_hits([QUESTION, "the and of"], top_k=5)
    assert [document.id for _, document, _ in hits[0]] == ["k1"]  # the others share no word but stop words
    assert hits[1] == []  # a question of stop words only matches nothing


def test_fusion_lifts_the_keyword_match_and_keeps_the_dense_score():
    dense = FAISSEmbeddingRetriever(document_store=_store(), top_k=2, hybrid="off")
    assert [d.id for d in dense.run(query_embedding=[1.0, 0.0], query=QUESTION)["documents"]] == ["n1", "n2"]
    hybrid = FAISSEmbeddingRetriever(document_store=_store(), top_k=2)  # auto: these are chunks of files
    documents = hybrid.run(query_embedding=[1.0, 0.0], query=QUESTION)["documents"]
    # n1: dense rank 1 only, 1/61; k1: dense rank 3 and keyword rank 1, 1/63 + 1/61
    assert [d.id for d in documents] == ["k1", "n1"]
    assert documents[0].score == pytest.approx(0.3)  # the strategy's own score, not the fused one
    assert documents[0].meta["keyword_rank"] == 1 and "keyword_rank" not in documents[1].meta
    # and k1.txt is the only file BM25 finds, so k1 is also first in the files' list
    assert documents[0].meta["file_rank"] == 1 and "file_rank" not in documents[1].meta
    assert documents[0].meta["fused_score"] == pytest.approx(1 / (RRF_K + 3) + 1 / (RRF_K + 1) + 1 / (RRF_K + 1))


def test_without_the_question_text_the_ranking_is_dense():
    retriever = FAISSEmbeddingRetriever(document_store=_store(), top_k=2)
    assert [d.id for d in retriever.run(query_embedding=[1.0, 0.0])["documents"]] == ["n1", "n2"]


def test_auto_leaves_a_corpus_of_passages_dense_and_on_fuses_it():
    auto = FAISSEmbeddingRetriever(document_store=_store(meta_key=None), top_k=2)
    assert [d.id for d in auto.run(query_embedding=[1.0, 0.0], query=QUESTION)["documents"]] == ["n1", "n2"]
    on = FAISSEmbeddingRetriever(document_store=_store(meta_key=None), top_k=2, hybrid="on")
    assert [d.id for d in on.run(query_embedding=[1.0, 0.0], query=QUESTION)["documents"]] == ["k1", "n1"]


def test_filters_hold_for_the_keyword_half_too():
    retriever = FAISSEmbeddingRetriever(document_store=_store(), top_k=2)
    documents = retriever.run(query_embedding=[1.0, 0.0], query=QUESTION,
                              filters={"field": "meta.file", "operator": "in", "value": ["n1.txt", "n2.txt"]})
    assert [d.id for d in documents["documents"]] == ["n1", "n2"]


def test_the_keyword_index_follows_writes_and_deletes():
    store = _store()
    assert [d.id for _, d, _ in store.keyword_hits([QUESTION], 5)[0]] == ["k1"]
    store.write_documents([Document(id="k2", content="Pump VX-9 maintenance: oil every 500 hours.",
                                    embedding=[0.0, 1.0], meta={"file": "k2.txt"})])
    assert {d.id for _, d, _ in store.keyword_hits([QUESTION], 5)[0]} == {"k1", "k2"}
    store.delete_documents(["k1"])
    assert [d.id for _, d, _ in store.keyword_hits([QUESTION], 5)[0]] == ["k2"]


def test_keyword_text_reads_the_title_and_heading_with_the_text():
    document = Document(content="Runs at 4200 rpm.", meta={"title": "pump manual", "heading": "Speed", "file": "a"})
    assert keyword_text(document) == "pump manual pump manual pump manual Speed Runs at 4200 rpm."  # weight 3
    assert keyword_text(Document(content="Runs.")) == "Runs."
    assert np.argmax(TextBM25([keyword_text(document), "other words"]).scores("manual speed")) == 0


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_hybrid_must_be_auto_on_or_off(value):
    with pytest.raises(ValueError, match="hybrid must be one of auto, on, off"):
        FAISSEmbeddingRetriever(document_store=FAISSDocumentStore(), hybrid=value)


def test_yaml_booleans_read_as_on_and_off_and_the_setting_round_trips():
    assert FAISSEmbeddingRetriever(document_store=FAISSDocumentStore(), hybrid=False).hybrid == "off"
    retriever = FAISSEmbeddingRetriever(document_store=FAISSDocumentStore(), hybrid=True)
    assert FAISSEmbeddingRetriever.from_dict(retriever.to_dict()).hybrid == "on"


def test_a_large_top_k_is_filled_from_both_lists():
    store = FAISSDocumentStore()
    rng = np.random.default_rng(0)
    store.write_documents([Document(id=f"d{i}", content=f"passage {i} about pumps" if i % 2 else f"passage {i}",
                                    embedding=rng.normal(size=4).tolist(), meta={"file": f"{i}.txt"})
                           for i in range(300)])
    documents = FAISSEmbeddingRetriever(document_store=store, top_k=120).run(query_embedding=[1.0, 0, 0, 0],
                                                                              query="pumps")["documents"]
    assert len(documents) == 120 and len({d.id for d in documents}) == 120
    assert sum("keyword_rank" in d.meta for d in documents) > 50  # BM25 gave more than the default 50 candidates


def _filings() -> FAISSDocumentStore:
    """Two filings whose names do not say whose they are; each says so once, on its cover, and then speaks of "the
    Company". The dense side prefers m1; keyword search finds a2 and m1 alike (a2 first, by row)."""
    rows = [("a1", "a.pdf", "Apple Inc. quarterly report, cover page.", [0.0, 1.0]),
            ("a2", "a.pdf", "The Company's operating expenses rose by 10 percent.", [0.8, 0.2]),
            ("m1", "m.pdf", "The Company's operating expenses rose by 12 percent.", [1.0, 0.0]),
            ("m2", "m.pdf", "Microsoft Corporation quarterly report, cover page.", [0.1, 1.0])]
    store = FAISSDocumentStore()
    store.write_documents([Document(id=i, content=text, embedding=vector,
                                    meta={"file": file, "title": f"2023 Q3 {file[0].upper()}"})
                           for i, file, text, vector in rows])
    return store


APPLE = "What were Apple's operating expenses?"


def test_the_file_a_question_is_about_lifts_its_chunks():
    store = _filings()
    assert store.file_keyword_scores(APPLE).keys() == {"a.pdf", "m.pdf"}  # both speak of operating expenses
    assert store.file_keyword_scores(APPLE)["a.pdf"] > store.file_keyword_scores(APPLE)["m.pdf"]  # Apple: a.pdf
    documents = FAISSEmbeddingRetriever(document_store=store, top_k=4).run(query_embedding=[1.0, 0.0],
                                                                            query=APPLE)["documents"]
    # dense and keyword alone tie a2 with m1 (ranks 2 + 1 and 1 + 2) and keep dense order, m1 first; the files'
    # list puts a.pdf first, so a2 leads
    assert [d.id for d in documents[:2]] == ["a2", "m1"]
    assert documents[0].meta["fused_score"] - 1 / (RRF_K + 1) == pytest.approx(
        documents[1].meta["fused_score"] - 1 / (RRF_K + 2))
    assert documents[0].score == pytest.approx(0.8)  # still the strategy's own score
    # every chunk of a file has its file's rank
    assert {d.id: d.meta["file_rank"] for d in documents} == {"a1": 1, "a2": 1, "m1": 2, "m2": 2}


def test_the_files_list_ranks_only_the_files_that_filters_let_through():
    documents = FAISSEmbeddingRetriever(document_store=_filings(), top_k=4).run(
        query_embedding=[1.0, 0.0], query=APPLE,
        filters={"field": "meta.file", "operator": "==", "value": "m.pdf"})["documents"]
    assert [d.id for d in documents] == ["m1", "m2"] and documents[0].meta["file_rank"] == 1


def test_file_keyword_texts_and_scores_follow_the_files():
    store = _filings()
    texts = file_keyword_texts(store.filter_documents() + [Document(content="a passage of no file")])
    assert list(texts) == ["a.pdf", "m.pdf"]  # a Document without a file is no file
    assert texts["a.pdf"].startswith("2023 Q3 A 2023 Q3 A 2023 Q3 A ")  # the title, weighted as in keyword_text
    assert "Apple Inc." in texts["a.pdf"] and "operating expenses" in texts["a.pdf"]
    store.delete_documents(["a1"])  # a.pdf no longer says whose it is
    scores = store.file_keyword_scores(APPLE)
    assert scores["a.pdf"] == pytest.approx(scores["m.pdf"], rel=0.2)
    assert FAISSDocumentStore().file_keyword_scores(APPLE) == {}
