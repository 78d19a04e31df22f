"""Chunks of files that say the same thing are one result that cites every file (issue 60); corpus passages never
merge."""

from __future__ import annotations

import pytest
from haystack import Document

from rag_mag.components.faiss_document_store import FAISSDocumentStore
from rag_mag.components.faiss_retriever import FAISSEmbeddingRetriever, duplicate_key
from rag_mag.metrics.files import file_at_k
from rag_mag.serving.answers import citation, source_reports

LEGAL = "Forward-looking statements involve risks and uncertainties."


def _store(documents: list[tuple[str, str, dict, list[float]]]) -> FAISSDocumentStore:
    store = FAISSDocumentStore()
    store.write_documents([Document(id=i, content=text, meta=meta, embedding=vector)
                           for i, text, meta, vector in documents])
    return store


def _files_store() -> FAISSDocumentStore:
    return _store([
        ("a1", LEGAL, {"file": "2023 Q1.pdf", "page": 3}, [1.0, 0.0]),
        ("b1", "forward looking statements  involve RISKS and uncertainties", {"file": "2023 Q2.pdf", "page": 4},
         [0.99, 0.1]),
        ("c1", LEGAL, {"file": "2023 Q3.pdf", "page": 2}, [0.98, 0.15]),
        ("a2", "Net sales were $94,836 million.", {"file": "2023 Q1.pdf", "page": 5}, [0.9, 0.3]),
        ("b2", "Net sales were $81,797 million.", {"file": "2023 Q2.pdf", "page": 5}, [0.85, 0.4]),
    ])


def test_copies_of_one_text_are_one_result_citing_every_file_and_the_slots_go_to_other_texts():
    retriever = FAISSEmbeddingRetriever(document_store=_files_store(), top_k=3)
    documents = retriever.run(query_embedding=[1.0, 0.0])["documents"]
    assert [d.id for d in documents] == ["a1", "a2", "b2"]  # the three copies take one slot
    assert documents[0].meta["also_in"] == [{"id": "b1", "file": "2023 Q2.pdf", "page": 4},
                                            {"id": "c1", "file": "2023 Q3.pdf", "page": 2}]
    assert "also_in" not in documents[1].meta  # same words, other figures: another text
    source = source_reports(documents)[0]
    assert citation(source) == "2023 Q1.pdf, page 3; also in 2023 Q2.pdf, page 4, 2023 Q3.pdf, page 2"
    unmerged = FAISSEmbeddingRetriever(document_store=_files_store(), top_k=3, merge_duplicates=False)
    assert [d.id for d in unmerged.run(query_embedding=[1.0, 0.0])["documents"]] == ["a1", "b1", "c1"]


def test_corpus_passages_of_the_same_text_stay_apart():
    store = _store([("p1", LEGAL, {"title": "A"}, [1.0, 0.0]), ("p2", LEGAL, {"title": "B"}, [0.9, 0.1])])
    documents = FAISSEmbeddingRetriever(document_store=store, top_k=2).run(query_embedding=[1.0, 0.0])["documents"]
    assert [d.id for d in documents] == ["p1", "p2"] and all("also_in" not in d.meta for d in documents)


def test_the_duplicate_key_ignores_case_punctuation_and_spacing_only():
    assert duplicate_key("Net sales, $94,836!") == duplicate_key("net  SALES 94 836")
    assert duplicate_key("Net sales 94,836") != duplicate_key("Net sales 81,797")


def test_a_result_that_cites_several_files_counts_for_each_of_them():
    assert file_at_k([("a.pdf", "b.pdf"), "c.pdf"], ["b.pdf"], 1) == 1.0
    assert file_at_k([("a.pdf",), "c.pdf"], ["b.pdf"], 2) == 0.0


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_merge_duplicates_must_be_a_boolean(value):
    with pytest.raises(ValueError, match="merge_duplicates"):
        FAISSEmbeddingRetriever(document_store=FAISSDocumentStore(), merge_duplicates=value)


def test_the_setting_round_trips():
    retriever = FAISSEmbeddingRetriever(document_store=FAISSDocumentStore(), merge_duplicates=False)
    assert FAISSEmbeddingRetriever.from_dict(retriever.to_dict()).merge_duplicates is False
