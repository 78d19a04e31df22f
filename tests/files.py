"""Real files for the document tests, written by the tests themselves: a PDF of pages with a text layer (fpdf2),
a DOCX with headings (python-docx), an HTML page and a Markdown file."""

from __future__ import annotations

from pathlib import Path

# Each page is long enough (25 words and more) to be a passage of its own under the splitter's min_words.
PDF_PAGES = [
    "The orchard grows apples and plums. Apples are picked in September. The trees stand in six long rows behind "
    "the house, and the oldest of them were planted a century ago.",
    "The vault on the second floor opens with the code 4711. The code was set by the caretaker. Nobody else on the "
    "staff has been told it, and it is written down nowhere.",
    "The garden shed holds rakes and spades. It is painted green. Its roof leaks a little in heavy rain, so the "
    "seeds are kept on the top shelf in tins.",
]


def write_pdf(path: Path, pages: list[str] = PDF_PAGES) -> Path:
    from fpdf import FPDF

    pdf = FPDF()
    for text in pages:
        pdf.add_page()
        pdf.set_font("Helvetica", size=12)
        pdf.multi_cell(0, 10, text)
    path.parent.mkdir(parents=True, exist_ok=True)
    pdf.output(str(path))
    return path


def write_pdf_with_a_large_array(path: Path, elements: int = 150_000) -> Path:
    """A text PDF whose catalog holds an array of more elements than pypdf reads by default (100,000), as real
    filings do (Microsoft's 10-Q of 2023 Q1)."""
    from pypdf import PdfWriter
    from pypdf.generic import ArrayObject, NameObject, NumberObject

    plain = write_pdf(path.with_name("plain-" + path.name))
    writer = PdfWriter(clone_from=str(plain))
    writer._root_object[NameObject("/RagMagLargeArray")] = ArrayObject(NumberObject(i) for i in range(elements))
    with open(path, "wb") as handle:
        writer.write(handle)
    plain.unlink()
    return path


def write_scanned_pdf(path: Path) -> Path:
    """A PDF whose page holds only a drawing, no text layer (as a scan without OCR)."""
    from fpdf import FPDF

    pdf = FPDF()
    pdf.add_page()
    pdf.rect(20, 20, 100, 60, style="F")
    pdf.output(str(path))
    return path


def write_encrypted_pdf(path: Path) -> Path:
    from pypdf import PdfReader, PdfWriter

    plain = write_pdf(path.with_name("plain-" + path.name))
    writer = PdfWriter()
    for page in PdfReader(plain).pages:
        writer.add_page(page)
    writer.encrypt(user_password="secret", algorithm="RC4-128")
    with open(path, "wb") as handle:
        writer.write(handle)
    plain.unlink()
    return path


def write_docx(path: Path, paragraphs: list[tuple[str, str]]) -> Path:
    """``paragraphs``: (kind, text) with kind ``"h1"``, ``"h2"`` or ``"p"``."""
    import docx

    document = docx.Document()
    for kind, text in paragraphs:
        if kind.startswith("h"):
            document.add_heading(text, level=int(kind[1:]))
        else:
            document.add_paragraph(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    document.save(str(path))
    return path


def write_folder(root: Path) -> Path:
    """A folder of the five supported kinds, each holding facts found nowhere else."""
    write_pdf(root / "manual.pdf")
    write_docx(root / "fleet.docx", [("h1", "Engines"), ("p", "The truck engine has six cylinders and runs on "
                                                         "diesel."), ("h2", "Wheels"),
                                     ("p", "Each trailer rolls on twelve wheels.")])
    (root / "birds.html").write_text("<html><head><title>Birds</title></head><body><article><h1>Swifts</h1><p>The "
                                     "common swift eats insects and sleeps while flying.</p><p>Swifts arrive in "
                                     "May and leave in August.</p></article></body></html>")
    (root / "notes").mkdir(parents=True, exist_ok=True)
    (root / "notes" / "river.md").write_text("# Rivers\n\nThe Danube flows through ten countries.\n\n## Source\n\n"
                                             "It rises in the Black Forest.\n")
    (root / "notes" / "keeper.txt").write_text("The lighthouse keeper is called Oskar. He has lived on the island "
                                               "since 1982.\n")
    return root
