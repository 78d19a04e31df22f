"""FAISSDocumentStore and FAISSEmbeddingRetriever: exact ranking, score parts, persistence, corruption."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from haystack import Document
from haystack.document_stores.errors import DuplicateDocumentError
from haystack.document_stores.types import DuplicatePolicy

from rag_mag.components.document_embedder import RagMagDocumentEmbedder
from rag_mag.components.faiss_document_store import FAISSDocumentStore
from rag_mag.components.faiss_retriever import FAISSEmbeddingRetriever
from rag_mag.components.text_embedder import RagMagTextEmbedder
from rag_mag.errors import CheckpointError, ConfigError, DataError
from rag_mag.retriever.strategies import Strategy
from tests.tiny import tiny_encoder

WORDS = ("paris france london england berlin germany rome italy capital city river king queen war ocean "
         "mountain book film song year born wrote").split()
QUERIES = ["capital of france", "who wrote the book", "river in germany", "king of england born"]


def make_documents(count: int = 40, seed: int = 0) -> list[Document]:
    rng = np.random.default_rng(seed)
    documents = []
    for i in range(count):
        words = rng.choice(WORDS, size=int(rng.integers(3, 14)))
        documents.append(Document(id=f"d{i:03d}", content=" ".join(words), meta={"title": str(words[0]), "n": i}))
    return documents


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """One tiny random checkpoint per strategy (different seeds for different weights)."""
    root = tmp_path_factory.mktemp("checkpoints")
    folders = {}
    for seed, strategy in enumerate(Strategy):
        encoder = tiny_encoder(root / f"tok-{strategy.value}", strategy.value, seed=seed)
        # A raw side divided by a calibrated constant, as the trainer does.
        encoder.config.query_norm_scale, encoder.config.document_norm_scale = 1.7, 2.3
        folders[strategy.value] = encoder.save(root / strategy.value)
    return folders


def embed_store(checkpoint: Path, documents: list[Document], path: Path | None = None, **store_args):
    embedder = RagMagDocumentEmbedder(model=str(checkpoint), batch_size=7, progress_bar=False, precision="fp32")
    embedded = embedder.run(documents)["documents"]
    store = FAISSDocumentStore(path=str(path) if path else None, **store_args)
    store.write_documents(embedded)
    return store, embedded


@pytest.mark.parametrize("strategy", [s.value for s in Strategy])
def test_ranking_equals_brute_force_numpy(checkpoints, strategy):
    documents = make_documents()
    store, embedded = embed_store(checkpoints[strategy], documents)
    text_embedder = RagMagTextEmbedder(model=str(checkpoints[strategy]))
    text_embedder.warm_up()
    encoder = text_embedder.checkpoint.encoder
    retriever = FAISSEmbeddingRetriever(document_store=store, top_k=len(documents))

    texts = [f"{d.meta['title']}\n{d.content}" for d in documents]
    doc_vectors = encoder.encode(texts, side="document", treated=True)  # (n, dim)
    doc_raw_norms = np.linalg.norm(encoder.encode(texts, side="document", treated=False), axis=1)
    for query in QUERIES:
        query_vector = encoder.encode([query], side="query", treated=True)[0]
        query_raw_norm = np.linalg.norm(encoder.encode([query], side="query", treated=False)[0])
        brute = doc_vectors @ query_vector
        expected_order = [documents[i].id for i in np.argsort(-brute, kind="stable")]

        out = text_embedder.run(query)
        np.testing.assert_allclose(out["embedding"], query_vector, rtol=1e-5, atol=1e-6)
        results = retriever.run(query_embedding=out["embedding"], query_meta=out["meta"])["documents"]
        assert [d.id for d in results] == expected_order
        by_id = {d.id: i for i, d in enumerate(documents)}
        for document in results:
            row = by_id[document.id]
            meta = document.meta
            assert document.score == pytest.approx(brute[row], rel=1e-4, abs=1e-5)
            assert document.score == pytest.approx(meta["cosine"] * meta["query_norm"] * meta["document_norm"],
                                                   rel=1e-5, abs=1e-6)
            assert meta["document_norm"] == pytest.approx(np.linalg.norm(doc_vectors[row]), rel=1e-5)
            assert meta["query_norm"] == pytest.approx(np.linalg.norm(query_vector), rel=1e-5)
            assert meta["document_raw_norm"] == pytest.approx(doc_raw_norms[row], rel=1e-4)
            assert meta["query_raw_norm"] == pytest.approx(query_raw_norm, rel=1e-4)
            assert -1.0 - 1e-5 <= meta["cosine"] <= 1.0 + 1e-5
            assert document.embedding is None and "embedding_raw_norm" not in meta


def test_treated_norms_follow_the_strategy(checkpoints):
    """cosine: both sides unit; qnorm: query unit, document raw/scale; dnorm: the reverse."""
    documents = make_documents(12)
    expectations = {"cosine": (True, True), "qnorm": (True, False), "dnorm": (False, True), "dot": (False, False)}
    for strategy, (query_unit, document_unit) in expectations.items():
        store, _ = embed_store(checkpoints[strategy], documents)
        embedder = RagMagTextEmbedder(model=str(checkpoints[strategy]))
        embedder.warm_up()
        out = embedder.run("capital of france")
        result = FAISSEmbeddingRetriever(document_store=store, top_k=3).run(
            query_embedding=out["embedding"], query_meta=out["meta"])["documents"][0].meta
        assert (abs(result["query_norm"] - 1) < 1e-5) is query_unit, strategy
        assert (abs(result["document_norm"] - 1) < 1e-5) is document_unit, strategy
        if not document_unit:
            assert result["document_norm"] == pytest.approx(result["document_raw_norm"] / 2.3, rel=1e-4)
        if not query_unit:
            assert result["query_norm"] == pytest.approx(result["query_raw_norm"] / 1.7, rel=1e-4)


def test_dnorm_ranks_like_cosine_on_raw_vectors(checkpoints):
    """The query norm scales all of a query's scores alike, so it never changes the ranking."""
    documents = make_documents()
    store, _ = embed_store(checkpoints["dnorm"], documents)
    embedder = RagMagTextEmbedder(model=str(checkpoints["dnorm"]))
    embedder.warm_up()
    encoder = embedder.checkpoint.encoder
    texts = [f"{d.meta['title']}\n{d.content}" for d in documents]
    raw = encoder.encode(texts, side="document", treated=False)
    raw /= np.linalg.norm(raw, axis=1, keepdims=True)
    for query in QUERIES:
        q = encoder.encode([query], side="query", treated=False)[0]
        expected = [documents[i].id for i in np.argsort(-(raw @ (q / np.linalg.norm(q))), kind="stable")[:10]]
        got = FAISSEmbeddingRetriever(document_store=store, top_k=10).run(query_embedding=embedder.run(query)[
            "embedding"])["documents"]
        assert [d.id for d in got] == expected


def test_batch_search_matches_single_queries(checkpoints):
    store, _ = embed_store(checkpoints["qnorm"], make_documents())
    embedder = RagMagTextEmbedder(model=str(checkpoints["qnorm"]))
    vectors, _ = embedder.embed(QUERIES)
    retriever = FAISSEmbeddingRetriever(document_store=store, top_k=5)
    batched = retriever.search_batch(vectors)
    for vector, documents in zip(vectors, batched, strict=True):
        single = retriever.run(query_embedding=vector.tolist())["documents"]
        assert [d.id for d in documents] == [d.id for d in single]


def test_persistence_round_trip(checkpoints, tmp_path):
    folder = tmp_path / "index"
    documents = make_documents()
    store, embedded = embed_store(checkpoints["learnable"], documents, folder)
    assert sorted(p.name for p in folder.iterdir()) == ["documents.jsonl", "ids.json", "index.faiss", "manifest.json"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["count"] == len(documents) and manifest["dim"] == 32 and manifest["index_type"] == "flat"
    assert manifest["strategy"] == "learnable" and len(manifest["checkpoint"]) == 16
    assert manifest["metric"] == "inner_product"

    reloaded = FAISSDocumentStore(path=str(folder))
    assert reloaded.count_documents() == len(documents)
    query = np.asarray(embedded[3].embedding, dtype=np.float32)[None, :]
    np.testing.assert_array_equal(reloaded.search(query, 10)[1], store.search(query, 10)[1])
    back = {d.id: d for d in reloaded.filter_documents()}
    assert back["d003"].content == documents[3].content and back["d003"].meta["n"] == 3
    np.testing.assert_allclose(back["d003"].embedding, embedded[3].embedding, rtol=1e-6)
    # provenance lives in the manifest, not in every document
    assert "embedding_checkpoint" not in back["d003"].meta and "embedding_strategy" not in back["d003"].meta
    assert "embedding_raw_norm" in back["d003"].meta

    # Appending to a loaded index extends it and saves again.
    extra = RagMagDocumentEmbedder(model=str(checkpoints["learnable"]), progress_bar=False, precision="fp32").run(
        [Document(id="new", content="rome italy capital")])["documents"]
    reloaded.write_documents(extra)
    assert FAISSDocumentStore(path=str(folder)).count_documents() == len(documents) + 1


def test_policies_delete_and_filters(checkpoints):
    store, embedded = embed_store(checkpoints["cosine"], make_documents(10))
    with pytest.raises(DuplicateDocumentError, match="d000"):
        store.write_documents(embedded[:1])
    assert store.write_documents(embedded[:2], policy=DuplicatePolicy.SKIP) == 0
    changed = [Document(id="d001", content="changed", embedding=embedded[5].embedding, meta=embedded[5].meta)]
    assert store.write_documents(changed, policy=DuplicatePolicy.OVERWRITE) == 1
    assert store.count_documents() == 10
    top = store.search(np.asarray([embedded[5].embedding], np.float32), 2)[1][0]
    assert {store.document_at(int(row)).id for row in top} == {"d001", "d005"}
    store.delete_documents(["d001", "d002", "missing"])
    assert store.count_documents() == 8
    assert {d.id for d in store.filter_documents({"field": "meta.n", "operator": "<", "value": 4})} == {"d000", "d003"}


def test_invalid_documents_and_mixed_checkpoints(checkpoints):
    store = FAISSDocumentStore()
    with pytest.raises(DataError, match="no embedding"):
        store.write_documents([Document(id="x", content="text")])
    store.write_documents([Document(id="a", content="a", embedding=[1.0, 0.0])])
    with pytest.raises(DataError, match="shape"):
        store.write_documents([Document(id="b", content="b", embedding=[1.0, 0.0, 0.0])])
    with pytest.raises(DataError, match="finite"):
        store.write_documents([Document(id="c", content="c", embedding=[float("nan"), 0.0])])

    _, cosine_docs = embed_store(checkpoints["cosine"], make_documents(3))
    qnorm_store, _ = embed_store(checkpoints["qnorm"], make_documents(3, seed=1))
    with pytest.raises(CheckpointError, match="different retriever checkpoints"):
        qnorm_store.write_documents([Document(id="zz", content="z", embedding=cosine_docs[0].embedding,
                                              meta=cosine_docs[0].meta)])
    assert qnorm_store.count_documents() == 3


def test_query_from_another_checkpoint_is_refused(checkpoints):
    store, _ = embed_store(checkpoints["cosine"], make_documents(5))
    other = RagMagTextEmbedder(model=str(checkpoints["dnorm"]))
    other.warm_up()
    out = other.run("capital of france")
    with pytest.raises(CheckpointError, match="re-index"):
        FAISSEmbeddingRetriever(document_store=store).run(query_embedding=out["embedding"], query_meta=out["meta"])


def test_retriever_validation(tmp_path):
    with pytest.raises(ValueError, match="top_k"):
        FAISSEmbeddingRetriever(document_store=FAISSDocumentStore(), top_k=0)
    with pytest.raises(ValueError, match="FAISSDocumentStore"):
        FAISSEmbeddingRetriever(document_store=object())
    store = FAISSDocumentStore()
    store.write_documents([Document(id="a", content="a", embedding=[1.0, 0.0])])
    retriever = FAISSEmbeddingRetriever(document_store=store)
    assert retriever.run(query_embedding=[1.0, 0.0], filters={"field": "meta.x", "operator": "==",
                                                              "value": 1})["documents"] == []
    with pytest.raises(ConfigError, match="bad filters"):
        retriever.run(query_embedding=[1.0, 0.0], filters={"field": "meta.x", "operator": "~~", "value": 1})
    with pytest.raises(DataError, match="dimension"):
        retriever.run(query_embedding=[1.0, 0.0, 1.0])
    assert len(retriever.run(query_embedding=[1.0, 0.0], top_k=5)["documents"]) == 1
    with pytest.raises(CheckpointError, match="rag-mag index"):
        FAISSEmbeddingRetriever(document_store=FAISSDocumentStore(path=str(tmp_path / "none"))).warm_up()
    with pytest.raises(ValueError, match="index_type"):
        FAISSDocumentStore(index_type="lsh")


def _saved_index(checkpoints, folder: Path) -> Path:
    embed_store(checkpoints["dot"], make_documents(20), folder)
    return folder


@pytest.mark.parametrize("damage, message", [
    (lambda f: (f / "index.faiss").write_bytes((f / "index.faiss").read_bytes()[:100]), "corrupt FAISS index"),
    (lambda f: (f / "index.faiss").unlink(), "missing"),
    (lambda f: (f / "manifest.json").write_text("{not json"), "corrupt index manifest"),
    (lambda f: (f / "documents.jsonl").write_text(
        "\n".join((f / "documents.jsonl").read_text().splitlines()[:-1]) + "\n"), "holds 19 documents"),
    (lambda f: (f / "ids.json").write_text(json.dumps(list(reversed(json.loads((f / "ids.json").read_text()))))),
     "not those of"),
    (lambda f: (f / "manifest.json").write_text(json.dumps({**json.loads((f / "manifest.json").read_text()),
                                                             "dim": 64})), "dimension 32"),
    (lambda f: (f / "manifest.json").write_text(json.dumps({**json.loads((f / "manifest.json").read_text()),
                                                             "format_version": 99})), "format version"),
])
def test_corrupt_index_gives_a_clear_error(checkpoints, tmp_path, damage, message):
    folder = _saved_index(checkpoints, tmp_path / "index")
    damage(folder)
    store = FAISSDocumentStore(path=str(folder))
    with pytest.raises(CheckpointError, match=message) as error:
        store.count_documents()
    assert str(folder) in str(error.value) and "rag-mag index" in str(error.value)
    with pytest.raises(CheckpointError, match=message):  # and again: never an empty store in its place
        FAISSEmbeddingRetriever(document_store=store).warm_up()


def test_index_type_mismatch_and_foreign_folder(checkpoints, tmp_path):
    folder = _saved_index(checkpoints, tmp_path / "index")
    with pytest.raises(CheckpointError, match="index_type='flat'"):
        FAISSDocumentStore(path=str(folder), index_type="hnsw").count_documents()
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    store = FAISSDocumentStore(path=str(foreign))
    with pytest.raises(CheckpointError, match="not a rag-mag index folder"):
        store.write_documents([Document(id="a", content="a", embedding=[1.0, 0.0])])
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_failed_save_leaves_the_old_index_intact(checkpoints, tmp_path, monkeypatch):
    folder = _saved_index(checkpoints, tmp_path / "index")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    store = FAISSDocumentStore(path=str(folder))
    store.count_documents()
    import faiss

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(faiss, "write_index", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        store.delete_documents(["d000"])
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["index"]  # no staging folder left behind


@pytest.mark.parametrize("index_type, extra", [("hnsw", {"ef_search": 64}), ("ivf", {"nlist": 4, "nprobe": 4}),
                                               ("hnsw_mips", {"ef_search": 64})])
def test_approximate_indexes_persist_and_search(checkpoints, tmp_path, index_type, extra):
    """With nprobe = nlist (IVF) or a small set (HNSW), the approximate index finds the exact top-5."""
    documents = make_documents(60)
    store, embedded = embed_store(checkpoints["qnorm"], documents, tmp_path / index_type, index_type=index_type,
                                  **extra)
    exact, _ = embed_store(checkpoints["qnorm"], documents)
    query = np.asarray([embedded[7].embedding], np.float32)
    reloaded = FAISSDocumentStore(path=str(tmp_path / index_type), index_type=index_type, **extra)
    assert reloaded.manifest["index_type"] == index_type
    np.testing.assert_array_equal(reloaded.search(query, 5)[1], exact.search(query, 5)[1])
    small, _ = embed_store(checkpoints["qnorm"], documents[:3], index_type="ivf", nlist=8)
    with pytest.raises(ConfigError, match="nlist=8 needs at least 8 documents"):
        small.search(query, 2)


def test_store_serialization_round_trip(tmp_path):
    store = FAISSDocumentStore(path=str(tmp_path / "i"), index_type="hnsw", hnsw_m=16, ef_search=32)
    retriever = FAISSEmbeddingRetriever(document_store=store, top_k=4, return_embedding=True)
    data = retriever.to_dict()
    again = FAISSEmbeddingRetriever.from_dict(data)
    assert again.to_dict() == data
    assert again.document_store.hnsw_m == 16 and again.top_k == 4
    data["init_parameters"]["document_store"]["type"] = "haystack.document_stores.in_memory.InMemoryDocumentStore"
    with pytest.raises(ValueError, match="FAISSDocumentStore"):
        FAISSEmbeddingRetriever.from_dict(data)


def test_auto_index_type_is_exact_below_the_threshold_and_records_what_it_built(checkpoints, tmp_path):
    from rag_mag.components import faiss_index

    store, _ = embed_store(checkpoints["qnorm"], make_documents(12), tmp_path / "auto", index_type="auto")
    assert store.manifest["index_type"] == "flat"
    assert json.loads((tmp_path / "auto" / "manifest.json").read_text())["index_type"] == "flat"
    assert FAISSDocumentStore(path=str(tmp_path / "auto"), index_type="auto").count_documents() == 12
    assert faiss_index.resolve_index_type("auto", faiss_index.AUTO_APPROXIMATE_FROM) == "hnsw"
    assert faiss_index.default_nlist(1_000_000) == 4000 and faiss_index.default_nlist(10) == 1


def test_hnsw_mips_folder_with_a_bad_max_norm_is_refused(checkpoints, tmp_path):
    folder = tmp_path / "mips"
    embed_store(checkpoints["qnorm"], make_documents(20), folder, index_type="hnsw_mips")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["mips_max_norm"] > 0
    (folder / "manifest.json").write_text(json.dumps({**manifest, "mips_max_norm": -1}))
    with pytest.raises(CheckpointError, match="mips_max_norm"):
        FAISSDocumentStore(path=str(folder), index_type="hnsw_mips").count_documents()


def test_hits_read_one_state_and_reload_sees_another_writer(tmp_path):
    from rag_mag.components.faiss_retriever import FAISSEmbeddingRetriever

    path = str(tmp_path / "index")
    writer = FAISSDocumentStore(path=path)
    writer.write_documents([Document(id="a", content="old a", embedding=[1.0, 0.0]),
                            Document(id="b", content="old b", embedding=[0.0, 1.0])])
    reader = FAISSDocumentStore(path=path)
    hits = reader.hits(np.asarray([[1.0, 0.2]], dtype=np.float32), 2)
    assert [(round(score, 3), document.id, document.content) for score, document, _ in hits[0]] == [
        (1.0, "a", "old a"), (0.2, "b", "old b")]
    writer.write_documents([Document(id="c", content="new c", embedding=[3.0, 0.0])])  # another process saves
    retriever = FAISSEmbeddingRetriever(document_store=reader, top_k=1)
    assert retriever.run(query_embedding=[1.0, 0.0])["documents"][0].id == "a"  # still the state it loaded
    reader.reload()
    top = retriever.run(query_embedding=[1.0, 0.0])["documents"][0]
    assert (top.id, top.content, top.score) == ("c", "new c", 3.0)
