"""BoilerplateCleaner: drops the lines of converted files that are not their content, before they are split.

Boilerplate becomes chunks that rank high for every question: a page footer ("Apple Inc. | Q3 2023 Form 10-Q |
12") on every page of a PDF, a table of contents, a copyright header or a navigation list on every page of a manual.
Three rules, each a pure function on strings, find such lines; lines are ``\\n``-separated lines of a page (pages
are separated by form feeds, as the PDF converter joins them) and are compared normalized (``normalize_line``:
stripped, lowercased, whitespace collapsed, every run of digits ``0``, so "Page 3 of 10" and "Page 4 of 10" are
the same line):

* **page headers and footers** (``repeated_page_lines``): in a Document of at least ``min_pages`` pages, a
  non-empty line found on at least ``page_share`` of its pages;
* **lines shared by files** (``shared_lines``): when at least ``min_documents`` Documents come together, a line of
  at least ``min_line_words`` words found in at least ``document_share`` of them, removed from all of them;
* **tables of contents** (``toc_line_numbers``): at least ``toc_min_lines`` consecutive lines of a page that each
  end in a page number after dot leaders or spaces ("Item 2. Management's Discussion ..... 23", "Risk Factors 41"),
  the page numbers never decreasing (a list of amounts is not a table of contents), with the "Table of Contents" or
  "Contents" line just before them.

A line counts as repeated only where it occurs at least twice (on two pages, in two Documents). Form feeds are
never removed, so pages keep their numbers; a Document that the rules would leave empty is kept as it was.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import replace
from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict

from rag_mag.components.passage_splitter import PAGE_BREAK

logger = logging.getLogger(__name__)

DEFAULT_MIN_PAGES = 3
DEFAULT_PAGE_SHARE = 0.5
DEFAULT_MIN_DOCUMENTS = 4
DEFAULT_DOCUMENT_SHARE = 0.5
DEFAULT_MIN_LINE_WORDS = 3
DEFAULT_TOC_MIN_LINES = 4
REMOVED_KEY = "boilerplate_lines_removed"
TOC_HEADINGS = {"table of contents", "contents"}

_DIGITS = re.compile(r"\d+")
_SPACES = re.compile(r"\s+")
# a title with a letter in it, dot leaders (". . .", "·····", "…") or spaces, then a page number
_TOC_ENTRY = re.compile(r"^(?P<title>.*[^\W\d_].*?)(?P<leader>[ \t]*(?:[.·…_][ \t]*){2,}|[ \t]+)(?P<page>\d{1,4})$")


def normalize_line(line: str) -> str:
    """The form in which lines are compared: stripped, lowercased, whitespace collapsed, digit runs ``0``."""
    return _DIGITS.sub("0", _SPACES.sub(" ", line.strip().lower()))


def _pages(text: str) -> list[list[str]]:
    return [page.split("\n") for page in text.split(PAGE_BREAK)]


def _least(share: float, total: int) -> int:
    """How many of ``total`` make ``share`` of them, and never fewer than 2 (once is not repeated)."""
    return max(2, math.ceil(share * total - 1e-9))


def repeated_page_lines(text: str, min_pages: int, page_share: float) -> set[str]:
    """The normalized non-empty lines found on at least ``page_share`` of the pages of ``text`` (form-feed
    separated), if it has at least ``min_pages`` pages."""
    pages = _pages(text)
    if len(pages) < min_pages:
        return set()
    counts: dict[str, int] = {}
    for page in pages:
        for line in {normalize_line(line) for line in page} - {""}:
            counts[line] = counts.get(line, 0) + 1
    least = _least(page_share, len(pages))
    return {line for line, count in counts.items() if count >= least}


def shared_lines(texts: list[str], min_documents: int, document_share: float, min_line_words: int) -> set[str]:
    """The normalized lines of at least ``min_line_words`` words found in at least ``document_share`` of
    ``texts``, if there are at least ``min_documents`` of them."""
    if len(texts) < min_documents:
        return set()
    counts: dict[str, int] = {}
    for text in texts:
        lines = {normalize_line(line) for line in text.replace(PAGE_BREAK, "\n").split("\n")}
        for line in lines:
            if len(line.split()) >= min_line_words:
                counts[line] = counts.get(line, 0) + 1
    least = _least(document_share, len(texts))
    return {line for line, count in counts.items() if count >= least}


def _toc_page_number(line: str) -> int | None:
    """The page number a table-of-contents line ends in, or None if it is not one."""
    match = _TOC_ENTRY.match(line.strip())
    if match is None:
        return None
    if match["leader"].strip() == "" and match["title"].rstrip()[-1].isdigit():
        return None  # "Total 120 345": a row of numbers, not a title and its page
    return int(match["page"])


def toc_line_numbers(lines: list[str], min_lines: int) -> set[int]:
    """The indices in ``lines`` (one page) of the table-of-contents blocks: runs of at least ``min_lines`` entries
    with non-decreasing page numbers (blank lines between them included), and the heading line just before."""
    found: set[int] = set()
    block: list[int] = []  # indices of the current run's entries
    last_page = -1

    def close() -> None:
        if len(block) >= min_lines:
            found.update(range(block[0], block[-1] + 1))
            before = block[0] - 1
            while before >= 0 and not lines[before].strip():
                before -= 1
            if before >= 0 and normalize_line(lines[before]) in TOC_HEADINGS:
                found.update(range(before, block[0]))

    for index, line in enumerate(lines):
        if not line.strip():
            continue
        page = _toc_page_number(line)
        if page is None or (block and page < last_page):
            close()
            block = []
        if page is not None:
            block.append(index)
            last_page = page
    close()
    return found


def remove_lines(text: str, normalized: set[str], toc_min_lines: int) -> tuple[str, int]:
    """``text`` without the lines whose normalized form is in ``normalized`` nor its tables of contents, form
    feeds kept; and how many lines went."""
    pages, removed = [], 0
    for lines in _pages(text):
        toc = toc_line_numbers(lines, toc_min_lines)
        kept = [line for index, line in enumerate(lines) if index not in toc and normalize_line(line) not in normalized]
        removed += len(lines) - len(kept)
        pages.append("\n".join(kept))
    return PAGE_BREAK.join(pages), removed


@component
class BoilerplateCleaner:
    """Removes page headers and footers, tables of contents and lines that the files given together share (see
    the module doc) from Documents, which keep their id and meta and gain ``meta["boilerplate_lines_removed"]``.

    The rule for shared lines sees only the Documents of one ``run`` call: ``rag-mag index`` hands the pipeline a
    batch of up to 32 files of a folder at a time, in folder order, so a line shared by files of different batches
    stays unless it is common within a batch.

    ```python
    cleaner = BoilerplateCleaner(min_pages=2)  # the footer, on both pages, goes
    cleaned = cleaner.run([Document(content="Intro\\nACME manual | page 1\\fBody\\nACME manual | page 2")])
    ```
    """

    def __init__(self, min_pages: int = DEFAULT_MIN_PAGES, page_share: float = DEFAULT_PAGE_SHARE,
                 min_documents: int = DEFAULT_MIN_DOCUMENTS, document_share: float = DEFAULT_DOCUMENT_SHARE,
                 min_line_words: int = DEFAULT_MIN_LINE_WORDS, toc_min_lines: int = DEFAULT_TOC_MIN_LINES) -> None:
        """
        :param min_pages: Fewest pages a Document needs for its repeated lines to count as headers and footers.
        :param page_share: Share of a Document's pages (more than 0, at most 1) a line must be found on.
        :param min_documents: Fewest Documents in a run for lines shared between them to count as boilerplate.
        :param document_share: Share of a run's Documents (more than 0, at most 1) a shared line must be found in.
        :param min_line_words: Fewest words of a line shared between Documents (shorter ones are headings).
        :param toc_min_lines: Fewest consecutive "title ... page" lines that make a table of contents.
        """
        for name, value in (("min_pages", min_pages), ("min_documents", min_documents),
                            ("min_line_words", min_line_words), ("toc_min_lines", toc_min_lines)):
            least = 1 if name == "min_line_words" else 2
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"{name} must be an integer of at least {least}, got {value!r}")
        for name, value in (("page_share", page_share), ("document_share", document_share)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= 1:
                raise ValueError(f"{name} must be a number more than 0 and at most 1, got {value!r}")
        self.min_pages = min_pages
        self.page_share = page_share
        self.min_documents = min_documents
        self.document_share = document_share
        self.min_line_words = min_line_words
        self.toc_min_lines = toc_min_lines

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, min_pages=self.min_pages, page_share=self.page_share,
                               min_documents=self.min_documents, document_share=self.document_share,
                               min_line_words=self.min_line_words, toc_min_lines=self.toc_min_lines)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BoilerplateCleaner:
        return default_from_dict(cls, data)

    @property
    def settings(self) -> str:
        """The parameters in one short string: chunks cleaned with other settings are not the same chunks."""
        return (f"boilerplate/1 pages={self.min_pages}:{float(self.page_share):g} "
                f"documents={self.min_documents}:{float(self.document_share):g} words={self.min_line_words} "
                f"toc={self.toc_min_lines}")

    @component.output_types(documents=list[Document])
    def run(self, documents: list[Document]) -> dict[str, list[Document]]:
        """
        Remove boilerplate lines.

        :param documents: Converted files, pages separated by form feeds; the rule for shared lines looks across
            them.
        :returns: `documents`: the same Documents in the same order, cleaned; one without content is passed on as
            it is.
        """
        if not isinstance(documents, list) or not all(isinstance(d, Document) for d in documents):
            raise TypeError("BoilerplateCleaner expects a list of Documents")
        texts = [document.content for document in documents if document.content]
        shared = shared_lines(texts, self.min_documents, self.document_share, self.min_line_words)
        return {"documents": [self.clean(document, shared) for document in documents]}

    def clean(self, document: Document, shared: set[str]) -> Document:
        """``document`` without its boilerplate lines and those in ``shared`` (normalized)."""
        if not document.content:
            return document
        normalized = shared | repeated_page_lines(document.content, self.min_pages, self.page_share)
        content, removed = remove_lines(document.content, normalized, self.toc_min_lines)
        if removed and not content.replace(PAGE_BREAK, "").strip():
            logger.debug("kept all %d lines of %s: the boilerplate rules would have left it empty", removed,
                         document.meta.get("file", document.id))
            content, removed = document.content, 0
        return replace(document, content=content, meta={**document.meta, REMOVED_KEY: removed})
