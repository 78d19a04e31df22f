"""The demo page in real headless Chromium (Debian's ``chromium``), driven over the DevTools protocol.

It loads the page served by ``rag-mag serve`` (real pipeline, MiniLM, vLLM), types a question, asks for
both strategies side by side, waits for the streamed answers, checks the sources and their score bars,
and saves screenshots under test-output/.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from rag_mag.models import REPO_ROOT
from tests.integration.demo_support import QUESTION, DemoProcess, InProcessDemo, app_without_llm, demo_indexes

pytestmark = [pytest.mark.integration, pytest.mark.browser]

OUTPUT = REPO_ROOT / "test-output"
ANSWER_TIMEOUT_S = 300.0


def chromium_path() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    pytest.fail("headless Chromium is not installed; run `scripts/setup.sh --browser` "
                "(or `apt-get install chromium`)")


class Browser:
    """A headless Chromium and one page, spoken to over the DevTools protocol (CDP) with websocket-client."""

    def __init__(self, width: int = 1400, height: int = 1100) -> None:
        import websocket

        self.profile = tempfile.mkdtemp(prefix="rag-mag-chromium-")
        self.process = subprocess.Popen(
            [chromium_path(), "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--remote-debugging-port=0",
             "--remote-allow-origins=*", f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.is_file() and port_file.read_text().strip()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                pytest.fail(f"Chromium did not start: {self.process.stderr.read().decode(errors='replace')[-2000:]}")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        pages = [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list").json() if t["type"] == "page"]
        self.socket = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self.ids = itertools.count(1)
        self.console: list[str] = []
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=False)

    def call(self, method: str, **params) -> dict:
        message_id = next(self.ids)
        self.socket.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("method") == "Runtime.exceptionThrown":
                self.console.append(json.dumps(message["params"]["exceptionDetails"])[:500])
            if message.get("id") == message_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.2)
        self.screenshot(OUTPUT / "demo-timeout.png")
        pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (screenshot: test-output/demo-timeout.png)")

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && document.getElementById('index').options.length > 0 "
                      "&& document.getElementById('index').value !== ''", 60, "the page and its index list")

    def click(self, selector: str) -> None:
        box = self.evaluate(f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
                            ".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def type_into(self, selector: str, text: str) -> None:
        self.evaluate(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.value = ''; "
                      "e.focus(); })()")
        self.call("Input.insertText", text=text)

    def screenshot(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        height = self.evaluate("Math.ceil(document.documentElement.scrollHeight)")
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": 1400, "height": max(600, min(int(height), 4000)), "scale": 1})
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def close(self) -> None:
        if getattr(self, "socket", None) is not None:
            self.socket.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    return demo_indexes(tmp_path_factory.mktemp("browser-indexes"))


@pytest.fixture(scope="module")
def demo(specs, vllm_server, tmp_path_factory):
    server = DemoProcess(specs, vllm_server, tmp_path_factory.mktemp("browser-demo") / "serve.log")
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


# Records every panel state the page goes through, to show that the answer was streamed.
RECORD_STATES = """(() => {
  window.__states = [];
  new MutationObserver((changes) => {
    for (const change of changes) {
      if (change.attributeName === 'data-state') {
        window.__states.push(change.target.dataset.index + ':' + change.target.dataset.state);
      }
    }
  }).observe(document.getElementById('results'), {attributes: true, subtree: true});
  return true;
})()"""

PANELS = """Array.from(document.querySelectorAll('.panel')).map((panel) => ({
  index: panel.dataset.index, state: panel.dataset.state,
  answer: panel.querySelector('.answer-text').textContent, timing: panel.querySelector('.timing').textContent,
  error: panel.querySelector('.panel-error').hidden ? null : panel.querySelector('.panel-error').textContent,
  sources: Array.from(panel.querySelectorAll('.source')).map((source) => ({
    title: source.querySelector('.title').textContent, score: source.querySelector('.score').textContent,
    cosineWidth: parseFloat(source.querySelector('.fill-cosine').style.width),
    normWidth: parseFloat(source.querySelector('.fill-norm').style.width),
    barHeight: source.querySelector('.fill-norm').getBoundingClientRect().height,
    formula: source.querySelector('.formula').textContent})),
}))"""


def test_ask_side_by_side_and_see_streamed_answers_with_score_bars(demo, browser):
    browser.open(demo)
    assert browser.evaluate("document.getElementById('index').value") == "__side_by_side__"
    # the status comes from its own poll of /health: wait for it rather than race it (issue 10)
    browser.wait_for("document.getElementById('llm-status').textContent === 'LLM: ready'", 120, "'LLM: ready'")
    browser.evaluate(RECORD_STATES)
    browser.type_into("#question", QUESTION)
    browser.evaluate("document.getElementById('top-k').value = '4'")
    browser.click("#ask-button")
    browser.wait_for("document.querySelectorAll('.panel').length === 2 && Array.from(document.querySelectorAll("
                     "'.panel')).every((p) => ['done', 'error'].includes(p.dataset.state))", ANSWER_TIMEOUT_S,
                     "both answers")
    panels = browser.evaluate(PANELS)
    shot = browser.screenshot(OUTPUT / "demo-side-by-side.png")
    assert [panel["index"] for panel in panels] == ["qnorm", "cosine"]
    for panel in panels:
        assert panel["state"] == "done" and panel["error"] is None, panel
        assert panel["answer"].strip() and "total" in panel["timing"]
        assert len(panel["sources"]) == 4
        for source in panel["sources"]:
            assert source["title"] and re.fullmatch(r"-?\d+\.\d{3}", source["score"])
            assert 0 <= source["cosineWidth"] <= 100 and 0 < source["normWidth"] <= 100 and source["barHeight"] > 0
            assert source["formula"].startswith(source["score"] + " = cos ")
        assert any(source["cosineWidth"] > 0 for source in panel["sources"])
    cosine_panel = panels[1]
    assert len({source["normWidth"] for source in cosine_panel["sources"]}) == 1  # cosine: every norm is 1
    states = browser.evaluate("window.__states")
    for name in ("qnorm", "cosine"):
        assert f"{name}:streaming" in states and states.index(f"{name}:streaming") < states.index(f"{name}:done")
    assert not browser.console, browser.console
    assert shot.stat().st_size > 20_000


def test_errors_are_readable_messages_on_the_page(demo, browser):
    browser.open(demo)
    browser.click("#ask-button")  # empty question
    message = browser.wait_for("!document.getElementById('error').hidden && "
                               "document.getElementById('error').textContent", 30, "the error message")
    assert "the question is empty" in message
    assert browser.evaluate("document.querySelectorAll('.panel').length") == 0
    browser.type_into("#question", "why? " * 250)
    assert browser.evaluate("document.getElementById('char-count').classList.contains('over')")
    browser.click("#ask-button")
    message = browser.wait_for("document.getElementById('error').textContent.includes('limit') && "
                               "document.getElementById('error').textContent", 30, "the too-long message")
    assert "the limit is 1000" in message
    browser.screenshot(OUTPUT / "demo-error.png")
    assert not browser.console, browser.console


def test_vllm_down_is_a_readable_message_on_the_page(specs, browser):
    server = InProcessDemo(app_without_llm(specs))
    try:
        browser.open(server.url)
        browser.wait_for("document.getElementById('llm-status').textContent === 'LLM: unreachable'", 30,
                         "the LLM status pill")
        browser.type_into("#question", QUESTION)
        browser.click("#ask-button")
        browser.wait_for("document.querySelectorAll('.panel[data-state=\"error\"]').length === 2", 60,
                         "both panels to show the error")
        panels = browser.evaluate(PANELS)
        browser.screenshot(OUTPUT / "demo-vllm-down.png")
    finally:
        server.stop()
    for panel in panels:
        assert "no vLLM server at" in panel["error"] and "rag-mag serve-llm" in panel["error"]
        assert not panel["sources"] and not panel["answer"]
    assert not browser.console, browser.console
