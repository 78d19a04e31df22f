"""BoilerplateCleaner: page headers and footers, lines shared by files, tables of contents; and the chunking digest
that covers its settings."""

from __future__ import annotations

import hashlib

import pytest
from haystack import Document, Pipeline

from rag_mag.components.boilerplate_cleaner import (
    REMOVED_KEY,
    BoilerplateCleaner,
    normalize_line,
    remove_lines,
    repeated_page_lines,
    shared_lines,
    toc_line_numbers,
)
from rag_mag.components.passage_splitter import PassageSplitter
from rag_mag.ingestion.file_indexing import chunking_digest

FOOTED_PAGES = "\f".join(
    f"{body}\nApple Inc. | Q3 2023 Form 10-Q | {page}" for page, body in enumerate([
        "Net sales rose in every region.", "Services grew faster than products.",
        "Operating expenses were flat.", "The board declared a dividend."], start=12))

SEC_TOC = """Apple Inc.
Table of Contents
Item 1. Financial Statements ..... 1
Item 2. Management's Discussion and Analysis ..... 13
Item 3. Quantitative and Qualitative Disclosures About Market Risk ..... 18
Item 4. Controls and Procedures 18
Item 1A. Risk Factors 41
The company designs and sells phones."""

COPYRIGHT = "Copyright 2024 ACME Corp. All rights reserved."
NAVIGATION = "Home | Guides | API reference | Release notes"


def manual_pages(topics: list[str]) -> list[str]:
    """Files of one manual: a copyright header, a navigation line and a short heading on each."""
    return [f"{COPYRIGHT.replace('2024', str(2020 + i))}\n{NAVIGATION}\nUser Guide\nThis page explains {topic} in "
            "detail." for i, topic in enumerate(topics)]


# ------------------------------------------------------------------------------------------- the rules
def test_lines_are_compared_stripped_lowercased_and_with_any_number_as_zero():
    assert normalize_line("  Page 3  of\t10 ") == normalize_line("page 4 of 10") == "page 0 of 0"
    assert normalize_line("Q3 2023 Form 10-Q") == "q0 0 form 0-q"


def test_a_footer_whose_page_number_changes_is_found_on_every_page():
    assert repeated_page_lines(FOOTED_PAGES, min_pages=3, page_share=0.5) == {"apple inc. | q0 0 form 0-q | 0"}
    assert repeated_page_lines(FOOTED_PAGES, min_pages=5, page_share=0.5) == set()  # too few pages
    text, removed = remove_lines(FOOTED_PAGES, repeated_page_lines(FOOTED_PAGES, 3, 0.5), toc_min_lines=4)
    assert removed == 4 and "Apple Inc." not in text
    assert text.split("\f") == ["Net sales rose in every region.", "Services grew faster than products.",
                                "Operating expenses were flat.", "The board declared a dividend."]


def test_a_line_on_too_few_pages_stays():
    text = "Intro\nSummary\fBody one\fBody two\fSummary\nBody three\fEnd"
    assert repeated_page_lines(text, min_pages=3, page_share=0.5) == set()  # on 2 of 5 pages
    assert repeated_page_lines(text, min_pages=3, page_share=0.4) == {"summary"}


def test_a_table_of_contents_goes_with_its_heading():
    lines = SEC_TOC.split("\n")
    assert toc_line_numbers(lines, min_lines=4) == set(range(1, 7))
    assert toc_line_numbers(lines, min_lines=6) == set()
    text, removed = remove_lines(SEC_TOC, set(), toc_min_lines=4)
    assert text == "Apple Inc.\nThe company designs and sells phones." and removed == 6


def test_lines_of_amounts_are_not_a_table_of_contents():
    amounts = ["Apples 12", "Pears 7", "Plums 30", "Figs 9", "Cherries 4"]  # page numbers would not go down
    assert toc_line_numbers(amounts, min_lines=4) == set()
    rows = ["Net sales 120 345", "Cost of sales 70 200", "Gross margin 50 145", "Operating income 20 90"]
    assert toc_line_numbers(rows, min_lines=4) == set()
    prose = ["This is a sentence.", "Another one follows it.", "Contents", "Intro 1", "Setup 2", "Use 3"]
    assert toc_line_numbers(prose, min_lines=4) == set()  # three entries are not enough


def test_lines_shared_by_most_files_go_and_short_headings_stay():
    texts = manual_pages(["installing", "upgrading", "backups", "logging", "alerts"])
    assert shared_lines(texts, min_documents=4, document_share=0.5, min_line_words=3) == {
        normalize_line(COPYRIGHT), normalize_line(NAVIGATION)}  # "User Guide" is 2 words: a heading
    assert shared_lines(texts[:3], min_documents=4, document_share=0.5, min_line_words=3) == set()
    assert normalize_line("User Guide") in shared_lines(texts, 4, 0.5, min_line_words=2)


# ------------------------------------------------------------------------------------------- the component
def test_the_component_cleans_documents_and_keeps_ids_meta_and_form_feeds():
    texts = manual_pages(["installing", "upgrading", "backups", "logging"]) + [FOOTED_PAGES]
    documents = [Document(content=text, meta={"file": f"f{i}.txt"}) for i, text in enumerate(texts)]
    cleaned = BoilerplateCleaner().run(documents)["documents"]
    assert [d.id for d in cleaned] == [d.id for d in documents]
    assert cleaned[0].content == "User Guide\nThis page explains installing in detail."
    assert cleaned[0].meta == {"file": "f0.txt", REMOVED_KEY: 2}
    assert cleaned[4].content.count("\f") == 3 and cleaned[4].meta[REMOVED_KEY] == 4
    assert documents[0].content.startswith("Copyright")  # the input is left as it was


def test_a_document_the_rules_would_empty_is_kept_and_one_without_content_passes():
    footer_only = "\f".join(f"ACME manual page {page}" for page in range(1, 5))
    empty = Document(content=None, meta={"file": "scan.pdf"})
    cleaned = BoilerplateCleaner().run([Document(content=footer_only), empty])["documents"]
    assert cleaned[0].content == footer_only and cleaned[0].meta[REMOVED_KEY] == 0
    assert cleaned[1] is empty


def test_settings_round_trip_and_bad_parameters_are_named():
    cleaner = BoilerplateCleaner(min_pages=4, page_share=0.6, min_documents=5, document_share=1,
                                 min_line_words=2, toc_min_lines=5)
    again = BoilerplateCleaner.from_dict(cleaner.to_dict())
    assert again.to_dict() == cleaner.to_dict() and again.settings == cleaner.settings
    assert BoilerplateCleaner(page_share=1).settings == BoilerplateCleaner(page_share=1.0).settings
    assert BoilerplateCleaner(page_share=0.6).settings != BoilerplateCleaner().settings
    for name, value in [("min_pages", 1), ("page_share", 0), ("page_share", 1.5), ("min_documents", "4"),
                        ("document_share", True), ("min_line_words", 0), ("toc_min_lines", 2.0)]:
        with pytest.raises(ValueError, match=name):
            BoilerplateCleaner(**{name: value})


def test_the_chunking_digest_covers_the_boilerplate_settings():
    splitter = PassageSplitter()
    alone = Pipeline()
    alone.add_component("splitter", splitter)
    assert chunking_digest(alone) == splitter.chunking
    digests = set()
    for cleaner in (BoilerplateCleaner(), BoilerplateCleaner(min_pages=5)):
        both = Pipeline()  # a component joins one pipeline only: the splitter is made again, with the same settings
        both.add_component("boilerplate", cleaner)
        both.add_component("splitter", PassageSplitter())
        both.connect("boilerplate.documents", "splitter.documents")
        digest = chunking_digest(both)
        assert digest == hashlib.sha256(f"{splitter.chunking} {cleaner.settings}".encode()).hexdigest()[:12]
        digests.add(digest)
    assert len(digests) == 2 and splitter.chunking not in digests
