"""A collection of real HTML manual pages, fetched reproducibly from a pinned Debian package.

``sqlite_docs``: the SQLite documentation of Debian bookworm's ``sqlite3-doc`` (3.40.1-2+deb12u2, public domain).
The .deb is downloaded once from the Debian pool (or with ``apt-get download``) into ``$RAG_MAG_CACHE/debian/``
(default ``~/.cache/rag-mag/debian/``), checked against its pinned sha256 and unpacked in pure Python (an ``ar``
archive holding ``data.tar.xz``). ``PAGES`` (76 pages: those the questions cite and on-topic distractors, menus
and syntax diagrams included) go to ``OUT/files/`` under their own names; the committed questions
(``data/realdocs/sqlite_docs/questions.jsonl``, written by reading the pages, see its SOURCE.md) to
``OUT/questions.jsonl``; ``OUT/prepared.json`` records the .deb's sha256, the questions' sha256 and the file list,
and a second call with the same record does nothing. The folder is built beside ``OUT`` and swapped in whole.

The 109 questions: validation 44 (38 answerable, 6 unanswerable), test 65 (56 answerable, 9 unanswerable); every
answer is short, every answerable question cites the page that states it, ``pages`` is null (HTML has no pages).
"""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rag_mag import durable
from rag_mag.data import iter_jsonl
from rag_mag.errors import DataError
from rag_mag.models import REPO_ROOT

logger = logging.getLogger(__name__)

POOL = "https://deb.debian.org/debian/pool/main"
SNAPSHOT = "https://snapshot.debian.org"
MANIFEST = "prepared.json"
AR_MAGIC = b"!<arch>\n"
AR_HEADER_SIZE = 60

# The pages of sqlite3-doc kept for the benchmark: first those the questions cite, then distractors on the same
# topics (the navigation-heavy index pages and the syntax-diagram-laden lang_*.html are there on purpose).
PAGES = tuple(f"{name}.html" for name in """
    limits autoinc withoutrowid stricttables wal foreignkeys datatype3 pragma lang_datefunc lang_corefunc
    lang_aggfunc lang_mathfunc json1 lang_upsert lang_returning gencol inmemorydb lang_vacuum faq versionnumbers lts
    cli lang_transaction windowfunctions quirks fts5 rtree whentouse tempfiles nulls fileformat2 lang_altertable
    partialindex rowvalue threadsafe lockingv3 uri lang_keywords lang_createtable isolation
    docs lang keyword_index fts3 lang_expr lang_insert lang_update lang_delete lang_createindex lang_createtrigger
    lang_createview lang_attach lang_savepoint lang_conflict lang_analyze lang_explain eqp queryplanner optoverview
    lang_with lang_naming lang_indexedby lang_droptable atomiccommit floatingpoint different features serverless
    selfcontained sharedcache mmap csv expridx lang_createvtab howtocorrupt datatypes
""".split())


@dataclass(frozen=True)
class DebianManual:
    """A pinned Debian package, the pages taken from it and the questions asked about them."""

    package: str
    source: str        # its source package (the folder of the pool and of snapshot.debian.org)
    version: str
    sha256: str        # of the .deb
    url: str           # where the .deb is downloaded from
    doc_dir: str       # the folder of the pages inside the package, without a leading "./"
    pages: tuple[str, ...]
    questions: Path    # the committed questions.jsonl

    @property
    def deb_name(self) -> str:
        return f"{self.package}_{self.version}_all.deb"


SQLITE_DOCS = DebianManual(
    package="sqlite3-doc", source="sqlite3", version="3.40.1-2+deb12u2",
    sha256="466e30d7066e2641fa13e56bc662a2ad521b8cc9c17dde9c9dac3d4f105e32f2",
    url=f"{POOL}/s/sqlite3/sqlite3-doc_3.40.1-2+deb12u2_all.deb", doc_dir="usr/share/doc/sqlite3", pages=PAGES,
    questions=REPO_ROOT / "data" / "realdocs" / "sqlite_docs" / "questions.jsonl")


class DownloadError(DataError):
    """The .deb could not be fetched (``missing``: the server said it has no such file)."""

    def __init__(self, message: str, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


# ----------------------------------------------------------------------------- download and verify
def cache_dir() -> Path:
    return Path(os.environ.get("RAG_MAG_CACHE") or "~/.cache/rag-mag").expanduser() / "debian"


def check_sha256(actual: str, expected: str, what: str) -> None:
    if actual != expected:
        raise DataError(f"{what} has sha256 {actual}, but the pinned sha256 is {expected}; it is not the pinned "
                        "package (a corrupt download or a different build), so it was not used")


def download(url: str, target: Path, sha256: str, timeout: float = 60.0, attempts: int = 3) -> None:
    """Fetch ``url`` into ``target``, which appears only once its sha256 is the pinned one. Network errors are
    retried ``attempts`` times; a 404 or a wrong digest is not."""
    failure = ""
    for attempt in range(1, attempts + 1):
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response, \
                    durable.atomic_write(target, "wb") as handle:
                digest = hashlib.sha256()
                while block := response.read(1 << 20):
                    digest.update(block)
                    handle.write(block)
                check_sha256(digest.hexdigest(), sha256, url)  # raised inside the block: target is left as it was
            return
        except urllib.error.HTTPError as error:
            if error.code in (404, 410):
                raise DownloadError(f"{url}: HTTP {error.code}", missing=True) from None
            failure = f"HTTP {error.code} {error.reason}"
        except (urllib.error.URLError, http.client.HTTPException, OSError) as error:
            failure = str(getattr(error, "reason", None) or error)
        logger.warning("download of %s failed (try %d of %d): %s", url, attempt, attempts, failure)
        if attempt < attempts:
            time.sleep(2 ** attempt)
    raise DownloadError(f"{url}: {failure} ({attempts} tries)")


def apt_download(package: str, version: str, target: Path, sha256: str, timeout: float = 300.0) -> None:
    """``apt-get download PACKAGE=VERSION`` in a temporary folder, the .deb checked and copied to ``target``."""
    with tempfile.TemporaryDirectory(prefix="rag-mag-apt-") as folder:
        try:
            result = subprocess.run(["apt-get", "download", f"{package}={version}"], cwd=folder, capture_output=True,
                                    text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise DownloadError(f"apt-get download {package}={version}: {error}") from None
        debs = sorted(Path(folder).glob("*.deb"))
        if result.returncode != 0 or len(debs) != 1:
            last_line = (result.stderr.strip().splitlines() or ["no .deb was written"])[-1]
            raise DownloadError(f"apt-get download {package}={version}: {last_line}")
        check_sha256(durable.sha256_of(debs[0]), sha256, f"{debs[0].name} from apt-get download")
        with open(debs[0], "rb") as source, durable.atomic_write(target, "wb") as handle:
            shutil.copyfileobj(source, handle)


def fetch_deb(manual: DebianManual) -> Path:
    """The pinned .deb in the cache: verified there, else downloaded from the pool, else with apt-get."""
    target = cache_dir() / manual.deb_name
    if target.is_file():
        check_sha256(durable.sha256_of(target), manual.sha256, f"the cached {target} (delete it to download again)")
        return target
    logger.info("downloading %s %s from %s", manual.package, manual.version, manual.url)
    try:
        download(manual.url, target, manual.sha256)
        return target
    except DownloadError as error:
        pool_error = error
    logger.warning("%s; trying apt-get download", pool_error)
    try:
        apt_download(manual.package, manual.version, target, manual.sha256)
        return target
    except DownloadError as apt_error:
        errors = f"{pool_error}; {apt_error}"
    if pool_error.missing:
        snapshot = f"{SNAPSHOT}/package/{manual.source}/{manual.version}/"
        raise DataError(f"{manual.package} version {manual.version} is no longer in the Debian pool ({errors}). This "
                        f"collection needs exactly that version (sha256 {manual.sha256}); Debian may have moved it "
                        f"to {SNAPSHOT}: download {manual.deb_name} from {snapshot} and put it at {target}")
    raise DataError(f"could not download {manual.deb_name}: {errors}; check the network, or put the file at {target}")


# ----------------------------------------------------------------------------- unpack
def ar_members(deb: Path) -> dict[str, bytes]:
    """The members of an ``ar`` archive (a .deb), by name."""
    data = Path(deb).read_bytes()
    if not data.startswith(AR_MAGIC):
        raise DataError(f"{deb} is not a Debian package (no ar archive header)")
    members, offset = {}, len(AR_MAGIC)
    while offset + AR_HEADER_SIZE <= len(data):
        header = data[offset:offset + AR_HEADER_SIZE]
        size_field = header[48:58].strip()
        if header[58:60] != b"`\n" or not size_field.isdigit():
            raise DataError(f"{deb}: malformed ar member header at byte {offset}")
        name, size = header[:16].decode("ascii", "replace").strip().rstrip("/"), int(size_field)
        start = offset + AR_HEADER_SIZE
        if start + size > len(data):
            raise DataError(f"{deb}: ar member {name!r} is truncated")
        members[name] = data[start:start + size]
        offset = start + size + size % 2  # members are padded to an even offset
    return members


def member_path(name: str, deb: Path) -> str:
    """A tar member name as a relative path without "./"; an absolute path or a ``..`` part is refused."""
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if name.startswith("/") or ".." in parts:
        raise DataError(f"{deb}: refusing the archive member {name!r} (an absolute path or one with '..')")
    return "/".join(parts)


def extract_pages(deb: Path, doc_dir: str, pages: tuple[str, ...], dest: Path) -> None:
    """Write ``doc_dir/PAGE`` of the package's data archive to ``dest/PAGE`` for every page, checking every member
    name on the way; a page the package does not hold as a regular file is a ``DataError``."""
    members = ar_members(deb)
    data_names = [name for name in members if name.startswith("data.tar")]
    if not data_names:
        raise DataError(f"{deb} holds no data.tar.* member (found {', '.join(members)})")
    wanted = {f"{doc_dir.strip('/')}/{page}": page for page in pages}
    found = set()
    try:
        with tarfile.open(fileobj=io.BytesIO(members[data_names[0]]), mode="r:*") as archive:
            for member in archive:
                page = wanted.get(member_path(member.name, deb))
                if page is None:
                    continue
                source = archive.extractfile(member) if member.isfile() else None
                if source is None:
                    raise DataError(f"{deb}: {member.name} is not a regular file")
                (dest / page).parent.mkdir(parents=True, exist_ok=True)
                (dest / page).write_bytes(source.read())
                found.add(page)
    except tarfile.TarError as error:
        raise DataError(f"{deb}: cannot read {data_names[0]} ({error})") from None
    missing = [page for page in pages if page not in found]
    if missing:
        raise DataError(f"{deb} has no {doc_dir}/{missing[0]} ({len(missing)} of the pinned pages are missing)")


# ----------------------------------------------------------------------------- the collection
def check_questions(questions: Path, files_root: Path) -> None:
    """Every question of ``questions`` is a JSON object whose ``files`` are all under ``files_root``."""
    for number, record in iter_jsonl(questions):
        files = record.get("files")
        if not isinstance(files, list):
            raise DataError(f"{questions}:{number}: field 'files' must be a list")
        missing = [name for name in files if not (files_root / str(name)).is_file()]
        if missing:
            raise DataError(f"{questions}:{number}: question {record.get('id')!r} cites {missing[0]!r}, which is "
                            "not one of the pages taken from the package")


def _manifest(manual: DebianManual) -> dict:
    if not manual.questions.is_file():
        raise DataError(f"questions file {manual.questions} does not exist")
    return {"package": manual.package, "version": manual.version, "deb_sha256": manual.sha256,
            "questions_sha256": durable.sha256_of(manual.questions), "files": sorted(manual.pages)}


def _is_prepared(out: Path, manifest: dict) -> bool:
    try:
        recorded = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return recorded == manifest and all((out / "files" / name).is_file() for name in manifest["files"])


def prepare_debian_manual(out: Path, data_root: Path, manual: DebianManual = SQLITE_DOCS) -> None:
    """Write ``out/files/`` (the pinned pages) and ``out/questions.jsonl``, unless ``out/prepared.json`` says they
    are there already. ``data_root`` is not read: the inputs are the pinned .deb and the committed questions (the
    argument is the one every collection of ``rag_mag.bench.folders.collections`` takes)."""
    out = Path(out)
    manifest = _manifest(manual)
    if _is_prepared(out, manifest):
        return
    with durable.job_lock(durable.lock_path(out), f"the {manual.package} pages in {out}"):
        durable.recover_dir(out)
        if _is_prepared(out, manifest):
            return
        deb = fetch_deb(manual)
        staging = durable.staging_dir(out)
        try:
            with durable.disk_full_as_error(out, f"the {manual.package} pages"):
                extract_pages(deb, manual.doc_dir, manual.pages, staging / "files")
                check_questions(manual.questions, staging / "files")
                shutil.copyfile(manual.questions, staging / "questions.jsonl")
                durable.write_text(staging / MANIFEST, json.dumps(manifest, indent=1) + "\n")
                durable.sync_tree(staging)
                durable.replace_dir(staging, out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    logger.info("prepared %d pages of %s %s and their questions in %s", len(manual.pages), manual.package,
                manual.version, out)
