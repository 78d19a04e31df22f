"""Qdrant's dot product on real vectors: the packaged MiniLM under qnorm, the bundled sample corpus.

The sample corpus is embedded once by RagMagDocumentEmbedder and written both to rag-mag's exact FAISS
store and to an embedded Qdrant collection with similarity dot_product; every sample question (and every
passage title, as a second set of queries) is embedded by RagMagTextEmbedder. Both engines must return the
same top-10 passages in the same order with the same scores. A cosine collection, which normalizes the
document vectors, must rank differently: the qnorm ranking depends on the document norms.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from haystack import Document
from haystack_integrations.components.retrievers.qdrant import QdrantEmbeddingRetriever
from haystack_integrations.document_stores.qdrant import QdrantDocumentStore

from rag_mag.components.document_embedder import RagMagDocumentEmbedder
from rag_mag.components.faiss_document_store import FAISSDocumentStore
from rag_mag.components.faiss_retriever import FAISSEmbeddingRetriever
from rag_mag.components.index_export import qdrant_store
from rag_mag.components.text_embedder import RagMagTextEmbedder
from rag_mag.models import REPO_ROOT
from rag_mag.retriever.encoder import MagnitudeEncoder

pytestmark = pytest.mark.integration

SAMPLE = REPO_ROOT / "data" / "sample"
TOP_K = 10


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    checkpoint = MagnitudeEncoder.build(strategy="qnorm").save(tmp_path_factory.mktemp("minilm") / "qnorm")
    rows = [json.loads(line) for line in (SAMPLE / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
    corpus = [Document(id=row["id"], content=row["text"], meta={"title": row["title"]}) for row in rows]
    documents = RagMagDocumentEmbedder(model=str(checkpoint), progress_bar=False).run(corpus)["documents"]
    dim = len(documents[0].embedding)
    faiss_store = FAISSDocumentStore()
    faiss_store.write_documents(documents)
    dot_store = qdrant_store(dim, progress_bar=False)
    dot_store.write_documents(documents)
    cosine_store = QdrantDocumentStore(":memory:", embedding_dim=dim, similarity="cosine", progress_bar=False)
    cosine_store.write_documents(documents)
    questions = [json.loads(line)["question"]
                 for line in (SAMPLE / "questions.jsonl").read_text(encoding="utf-8").splitlines()]
    queries = questions + sorted({row["title"] for row in rows})
    query_embeddings, _ = RagMagTextEmbedder(model=str(checkpoint)).embed(queries)  # (m, dim), treated
    yield {"documents": documents, "faiss": faiss_store, "dot": dot_store, "cosine": cosine_store,
           "queries": query_embeddings}
    dot_store.close()
    cosine_store.close()


def test_the_sample_vectors_have_varied_norms(engines):
    document_norms = np.linalg.norm([d.embedding for d in engines["documents"]], axis=1)
    assert document_norms.std() / document_norms.mean() > 0.02  # raw MiniLM passages: qnorm keeps these
    np.testing.assert_allclose(np.linalg.norm(engines["queries"], axis=1), 1.0, rtol=1e-5)  # qnorm: unit queries
    assert len(engines["queries"]) > 100


def test_qdrant_dot_product_ranks_exactly_as_faiss_under_qnorm(engines):
    faiss_retriever = FAISSEmbeddingRetriever(engines["faiss"], top_k=TOP_K)
    dot_retriever = QdrantEmbeddingRetriever(engines["dot"], top_k=TOP_K)
    cosine_retriever = QdrantEmbeddingRetriever(engines["cosine"], top_k=TOP_K)
    cosine_differs = 0
    for query in engines["queries"]:
        expected = faiss_retriever.run(query.tolist())["documents"]
        found = dot_retriever.run(query.tolist())["documents"]
        assert [d.id for d in found] == [d.id for d in expected]
        np.testing.assert_allclose([d.score for d in found], [d.score for d in expected], rtol=1e-5, atol=1e-6)
        cosine_differs += [d.id for d in cosine_retriever.run(query.tolist())["documents"]] != \
            [d.id for d in expected]
    # Measured: the top-10 of a cosine collection differs for most queries; the norms change the ranking.
    assert cosine_differs > len(engines["queries"]) // 4
