"""Bad files given to `rag-mag index PATH...`: each gets one line naming the file and what is wrong, the batch's
other files are indexed, the exit code is 3, and the index that was there before stays whole."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from rag_mag.cli.main import main
from rag_mag.components import faiss_index
from rag_mag.components.faiss_document_store import FAISSDocumentStore
from rag_mag.ingestion.file_indexing import EXIT_SKIPPED
from tests.files import write_encrypted_pdf, write_folder, write_pdf, write_scanned_pdf
from tests.tiny import tiny_encoder

pytestmark = pytest.mark.faults


@pytest.fixture(scope="module")
def retriever(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("file-faults")
    return tiny_encoder(root / "tok", "qnorm", seed=4).save(root / "qnorm")


def corrupt_pdf(path: Path) -> None:
    path.write_bytes(b"%PDF-1.7\n1 0 obj << /Type /Catalog /Pages 9 0 R >>\n" + os.urandom(300) + b"\n%%EOF")


def unreadable(path: Path, monkeypatch) -> None:
    path.write_text("You cannot read this sentence.")
    if os.geteuid() != 0:
        path.chmod(0)
        return
    # root reads every file whatever its mode: the read itself is made to fail as it would for a user
    original = Path.read_bytes

    def read_bytes(self):
        if self == path:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return original(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)


CASES = {
    "corrupt PDF": ("broken.pdf", corrupt_pdf, "corrupt PDF"),
    "encrypted PDF": ("locked.pdf", write_encrypted_pdf, "encrypted PDF"),
    "scanned PDF without text": ("scan.pdf", write_scanned_pdf, "no text"),
    "empty file": ("empty.txt", lambda p: p.write_text(""), "empty file"),
    "binary data named .txt": ("data.txt", lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00" + os.urandom(64)),
                               "binary data, not text"),
    "text that is not UTF-8": ("latin.md", lambda p: p.write_bytes("Caf\xe9 au lait, s'il vous pla\xeet.".encode(
        "latin-1")), "not UTF-8 text"),
    "file over the size limit": ("big.txt", lambda p: p.write_text("A sentence about size. " * 5000),
                                 "over the limit of 0.05 MB"),
    "symlink loop": ("loop.txt", lambda p: os.symlink(p.name, p), "symlink loop"),
    "unsupported type": ("photo.png", lambda p: p.write_bytes(b"\x89PNG\r\n"), "unsupported type .png"),
}


@pytest.mark.parametrize("case", list(CASES) + ["unreadable file"])
def test_a_bad_file_is_named_and_the_others_go_in(case, retriever, tmp_path, capsys, monkeypatch, fault_case):
    docs, out = write_folder(tmp_path / "docs"), tmp_path / "index"
    assert main(["index", str(docs), "--out", str(out), "--retriever", str(retriever)]) == 0
    before = {d.id for d in FAISSDocumentStore(path=str(out)).filter_documents()}
    capsys.readouterr()
    write_pdf(docs / "new.pdf", ["A new page about owls. Owls hunt at night."])  # a good file in the same batch
    if case == "unreadable file":
        name, reason = "secret.txt", "cannot read it: permission denied"
        unreadable(docs / name, monkeypatch)
    else:
        name, make, reason = CASES[case]
        make(docs / name)
    limit = ["--max-file-mb", "0.05"] if case == "file over the size limit" else []
    code = main(["index", str(docs), "--out", str(out), "--retriever", str(retriever), *limit])
    captured = capsys.readouterr()
    assert code == EXIT_SKIPPED, captured.err
    lines = [line for line in captured.err.splitlines() if line.startswith("skipped ")]
    assert lines == [f"skipped {docs / name}: {lines[0].split(': ', 1)[1]}"] and reason in lines[0], captured.err
    assert "Traceback" not in captured.err
    assert captured.out.strip().splitlines()[-1].startswith("files: 1 added, 0 changed, 0 removed, 5 unchanged, "
                                                            "1 skipped")
    faiss_index.verify_folder(out)
    after = FAISSDocumentStore(path=str(out)).filter_documents()
    assert before < {d.id for d in after} and "new.pdf" in {d.meta["file"] for d in after}
    fault_case.clear_error()


def test_a_file_that_goes_bad_leaves_no_stale_chunks(retriever, tmp_path, capsys, fault_case):
    docs, out = write_folder(tmp_path / "docs"), tmp_path / "index"
    main(["index", str(docs), "--out", str(out), "--retriever", str(retriever)])
    (docs / "notes" / "keeper.txt").write_bytes(b"\xff\xfe not utf-8 any more")
    assert main(["index", str(docs), "--out", str(out), "--retriever", str(retriever)]) == EXIT_SKIPPED
    assert "not UTF-8 text" in capsys.readouterr().err
    assert "notes/keeper.txt" not in {d.meta["file"] for d in FAISSDocumentStore(path=str(out)).filter_documents()}
    fault_case.clear_error()


def test_a_missing_path_and_an_unreadable_index_are_one_line(retriever, tmp_path, capsys, fault_case):
    assert main(["index", str(tmp_path / "nowhere"), "--out", str(tmp_path / "index"),
                 "--retriever", str(retriever)]) == 2
    assert "does not exist" in capsys.readouterr().err
    not_an_index = tmp_path / "notes"
    not_an_index.mkdir()
    (not_an_index / "x.txt").write_text("x")
    assert main(["index", "--remove", "a.pdf", "--out", str(not_an_index)]) == 2
    assert "no index at" in capsys.readouterr().err
    fault_case.clear_error()


def test_sigterm_while_indexing_files_keeps_the_finished_batches(retriever, tmp_path, fault_case):
    import subprocess
    import sys

    from rag_mag.models import REPO_ROOT

    docs, out = tmp_path / "docs", tmp_path / "index"
    docs.mkdir()
    for number in range(70):  # three batches of at most 32 files
        (docs / f"note{number:02d}.txt").write_text(f"Note {number} says that the item weighs {number} grams.")
    command = [sys.executable, "-m", "rag_mag.cli.main", "index", str(docs), "--out", str(out), "--retriever",
               str(retriever)]
    env = {**os.environ, "RAG_MAG_KILL_AT": "index:files#1", "RAG_MAG_FAULT_SIGNAL": "SIGTERM"}
    stopped = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    assert "stopped after 32 of 70 files by SIGTERM" in stopped.stderr and "Traceback" not in stopped.stderr
    faiss_index.verify_folder(out)
    assert len({d.meta["file"] for d in FAISSDocumentStore(path=str(out)).filter_documents()}) == 32
    resumed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert resumed.stdout.strip().splitlines()[-1].startswith("files: 38 added, 0 changed, 0 removed, 32 unchanged")
    fault_case.survived()
