"""Qdrant as the vector database instead of FAISS: dot product ranks exactly as FAISS inner product.

Real components throughout: Qdrant's embedded engine (qdrant-client local mode, installed by the vectordb
extra), its Haystack retriever, rag-mag's FAISS store, ScoreExplainer, export_index and the YAML pipelines.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from haystack import Document, Pipeline, component
from haystack.dataclasses import ChatMessage
from haystack_integrations.components.retrievers.qdrant import QdrantEmbeddingRetriever
from haystack_integrations.document_stores.qdrant import QdrantDocumentStore

from rag_mag.cli.main import main
from rag_mag.components.document_embedder import CHECKPOINT_KEY, RAW_NORM_KEY, STRATEGY_KEY
from rag_mag.components.faiss_document_store import FAISSDocumentStore
from rag_mag.components.faiss_retriever import FAISSEmbeddingRetriever
from rag_mag.components.index_export import export_index, qdrant_store
from rag_mag.components.score_explainer import ScoreExplainer
from rag_mag.errors import CheckpointError, ConfigError, DataError
from rag_mag.serving.pipelines import (
    ALLOWED_MODULES,
    PIPELINES_DIR,
    apply_overrides,
    load_pipeline,
    named_outputs,
    read_pipeline_dict,
    run_pipeline,
)
from tests.local import closed_port_url
from tests.tiny import tiny_encoder

DIM = 24
TOP_K = 10
PARTS = ("cosine", "query_norm", "document_norm", "document_raw_norm", "query_raw_norm")


@component
class FixedReply:
    """A stand-in for VLLMChatGenerator: always the same reply."""

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage]) -> dict:
        return {"replies": [ChatMessage.from_assistant("Paris")]}




def varied_norm_documents(count: int = 400, seed: int = 0) -> list[Document]:
    """Random directions with norms spread over e^-2 .. e^2 (a factor of 55), as treated by qnorm/dot."""
    rng = np.random.default_rng(seed)
    directions = rng.normal(size=(count, DIM))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    vectors = directions * np.exp(rng.uniform(-2.0, 2.0, size=(count, 1)))  # (count, DIM)
    return [Document(id=f"doc{i}", content=f"passage {i}", embedding=vector.astype(np.float32).tolist(),
                     meta={RAW_NORM_KEY: float(np.linalg.norm(vector)), CHECKPOINT_KEY: "ckpt-a",
                           STRATEGY_KEY: "qnorm"})
            for i, vector in enumerate(vectors)]


def unit_queries(count: int = 60, seed: int = 1) -> np.ndarray:
    """qnorm's queries: unit vectors (m, DIM)."""
    queries = np.random.default_rng(seed).normal(size=(count, DIM)).astype(np.float32)
    return queries / np.linalg.norm(queries, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def stores():
    documents = varied_norm_documents()
    faiss_store = FAISSDocumentStore()
    faiss_store.write_documents(documents)
    dot_store = qdrant_store(DIM, progress_bar=False)
    dot_store.write_documents(documents)
    cosine_store = QdrantDocumentStore(":memory:", embedding_dim=DIM, similarity="cosine", progress_bar=False)
    cosine_store.write_documents(documents)
    yield {"documents": documents, "faiss": faiss_store, "dot": dot_store, "cosine": cosine_store}
    dot_store.close()
    cosine_store.close()


def test_dot_product_stores_the_vectors_unnormalized_and_cosine_does_not(stores):
    norms = {d.id: np.linalg.norm(d.embedding) for d in stores["documents"]}
    dot_norms = {d.id: np.linalg.norm(d.embedding) for d in stores["dot"].filter_documents()}
    cosine_norms = np.array([np.linalg.norm(d.embedding) for d in stores["cosine"].filter_documents()])
    assert dot_norms.keys() == norms.keys()
    np.testing.assert_allclose([dot_norms[k] for k in norms], list(norms.values()), rtol=1e-6)
    assert max(norms.values()) / min(norms.values()) > 20
    np.testing.assert_allclose(cosine_norms, 1.0, rtol=1e-5)  # Qdrant's Cosine normalizes on upsert


def test_dot_product_ranks_and_scores_as_faiss_exact_search(stores):
    faiss_retriever = FAISSEmbeddingRetriever(stores["faiss"], top_k=TOP_K)
    dot_retriever = QdrantEmbeddingRetriever(stores["dot"], top_k=TOP_K)
    cosine_retriever = QdrantEmbeddingRetriever(stores["cosine"], top_k=TOP_K)
    cosine_differs = 0
    for query in unit_queries():
        expected = faiss_retriever.run(query.tolist())["documents"]
        found = dot_retriever.run(query.tolist())["documents"]
        assert [d.id for d in found] == [d.id for d in expected]
        np.testing.assert_allclose([d.score for d in found], [d.score for d in expected], rtol=1e-5, atol=1e-6)
        cosine_differs += [d.id for d in cosine_retriever.run(query.tolist())["documents"]] != [d.id for d in expected]
    # The ranking is the document norms' doing: with them normalized away it is a different ranking.
    assert cosine_differs == len(unit_queries())


def test_dot_strategy_queries_with_their_own_norms_rank_alike(stores):
    faiss_retriever = FAISSEmbeddingRetriever(stores["faiss"], top_k=TOP_K)
    dot_retriever = QdrantEmbeddingRetriever(stores["dot"], top_k=TOP_K)
    scales = np.exp(np.random.default_rng(2).uniform(-1.5, 1.5, size=(20, 1)))
    for query in unit_queries(20) * scales:  # dot: the query keeps its (scaled) norm too
        expected = faiss_retriever.run(query.tolist())["documents"]
        found = dot_retriever.run(query.tolist())["documents"]
        assert [d.id for d in found] == [d.id for d in expected]
        np.testing.assert_allclose([d.score for d in found], [d.score for d in expected], rtol=1e-5, atol=1e-6)


def test_score_explainer_gives_the_faiss_retrievers_parts(stores):
    faiss_retriever = FAISSEmbeddingRetriever(stores["faiss"], top_k=TOP_K)
    dot_retriever = QdrantEmbeddingRetriever(stores["dot"], top_k=TOP_K, return_embedding=True)
    explainer = ScoreExplainer()
    query_meta = {"raw_norm": 4.2, "checkpoint": "ckpt-a", "strategy": "qnorm"}
    for query in unit_queries(10):
        expected = faiss_retriever.run(query.tolist(), query_meta=query_meta)["documents"]
        retrieved = dot_retriever.run(query.tolist())["documents"]
        explained = explainer.run(documents=retrieved, query_embedding=query.tolist(),
                                  query_meta=query_meta)["documents"]
        assert [d.id for d in explained] == [d.id for d in expected]
        for ours, theirs in zip(explained, expected, strict=True):
            assert ours.embedding is None and CHECKPOINT_KEY not in ours.meta and STRATEGY_KEY not in ours.meta
            np.testing.assert_allclose([ours.meta[p] for p in PARTS], [theirs.meta[p] for p in PARTS], rtol=1e-5)
            assert ours.meta["cosine"] * ours.meta["query_norm"] * ours.meta["document_norm"] == \
                pytest.approx(ours.score, rel=1e-5)


def test_score_explainer_refuses_another_checkpoint_and_missing_vectors(stores):
    query = unit_queries(1)[0].tolist()
    retrieved = QdrantEmbeddingRetriever(stores["dot"], top_k=3, return_embedding=True).run(query)["documents"]
    with pytest.raises(CheckpointError, match="ckpt-a.*ckpt-b"):
        ScoreExplainer().run(documents=retrieved, query_embedding=query, query_meta={"checkpoint": "ckpt-b"})
    without = QdrantEmbeddingRetriever(stores["dot"], top_k=3).run(query)["documents"]
    with pytest.raises(DataError, match="return_embedding: true"):
        ScoreExplainer().run(documents=without, query_embedding=query)
    kept = ScoreExplainer(return_embedding=True).run(documents=retrieved, query_embedding=query)["documents"]
    np.testing.assert_allclose(kept[0].embedding, retrieved[0].embedding, rtol=1e-6)
    with pytest.raises(ValueError, match="return_embedding"):
        ScoreExplainer(return_embedding="yes")


@pytest.fixture
def index_dir(tmp_path, stores):
    folder = tmp_path / "index"
    FAISSDocumentStore(path=str(folder)).write_documents(stores["documents"])
    return folder


def test_export_index_to_an_embedded_qdrant_folder_ranks_as_the_index(index_dir, tmp_path, stores):
    target = str(tmp_path / "qdrant")
    store = qdrant_store(DIM, path=target, progress_bar=False)
    assert export_index(index_dir, store) == len(stores["documents"])
    store.close()
    reopened = qdrant_store(DIM, path=target, progress_bar=False)  # persisted in the folder
    try:
        assert reopened.count_documents() == len(stores["documents"])
        stored = reopened.filter_documents()
        assert {d.meta[CHECKPOINT_KEY] for d in stored} == {"ckpt-a"}  # provenance back from the manifest
        assert {d.meta[STRATEGY_KEY] for d in stored} == {"qnorm"}
        faiss_retriever = FAISSEmbeddingRetriever(FAISSDocumentStore(path=str(index_dir)), top_k=TOP_K)
        dot_retriever = QdrantEmbeddingRetriever(reopened, top_k=TOP_K)
        for query in unit_queries(20, seed=3):
            assert [d.id for d in dot_retriever.run(query.tolist())["documents"]] == \
                [d.id for d in faiss_retriever.run(query.tolist())["documents"]]
    finally:
        reopened.close()


def test_export_index_refuses_a_cosine_store_a_wrong_dimension_and_a_missing_index(index_dir, tmp_path):
    cosine = QdrantDocumentStore(":memory:", embedding_dim=DIM, similarity="cosine")
    with pytest.raises(ConfigError, match="'cosine'.*dot_product"):
        export_index(index_dir, cosine)
    with pytest.raises(ConfigError, match=f"{DIM}-dimensional.*embedding_dim=8"):
        export_index(index_dir, qdrant_store(8))
    with pytest.raises(CheckpointError, match="no index at"):
        export_index(tmp_path / "nowhere", qdrant_store(DIM))
    with pytest.raises(ConfigError, match="not both"):
        qdrant_store(DIM, path=str(tmp_path / "q"), url="http://localhost:6333")
    assert cosine.count_documents() == 0


def test_export_index_cli(index_dir, tmp_path, capsys):
    target = tmp_path / "qdrant"
    assert main(["export-index", str(index_dir), "--qdrant", str(target)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["exported"] == report["documents_in_collection"] == 400 and report["strategy"] == "qnorm"
    assert main(["export-index", str(index_dir), "--qdrant", str(target)]) == 0  # again: overwritten, not doubled
    assert json.loads(capsys.readouterr().out)["documents_in_collection"] == 400
    assert main(["export-index", str(tmp_path / "nowhere"), "--qdrant", str(target)]) == 2
    assert "no index at" in capsys.readouterr().err
    assert main(["export-index", str(index_dir), "--qdrant", str(index_dir)]) == 2
    assert "is a FAISS index folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["export-index", str(index_dir)])  # --qdrant or --url is required


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A tiny qnorm checkpoint and a FAISS index of a small corpus built by pipelines/indexing.yaml."""
    root = tmp_path_factory.mktemp("vector-db")
    checkpoint = tiny_encoder(root / "tok", "qnorm").save(root / "ckpt")
    corpus = root / "corpus.jsonl"
    texts = ["paris is the capital city of france", "berlin is the capital of germany", "rome is the capital of "
             "italy", "the thames is a river in london england", "hamlet is a book the king wrote",
             "the mountain is born in the war year", "the ocean queen song", "a film of the year"]
    corpus.write_text("".join(json.dumps({"id": f"p{i}", "title": text.split()[0], "text": text}) + "\n"
                              for i, text in enumerate(texts)))
    index = root / "index"
    pipeline = load_pipeline(PIPELINES_DIR / "indexing.yaml", {"corpus": str(corpus), "retriever": str(checkpoint),
                                                               "out": str(index), "embedder.progress_bar": False})
    assert run_pipeline(pipeline, {})["writer"]["documents_written"] == len(texts)
    return {"checkpoint": checkpoint, "index": index}


def test_rag_qdrant_pipeline_answers_from_the_same_sources_as_rag(built, tmp_path):
    target = tmp_path / "qdrant"
    assert main(["export-index", str(built["index"]), "--qdrant", str(target)]) == 0
    dim = json.loads((built["index"] / "manifest.json").read_text())["dim"]
    results = {}
    for name, overrides in (("rag", {"index": str(built["index"])}),
                            ("rag_qdrant", {"qdrant": str(target), "embedding_dim": dim})):
        data = apply_overrides(read_pipeline_dict(PIPELINES_DIR / f"{name}.yaml"),
                               {"retriever": str(built["checkpoint"]), "top_k": 4, **overrides})
        pipeline = Pipeline.from_dict(data, allowed_modules=ALLOWED_MODULES, components={"llm": FixedReply()})
        result = run_pipeline(pipeline, {"question": "capital of france"}, preflight=False)
        results[name] = named_outputs(pipeline, result)["answers"][0].documents
        if name == "rag_qdrant":
            pipeline.get_component("retriever").close()
    assert [d.id for d in results["rag_qdrant"]] == [d.id for d in results["rag"]] and len(results["rag"]) == 4
    for ours, theirs in zip(results["rag_qdrant"], results["rag"], strict=True):
        assert ours.score == pytest.approx(theirs.score, rel=1e-5)
        np.testing.assert_allclose([ours.meta[p] for p in PARTS], [theirs.meta[p] for p in PARTS], rtol=1e-5)


def test_ask_sends_index_and_qdrant_only_to_pipelines_that_read_them(built, tmp_path, capsys, monkeypatch):
    import rag_mag.serving.pipelines as pipelines

    seen = []  # the overrides `ask` gives load_pipeline, recorded where they are applied
    real_apply = pipelines.apply_overrides
    monkeypatch.setattr(pipelines, "apply_overrides", lambda data, overrides: seen.append(dict(overrides)) or
                        real_apply(data, overrides))
    args = ["ask", "capital of france", "--retriever", str(built["checkpoint"]), "--llm-url", closed_port_url()]
    qdrant = ["--pipeline", str(PIPELINES_DIR / "rag_qdrant.yaml"), "--qdrant", str(tmp_path / "q")]
    assert main(args + qdrant) == 2
    assert "no Qdrant folder" in capsys.readouterr().err and not seen
    assert main(["export-index", str(built["index"]), "--qdrant", str(tmp_path / "q")]) == 0
    capsys.readouterr()
    assert main(args + qdrant) == 2
    assert "no vLLM server" in capsys.readouterr().err
    assert seen[-1]["qdrant"] == str(tmp_path / "q") and "index" not in seen[-1]
    assert main(args + ["--index", str(built["index"])]) == 2  # rag.yaml: index, and no qdrant
    assert "no vLLM server" in capsys.readouterr().err
    assert seen[-1]["index"] == str(built["index"]) and "qdrant" not in seen[-1]
