"""Your own documents end to end: a folder of real files through the real converters, the trained default retriever
(MiniLM, qnorm), and answers from the real vLLM server, citing file and page; then an edit and a deletion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag_mag.cli.main import main
from rag_mag.components import faiss_index
from rag_mag.components.faiss_document_store import FAISSDocumentStore
from rag_mag.models import default_retriever_dir
from tests.files import write_folder

pytestmark = pytest.mark.integration


def ask(question: str, index: Path, url: str, capsys, *extra: str) -> dict:
    code = main(["ask", question, "--index", str(index), "--llm-url", url, "--json", *extra])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def index(folder: Path, out: Path, capsys) -> str:
    code = main(["index", str(folder), "--out", str(out), "--retriever", str(default_retriever_dir())])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out.strip().splitlines()[-1]


def test_a_folder_answers_with_file_and_page_and_follows_edits(vllm_server, tmp_path, capsys):
    docs, out = write_folder(tmp_path / "docs"), tmp_path / "index"
    assert index(docs, out, capsys).startswith("files: 5 added")
    faiss_index.verify_folder(out)

    report = ask("What is the code of the vault?", out, vllm_server, capsys)
    top = report["sources"][0]
    assert (top["file"], top["page"]) == ("manual.pdf", 2)  # the fact is only on page 2
    assert "4711" in report["answer"] and top["excerpt"][slice(*top["answer_span"])] == "4711"

    only_notes = ask("What is the code of the vault?", out, vllm_server, capsys, "--source", "notes/*")
    assert {source["file"] for source in only_notes["sources"]} <= {"notes/keeper.txt", "notes/river.md"}

    # an edit: the old fact goes, the new one is found, and only that file's chunks are encoded
    (docs / "notes" / "keeper.txt").write_text("The lighthouse keeper is called Ingrid. She came to the island "
                                               "in 2001.\n")
    line = index(docs, out, capsys)
    assert line.startswith("files: 0 added, 1 changed, 0 removed, 4 unchanged") and "chunks: 1 encoded" in line
    store = FAISSDocumentStore(path=str(out))
    texts = " ".join(d.content for d in store.filter_documents())
    assert "Oskar" not in texts and "Ingrid" in texts
    report = ask("What is the name of the lighthouse keeper?", out, vllm_server, capsys)
    assert report["sources"][0]["file"] == "notes/keeper.txt" and "Ingrid" in report["answer"]

    # a deletion: its chunks are gone
    (docs / "manual.pdf").unlink()
    line = index(docs, out, capsys)
    assert "1 removed" in line and "chunks: 0 encoded, 3 removed" in line
    assert "manual.pdf" not in {d.meta["file"] for d in FAISSDocumentStore(path=str(out)).filter_documents()}
    faiss_index.verify_folder(out)
