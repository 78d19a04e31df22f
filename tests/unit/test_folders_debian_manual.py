"""The Debian manual collection (rag_mag/bench/folders/debian_manual.py): unpacking a .deb built here by hand, the
sha256 and path checks, idempotence, and the committed sqlite_docs questions. One integration test downloads the real
package and checks every short answer against the text of the page it cites."""

from __future__ import annotations

import dataclasses
import hashlib
import html
import io
import json
import re
import tarfile
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from rag_mag.bench.folders import debian_manual as debian_docs
from rag_mag.bench.folders.debian_manual import (
    SQLITE_DOCS,
    DebianManual,
    DownloadError,
    extract_pages,
    prepare_debian_manual,
)
from rag_mag.errors import DataError

DOC_DIR = "usr/share/doc/fake"
PAGES = {"alpha.html": b"<html><body><p>Alpha is <b>first</b>.</p></body></html>\n",
         "sub/beta.html": b"<html><body><nav>menu</nav><p>Beta has 42 pages.</p></body></html>\n"}
QUESTION_FIELDS = ("id", "collection", "question", "answers", "answer_type", "files", "pages", "answerable", "split")


# ----------------------------------------------------------------------------- a .deb written by hand
def _tar_xz(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _ar(members: dict[str, bytes]) -> bytes:
    """The ar format of a .deb: a magic line, then per member a 60-byte header and its data padded to even."""
    out = bytearray(b"!<arch>\n")
    for name, data in members.items():
        out += f"{name:<16}{1700000000:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode("ascii")
        out += data + (b"\n" if len(data) % 2 else b"")
    return bytes(out)


def _fake_deb(path: Path, data_members: dict[str, bytes]) -> Path:
    control = _tar_xz({"./control": b"Package: fake-doc\n"}) + b"x"  # odd length: the next member is padded
    path.write_bytes(_ar({"debian-binary": b"2.0\n", "control.tar.xz": control,
                          "data.tar.xz": _tar_xz(data_members)}))
    return path


def _package_members() -> dict[str, bytes]:
    return {f"./{DOC_DIR}/{name}": data for name, data in PAGES.items()} | {"./usr/share/doc/fake/copyright": b"PD\n"}


def _questions(path: Path, files: list[list[str]]) -> Path:
    path.write_text("".join(json.dumps({"id": f"fake-{n}", "collection": "fake", "question": "?", "answers": ["x"],
                                        "answer_type": "short", "files": cited, "pages": None, "answerable": True,
                                        "split": "test"}) + "\n" for n, cited in enumerate(files)), encoding="utf-8")
    return path


@pytest.fixture
def manual(tmp_path, monkeypatch) -> DebianManual:
    """A manual whose .deb is a local file (a file:// URL: the download code runs, the network is not used)."""
    monkeypatch.setenv("RAG_MAG_CACHE", str(tmp_path / "cache"))
    deb = _fake_deb(tmp_path / "fake.deb", _package_members())
    return DebianManual(package="fake-doc", source="fake", version="1.0-1", sha256=hashlib.sha256(deb.read_bytes())
                        .hexdigest(), url=deb.as_uri(), doc_dir=DOC_DIR, pages=tuple(PAGES),
                        questions=_questions(tmp_path / "questions.jsonl", [["alpha.html"], ["sub/beta.html"]]))


# ----------------------------------------------------------------------------- unpacking
def test_extract_pages_writes_the_pinned_pages_only(tmp_path):
    deb = _fake_deb(tmp_path / "fake.deb", _package_members())
    extract_pages(deb, DOC_DIR, tuple(PAGES), tmp_path / "files")
    written = sorted(path.relative_to(tmp_path / "files").as_posix() for path in (tmp_path / "files").rglob("*.*"))
    assert written == sorted(PAGES)
    assert all((tmp_path / "files" / name).read_bytes() == data for name, data in PAGES.items())


@pytest.mark.parametrize("bad_name", ["../evil.html", "./usr/share/doc/../../../evil.html", "/etc/evil.html"])
def test_extract_refuses_a_member_outside_the_archive(tmp_path, bad_name):
    deb = _fake_deb(tmp_path / "fake.deb", _package_members() | {bad_name: b"evil"})
    with pytest.raises(DataError, match="refusing the archive member"):
        extract_pages(deb, DOC_DIR, tuple(PAGES), tmp_path / "files")
    assert not (tmp_path / "evil.html").exists() and not (tmp_path.parent / "evil.html").exists()


def test_extract_names_a_missing_page_and_a_non_deb(tmp_path):
    deb = _fake_deb(tmp_path / "fake.deb", _package_members())
    with pytest.raises(DataError, match="no usr/share/doc/fake/gamma.html"):
        extract_pages(deb, DOC_DIR, ("alpha.html", "gamma.html"), tmp_path / "files")
    (tmp_path / "not.deb").write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(DataError, match="not a Debian package"):
        extract_pages(tmp_path / "not.deb", DOC_DIR, ("alpha.html",), tmp_path / "files")


# ----------------------------------------------------------------------------- preparing the collection
def test_prepare_downloads_verifies_and_is_idempotent(tmp_path, manual, monkeypatch):
    out = tmp_path / "out"
    prepare_debian_manual(out, tmp_path / "unused-data-root", manual)
    assert (tmp_path / "cache" / "debian" / manual.deb_name).is_file()
    assert {name: (out / "files" / name).read_bytes() for name in PAGES} == PAGES
    assert (out / "questions.jsonl").read_bytes() == manual.questions.read_bytes()
    recorded = json.loads((out / "prepared.json").read_text(encoding="utf-8"))
    assert recorded["deb_sha256"] == manual.sha256 and recorded["files"] == sorted(PAGES)
    assert not [path for path in tmp_path.iterdir() if "staging" in path.name]

    def no_second_fetch(_manual):
        raise AssertionError("a prepared folder was prepared again")

    monkeypatch.setattr(debian_docs, "fetch_deb", no_second_fetch)
    before = {path: path.stat().st_mtime_ns for path in out.rglob("*")}
    prepare_debian_manual(out, tmp_path / "unused-data-root", manual)
    assert {path: path.stat().st_mtime_ns for path in out.rglob("*")} == before


def test_changed_questions_prepare_again(tmp_path, manual):
    out = tmp_path / "out"
    prepare_debian_manual(out, tmp_path, manual)
    _questions(manual.questions, [["sub/beta.html"]])
    prepare_debian_manual(out, tmp_path, manual)
    assert (out / "questions.jsonl").read_bytes() == manual.questions.read_bytes()


def test_a_wrong_sha256_is_one_clear_error_and_nothing_is_kept(tmp_path, manual):
    wrong = dataclasses.replace(manual, sha256="0" * 64)
    with pytest.raises(DataError) as refused:
        prepare_debian_manual(tmp_path / "out", tmp_path, wrong)
    assert manual.sha256 in str(refused.value) and "0" * 64 in str(refused.value)
    assert not (tmp_path / "out").exists()
    assert not list((tmp_path / "cache" / "debian").glob("*"))  # no file, no temporary left behind


def test_a_tampered_cached_deb_is_refused(tmp_path, manual):
    cached = tmp_path / "cache" / "debian" / manual.deb_name
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"!<arch>\ntampered")
    with pytest.raises(DataError, match="delete it to download again") as refused:
        prepare_debian_manual(tmp_path / "out", tmp_path, manual)
    assert manual.sha256 in str(refused.value) and cached.read_bytes() == b"!<arch>\ntampered"


def test_a_question_citing_a_page_not_taken_is_refused(tmp_path, manual):
    _questions(manual.questions, [["alpha.html"], ["gamma.html"]])
    with pytest.raises(DataError, match="'gamma.html'"):
        prepare_debian_manual(tmp_path / "out", tmp_path, manual)
    assert not (tmp_path / "out").exists()


def test_a_version_gone_from_the_pool_points_to_snapshot(tmp_path, manual, monkeypatch):
    def gone(url, *args, **kwargs):
        raise DownloadError(f"{url}: HTTP 404", missing=True)

    def apt_fails(package, version, *args, **kwargs):
        raise DownloadError(f"apt-get download {package}={version}: E: Version '{version}' was not found")

    monkeypatch.setattr(debian_docs, "download", gone)
    monkeypatch.setattr(debian_docs, "apt_download", apt_fails)
    with pytest.raises(DataError, match=r"version 1\.0-1 is no longer in the Debian pool.*snapshot\.debian\.org"):
        prepare_debian_manual(tmp_path / "out", tmp_path, manual)


def test_download_gives_up_after_its_tries(tmp_path):
    with pytest.raises(DownloadError, match=r"1 tries") as refused:
        debian_docs.download((tmp_path / "absent.deb").as_uri(), tmp_path / "cache.deb", "0" * 64, attempts=1)
    assert not refused.value.missing and not (tmp_path / "cache.deb").exists()


# ----------------------------------------------------------------------------- the committed questions
def _committed() -> list[dict]:
    lines = SQLITE_DOCS.questions.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_committed_questions_are_valid():
    questions = _committed()
    assert all(tuple(question) == QUESTION_FIELDS for question in questions)
    assert len({question["id"] for question in questions}) == len(questions)
    assert len({question["question"].lower() for question in questions}) == len(questions)
    for question in questions:
        assert re.fullmatch(r"sqlite-\d{3}", question["id"]) and question["collection"] == "sqlite_docs"
        assert question["answer_type"] == "short" and question["pages"] is None
        assert question["split"] in ("validation", "test") and question["question"].strip().endswith("?")
        assert type(question["answerable"]) is bool
        assert bool(question["answers"]) == bool(question["files"]) == question["answerable"], question["id"]
        assert all(isinstance(answer, str) and 0 < len(answer.split()) <= 6 for answer in question["answers"])
        assert set(question["files"]) <= set(SQLITE_DOCS.pages), question["id"]
    counts = Counter((question["split"], question["answerable"]) for question in questions)
    assert counts[("validation", True)] + counts[("test", True)] >= 50
    assert counts[("validation", False)] + counts[("test", False)] >= 12
    assert all(counts[(split, answerable)] for split in ("validation", "test") for answerable in (True, False))
    assert 0.3 <= (counts[("validation", True)] + counts[("validation", False)]) / len(questions) <= 0.5


def test_pinned_pages_fit_the_brief():
    assert 50 <= len(SQLITE_DOCS.pages) <= 80 and len(set(SQLITE_DOCS.pages)) == len(SQLITE_DOCS.pages)
    assert all(page.endswith(".html") and "/" not in page for page in SQLITE_DOCS.pages)


# ----------------------------------------------------------------------------- the real package
def _page_text(path: Path) -> str:
    """The text of an HTML page: tags stripped, entities decoded, whitespace collapsed, lower case."""
    text = html.unescape(re.sub(r"<[^>]*>", " ", path.read_text(encoding="utf-8", errors="replace")))
    return " ".join(text.split()).lower()


@pytest.mark.integration
def test_real_package_holds_every_short_answer(tmp_path):
    if not (debian_docs.cache_dir() / SQLITE_DOCS.deb_name).is_file():
        try:
            urllib.request.urlopen(urllib.request.Request(SQLITE_DOCS.url, method="HEAD"), timeout=15).close()
        except (urllib.error.URLError, OSError) as error:
            pytest.skip(f"the Debian pool is unreachable ({SQLITE_DOCS.url}: {error})")
    prepare_debian_manual(tmp_path / "sqlite_docs", tmp_path)
    files = tmp_path / "sqlite_docs" / "files"
    assert sorted(path.name for path in files.iterdir()) == sorted(SQLITE_DOCS.pages)
    texts = {page: _page_text(files / page) for page in SQLITE_DOCS.pages}
    unstated = [(question["id"], question["answers"][0]) for question in _committed() if question["answerable"]
                and not any(question["answers"][0].lower() in texts[page] for page in question["files"])]
    assert not unstated, f"answers not found in the text of the pages they cite: {unstated}"
