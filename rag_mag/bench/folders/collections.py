"""Benchmark collections of real documents: ``OUT/files/`` (what a user would index) and ``OUT/questions.jsonl``
(one ``RealQuestion`` a line), prepared from ``DATA_ROOT/realdocs/NAME/`` (see its SOURCES.md) in a folder swapped in
whole, and left as it is while ``OUT/prepared.json`` records the same format version and input sha256s.
``load_collection`` reads any folder in this format, so a collection made elsewhere needs no code."""

from __future__ import annotations

import csv
import fnmatch
import hashlib
import json
import logging
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from rag_mag import durable
from rag_mag.data import iter_jsonl
from rag_mag.errors import ConfigError, DataError
from rag_mag.models import REPO_ROOT

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
SPLITS = ("validation", "test")
ANSWER_TYPES = ("short", "long")
VALIDATION_SHARE = 0.4  # of the collections whose source has no split, by a hash of the question id
MANIFEST = "prepared.json"


@dataclass(frozen=True)
class RealQuestion:
    id: str
    collection: str
    question: str
    answers: tuple[str, ...]     # empty when unanswerable
    answer_type: str             # "short" | "long"
    files: tuple[str, ...]       # relative to files/, forward slashes; empty when unanswerable
    pages: tuple[int, ...] | None  # 1-based, only where the page is known
    answerable: bool
    split: str                   # "validation" | "test"


@dataclass(frozen=True)
class Collection:
    name: str
    folder: Path
    questions_path: Path
    files_count: int
    questions_count: int


# ----------------------------------------------------------------------------- the questions file
def _is_text_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) and item.strip() for item in value)


def _is_relative_posix(path: str) -> bool:
    return "\\" not in path and all(part not in ("", ".", "..") for part in path.split("/"))  # "" also: /x, x//y


_FIELD_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {  # field: (its test, what it must be)
    **{field: (lambda value: isinstance(value, str) and bool(value.strip()), "a non-empty string")
       for field in ("id", "collection", "question")},
    "answers": (_is_text_list, "a list of non-empty strings"),
    "answer_type": (lambda value: value in ANSWER_TYPES, f"one of {', '.join(ANSWER_TYPES)}"),
    "files": (lambda value: _is_text_list(value) and all(map(_is_relative_posix, value)),
              "a list of paths relative to files/, with forward slashes and no '..'"),
    "pages": (lambda pages: pages is None or (isinstance(pages, list) and all(type(n) is int and n > 0 for n in pages)),
              "null or a list of page numbers from 1"),
    "answerable": (lambda value: type(value) is bool, "true or false"),
    "split": (lambda value: value in SPLITS, f"one of {', '.join(SPLITS)}"),
}
QUESTION_FIELDS = tuple(_FIELD_RULES)


def _question_from(record: Any, where: str) -> RealQuestion:
    """One validated question; ``where`` is ``FILE:LINE`` for the error message."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for field, (test, must_be) in _FIELD_RULES.items():
        if field not in record:
            raise DataError(f"{where}: field {field!r} is missing")
        if not test(record[field]):
            raise DataError(f"{where}: field {field!r} must be {must_be}, got {record[field]!r}")
    unknown = sorted(set(record) - set(QUESTION_FIELDS))
    if unknown:
        raise DataError(f"{where}: field {unknown[0]!r} is not part of the schema ({', '.join(QUESTION_FIELDS)})")
    for field in ("answers", "files"):
        if bool(record[field]) != record["answerable"]:
            raise DataError(f"{where}: field {field!r} must be {'non-empty' if record['answerable'] else 'empty'} "
                            f"when 'answerable' is {str(record['answerable']).lower()}")
    pages = record["pages"]
    return RealQuestion(**{**record, "answers": tuple(record["answers"]), "files": tuple(record["files"]),
                           "pages": None if pages is None else tuple(pages)})


def read_questions(path: Path) -> list[RealQuestion]:
    """The questions of a ``questions.jsonl``; a bad record is a ``DataError`` naming the file, line and field."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"questions file {path} does not exist")
    questions: dict[str, tuple[int, RealQuestion]] = {}  # id -> (its line, the question)
    for number, record in iter_jsonl(path):
        question = _question_from(record, f"{path}:{number}")
        earlier = questions.get(question.id)
        if earlier:
            raise DataError(f"{path}:{number}: field 'id' repeats {question.id!r} of line {earlier[0]}")
        questions[question.id] = (number, question)
    return [question for _, question in questions.values()]


def write_questions(path: Path, questions: Sequence[RealQuestion]) -> None:
    durable.write_text(path, "".join(json.dumps(asdict(q), ensure_ascii=False) + "\n" for q in questions))


def question_split(questions: Sequence[RealQuestion], split: str) -> list[RealQuestion]:
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; the splits are {', '.join(SPLITS)}")
    return [question for question in questions if question.split == split]


def load_collection(folder: Path) -> Collection:
    """A collection folder in this format (``files/`` + ``questions.jsonl``), with every cited file present."""
    folder = Path(folder)
    files_root, questions_path = folder / "files", folder / "questions.jsonl"
    if not files_root.is_dir():
        raise DataError(f"{folder} is not a collection: it has no files/ folder")
    questions = read_questions(questions_path)
    names = sorted({question.collection for question in questions})
    if len(names) > 1:
        raise DataError(f"{questions_path} mixes collections {', '.join(names)}; one folder holds one collection")
    for question in questions:
        missing = [path for path in question.files if not (files_root / path).is_file()]
        if missing:
            raise DataError(f"{questions_path}: question {question.id!r} cites {missing[0]!r}, which is not a "
                            f"file under {files_root}")
    files_count = sum(1 for path in files_root.rglob("*") if path.is_file())
    return Collection(name=names[0] if names else folder.name, folder=folder, questions_path=questions_path,
                      files_count=files_count, questions_count=len(questions))


def _require(path: Path) -> Path:
    if path.is_file():
        return path
    raise DataError(f"{path} does not exist; see realdocs/SOURCES.md for the files each collection needs")


def _read_csv(path: Path, columns: Sequence[str]) -> list[dict[str, str]]:
    previous_limit = csv.field_size_limit(2**31 - 1)  # documents.csv holds pages of up to 212k characters
    try:
        with open(_require(path), encoding="utf-8-sig", newline="") as handle:  # -sig: qna_data.csv starts with a BOM
            reader = csv.DictReader(handle)
            missing = [column for column in columns if column not in (found := reader.fieldnames or [])]
            if missing:
                raise DataError(f"{path}: column {missing[0]!r} is missing (found {', '.join(found)})")
            return list(reader)
    finally:
        csv.field_size_limit(previous_limit)


def _records(path: Path, fields: Sequence[str]) -> list[dict[str, Any]]:
    try:  # a JSON file holding a list of objects, each with ``fields``
        records = json.loads(_require(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise DataError(f"{path}:{error.lineno}: not valid JSON ({error.msg})") from None
    if not isinstance(records, list):
        raise DataError(f"{path}: expected a JSON list, got {type(records).__name__}")
    for number, record in enumerate(records):
        missing = [field for field in fields if not isinstance(record, dict) or field not in record]
        if missing:
            raise DataError(f"{path}: record {number} has no field {missing[0]!r}")
    return records


def _hash_split(question_id: str) -> str:
    fraction = int(hashlib.sha256(question_id.encode("utf-8")).hexdigest()[:8], 16) / 2**32
    return "validation" if fraction < VALIDATION_SHARE else "test"


# ----------------------------------------------------------------------------- stici: web pages stored as text
STICI_KINDS = {  # kind: (file of all its questions, answer type; None: unanswerable)
    "single_passage": ("single_passage_answer_questions.csv", "short"),
    "multi_passage": ("multi_passage_answer_questions.csv", "long"),
    "no_answer": ("no_answer_questions.csv", None),
}


def looks_like_markdown(text: str) -> bool:
    """Whether ``text`` is Markdown: at least two kinds of Markdown markup. A ``# line`` alone is not enough: it
    is also a comment in the Python and shell snippets that text scraped from a rendered page keeps."""
    markers = (r"(?m)^#{1,6} \S", r"\A#{1,6} \S", r"(?m)^```", r"\[[^\]\n]+\]\([^)\s]+\)", r"\*\*[^*\n]+\*\*",
               r"(?m)^\|?\s*:?-{3,}:?\s*\|")
    return sum(1 for marker in markers if re.search(marker, text)) >= 2


def _slug(url: str) -> str:
    parsed = urlparse(url)
    last = unquote(parsed.path.rstrip("/").rsplit("/", 1)[-1])
    last = re.sub(r"\.(html?|php|aspx?|docx?|pdf|txt|md)$", "", last, flags=re.IGNORECASE)
    slug = re.sub(r"[^a-z0-9]+", "-", last.lower()).strip("-")[:60].strip("-")
    return slug or re.sub(r"[^a-z0-9]+", "-", parsed.netloc.lower()).strip("-") or "document"


def _stici_documents(source: Path, files_root: Path) -> dict[str, str]:
    """Write each document as ``NN-slug.md|txt``; returns document index -> its path under files/."""
    paths: dict[str, str] = {}
    for number, row in enumerate(_read_csv(source / "documents.csv", ("index", "source_url", "text")), start=1):
        index = row["index"].strip()
        if not index.isdigit() or index in paths:
            raise DataError(f"{source / 'documents.csv'}, row {number}: index {index!r} is not a new whole number")
        extension = "md" if looks_like_markdown(row["text"]) else "txt"
        paths[index] = f"{int(index):02d}-{_slug(row['source_url'])}.{extension}"
        (files_root / paths[index]).write_text(row["text"], encoding="utf-8")
    return paths


def _stici_questions(source: Path, kind: str, documents: dict[str, str]) -> list[RealQuestion]:
    """The questions of ``kind``, each in its ``*_questions.csv`` and in exactly one split file."""
    file_name, answer_type = STICI_KINDS[kind]
    test_name, validation_name = f"{kind}_test_questions.csv", f"{kind}_train_validate_questions.csv"
    columns = ("document_index", "question") + (("answer",) if answer_type else ())
    tables = {name: [tuple(row[column].strip() for column in columns) for row in _read_csv(source / name, columns)]
              for name in (file_name, test_name, validation_name)}
    for name, keys in tables.items():
        repeated = [key for key in keys if keys.count(key) > 1]
        if repeated:
            raise DataError(f"{source / name}: question {repeated[0][1]!r} appears twice")
    for key in dict.fromkeys(key for keys in tables.values() for key in keys):
        holders = [name for name, keys in tables.items() if key in keys]
        if holders[0] != file_name or len(holders) != 2:
            raise DataError(f"{source}: {kind} question {key[1]!r} is in {' and '.join(holders)}; each must be in "
                            f"{file_name} and in exactly one of {test_name} and {validation_name}")
        if key[0] not in documents:
            raise DataError(f"{source / file_name}: question {key[1]!r} has document_index {key[0]!r}, which is "
                            "not in documents.csv")
    return [RealQuestion(id=f"stici-{kind}-{number}", collection="stici", question=key[1], answers=key[2:],
                         answer_type=answer_type or "short", files=(documents[key[0]],) if answer_type else (),
                         pages=None, answerable=bool(answer_type),
                         split="test" if key in tables[test_name] else "validation")
            for number, key in enumerate(tables[file_name], start=1)]


def _prepare_stici(out: Path, data_root: Path) -> None:
    source = data_root / "realdocs" / "stici"
    (out / "files").mkdir(parents=True, exist_ok=True)
    documents = _stici_documents(source, out / "files")
    write_questions(out / "questions.jsonl", [question for kind in STICI_KINDS
                                              for question in _stici_questions(source, kind, documents)])


# ----------------------------------------------------------------------------- anthropic_docs: chunks of 45 pages
def _page_path(url: str) -> str:
    """``https://host/en/docs/x/embeddings`` -> ``en/docs/x/embeddings.md``; a path ending in / -> ``.../index.md``."""
    path = urlparse(url).path
    parts = [part for part in (re.sub(r"[^A-Za-z0-9._-]+", "-", unquote(part)) for part in path.split("/"))
             if part.strip(".")]  # no empty, "." or ".." parts
    if not parts or path.endswith("/"):
        parts.append("index")
    return "/".join(parts) + ".md"


def _prepare_anthropic_docs(out: Path, data_root: Path) -> None:
    source = data_root / "realdocs" / "anthropic_docs"
    chunks = _records(source / "anthropic_docs.json", ("chunk_link", "chunk_heading", "text"))
    pages: dict[str, list[str]] = {}  # page path -> its sections, in the order of the chunks
    page_of_link: dict[str, str] = {}
    for chunk in chunks:
        path = _page_path(chunk["chunk_link"].split("#", 1)[0])
        heading, text = chunk["chunk_heading"].strip(), chunk["text"]
        first, _, rest = text.partition("\n")
        body = rest.strip("\n") if first.strip() == heading else text.strip("\n")  # each text repeats its heading
        pages.setdefault(path, []).append(f"# {heading}\n\n{body}".rstrip() + "\n")
        page_of_link[chunk["chunk_link"]] = path
    for path, sections in pages.items():
        (out / "files" / path).parent.mkdir(parents=True, exist_ok=True)
        (out / "files" / path).write_text("\n".join(sections), encoding="utf-8")
    evaluation = source / "docs_evaluation_dataset.json"
    records = _records(evaluation, ("id", "question", "correct_chunks", "correct_answer"))
    for record in records:
        unknown = [link for link in record["correct_chunks"] if link not in page_of_link]
        if unknown:
            raise DataError(f"{evaluation}: question {record['id']!r} cites chunk {unknown[0]!r}, not in the chunks")
    write_questions(out / "questions.jsonl", [RealQuestion(
        id=f"anthropic_docs-{record['id']}", collection="anthropic_docs", question=record["question"],
        answers=(record["correct_answer"],), answer_type="long",
        files=tuple(dict.fromkeys(page_of_link[link] for link in record["correct_chunks"])), pages=None,
        answerable=True, split=_hash_split(f"anthropic_docs-{record['id']}")) for record in records])


# ----------------------------------------------------------------------------- sec10q: 10-Q filings as PDF
def _prepare_sec10q(out: Path, data_root: Path) -> None:
    docs, table = data_root / "realdocs" / "sec10q" / "docs", data_root / "realdocs" / "sec10q" / "qna_data.csv"
    pdfs = sorted(path.name for path in docs.glob("*.pdf"))
    if not pdfs:
        raise DataError(f"{docs} holds no PDF files; see realdocs/SOURCES.md")
    durable.ensure_free_space(out, sum((docs / name).stat().st_size for name in pdfs), "the sec10q PDFs")
    (out / "files").mkdir(parents=True, exist_ok=True)
    for name in pdfs:
        shutil.copyfile(docs / name, out / "files" / name)
    questions: dict[str, RealQuestion] = {}
    for number, row in enumerate(_read_csv(table, ("Question", "Source Docs", "Answer")), start=1):
        text, answer = row["Question"].strip(), row["Answer"].strip()
        # "*AAPL*", or several globs separated by commas, semicolons or new lines (a glob may hold spaces)
        globs = [glob.strip() for glob in re.split(r"[,;\n]", row["Source Docs"]) if glob.strip()]
        unmatched = [glob for glob in globs if not any(fnmatch.fnmatchcase(name, glob) for name in pdfs)]
        question_id = "sec10q-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]
        problem = ("a cell is empty" if not (text and answer and globs) else
                   f"Source Docs {unmatched[0]!r} matches no PDF in {docs}" if unmatched else
                   f"the question {text!r} is asked twice" if question_id in questions else None)
        if problem:
            raise DataError(f"{table}, row {number}: {problem}")
        files = tuple(name for name in pdfs if any(fnmatch.fnmatchcase(name, glob) for glob in globs))
        questions[question_id] = RealQuestion(
            id=question_id, collection="sec10q", question=text, answers=(answer,), answer_type="long", files=files,
            pages=None, answerable=True, split=_hash_split(question_id))
    write_questions(out / "questions.jsonl", list(questions.values()))


def _prepare_sqlite_docs(out: Path, data_root: Path) -> None:  # pages from Debian, questions committed here
    from rag_mag.bench.folders.debian_manual import prepare_debian_manual

    prepare_debian_manual(out, data_root)


COLLECTIONS: dict[str, Callable[[Path, Path], None]] = {  # (out, data_root): write out/files/, out/questions.jsonl
    "stici": _prepare_stici,
    "anthropic_docs": _prepare_anthropic_docs,
    "sec10q": _prepare_sec10q,
    "sqlite_docs": _prepare_sqlite_docs,
}


def _input_hashes(name: str, data_root: Path) -> dict[str, str]:
    """The sha256 of every source file, in the data root or in this repository (sqlite_docs' questions)."""
    source = data_root / "realdocs" / name
    if not source.is_dir():
        source = REPO_ROOT / "data" / "realdocs" / name
    if not source.is_dir():
        return {}
    return {path.relative_to(source).as_posix(): durable.sha256_of(path)
            for path in sorted(source.rglob("*")) if path.is_file()}


def _with_counts(manifest: dict[str, Any], collection: Collection) -> dict[str, Any]:
    return {**manifest, "files_count": collection.files_count, "questions_count": collection.questions_count}


def _prepared_already(out: Path, manifest: dict[str, Any]) -> Collection | None:
    """The collection in ``out`` if it is a complete preparation described by ``manifest``, else None."""
    try:
        recorded = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
        collection = load_collection(out)
    except (OSError, ValueError, DataError):  # not prepared, or no longer complete
        return None
    return collection if recorded == _with_counts(manifest, collection) else None


def prepare_collection(name: str, out: Path, data_root: Path) -> Collection:
    """Write collection ``name`` into ``out`` from ``data_root/realdocs/NAME``, unless ``out`` already holds it."""
    if name not in COLLECTIONS:
        raise ConfigError(f"unknown collection {name!r}; the collections are {', '.join(COLLECTIONS)}")
    out, data_root = Path(out), Path(data_root)
    manifest = {"format_version": FORMAT_VERSION, "collection": name, "inputs": _input_hashes(name, data_root)}
    # Checked first without the lock, whose probe would write inside out: a folder is only ever swapped in whole
    collection = _prepared_already(out, manifest)
    if collection is not None:
        return collection
    with durable.job_lock(durable.lock_path(out), f"collection {name} in {out}"):
        durable.recover_dir(out)
        return _prepared_already(out, manifest) or _prepare(name, out, data_root, manifest)


def _prepare(name: str, out: Path, data_root: Path, manifest: dict[str, Any]) -> Collection:
    staging = durable.staging_dir(out)
    try:
        with durable.disk_full_as_error(out, f"collection {name}"):
            COLLECTIONS[name](staging, data_root)
            collection = load_collection(staging)
            if collection.questions_count and collection.name != name:
                raise DataError(f"the questions of collection {name} say they are of {collection.name!r}")
            durable.write_text(staging / MANIFEST, json.dumps(_with_counts(manifest, collection), indent=1) + "\n")
            durable.sync_tree(staging)
            durable.replace_dir(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("prepared collection %s in %s: %d files, %d questions", name, out, collection.files_count,
                collection.questions_count)
    return replace(collection, name=name, folder=out, questions_path=out / "questions.jsonl")
