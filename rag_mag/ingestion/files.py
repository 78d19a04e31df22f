"""A user's files, found and checked before they reach the converters (``rag-mag index PATH...``, the demo).

``find_files`` walks the paths given (files and folders, with include and exclude globs on the path relative to
the folder) and ``read_file`` reads one and says, in one line, what is wrong with it, if anything: an unsupported
type, a file over the size limit, an empty or unreadable file, a symlink loop, binary data or text that is not
UTF-8 in a text file, a corrupt or encrypted PDF, a DOCX that is not a zip archive. Haystack's converters only
log a warning and skip such a file; here each one gets its reason, and the rest of the batch goes on.

A file that passes comes back as a ``ByteStream`` whose meta holds ``file`` (its path relative to the folder that
was indexed, or its name when it was given alone), ``folder`` (that folder, absolute) and ``file_sha256``.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import io
import os
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from rag_mag.errors import ConfigError

# Extension -> MIME type: the router of pipelines/index_files.yaml sends each to its converter.
FILE_TYPES = {
    ".txt": "text/plain", ".text": "text/plain",
    ".md": "text/markdown", ".markdown": "text/markdown",
    ".html": "text/html", ".htm": "text/html",
    ".pdf": "application/pdf",
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
}
TEXT_TYPES = {"text/plain", "text/markdown", "text/html"}
DEFAULT_MAX_FILE_MB = 50.0
PDF_ELEMENT_LIMIT = 1_000_000  # elements of one PDF array or dictionary (pypdf's default: 100,000)
_SNIFF_BYTES = 8192


@dataclass(frozen=True)
class FoundFile:
    """A file to index: where it is on disk, and the path it is known by in the index."""

    path: Path
    folder: Path
    name: str  # relative to ``folder``, with forward slashes


@dataclass
class Scan:
    """What ``find_files`` found: the files to read, the folders walked (whose missing files are removed from an
    index), and the paths refused with their reason."""

    files: list[FoundFile] = field(default_factory=list)
    folders: list[Path] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)


def supported_types() -> str:
    return ", ".join(sorted(FILE_TYPES))


def _matches(name: str, patterns: list[str]) -> bool:
    base = PurePosixPath(name).name
    return any(fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(base, pattern) for pattern in patterns)


def _walk(folder: Path) -> Iterator[Path]:
    """Every file under ``folder`` in a stable order; hidden files and folders (dot names) are left out, and
    symlinked folders are not followed (a symlinked file is read, or refused if it loops)."""
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if not name.startswith("."):
                yield Path(root) / name


def find_files(paths: list[str | os.PathLike], include: list[str] | None = None,
               exclude: list[str] | None = None) -> Scan:
    """The files under ``paths`` to index; a path that does not exist is a ``ConfigError`` (a typo, not data)."""
    scan, seen = Scan(), set()
    for given in paths:
        path = Path(given)
        if not path.exists() and not path.is_symlink():
            raise ConfigError(f"{path} does not exist; give files or folders to index")
        if path.is_dir():
            folder = path.resolve()
            scan.folders.append(folder)
            candidates = [(file, file.relative_to(path).as_posix()) for file in _walk(path)]
        else:
            folder = path.absolute().parent.resolve()
            candidates = [(path, path.name)]
        for file, name in candidates:
            if include and not _matches(name, include):
                continue
            if exclude and _matches(name, exclude):
                continue
            if name in seen:
                scan.refused.append((str(file), f"another file given in this run is also called {name!r} in the "
                                                "index; index the two folders into separate --out folders"))
                continue
            seen.add(name)
            scan.files.append(FoundFile(path=file, folder=folder, name=name))
    return scan


def _os_reason(error: OSError) -> str:
    if error.errno == errno.ELOOP:
        return "symlink loop (the link points back to itself); remove or fix the link"
    if error.errno in (errno.EACCES, errno.EPERM):
        return "cannot read it: permission denied; make it readable (chmod +r) or exclude it"
    if error.errno == errno.ENOENT:
        return "it disappeared or is a broken symlink"
    return f"cannot read it: {error.strerror or error}"


def _text_problem(data: bytes) -> str | None:
    if b"\x00" in data[:_SNIFF_BYTES]:
        return "binary data, not text; give it the extension of its real type, or exclude it"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        return (f"not UTF-8 text (invalid byte 0x{data[error.start]:02x} at offset {error.start}); convert it, "
                "e.g. iconv -f latin1 -t utf-8")
    return None


def pdf_limits():
    """pypdf's limits for the current thread's work, as a context manager: pypdf refuses arrays and dictionaries
    of more than 100,000 elements (a guard against hostile files), and real filings hold larger ones (Microsoft's
    10-Q of 2023 Q1 and Q2 in shared/data/realdocs/sec10q). ``PDF_ELEMENT_LIMIT`` is still a bound, and so is
    the size limit of every file."""
    import pypdf

    return pypdf.apply_configuration(array_maximum_element_count=PDF_ELEMENT_LIMIT,
                                     dictionary_maximum_element_count=PDF_ELEMENT_LIMIT)


def _pdf_problem(data: bytes) -> str | None:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError, PyPdfError

    try:
        with pdf_limits():
            reader = PdfReader(io.BytesIO(data))
            if reader.is_encrypted and not reader.decrypt(""):
                return "encrypted PDF; save a copy without a password (e.g. qpdf --decrypt) and index that"
            len(reader.pages)
    except (PdfReadError, PyPdfError, ValueError, KeyError, TypeError, AttributeError, IndexError,
            OSError) as error:
        return f"corrupt PDF ({type(error).__name__}: {str(error)[:80]}); open and save it again, or exclude it"
    except NotImplementedError as error:  # an encryption algorithm pypdf cannot decrypt
        return f"encrypted PDF ({error}); save a copy without a password and index that"
    return None


def _docx_problem(data: bytes) -> str | None:
    if not zipfile.is_zipfile(io.BytesIO(data)):
        return "corrupt DOCX (not a zip archive); open and save it again in a word processor, or exclude it"
    return None


def read_file(found: FoundFile, max_bytes: int):
    """``(ByteStream, None)`` for a file that can be read, else ``(None, reason)``: one line saying what is wrong.

    The content is not checked yet: ``content_problem`` does that, for the files that are new or changed."""
    from haystack.dataclasses import ByteStream

    mime_type = FILE_TYPES.get(found.path.suffix.lower())
    if mime_type is None:
        suffix = found.path.suffix or "(no extension)"
        return None, f"unsupported type {suffix}; supported: {supported_types()}"
    try:
        size = found.path.stat().st_size
        if size > max_bytes:
            return None, (f"{size / 1e6:.1f} MB, over the limit of {max_bytes / 1e6:g} MB; raise --max-file-mb "
                          "or exclude it")
        if size == 0:
            return None, "empty file"
        data = found.path.read_bytes()
    except OSError as error:
        return None, _os_reason(error)
    meta = {"file": found.name, "folder": str(found.folder), "file_sha256": hashlib.sha256(data).hexdigest(),
            "title": PurePosixPath(found.name).stem}
    return ByteStream(data=data, mime_type=mime_type, meta=meta), None


def content_problem(stream) -> str | None:
    """What is wrong with a file's content for its converter (one line), or None."""
    data = stream.data
    if not data.strip():
        return "empty file (only whitespace)"
    if stream.mime_type in TEXT_TYPES:
        return _text_problem(data)
    if stream.mime_type == "application/pdf":
        return _pdf_problem(data)
    return _docx_problem(data)
