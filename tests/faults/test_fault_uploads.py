"""Uploads the documents panel must refuse: names that try to leave the uploads folder, a type the pipeline does not
convert, a file over the size limit, a request without the page's header (another web page's form), a delete of a
file that is not there. Each gets its status and one clear message, and nothing is written anywhere: not outside
the uploads folder, and not inside it either."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from rag_mag.demo.app import create_app
from rag_mag.demo.document_jobs import uploads_dir
from rag_mag.demo.indexes import IndexSpec
from rag_mag.demo.loading import load_index
from rag_mag.demo.service import DemoService
from rag_mag.serving.pipelines import PIPELINES_DIR
from tests.local import closed_port_url
from tests.tiny import paris_index

pytestmark = pytest.mark.faults

UPLOAD = {"X-RagMag-Upload": "1"}
MAX_UPLOAD_MB = 0.05  # 50 kB




@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A folder holding the index, its retriever and (once something is uploaded) its uploads folder."""
    root = tmp_path_factory.mktemp("upload-faults")
    paris_index(root)
    return root


@pytest.fixture(scope="module")
def client(root):
    url = closed_port_url()
    service = DemoService([load_index(IndexSpec("qnorm", root / "index-qnorm", root / "retriever-qnorm"), PIPELINES_DIR
                                      / "rag.yaml", url)], url, max_upload_mb=MAX_UPLOAD_MB)
    with TestClient(create_app(service), base_url="http://127.0.0.1") as test_client:
        yield test_client


def tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every entry under ``folder`` with its size and mtime, and the names beside it and one level up (where
    ``../x`` and ``../../x`` from the uploads folder would land)."""
    entries = {str(path): (path.stat().st_size, path.stat().st_mtime_ns) for path in folder.rglob("*")}
    for outside in (folder.parent, folder.parent.parent):
        entries.update({str(path): (0, 0) for path in outside.iterdir() if path != folder})
    return entries


def refused(response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"], error
    return error["message"]


def upload(client, name: str, content: bytes = b"The vault code is 4711.\n", headers=UPLOAD):
    return client.post("/api/documents?index=qnorm", headers=headers,
                       files=[("files", (name, content, "text/plain"))])


@pytest.mark.parametrize("name", ["../../x.txt", "a/b.txt", "..", "../x.txt", "a\\b.txt", ".hidden.txt",
                                  "..\\..\\x.txt", "/etc/x.txt"])
def test_a_name_that_tries_to_leave_the_uploads_folder_is_400(client, root, name, fault_case):
    before = tree(root)
    message = refused(upload(client, name), 400, "invalid_file_name")
    assert "invalid file name" in message and "plain file name" in message
    assert tree(root) == before and not uploads_dir(root / "index-qnorm").exists()
    assert not (root.parent / "x.txt").exists() and not (root.parent.parent / "x.txt").exists()
    fault_case.clear_error()


@pytest.mark.parametrize("name", [b"x.txt\x00.pdf", b"x\ty.txt", b"../../x.txt", b"..%2F..%2Fx.txt"])
def test_a_name_sent_byte_for_byte_is_checked_as_sent(client, root, name, fault_case):
    """httpx escapes control characters in a file name (%00, %09); a hand-made body carries them as they are."""
    before = tree(root)
    body = (b'--B0undary\r\nContent-Disposition: form-data; name="files"; filename="' + name + b'"\r\n'
            b"Content-Type: text/plain\r\n\r\nThe vault code is 4711.\r\n--B0undary--\r\n")
    response = client.post("/api/documents?index=qnorm", content=body,
                           headers={**UPLOAD, "content-type": "multipart/form-data; boundary=B0undary"})
    if name == b"..%2F..%2Fx.txt":  # not decoded: a plain (odd) name that stays in the uploads folder
        assert response.status_code == 400 and "holds '..'" in response.json()["error"]["message"]
    else:
        assert "invalid file name" in refused(response, 400, "invalid_file_name")
    assert tree(root) == before and not uploads_dir(root / "index-qnorm").exists()
    fault_case.clear_error()


@pytest.mark.parametrize("name", ["../../x.txt", "a/b.txt", ".."])
def test_a_delete_that_tries_to_leave_the_uploads_folder_is_400(client, root, name, fault_case):
    (root / "x.txt").write_text("a file beside the index, which no delete may reach\n")
    before = tree(root)
    response = client.delete("/api/documents", params={"index": "qnorm", "file": name}, headers=UPLOAD)
    assert "invalid file name" in refused(response, 400, "invalid_file_name")
    assert tree(root) == before and (root / "x.txt").is_file()
    fault_case.clear_error()


@pytest.mark.parametrize("name", ["tool.exe", "notes", "archive.tar.gz", "sheet.xlsx"])
def test_a_type_the_pipeline_does_not_convert_is_415(client, root, name, fault_case):
    before = tree(root)
    message = refused(upload(client, name), 415, "unsupported_file_type")
    assert repr(name) in message and ".pdf" in message and ".docx" in message and ".txt" in message
    assert tree(root) == before
    fault_case.clear_error()


def test_a_file_over_the_size_limit_is_413(client, root, fault_case):
    before = tree(root)
    message = refused(upload(client, "big.txt", b"word " * 12_000), 413, "file_too_large")  # 60 kB > 50 kB
    assert "'big.txt'" in message and "0.05 MB" in message and "--max-upload-mb" in message
    assert tree(root) == before
    fault_case.clear_error()


def test_a_request_over_the_limit_of_all_its_files_is_413(client, root, fault_case):
    before = tree(root)
    message = refused(upload(client, "huge.txt", b"x" * 700_000), 413, "upload_too_large")
    assert "MB" in message
    assert tree(root) == before
    fault_case.clear_error()


def test_a_streamed_upload_without_a_length_is_cut_off_at_the_limit(client, root, fault_case):
    def body():
        yield (b'--B0undary\r\nContent-Disposition: form-data; name="files"; filename="endless.txt"\r\n'
               b"Content-Type: text/plain\r\n\r\n")
        for _ in range(200):  # 800 kB, over the limit of one request (10 files of 50 kB)
            yield b"x" * 4096

    before = tree(root)
    response = client.post("/api/documents?index=qnorm", content=body(),
                           headers={**UPLOAD, "content-type": "multipart/form-data; boundary=B0undary"})
    assert "the limit of one request" in refused(response, 413, "upload_too_large")
    assert tree(root) == before
    fault_case.clear_error()


def test_more_files_than_one_upload_may_carry_is_413(client, root, fault_case):
    before = tree(root)
    response = client.post("/api/documents?index=qnorm", headers=UPLOAD,
                           files=[("files", (f"f{i}.txt", b"text\n", "text/plain")) for i in range(11)])
    assert "Too many files" in refused(response, 413, "upload_too_large")
    assert tree(root) == before
    fault_case.clear_error()


def test_one_bad_file_refuses_the_whole_upload(client, root, fault_case):
    before = tree(root)
    response = client.post("/api/documents?index=qnorm", headers=UPLOAD, files=[
        ("files", ("good.txt", b"fine text\n", "text/plain")), ("files", ("../evil.txt", b"x", "text/plain"))])
    assert "'../evil.txt'" in refused(response, 400, "invalid_file_name")
    assert tree(root) == before  # good.txt was not written either
    fault_case.clear_error()


@pytest.mark.parametrize("headers", [{}, {"X-RagMag-Upload": "0"}, {"origin": "http://127.0.0.1"}])
def test_an_upload_or_delete_without_the_page_header_is_403(client, root, headers, fault_case):
    before = tree(root)
    message = refused(upload(client, "notes.txt", headers=headers), 403, "upload_header_missing")
    assert "X-RagMag-Upload: 1" in message
    response = client.delete("/api/documents?index=qnorm&file=notes.txt", headers=headers)
    refused(response, 403, "upload_header_missing")
    assert tree(root) == before
    fault_case.clear_error()


def test_an_upload_that_is_not_multipart_is_415(client, root, fault_case):
    before = tree(root)
    response = client.post("/api/documents", headers={**UPLOAD, "content-type": "application/json"},
                           content=b'{"file": "x.txt"}')
    assert "multipart/form-data" in refused(response, 415, "unsupported_media_type")
    response = client.post("/api/documents", headers=UPLOAD, data={"field": "no file here"})
    refused(response, 415, "unsupported_media_type")
    response = client.post("/api/documents", headers=UPLOAD, data={"field": "no file"},
                           files=[("other", ("", b"", "text/plain"))])
    assert response.status_code == 400, response.text
    assert tree(root) == before
    fault_case.clear_error()


def test_a_delete_of_an_unknown_file_is_404(client, root, fault_case):
    before = tree(root)
    message = refused(client.delete("/api/documents?index=qnorm&file=never-uploaded.pdf", headers=UPLOAD), 404,
                      "file_not_found")
    assert "'never-uploaded.pdf'" in message and "no uploaded file" in message
    refused(client.delete("/api/documents?index=nonesuch&file=a.pdf", headers=UPLOAD), 404, "index_not_found")
    refused(client.get("/api/documents?index=nonesuch"), 404, "index_not_found")
    refused(client.get("/api/documents/jobs/0123456789ab"), 404, "job_not_found")
    assert tree(root) == before
    fault_case.clear_error()
