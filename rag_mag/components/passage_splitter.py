"""PassageSplitter: cuts converted files into retriever-sized passages that know where they came from.

Haystack's ``DocumentSplitter`` respects sentence boundaries only through NLTK's punkt model, which it downloads
at run time (there is no hub here, and users behind a proxy meet the same wall). This splitter needs no model:

* sentences end at ``.``, ``!`` or ``?`` (with closing quotes or brackets) before whitespace and a capital,
  digit or quote, at a line break, and at a page break (form feed, as the PDF converter joins pages); a
  single letter or a common abbreviation before the period ("J.", "e.g.", "Dr.") does not end a sentence;
* sentences are packed into passages of at most ``split_length`` words; a sentence longer than that is cut
  between words; the next passage starts with the previous one's last sentences of at most ``split_overlap``
  words;
* a passage never spans two pages, so its page is a citation (1-based; kept only for paginated text);
* no passage is shorter than ``min_words`` words (Haystack's ``DocumentSplitter`` calls it ``split_threshold``):
  a short one joins the passage before it on its page, else the one after it; a page too short for a passage of
  its own joins the page before it (else the one after), and the passage then cites both (``page`` and
  ``page_end``). A source shorter than ``min_words`` in all is one passage: the whole file, not a fragment of it
  (a note of a few words is what the user indexed; a heading cut off from its section is not). Short chunks are
  headings, navigation and "See also" lines: their mean-pooled embeddings have the largest norms (eval/README.md,
  "Real documents"), so under qnorm and dot they would rank first for every question.

Every passage keeps the source Document's meta and adds ``chunk_index`` (its ordinal in the source, from 0),
``char_start`` / ``char_end`` (its span in the source's text, so ``text[char_start:char_end] == content``),
``page`` where the source has pages, ``heading`` (the nearest heading-like line above it: a line of at most
``heading_max_words`` words, without sentence punctuation at its end, between a finished sentence and a
capitalised line), and ``chunking`` (a digest of the settings). Its id is derived from the source's ``file`` and
``file_sha256`` meta (or the source's id), the settings and the ordinal, so the same file with the same settings
always gets the same ids.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict

# The retriever was trained on Wikipedia passages of about 100 words (data/SOURCES.md): the default fits them.
DEFAULT_SPLIT_LENGTH = 100
DEFAULT_SPLIT_OVERLAP = 20
DEFAULT_HEADING_MAX_WORDS = 10
DEFAULT_MIN_WORDS = 25  # chosen on the real documents' validation split (eval/README.md, "Real documents")
PAGE_BREAK = "\f"
CHUNKING_KEY = "chunking"

_SENTENCE_END = re.compile(r"""[.!?]['")\]]*(?=\s+['"(\[]?[A-Z0-9])""")
_ABBREVIATIONS = {"e.g", "i.e", "etc", "vs", "mr", "mrs", "ms", "dr", "prof", "st", "no", "fig", "al", "jr", "sr",
                  "inc", "ltd", "co", "cf", "approx", "vol", "pp", "ed", "eds", "jan", "feb", "mar", "apr", "jun",
                  "jul", "aug", "sep", "sept", "oct", "nov", "dec", "u.s", "u.k"}
_WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class Span:
    """Characters [start, end) of a text."""

    start: int
    end: int


def sentence_spans(text: str, start: int, end: int) -> list[Span]:
    """The sentences of ``text[start:end]`` (one page) as spans, leading and trailing whitespace excluded."""
    cuts = [start]
    for line in re.finditer(r"\n", text[start:end]):
        cuts.append(start + line.end())
    for match in _SENTENCE_END.finditer(text, start, end):
        word = text[text.rfind(" ", start, match.start()) + 1:match.start()].lower().lstrip("(\"'")
        if len(word) == 1 or word in _ABBREVIATIONS:
            continue
        cuts.append(match.end())
    cuts = sorted(set(cuts)) + [end]
    spans = []
    for left, right in zip(cuts, cuts[1:], strict=False):
        stripped_left = left + len(text[left:right]) - len(text[left:right].lstrip())
        stripped_right = right - (len(text[left:right]) - len(text[left:right].rstrip()))
        if stripped_right > stripped_left:
            spans.append(Span(stripped_left, stripped_right))
    return spans


def word_spans(text: str, span: Span) -> list[Span]:
    """The words of ``text[span.start:span.end]`` as spans of ``text``."""
    return [Span(match.start(), match.end()) for match in _WORD.finditer(text, span.start, span.end)]


def pack(text: str, sentences: list[Span], length: int, overlap: int) -> list[Span]:
    """Passages of whole sentences, at most ``length`` words each, overlapping by at most ``overlap`` words."""
    units: list[tuple[Span, int]] = []  # (span, words): sentences, long ones cut between words
    for sentence in sentences:
        words = word_spans(text, sentence)
        for first in range(0, len(words), length):
            piece = words[first:first + length]
            units.append((Span(piece[0].start, piece[-1].end), len(piece)))
    passages, first = [], 0
    while first < len(units):
        last, words = first, units[first][1]
        while last + 1 < len(units) and words + units[last + 1][1] <= length:
            last += 1
            words += units[last][1]
        passages.append(Span(units[first][0].start, units[last][0].end))
        if last + 1 >= len(units):
            break
        start_next, carried = last + 1, 0
        while start_next - 1 > first and carried + units[start_next - 1][1] <= overlap:
            start_next -= 1
            carried += units[start_next][1]
        first = start_next
    return passages


@dataclass(frozen=True)
class Passage:
    """A passage's span and the pages it covers (first and last; the same page but where a short page joined)."""

    span: Span
    page: int
    page_end: int


def join_short(text: str, passages: list[Passage], min_words: int) -> list[Passage]:
    """``passages`` (in order) where every one shorter than ``min_words`` words has joined a neighbour: the one
    before it on its page, else the one after it on its page, else the one before it (another page), else the one
    after it. A lone passage stays, however short: it is the whole source."""
    def words(passage: Passage) -> int:
        return len(_WORD.findall(text, passage.span.start, passage.span.end))

    def joined(first: Passage, second: Passage) -> Passage:
        return Passage(Span(min(first.span.start, second.span.start), max(first.span.end, second.span.end)),
                       min(first.page, second.page), max(first.page_end, second.page_end))

    passages = list(passages)
    index = 0
    while index < len(passages):
        passage = passages[index]
        if words(passage) >= min_words:
            index += 1
            continue
        if len(passages) == 1:
            return passages
        before = passages[index - 1] if index > 0 else None
        after = passages[index + 1] if index + 1 < len(passages) else None
        if before is not None and (before.page_end == passage.page or after is None
                                   or after.page != passage.page_end):
            passages[index - 1:index + 1] = [joined(before, passage)]
            index -= 1  # the joined passage is looked at again (it may still be short)
        else:
            passages[index:index + 2] = [joined(passage, after)]
    return passages


def nearest_heading(text: str, position: int, floor: int, max_words: int) -> str | None:
    """The last heading-like line that starts before ``position`` and at or after ``floor``."""
    heading = None
    offset = floor
    lines = text[floor:position].split("\n")
    previous = ""
    for line in lines:
        stripped = line.strip()
        following = text[offset + len(line) + 1:offset + len(line) + 80].lstrip()
        if (stripped and len(stripped.split()) <= max_words and stripped[-1] not in ".!?:;,"
                and (not previous or previous[-1] in ".!?:") and following[:1].isupper()):
            heading = stripped
        if stripped:
            previous = stripped
        offset += len(line) + 1
    return heading


@component
class PassageSplitter:
    """Splits Documents into passages of about ``split_length`` words, cut at sentence ends, with their
    page, heading, ordinal and character offsets in ``meta`` and stable ids (see the module doc).

    ```python
    splitter = PassageSplitter(split_length=100, split_overlap=20)
    passages = splitter.run([Document(content=text, meta={"file": "notes/a.pdf", "file_sha256": digest})])
    ```
    """

    def __init__(self, split_length: int = DEFAULT_SPLIT_LENGTH, split_overlap: int = DEFAULT_SPLIT_OVERLAP,
                 heading_max_words: int = DEFAULT_HEADING_MAX_WORDS, min_words: int = DEFAULT_MIN_WORDS) -> None:
        """
        :param split_length: Most words in a passage (a longer sentence is cut between words).
        :param split_overlap: Most words that a passage repeats from the end of the one before it, in whole
            sentences; 0 for none. Must be smaller than `split_length`.
        :param heading_max_words: Longest line, in words, that can be taken for a section heading.
        :param min_words: Fewest words in a passage: a shorter one joins its neighbour (see the module doc); 0 or 1
            keeps every passage. At most `split_length`.
        """
        for name, value, least in (("split_length", split_length, 1), ("split_overlap", split_overlap, 0),
                                   ("heading_max_words", heading_max_words, 1), ("min_words", min_words, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"{name} must be an integer of at least {least}, got {value!r}")
        if split_overlap >= split_length:
            raise ValueError(f"split_overlap ({split_overlap}) must be smaller than split_length ({split_length})")
        if min_words > split_length:
            raise ValueError(f"min_words ({min_words}) must be at most split_length ({split_length})")
        self.split_length = split_length
        self.split_overlap = split_overlap
        self.heading_max_words = heading_max_words
        self.min_words = min_words

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, split_length=self.split_length, split_overlap=self.split_overlap,
                               heading_max_words=self.heading_max_words, min_words=self.min_words)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PassageSplitter:
        return default_from_dict(cls, data)

    @property
    def chunking(self) -> str:
        """A short digest of the settings: chunks made with other settings are not the same chunks."""
        settings = f"passage-splitter/1 {self.split_length} {self.split_overlap} {self.heading_max_words}"
        if self.min_words > 1:  # indexes chunked before min_words existed keep their digest when it is off
            settings += f" min_words={self.min_words}"
        return hashlib.sha256(settings.encode()).hexdigest()[:12]

    @component.output_types(documents=list[Document])
    def run(self, documents: list[Document]) -> dict[str, list[Document]]:
        """
        Split documents.

        :param documents: Converted files (or any Documents with text); their meta is copied to each passage.
        :returns: `documents`: the passages, in source order; a source without text gives none.
        """
        if not isinstance(documents, list) or not all(isinstance(d, Document) for d in documents):
            raise TypeError("PassageSplitter expects a list of Documents")
        passages = []
        for document in documents:
            passages.extend(self.split(document))
        return {"documents": passages}

    def split(self, document: Document) -> list[Document]:
        text = document.content or ""
        paginated = PAGE_BREAK in text
        meta = dict(document.meta or {})
        source = str(meta.get("file") or document.id)
        version = str(meta.get("file_sha256") or hashlib.sha256(text.encode()).hexdigest())
        passages, page_starts, page_start = [], {}, 0
        for page, page_text in enumerate(text.split(PAGE_BREAK), start=1):
            page_end = page_start + len(page_text)
            page_starts[page] = page_start
            spans = pack(text, sentence_spans(text, page_start, page_end), self.split_length, self.split_overlap)
            passages.extend(Passage(span, page, page) for span in spans)
            page_start = page_end + len(PAGE_BREAK)
        if self.min_words > 1:
            passages = join_short(text, passages, self.min_words)
        documents = []
        for index, passage in enumerate(passages):
            span = passage.span
            passage_meta = {**meta, "chunk_index": index, "char_start": span.start, "char_end": span.end,
                            CHUNKING_KEY: self.chunking}
            if paginated:
                passage_meta["page"] = passage.page
                if passage.page_end != passage.page:
                    passage_meta["page_end"] = passage.page_end
            first_line_end = text.find("\n", span.start, span.end)  # a heading may open the passage
            heading = nearest_heading(text, span.start if first_line_end < 0 else first_line_end,
                                      page_starts[passage.page], self.heading_max_words)
            if heading and text[span.start:span.end].strip() != heading:
                passage_meta["heading"] = heading
            key = f"{source}\x1f{version}\x1f{self.chunking}\x1f{index}"
            documents.append(Document(id=hashlib.sha256(key.encode()).hexdigest()[:32],
                                      content=text[span.start:span.end], meta=passage_meta))
        return documents
