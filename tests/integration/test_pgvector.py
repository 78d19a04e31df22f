"""PostgreSQL + pgvector for real: the server of `rag-mag db start` (started by .ci/run; started here when none
runs), Haystack's PgvectorDocumentStore, and the trained default retriever (MiniLM, qnorm) on the sample."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rag_mag.cli.main import main
from rag_mag.components.faiss_document_store import FAISSDocumentStore
from rag_mag.data import read_eval
from rag_mag.models import REPO_ROOT, default_retriever_dir
from rag_mag.retriever.encoder import MagnitudeEncoder
from rag_mag.serving.db import pgvector
from tests.files import write_folder

pytestmark = pytest.mark.integration

SAMPLE = REPO_ROOT / "data" / "sample"


@pytest.fixture(scope="module")
def pg_url():
    with pgvector.using_server() as url:
        yield url


def drop(url: str, *tables: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        for table in tables:
            connection.execute(f"DROP TABLE IF EXISTS {pgvector.check_table_name(table)}")


@pytest.fixture(scope="module")
def qnorm_index(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pg-qnorm") / "index"
    assert main(["index", "--corpus", str(SAMPLE / "corpus.jsonl"), "--retriever", str(default_retriever_dir()),
                 "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def queries() -> np.ndarray:
    questions = [record.question for record in read_eval(SAMPLE / "questions.jsonl")]
    return MagnitudeEncoder.load(default_retriever_dir()).encode(questions, side="query", treated=True)


def pg_top(table: str, query: np.ndarray, k: int = 10, function: str = "inner_product") -> list:
    store = pgvector.table_store(table, len(query))
    return store._embedding_retrieval(query.tolist(), top_k=k, vector_function=function)


def test_pgvector_exact_top_10_equals_faiss_flat(pg_url, qnorm_index, queries, capsys):
    assert main(["export-index", str(qnorm_index), "--pgvector", "test_qnorm"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 455
    faiss = FAISSDocumentStore(path=str(qnorm_index))
    scores, rows = faiss.search(queries, 10)
    for query, faiss_scores, faiss_rows in zip(queries, scores, rows, strict=True):
        found = pg_top("test_qnorm", query)
        assert len(found) == 10
        np.testing.assert_allclose([d.score for d in found], faiss_scores, atol=1e-5)
        faiss_ids = [faiss.document_at(int(row)).id for row in faiss_rows]
        for rank, document in enumerate(found):  # the same ids, but for ties within the tolerance
            if document.id != faiss_ids[rank]:
                assert abs(document.score - faiss_scores[rank]) < 1e-5 and document.id in faiss_ids
    drop(pg_url, "test_qnorm")


def test_a_cosine_table_ranks_differently_where_document_norms_differ(pg_url, qnorm_index, queries):
    main(["export-index", str(qnorm_index), "--pgvector", "test_norms"])
    moved = 0
    for query in queries[:40]:
        by_inner = pg_top("test_norms", query, 455)
        by_cosine = pg_top("test_norms", query, 10, "cosine_similarity")
        norms = {d.id: float(np.linalg.norm(d.embedding)) for d in by_inner}
        # cosine is the inner product without the document norm: it ranks by score / |d|
        expected = sorted(by_inner, key=lambda d: -d.score / norms[d.id])[:10]
        assert [d.id for d in by_cosine][:5] == [d.id for d in expected][:5]
        moved += [d.id for d in by_cosine] != [d.id for d in by_inner[:10]]
    assert moved > 0 and len({round(n, 3) for n in norms.values()}) > 100
    drop(pg_url, "test_norms")


def test_files_in_a_table_with_filters_upserts_and_deletes(pg_url, tmp_path, capsys):
    docs = write_folder(tmp_path / "docs")
    base = ["--store", "pgvector", "--table", "test_files", "--retriever", str(default_retriever_dir())]
    assert main(["index", str(docs), *base]) == 0
    target_files = pgvector.table_files("test_files")
    assert target_files == ["birds.html", "fleet.docx", "manual.pdf", "notes/keeper.txt", "notes/river.md"]
    store = pgvector.table_store("test_files", 384)
    only = store.filter_documents({"field": "meta.file", "operator": "==", "value": "manual.pdf"})
    assert sorted(d.meta["page"] for d in only) == [1, 2, 3]
    # the FAISS path gives the same ids to the same files
    faiss_out = tmp_path / "faiss"
    assert main(["index", str(docs), "--out", str(faiss_out), "--retriever", str(default_retriever_dir())]) == 0
    assert {d.id for d in FAISSDocumentStore(path=str(faiss_out)).filter_documents()} == {
        d.id for d in store.filter_documents()}
    (docs / "notes" / "keeper.txt").write_text("The lighthouse keeper is called Ingrid.\n")
    capsys.readouterr()
    assert main(["index", str(docs), *base]) == 0
    assert "1 changed" in capsys.readouterr().out
    keeper = store.filter_documents({"field": "meta.file", "operator": "==", "value": "notes/keeper.txt"})
    assert [d.content for d in keeper] == ["The lighthouse keeper is called Ingrid."]
    assert main(["index", "--remove", "birds.html", *base[:4]]) == 0
    assert "birds.html" not in pgvector.table_files("test_files")
    drop(pg_url, "test_files")


def test_a_retriever_that_does_not_match_the_table_is_refused(pg_url, qnorm_index, tmp_path, capsys):
    main(["export-index", str(qnorm_index), "--pgvector", "test_refusal"])
    capsys.readouterr()
    cosine = MagnitudeEncoder.build(strategy="cosine").save(tmp_path / "retriever-cosine")
    code = main(["ask", "Who wrote Hamlet?", "--pipeline", str(REPO_ROOT / "pipelines" / "rag_pgvector.yaml"),
                 "--table", "test_refusal", "--retriever", str(cosine), "--llm-url", "http://127.0.0.1:9/v1"])
    message = capsys.readouterr().err
    tag = json.loads((qnorm_index / "manifest.json").read_text())
    assert code == 2 and "table test_refusal holds vectors of retriever checkpoint" in message
    assert tag["checkpoint"] in message and "Traceback" not in message
    drop(pg_url, "test_refusal")


def test_hybrid_retrieval_fuses_dense_and_full_text_in_one_table(pg_url, vllm_server, tmp_path, capsys):
    docs = write_folder(tmp_path / "docs")
    assert main(["index", str(docs), "--store", "pgvector", "--table", "test_hybrid",
                 "--retriever", str(default_retriever_dir())]) == 0
    capsys.readouterr()
    assert main(["ask", "Which countries does the Danube flow through?", "--pipeline",
                 str(REPO_ROOT / "pipelines" / "rag_hybrid.yaml"), "--table", "test_hybrid", "--top-k", "3",
                 "--llm-url", vllm_server, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["sources"][0]["file"] == "notes/river.md"
    # reciprocal rank fusion: the top source was first in both lists, so its fused score is the largest possible
    scores = [source["score"] for source in report["sources"]]
    assert scores == sorted(scores, reverse=True) and scores[0] == pytest.approx(1.0)
    assert report["sources"][0]["cosine"] is not None  # the dense list's explanation survives the join
    drop(pg_url, "test_hybrid")


def test_the_hnsw_settings_of_rag_pgvector_reach_the_server(pg_url, qnorm_index, queries):
    """--set search=hnsw, hnsw_graph and ef_search build the graph with those settings and search with that ef;
    on 455 rows a graph with ef_search 200 finds the exact top-10."""
    import psycopg

    from rag_mag.serving.pipelines import load_pipeline, read_pipeline_dict

    assert main(["export-index", str(qnorm_index), "--pgvector", "test_hnsw"]) == 0
    path = REPO_ROOT / "pipelines" / "rag_pgvector.yaml"
    pipeline = load_pipeline(path, {**pgvector.table_overrides(read_pipeline_dict(path), "test_hnsw"), "search": "hnsw",
                                    "hnsw_graph": {"m": 8, "ef_construction": 32}, "ef_search": 200})
    retriever = pipeline.get_component("retriever")
    assert retriever.document_store.count_documents() == 455  # connects, and creates the graph index
    with psycopg.connect(pg_url) as connection:
        definition = connection.execute("SELECT indexdef FROM pg_indexes WHERE tablename = 'test_hnsw' AND "
                                        "indexdef LIKE '%USING hnsw%'").fetchone()[0]
    assert "vector_ip_ops" in definition and "m='8'" in definition and "ef_construction='32'" in definition
    assert retriever.document_store.hnsw_ef_search == 200
    for query in queries[:20]:
        found = retriever.run(query_embedding=query.tolist(), top_k=10)["documents"]
        exact = pg_top("test_hnsw", query)
        assert [d.id for d in found] == [d.id for d in exact]
    drop(pg_url, "test_hnsw")
