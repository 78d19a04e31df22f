"""The demo's documents panel: upload files into a served index, list its files, delete one.

Routes (rag_mag/demo/app.py):
  GET    /api/documents?index=NAME             the index's files with their chunk counts, the uploaded files not
                                               indexed (yet), the limits, and the running (or last) job
  POST   /api/documents?index=NAME             multipart/form-data, one or more files -> 202 {job}; the files are
                                               written into ``<index_dir>.uploads/`` and a job indexes them
  DELETE /api/documents?index=NAME&file=NAME   the uploaded file leaves the folder, a job drops its chunks -> 202
  GET    /api/documents/jobs/{id}              a job: state, files done / total, chunks encoded, summary, skipped

An index on a PostgreSQL table lists the table's files; its uploads and deletes are refused with 409 and the
``rag-mag index ... --store pgvector`` command that does them (rag_mag/demo/tables.py).

Every file is checked before anything is written: a plain file name (no ``/``, ``\\``, ``..``, leading dot,
control character) else 400; an extension of ``rag_mag.ingestion.files.FILE_TYPES`` else 415; at most
``max_upload_mb`` else 413. A multipart POST can be sent from any web page without a CORS preflight, so the
upload and delete routes also need the header ``X-RagMag-Upload: 1``, which only the page's own script sends
(403 without it). The jobs themselves are in ``rag_mag.demo.document_jobs``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import Request

from rag_mag import durable
from rag_mag.demo.document_jobs import IndexDocuments, Job
from rag_mag.demo.messages import RequestError
from rag_mag.demo.service import DemoService
from rag_mag.ingestion.files import FILE_TYPES, supported_types

logger = logging.getLogger(__name__)

UPLOAD_HEADER = "X-RagMag-Upload"
MAX_FILES_PER_UPLOAD = 10
MAX_NAME_BYTES = 255  # what Linux file systems allow in one name


def check_upload_header(request: Request) -> None:
    """403 unless the request carries ``X-RagMag-Upload: 1`` (a form on another page cannot set it)."""
    if request.headers.get(UPLOAD_HEADER) != "1":
        raise RequestError(f"uploads and deletes must come from the demo page's own script, with the header "
                           f"{UPLOAD_HEADER}: 1 (a form on another web page cannot send it); from a script, add "
                           f"-H '{UPLOAD_HEADER}: 1'", status=403, code="upload_header_missing")


def check_file_name(name: Any) -> str:
    """A plain file name, or a 400 naming it: no folder parts, no ``..``, no leading dot, no control character."""
    if not isinstance(name, str) or not name.strip():
        raise RequestError("a file has no name; give every uploaded file a name such as notes.pdf", param="file")
    problem = None
    if "/" in name or "\\" in name:
        problem = "it holds a folder separator"
    elif ".." in name:
        problem = "it holds '..'"
    elif name.startswith("."):
        problem = "it starts with a dot (hidden files are not indexed)"
    elif any(ord(char) < 32 or ord(char) == 127 for char in name):
        problem = "it holds a control character"
    elif len(name.encode("utf-8", errors="replace")) > MAX_NAME_BYTES:
        problem = f"it is longer than {MAX_NAME_BYTES} bytes"
    if problem:
        raise RequestError(f"invalid file name {name!r}: {problem}; give a plain file name such as notes.pdf "
                           "(uploads go into the index's uploads folder, never elsewhere)", code="invalid_file_name",
                           param="file")
    return name


def check_file_type(name: str) -> str:
    """415 unless the name's extension is one the indexing pipeline converts."""
    suffix = Path(name).suffix.lower()
    if suffix not in FILE_TYPES:
        raise RequestError(f"{name!r}: unsupported type {suffix or '(no extension)'}; allowed: {supported_types()}",
                           status=415, code="unsupported_file_type", param="file")
    return name


async def _limited(request: Request, max_bytes: int) -> AsyncIterator[bytes]:
    """The request body, refused with 413 as soon as it grows past ``max_bytes``."""
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise RequestError(f"the upload is over {max_bytes / 1e6:g} MB, the limit of one request (at most "
                               f"{MAX_FILES_PER_UPLOAD} files at once); send fewer files at a time", status=413,
                               code="upload_too_large")
        yield chunk


class Documents:
    """The documents panel of every served index (what the routes call)."""

    def __init__(self, service: DemoService) -> None:
        self.service = service
        self.max_file_bytes = int(service.max_upload_mb * 1e6)
        self.max_request_bytes = self.max_file_bytes * MAX_FILES_PER_UPLOAD + 64 * 1024  # + multipart headers
        self.indexes = {name: IndexDocuments(loaded) for name, loaded in service.indexes.items()}

    def index(self, name: Any) -> IndexDocuments:
        name = self.service.default_index if name in (None, "") else name
        if name not in self.indexes:
            raise RequestError(f"unknown index {name!r}; this demo serves: {', '.join(self.indexes)}", status=404,
                               code="index_not_found", param="index")
        return self.indexes[name]

    # ------------------------------------------------------------------------------ GET
    def listing(self, index: Any) -> dict[str, Any]:
        """The files of an index with their chunk counts, and the uploads waiting for (or refused by) a job."""
        documents = self.index(index)
        indexed = documents.indexed_files()
        names = {entry["file"] for entry in indexed}
        waiting = [{"file": name, "chunks": 0, "uploaded": True, "indexed": False}
                   for name in documents.uploaded_names() if name not in names]
        job = documents.current_job()
        return {"index": documents.name, "files": [{**entry, "indexed": True} for entry in indexed] + waiting,
                "chunks": sum(entry["chunks"] for entry in indexed), "documents": documents.loaded.documents,
                "uploads_dir": documents.uploads.name if documents.uploads else None, "table": documents.table,
                "max_upload_mb": self.service.max_upload_mb,
                "max_files_per_upload": MAX_FILES_PER_UPLOAD, "types": sorted(FILE_TYPES),
                "job": job.to_dict() if job else None}

    def job(self, job_id: str) -> Job:
        for documents in self.indexes.values():
            if (job := documents.job(job_id)) is not None:
                return job
        raise RequestError(f"no indexing job {job_id!r}; the demo remembers the last jobs of each index since it "
                           "started", status=404, code="job_not_found")

    # ------------------------------------------------------------------------------ POST
    async def upload(self, request: Request, index: Any) -> Job:
        """Check every file of a multipart upload, write them all into the uploads folder, start a job."""
        check_upload_header(request)
        documents = self.index(index)
        documents.check_writable()
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type != "multipart/form-data":
            raise RequestError(f"send the files as multipart/form-data (a form with one or more file fields), got "
                               f"{media_type or 'no content type'!r}", status=415, code="unsupported_media_type")
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_request_bytes:
            raise RequestError(f"the upload is {int(declared) / 1e6:.1f} MB; one request may carry at most "
                               f"{MAX_FILES_PER_UPLOAD} files of {self.service.max_upload_mb:g} MB each", status=413,
                               code="upload_too_large")
        form = await self._parse(request)
        try:
            files = await self._checked_files(form, documents)
        finally:
            await form.close()
        await asyncio.to_thread(self._write, documents, files)
        logger.info("index %s: %d file(s) uploaded: %s", documents.name, len(files), ", ".join(files))
        return documents.schedule("upload " + ", ".join(files))

    async def _parse(self, request: Request):
        from starlette.formparsers import MultiPartException, MultiPartParser

        parser = MultiPartParser(request.headers, _limited(request, self.max_request_bytes),
                                 max_files=MAX_FILES_PER_UPLOAD, max_fields=MAX_FILES_PER_UPLOAD)
        try:
            return await parser.parse()
        except MultiPartException as error:
            status = 413 if "Too many files" in error.message else 400
            raise RequestError(f"cannot read the upload: {error.message}", status=status,
                               code="upload_too_large" if status == 413 else "invalid_upload") from None

    async def _checked_files(self, form, documents: IndexDocuments) -> dict[str, bytes]:
        """``{name: content}`` of the form's files, or the first problem as a 4xx naming the file."""
        from starlette.datastructures import UploadFile

        uploads = [value for _, value in form.multi_items() if isinstance(value, UploadFile)]
        if not uploads:
            raise RequestError("the upload holds no file; send one or more files as multipart/form-data fields",
                               code="no_file", param="file")
        taken = {entry["file"] for entry in documents.indexed_files() if not entry["uploaded"]}
        files: dict[str, bytes] = {}
        for upload in uploads:
            name = check_file_type(check_file_name(upload.filename))
            if name in files:
                raise RequestError(f"two files are named {name!r} in this upload; rename one", param="file")
            if upload.size is not None and upload.size > self.max_file_bytes:
                raise RequestError(f"{name!r} is {upload.size / 1e6:.1f} MB, over the limit of "
                                   f"{self.service.max_upload_mb:g} MB per file (rag-mag serve --max-upload-mb)",
                                   status=413, code="file_too_large", param="file")
            if name in taken:
                raise RequestError(f"{name!r} is already in the index {documents.name}, indexed from another folder "
                                   "with `rag-mag index`; rename the upload", status=409, code="file_name_taken",
                                   param="file")
            files[name] = await upload.read()
        return files

    @staticmethod
    def _write(documents: IndexDocuments, files: dict[str, bytes]) -> None:
        folder = documents.uploads
        for name, content in files.items():
            target = folder / name
            if target.resolve().parent != folder.resolve():  # the name checks rule this out; a guard all the same
                raise RequestError(f"invalid file name {name!r}: it leaves the uploads folder",
                                   code="invalid_file_name", param="file")
            durable.write_bytes(target, content)

    # ------------------------------------------------------------------------------ DELETE
    def delete(self, index: Any, name: Any) -> Job:
        """Remove an uploaded file from the folder and start a job that drops its chunks; 404 for another file."""
        documents = self.index(index)
        documents.check_writable()
        name = check_file_name(name)
        target = documents.uploads / name
        indexed = {entry["file"]: entry for entry in documents.indexed_files()}
        on_disk = target.exists() or target.is_symlink()
        if not on_disk and not indexed.get(name, {}).get("uploaded"):
            hint = (f"it was indexed from another folder with `rag-mag index`; remove it with `rag-mag index --remove "
                    f"{name} --out {documents.loaded.spec.index_dir.name}`" if name in indexed
                    else "no uploaded file has this name")
            raise RequestError(f"cannot delete {name!r} from the index {documents.name}: {hint}", status=404,
                               code="file_not_found", param="file")
        if on_disk:
            target.unlink()
            durable.fsync_dir(documents.uploads)
        logger.info("index %s: %s deleted", documents.name, name)
        return documents.schedule(f"delete {name}")
