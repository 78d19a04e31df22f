"""The documents panel in real headless Chromium: upload files through the page (DOM.setFileInputFiles), see them
listed with their chunk counts, ask about them (real pipeline, MiniLM, vLLM), delete one and see it gone.

The index served is a copy of the qnorm index of tests/integration/demo_support.py, so the uploads never reach
artifacts/. Screenshots go to test-output/.
"""

from __future__ import annotations

import json
import shutil

import pytest

from rag_mag.demo.document_jobs import uploads_dir
from rag_mag.demo.indexes import IndexSpec
from tests.files import write_pdf
from tests.integration.demo_support import DemoProcess, InProcessDemo, app_without_llm, demo_indexes
from tests.integration.test_demo_browser import ANSWER_TIMEOUT_S, OUTPUT, Browser

pytestmark = [pytest.mark.integration, pytest.mark.browser]

KEEPER = ("The lighthouse keeper of Varnholm island is called Oskar Lindqvist. He has kept the Varnholm lighthouse "
          "since 1982 and lives in the tower with his dog.\n")
QUESTION = "Who is the lighthouse keeper of Varnholm island?"
INDEXED_S = 180.0

DOCUMENTS = """Array.from(document.querySelectorAll('#document-list .document')).map((item) => ({
  file: item.dataset.file, chunks: Number(item.dataset.chunks),
  text: item.querySelector('.document-chunks').textContent,
  deletable: !!item.querySelector('.document-delete')}))"""

SOURCES = """Array.from(document.querySelectorAll('.panel')).map((panel) => ({
  state: panel.dataset.state, answer: panel.querySelector('.answer-text').textContent,
  error: panel.querySelector('.panel-error').hidden ? null : panel.querySelector('.panel-error').textContent,
  titles: Array.from(panel.querySelectorAll('.source .title')).map((title) => title.textContent)}))"""


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> IndexSpec:
    root = tmp_path_factory.mktemp("documents-browser")
    qnorm = demo_indexes(root / "built")[0]
    shutil.copytree(qnorm.index_dir, root / "served" / "index-qnorm")
    return IndexSpec("qnorm", root / "served" / "index-qnorm", qnorm.retriever_dir)


@pytest.fixture(scope="module")
def demo(spec, vllm_server, tmp_path_factory):
    server = DemoProcess([spec], vllm_server, tmp_path_factory.mktemp("documents-demo") / "serve.log",
                         "--max-upload-mb", "5")
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.fixture
def browser():
    browser = Browser()
    try:
        yield browser
    finally:
        browser.close()


def click(browser: Browser, selector: str) -> None:
    """Browser.click on an element scrolled into view (the panel sits below the answers)."""
    browser.evaluate(f"document.querySelector({json.dumps(selector)}).scrollIntoView({{block: 'center'}})")
    browser.click(selector)


def choose_files(browser: Browser, *paths) -> None:
    root = browser.call("DOM.getDocument")["root"]["nodeId"]
    node = browser.call("DOM.querySelector", nodeId=root, selector="#upload-files")["nodeId"]
    browser.call("DOM.setFileInputFiles", nodeId=node, files=[str(path) for path in paths])


def wait_for_job(browser: Browser, what: str) -> str:
    return browser.wait_for("['done', 'failed'].includes(document.getElementById('upload-status').dataset.state) && "
                            "document.getElementById('upload-status').textContent", INDEXED_S, what)


def open_page(browser: Browser, url: str) -> None:
    browser.open(url)
    browser.wait_for("!!document.querySelector('#document-list .document, #document-list .document-empty')", 60,
                     "the documents list")


def test_upload_ask_and_delete_through_the_page(demo, spec, browser, tmp_path):
    keeper = tmp_path / "lighthouse.txt"
    keeper.write_text(KEEPER)
    pdf = write_pdf(tmp_path / "vault.pdf")
    open_page(browser, demo)
    choose_files(browser, keeper, pdf)
    click(browser, "#upload-button")
    status = wait_for_job(browser, "the upload's indexing job")
    assert status.startswith("Indexed. files: 2 added"), status
    browser.wait_for("document.querySelectorAll('#document-list .document').length === 2", 30, "the two files")
    files = {entry["file"]: entry for entry in browser.evaluate(DOCUMENTS)}
    assert files["vault.pdf"]["chunks"] == 3 and files["vault.pdf"]["text"] == "3 chunks"  # one per page
    assert files["lighthouse.txt"]["chunks"] >= 1 and all(entry["deletable"] for entry in files.values())
    assert "2 files" in browser.evaluate("document.getElementById('documents-summary').textContent")
    assert sorted(p.name for p in uploads_dir(spec.index_dir).iterdir()) == ["lighthouse.txt", "vault.pdf"]
    browser.screenshot(OUTPUT / "demo-documents-uploaded.png")

    browser.type_into("#question", QUESTION)
    browser.evaluate("document.getElementById('top-k').value = '4'")
    click(browser, "#ask-button")
    browser.wait_for("document.querySelectorAll('.panel').length === 1 && ['done', 'error'].includes("
                     "document.querySelector('.panel').dataset.state)", ANSWER_TIMEOUT_S, "the answer")
    panel = browser.evaluate(SOURCES)[0]
    browser.screenshot(OUTPUT / "demo-documents-answer.png")
    assert panel["state"] == "done" and panel["error"] is None, panel
    assert panel["answer"].strip() and panel["titles"][0] == "lighthouse.txt", panel

    click(browser, '#document-list .document[data-file="lighthouse.txt"] .document-delete')
    browser.wait_for("!document.querySelector('#document-list .document[data-file=\"lighthouse.txt\"]') && "
                     "document.getElementById('upload-status').dataset.state === 'done'", INDEXED_S,
                     "lighthouse.txt to leave the list")
    assert "1 removed" in browser.evaluate("document.getElementById('upload-status').textContent")
    assert [entry["file"] for entry in browser.evaluate(DOCUMENTS)] == ["vault.pdf"]
    assert not (uploads_dir(spec.index_dir) / "lighthouse.txt").exists()
    browser.screenshot(OUTPUT / "demo-documents-deleted.png")
    assert not browser.console, browser.console


def test_a_refused_upload_is_a_readable_message_on_the_page(spec, browser, tmp_path):
    program = tmp_path / "tool.exe"
    program.write_bytes(b"MZ not a document")
    server = InProcessDemo(app_without_llm([spec]))
    try:
        open_page(browser, server.url)
        choose_files(browser, program)
        click(browser, "#upload-button")
        message = browser.wait_for("!document.getElementById('documents-error').hidden && "
                                   "document.getElementById('documents-error').textContent", 30, "the refusal")
        browser.screenshot(OUTPUT / "demo-documents-refused.png")
    finally:
        server.stop()
    assert message.startswith("Upload refused: 'tool.exe': unsupported type .exe; allowed: ") and ".pdf" in message
    assert not (uploads_dir(spec.index_dir) / "tool.exe").exists()
    assert not browser.console, browser.console
