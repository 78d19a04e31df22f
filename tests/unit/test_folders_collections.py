"""rag_mag.bench.folders.collections: real-document QA sets written as collections (files + questions.jsonl), on tiny
fake sources in each source's own format; the real ones behind the integration marker."""

from __future__ import annotations

import csv
import io
import json
import sys
import types
from pathlib import Path

import pytest

from rag_mag.bench.folders import collections as realdocs
from rag_mag.bench.folders.collections import (
    COLLECTIONS,
    SPLITS,
    RealQuestion,
    load_collection,
    looks_like_markdown,
    prepare_collection,
    question_split,
    read_questions,
    write_questions,
)
from rag_mag.errors import ConfigError, DataError

README = "# Tool\n\nA [link](https://example.org) and **bold**.\n\n```\npip install tool\n```\n"
SCRAPED_CODE = "Recipes\nUse an if expression.\n\n# condition is a boolean\ncondition = True\n# another comment\n"


def _write_csv(path: Path, header: list[str], rows: list[list[str]], encoding: str = "utf-8") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding=encoding, newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


# ----------------------------------------------------------------------------- fake sources
def _stici(root: Path) -> Path:
    source = root / "realdocs" / "stici"
    _write_csv(source / "documents.csv", ["index", "source_url", "text"], [
        ["0", "https://github.com/someone/tool", README],
        ["1", "https://docs.example.org/recipes.html", SCRAPED_CODE],
        ["2", "https://www.dropbox.com/scl/fi/x/c2%20-%20session%2050.docx?dl=0", "Session notes\nWe went north."],
    ])
    single = [["0", "How is the tool installed?", "With pip."], ["1", "What is condition?", "A boolean."],
              ["2", "Where did we go?", "North."]]
    multi = [["0", "What does the tool page hold?", "A link, bold text and code."]]
    none = [["2", "Who is the king?"], ["1", "What is the timer?"]]
    for kind, rows, header, test_rows in (
            ("single_passage", single, ["document_index", "question", "answer"], [0]),
            ("multi_passage", multi, ["document_index", "question", "answer"], []),
            ("no_answer", none, ["document_index", "question"], [1])):
        whole = f"{kind}_answer_questions.csv" if kind != "no_answer" else "no_answer_questions.csv"
        _write_csv(source / whole, header, rows)
        _write_csv(source / f"{kind}_test_questions.csv", header, [rows[i] for i in test_rows])
        _write_csv(source / f"{kind}_train_validate_questions.csv", header,
                   [row for i, row in enumerate(rows) if i not in test_rows])
    return source


def _anthropic_docs(root: Path) -> Path:
    source = root / "realdocs" / "anthropic_docs"
    source.mkdir(parents=True)
    base = "https://docs.claude.com/en"
    chunks = [
        {"chunk_link": f"{base}/api/#authentication", "chunk_heading": "Authentication",
         "text": "Authentication\n\n\nSend an x-api-key header.\n"},
        {"chunk_link": f"{base}/docs/build-with-claude/embeddings#models", "chunk_heading": "Models",
         "text": "Models\n\n\nUse voyage models.\n"},
        {"chunk_link": f"{base}/docs/build-with-claude/embeddings#pricing", "chunk_heading": "Pricing",
         "text": "Pricing\n\nPer token.\n"},
    ]
    questions = [
        {"id": "q1", "question": "How do I authenticate?", "correct_answer": "With an x-api-key header.",
         "correct_chunks": [f"{base}/api/#authentication"]},
        {"id": "q2", "question": "Which models and price?", "correct_answer": "Voyage, per token.",
         "correct_chunks": [f"{base}/docs/build-with-claude/embeddings#models",
                            f"{base}/docs/build-with-claude/embeddings#pricing"]},
    ]
    (source / "anthropic_docs.json").write_text(json.dumps(chunks), encoding="utf-8")
    (source / "docs_evaluation_dataset.json").write_text(json.dumps(questions), encoding="utf-8")
    return source


def _sec10q(root: Path, source_docs: tuple[str, ...] = ("*AAPL*", "*2023 Q3 MSFT*", "*2022 Q3 AAPL*, *MSFT*")) -> Path:
    source = root / "realdocs" / "sec10q"
    (source / "docs").mkdir(parents=True)
    for name in ("2022 Q3 AAPL.pdf", "2023 Q3 AAPL.pdf", "2022 Q3 MSFT.pdf", "2023 Q3 MSFT.pdf"):
        (source / "docs" / name).write_bytes(b"%PDF-1.4 " + name.encode())
    rows = [[f"Question {number}?", docs, "Multi-Doc RAG", "Table", f"Answer {number}."]
            for number, docs in enumerate(source_docs)]
    _write_csv(source / "qna_data.csv", ["Question", "Source Docs", "Question Type", "Source Chunk Type", "Answer"],
               rows, encoding="utf-8-sig")  # the real file starts with a byte-order mark
    return source


def _by_id(collection) -> dict[str, RealQuestion]:
    return {question.id: question for question in read_questions(collection.questions_path)}


# ----------------------------------------------------------------------------- the three sources
def test_stici_writes_typed_files_and_questions_with_the_source_splits(tmp_path):
    _stici(tmp_path)
    collection = prepare_collection("stici", tmp_path / "out", tmp_path)
    names = sorted(path.name for path in (tmp_path / "out" / "files").iterdir())
    # the README is Markdown; scraped text whose "# ..." lines are code comments is not
    assert names == ["00-tool.md", "01-recipes.txt", "02-c2-session-50.txt"]
    assert (tmp_path / "out" / "files" / "00-tool.md").read_text(encoding="utf-8") == README
    assert (collection.files_count, collection.questions_count, collection.name) == (3, 6, "stici")
    questions = _by_id(collection)
    assert questions["stici-single_passage-1"] == RealQuestion(
        id="stici-single_passage-1", collection="stici", question="How is the tool installed?",
        answers=("With pip.",), answer_type="short", files=("00-tool.md",), pages=None, answerable=True,
        split="test")
    assert questions["stici-multi_passage-1"].answer_type == "long"
    assert questions["stici-single_passage-3"].split == "validation"
    unanswerable = questions["stici-no_answer-2"]
    assert (unanswerable.answerable, unanswerable.answers, unanswerable.files, unanswerable.split) == (
        False, (), (), "test")


@pytest.mark.parametrize("damage, message", [
    ("both", "is in single_passage_answer_questions.csv and single_passage_test_questions.csv and "
             "single_passage_train_validate_questions.csv"),
    ("neither", "is in single_passage_answer_questions.csv;"),
])
def test_stici_refuses_a_question_not_in_exactly_one_split_file(tmp_path, damage, message):
    source = _stici(tmp_path)
    header = ["document_index", "question", "answer"]
    row = ["2", "Where did we go?", "North."]
    _write_csv(source / "single_passage_test_questions.csv", header,
               [["0", "How is the tool installed?", "With pip."]] + ([row] if damage == "both" else []))
    if damage == "neither":
        _write_csv(source / "single_passage_train_validate_questions.csv", header,
                   [["1", "What is condition?", "A boolean."]])
    with pytest.raises(DataError, match=message):
        prepare_collection("stici", tmp_path / "out", tmp_path)
    assert [path.name for path in tmp_path.iterdir()] == ["realdocs"]  # no output, staging folder or lock left


def test_anthropic_docs_regroups_chunks_into_markdown_pages(tmp_path):
    _anthropic_docs(tmp_path)
    collection = prepare_collection("anthropic_docs", tmp_path / "out", tmp_path)
    files = tmp_path / "out" / "files"
    assert sorted(path.relative_to(files).as_posix() for path in files.rglob("*.md")) == [
        "en/api/index.md", "en/docs/build-with-claude/embeddings.md"]
    # one "# heading" per chunk, in the original order, without the heading line each chunk's text repeats
    assert (files / "en/docs/build-with-claude/embeddings.md").read_text(encoding="utf-8") == (
        "# Models\n\nUse voyage models.\n\n# Pricing\n\nPer token.\n")
    questions = _by_id(collection)
    assert questions["anthropic_docs-q2"].files == ("en/docs/build-with-claude/embeddings.md",)
    assert questions["anthropic_docs-q1"].answers == ("With an x-api-key header.",)
    assert all(q.answer_type == "long" and q.answerable and q.split in SPLITS for q in questions.values())


def test_the_hash_split_is_stable_and_near_forty_percent_validation():
    splits = [realdocs._hash_split(f"question-{number}") for number in range(2000)]
    assert splits == [realdocs._hash_split(f"question-{number}") for number in range(2000)]
    assert 0.36 < splits.count("validation") / len(splits) < 0.44


def test_sec10q_copies_the_pdfs_and_resolves_the_source_globs(tmp_path):
    _sec10q(tmp_path)
    collection = prepare_collection("sec10q", tmp_path / "out", tmp_path)
    assert collection.files_count == 4
    assert (tmp_path / "out/files/2023 Q3 MSFT.pdf").read_bytes() == b"%PDF-1.4 2023 Q3 MSFT.pdf"
    files = [question.files for question in read_questions(collection.questions_path)]
    assert files == [("2022 Q3 AAPL.pdf", "2023 Q3 AAPL.pdf"), ("2023 Q3 MSFT.pdf",),
                     ("2022 Q3 AAPL.pdf", "2022 Q3 MSFT.pdf", "2023 Q3 MSFT.pdf")]
    assert all(q.pages is None and q.answer_type == "long" for q in read_questions(collection.questions_path))


def test_sec10q_refuses_a_glob_that_matches_no_pdf(tmp_path):
    _sec10q(tmp_path, source_docs=("*AAPL*", "*NVDA*"))
    with pytest.raises(DataError, match=r"qna_data.csv, row 2: Source Docs '\*NVDA\*' matches no PDF"):
        prepare_collection("sec10q", tmp_path / "out", tmp_path)


# ----------------------------------------------------------------------------- preparing once
def _snapshot(folder: Path) -> dict[str, int]:
    return {str(path): path.stat().st_mtime_ns for path in [folder, *folder.rglob("*")]}


def test_a_second_preparation_writes_nothing_and_changed_inputs_rebuild(tmp_path):
    source = _stici(tmp_path)
    out = tmp_path / "out"
    prepare_collection("stici", out, tmp_path)
    before = _snapshot(out)
    again = prepare_collection("stici", out, tmp_path)
    assert _snapshot(out) == before and again.questions_count == 6
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out", "realdocs"]  # no lock, no staging left
    rows = list(csv.reader(io.StringIO((source / "documents.csv").read_text(encoding="utf-8"), newline="")))
    rows[3][2] = "Session notes\nWe went south."
    _write_csv(source / "documents.csv", rows[0], rows[1:])
    prepare_collection("stici", out, tmp_path)
    assert (out / "files/02-c2-session-50.txt").read_text(encoding="utf-8").endswith("south.")
    manifest = json.loads((out / "prepared.json").read_text(encoding="utf-8"))
    assert manifest["format_version"] == realdocs.FORMAT_VERSION and "documents.csv" in manifest["inputs"]


def test_a_preparation_missing_a_file_is_made_again(tmp_path):
    _anthropic_docs(tmp_path)
    out = tmp_path / "out"
    prepare_collection("anthropic_docs", out, tmp_path)
    (out / "files/en/api/index.md").unlink()
    prepare_collection("anthropic_docs", out, tmp_path)
    assert (out / "files/en/api/index.md").is_file()


def test_unknown_collection_and_split_are_refused_with_the_known_names(tmp_path):
    with pytest.raises(ConfigError, match="unknown collection 'wiki'; the collections are stici, anthropic_docs"):
        prepare_collection("wiki", tmp_path / "out", tmp_path)
    with pytest.raises(ConfigError, match="unknown split 'train'; the splits are validation, test"):
        question_split([], "train")


def test_question_split_filters(tmp_path):
    _stici(tmp_path)
    questions = read_questions(prepare_collection("stici", tmp_path / "out", tmp_path).questions_path)
    assert [q.id for q in question_split(questions, "test")] == ["stici-single_passage-1", "stici-no_answer-2"]
    assert len(question_split(questions, "validation")) == 4


def test_a_missing_source_is_one_clear_error(tmp_path):
    with pytest.raises(DataError, match=r"realdocs/anthropic_docs/anthropic_docs.json does not exist"):
        prepare_collection("anthropic_docs", tmp_path / "out", tmp_path)


def test_sqlite_docs_is_prepared_by_the_debian_module_imported_on_use(tmp_path, monkeypatch):
    def prepare_debian_manual(out: Path, data_root: Path) -> None:
        (out / "files").mkdir()
        (out / "files" / "lang.html").write_text("<h1>SQL</h1>", encoding="utf-8")
        write_questions(out / "questions.jsonl", [RealQuestion(
            id="sqlite-1", collection="sqlite_docs", question="What is SQL?", answers=("A language.",),
            answer_type="short", files=("lang.html",), pages=None, answerable=True, split="test")])

    monkeypatch.setitem(sys.modules, "rag_mag.bench.folders.debian_manual",
                        types.SimpleNamespace(prepare_debian_manual=prepare_debian_manual))
    collection = prepare_collection("sqlite_docs", tmp_path / "out", tmp_path)
    assert (collection.name, collection.files_count, collection.questions_count) == ("sqlite_docs", 1, 1)
    assert set(COLLECTIONS) == {"stici", "anthropic_docs", "sec10q", "sqlite_docs"}


# ----------------------------------------------------------------------------- the format, for any collection
def _record(**changes) -> dict:
    record = {"id": "q1", "collection": "mine", "question": "Why?", "answers": ["Because."], "answer_type": "short",
              "files": ["a/b.txt"], "pages": [2], "answerable": True, "split": "test"}
    record.update(changes)
    return record


def _user_collection(folder: Path, records: list[dict]) -> Path:
    (folder / "files" / "a").mkdir(parents=True)
    (folder / "files" / "a" / "b.txt").write_text("Because.", encoding="utf-8")
    (folder / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return folder


def test_load_collection_reads_another_teams_folder(tmp_path):
    unanswerable = _record(id="q2", answers=[], files=[], pages=None, answerable=False, split="validation")
    collection = load_collection(_user_collection(tmp_path / "theirs", [_record(), unanswerable]))
    assert (collection.name, collection.files_count, collection.questions_count) == ("mine", 1, 2)
    assert read_questions(collection.questions_path)[0].pages == (2,)


def test_load_collection_refuses_a_cited_file_that_is_missing(tmp_path):
    folder = _user_collection(tmp_path / "theirs", [_record(files=["a/c.txt"])])
    with pytest.raises(DataError, match=r"question 'q1' cites 'a/c.txt', which is not a file under"):
        load_collection(folder)


@pytest.mark.parametrize("changes, message", [
    ({"answers": "Because."}, "field 'answers' must be a list of non-empty strings, got 'Because.'"),
    ({"answer_type": "medium"}, "field 'answer_type' must be one of short, long, got 'medium'"),
    ({"files": ["../etc/passwd"]}, "field 'files' must be a list of paths relative to files/"),
    ({"files": ["a\\b.txt"]}, "field 'files' must be a list of paths relative to files/"),
    ({"pages": [0]}, "field 'pages' must be null or a list of page numbers from 1, got \\[0\\]"),
    ({"pages": [True]}, "field 'pages' must be null or a list of page numbers from 1"),
    ({"answerable": "yes"}, "field 'answerable' must be true or false"),
    ({"split": "train"}, "field 'split' must be one of validation, test, got 'train'"),
    ({"answerable": False}, "field 'answers' must be empty when 'answerable' is false"),
    ({"files": []}, "field 'files' must be non-empty when 'answerable' is true"),
    ({"extra": 1}, "field 'extra' is not part of the schema"),
    ({"question": ""}, "field 'question' must be a non-empty string"),
])
def test_read_questions_names_the_file_line_and_field(tmp_path, changes, message):
    path = tmp_path / "questions.jsonl"
    path.write_text(json.dumps(_record(id="q0")) + "\n\n" + json.dumps(_record(**changes)) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=f"questions.jsonl:3: {message}"):
        read_questions(path)


def test_read_questions_refuses_a_missing_field_bad_json_and_a_repeated_id(tmp_path):
    path = tmp_path / "questions.jsonl"
    record = _record()
    del record["pages"]
    for text, message in ((json.dumps(record), "questions.jsonl:1: field 'pages' is missing"),
                          ("{not json", "questions.jsonl:1: not valid JSON"),
                          (json.dumps(_record()) + "\n" + json.dumps(_record()),
                           "questions.jsonl:2: field 'id' repeats 'q1' of line 1")):
        path.write_text(text + "\n", encoding="utf-8")
        with pytest.raises(DataError, match=message):
            read_questions(path)


def test_written_questions_read_back_equal(tmp_path):
    question = RealQuestion(id="x", collection="c", question="Q?", answers=(), answer_type="long", files=(),
                            pages=None, answerable=False, split="validation")
    write_questions(tmp_path / "q.jsonl", [question])
    assert read_questions(tmp_path / "q.jsonl") == [question]


def test_markdown_needs_more_than_lines_that_start_with_a_hash():
    assert looks_like_markdown(README)
    assert looks_like_markdown("# Title\n\nSome text.\n\n## Section\n")
    assert not looks_like_markdown(SCRAPED_CODE)
    assert not looks_like_markdown("Plain text with a `code` word.")


# ----------------------------------------------------------------------------- the real sources
@pytest.mark.integration
@pytest.mark.parametrize("name, files, answerable, unanswerable", [
    ("stici", 20, 80, 40), ("anthropic_docs", 45, 100, 0), ("sec10q", 20, 195, 0)])
def test_the_real_collections(tmp_path, name, files, answerable, unanswerable):
    from rag_mag.bench.datasets import data_root

    root = data_root()
    if root is None or not (root / "realdocs" / name).is_dir():
        pytest.skip(f"realdocs/{name} not found (set RAG_MAG_DATA_ROOT or place the data in ../shared/data)")
    collection = prepare_collection(name, tmp_path / name, root)
    questions = read_questions(collection.questions_path)
    assert collection.files_count == files
    assert (sum(q.answerable for q in questions), sum(not q.answerable for q in questions)) == (
        answerable, unanswerable)
    assert all(q.files for q in questions if q.answerable)
    assert {q.split for q in questions} == set(SPLITS)
