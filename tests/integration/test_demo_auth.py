"""Keys and roles against ``rag-mag serve`` running for real (real pipeline, MiniLM, the real vLLM server), with a
read key and a write key made by ``rag-mag keys add``: 401 without a key or with a revoked one, 403 for a read key's
upload, 429 beyond the rate and after wrong keys from one address, the write key's upload answered from, the OpenAI
client with its key, and the page asking for the key in headless Chromium. Also the refusals at start: a key file
others may read, and ``--host 0.0.0.0`` without keys; and the vLLM server that rag-mag started, which asks for its
own key."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rag_mag.demo.indexes import IndexSpec
from rag_mag.serving.llm.records import read_api_key
from rag_mag.serving.llm.settings import API_KEY_ENV
from rag_mag.serving.processes import find_free_port
from tests.integration.demo_support import QUESTION, DemoProcess, demo_indexes, index_flags, serve_command, serve_env

pytestmark = pytest.mark.integration

TIMEOUT = httpx.Timeout(300.0, connect=10.0)
RATE = 40  # requests a minute per key in this module's demo
KEEPER = ("The lighthouse keeper of Varnholm island is called Oskar Lindqvist. He has kept the Varnholm lighthouse "
          "since 1982 and lives in the tower with his dog.\n")
KEEPER_QUESTION = "Who is the lighthouse keeper of Varnholm island?"
INDEXED_S = 180.0
TEST_URL_ENV = "RAG_MAG_TEST_VLLM_URL"  # tests/conftest.py: a running server to use instead of starting one


def keys_command(keys_file: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rag_mag.cli.main", "-q", "keys", *args], env=serve_env(keys_file),
                          capture_output=True, text=True, timeout=120)


def add_key(keys_file: Path, name: str, role: str) -> str:
    result = keys_command(keys_file, "add", name, "--role", role)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]  # the key is the last line


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def specs(tmp_path_factory) -> list[IndexSpec]:
    """qnorm (a copy: uploads never reach artifacts/) and cosine."""
    root = tmp_path_factory.mktemp("auth-indexes")
    qnorm, cosine = demo_indexes(root / "built")
    shutil.copytree(qnorm.index_dir, root / "served" / "index-qnorm")
    return [IndexSpec("qnorm", root / "served" / "index-qnorm", qnorm.retriever_dir), cosine]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("auth-keys") / "keys.json"
    return {"path": path, "reader": add_key(path, "reader", "read"), "writer": add_key(path, "writer", "write")}


@pytest.fixture(scope="module")
def demo(specs, made, vllm_server, tmp_path_factory):
    server = DemoProcess(specs, vllm_server, tmp_path_factory.mktemp("auth-demo") / "serve.log", "--rate-limit",
                         str(RATE), keys_file=made["path"])
    try:
        yield server.wait_ready()
    finally:
        assert server.stop() == 0, f"rag-mag serve did not stop cleanly; see {server.log_path}"
        log = server.log_path.read_text()
        assert made["reader"] not in log and made["writer"] not in log and "rmk_" not in log


def get_with_retry(url: str, headers: dict[str, str]) -> httpx.Response:
    """A GET that waits out a 429 as its Retry-After says (the job polls below ask often)."""
    for _ in range(30):
        response = httpx.get(url, headers=headers, timeout=TIMEOUT)
        if response.status_code != 429:
            return response
        time.sleep(int(response.headers["Retry-After"]))
    pytest.fail(f"{url} stayed at 429")


def test_without_a_key_the_api_is_401_and_health_says_nothing_of_the_documents(demo):
    chat = {"model": "qnorm", "messages": [{"role": "user", "content": QUESTION}]}
    for response in (httpx.post(f"{demo}/api/ask", json={"question": QUESTION}, timeout=TIMEOUT),
                     httpx.post(f"{demo}/v1/chat/completions", json=chat, timeout=TIMEOUT),
                     httpx.get(f"{demo}/api/documents?index=qnorm", timeout=TIMEOUT)):
        assert response.status_code == 401, response.text
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
        assert response.json()["error"]["code"] == "key_missing"
    health = httpx.get(f"{demo}/health", timeout=TIMEOUT)
    assert health.status_code == 200 and health.json() == {"status": "ok", "auth": "keys", "llm": {"reachable": True}}


def test_the_read_key_asks_and_may_not_upload(demo, made):
    response = httpx.post(f"{demo}/api/ask", json={"question": QUESTION, "index": "cosine", "top_k": 3},
                          headers=bearer(made["reader"]), timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    assert response.json()["answer"].strip() and len(response.json()["sources"]) == 3
    upload = httpx.post(f"{demo}/api/documents?index=qnorm", headers={**bearer(made["reader"]), "X-RagMag-Upload": "1"},
                        files=[("files", ("lighthouse.txt", KEEPER.encode(), "text/plain"))], timeout=TIMEOUT)
    assert upload.status_code == 403 and upload.json()["error"]["code"] == "key_read_only"


def test_the_write_key_uploads_and_the_file_is_answered_from(demo, made, specs):
    writer = {**bearer(made["writer"]), "X-RagMag-Upload": "1"}
    upload = httpx.post(f"{demo}/api/documents?index=qnorm", headers=writer,
                        files=[("files", ("lighthouse.txt", KEEPER.encode(), "text/plain"))], timeout=TIMEOUT)
    assert upload.status_code == 202, upload.text
    job_url = f"{demo}{upload.headers['Location']}"
    deadline = time.monotonic() + INDEXED_S
    while (job := get_with_retry(job_url, bearer(made["writer"])).json()["job"])["state"] not in ("done", "failed"):
        assert time.monotonic() < deadline, job
        time.sleep(2.0)
    assert job["state"] == "done", job
    assert (specs[0].index_dir.with_name("index-qnorm.uploads") / "lighthouse.txt").is_file()
    response = httpx.post(f"{demo}/api/ask", json={"question": KEEPER_QUESTION, "index": "qnorm", "top_k": 4},
                          headers=bearer(made["reader"]), timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["sources"][0]["file"] == "lighthouse.txt" and body["answer"].strip()


def test_the_openai_client_with_a_key(demo, made):
    import openai

    client = openai.OpenAI(base_url=f"{demo}/v1", api_key=made["reader"], max_retries=0, timeout=300.0)
    assert [model.id for model in client.models.list()] == ["qnorm", "cosine"]
    completion = client.chat.completions.create(model="cosine", messages=[{"role": "user", "content": QUESTION}])
    assert completion.choices[0].message.content.strip() and completion.model == "cosine"
    stranger = openai.OpenAI(base_url=f"{demo}/v1", api_key="rmk_00000000_" + "C" * 43, max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="the key is not valid"):
        stranger.chat.completions.create(model="cosine", messages=[{"role": "user", "content": QUESTION}])


def test_a_revoked_key_is_401_on_its_next_request(demo, made):
    key = add_key(made["path"], "temp", "read")
    assert httpx.get(f"{demo}/api/indexes", headers=bearer(key), timeout=TIMEOUT).status_code == 200
    result = keys_command(made["path"], "revoke", "temp")
    assert result.returncode == 0, result.stderr
    response = httpx.get(f"{demo}/api/indexes", headers=bearer(key), timeout=TIMEOUT)
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_key"
    listing = keys_command(made["path"], "list").stdout
    assert "temp" not in listing and "reader" in listing and "rmk_" not in listing


def test_a_key_over_its_rate_is_429_with_retry_after(demo, made):
    key = add_key(made["path"], "burst", "read")
    statuses, retry_after = [], None
    with httpx.Client(timeout=TIMEOUT) as client:
        for _ in range(RATE + 5):
            response = client.get(f"{demo}/api/indexes", headers=bearer(key))
            statuses.append(response.status_code)
            if response.status_code == 429:
                retry_after = response.headers["Retry-After"]
                assert response.json()["error"]["code"] == "rate_limited"
    assert statuses[:RATE] == [200] * RATE and 429 in statuses
    assert retry_after is not None and int(retry_after) >= 1
    assert httpx.get(f"{demo}/api/indexes", headers=bearer(made["reader"]), timeout=TIMEOUT).status_code == 200


def test_wrong_keys_from_one_address_are_429_for_that_address_only(demo, made):
    # From 127.0.0.2 (loopback too), so that the shut-out address is not the one the other tests use.
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=TIMEOUT) as other:
        wrong = bearer("rmk_00000000_" + "D" * 43)
        assert [other.get(f"{demo}/api/indexes", headers=wrong).status_code for _ in range(20)] == [401] * 20
        response = other.get(f"{demo}/api/indexes", headers=bearer(made["reader"]))
        assert response.status_code == 429 and response.json()["error"]["code"] == "too_many_failed_keys"
        assert 1 <= int(response.headers["Retry-After"]) <= 60
    assert httpx.get(f"{demo}/api/indexes", headers=bearer(made["reader"]), timeout=TIMEOUT).status_code == 200


def wait_through_navigation(browser, expression: str, timeout: float, what: str):
    """``Browser.wait_for`` across a page load (an evaluation may meet the old page's context as it goes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if value := browser.evaluate(expression):
                return value
        except RuntimeError:  # "Execution context was destroyed": the page is being replaced
            pass
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.mark.browser
def test_the_page_asks_for_the_key_then_answers(demo, made):
    from tests.integration.test_demo_browser import ANSWER_TIMEOUT_S, OUTPUT, PANELS, Browser

    browser = Browser()
    try:
        browser.call("Page.navigate", url=demo)
        wait_through_navigation(browser, "!!document.getElementById('key-form') && "
                                "!document.getElementById('key-form').hidden", 60, "the key form")
        assert "needs a key" in browser.evaluate("document.getElementById('key-message').textContent")
        browser.type_into("#api-key", made["reader"])
        browser.click("#key-button")
        wait_through_navigation(browser, "document.readyState === 'complete' && "
                                "document.getElementById('index').options.length > 0 && "
                                "document.getElementById('index').value !== ''", 60, "the index list, with the key")
        assert browser.evaluate("document.getElementById('key-form').hidden")
        assert browser.evaluate("sessionStorage.getItem('rag-mag-key')") == made["reader"]
        assert made["reader"] not in browser.evaluate("location.href")
        browser.type_into("#question", QUESTION)
        browser.evaluate("document.getElementById('index').value = 'qnorm'")
        browser.click("#ask-button")
        browser.wait_for("document.querySelectorAll('.panel').length === 1 && ['done', 'error'].includes("
                         "document.querySelector('.panel').dataset.state)", ANSWER_TIMEOUT_S, "the answer")
        panel = browser.evaluate(PANELS)[0]
        browser.screenshot(OUTPUT / "demo-with-key.png")
        assert panel["state"] == "done" and panel["error"] is None and panel["answer"].strip(), panel
        assert not browser.console, browser.console
    finally:
        browser.close()


@pytest.mark.skipif(bool(os.environ.get(TEST_URL_ENV)), reason=f"${TEST_URL_ENV} names a server this session did "
                    "not start")
def test_the_vllm_server_rag_mag_started_asks_for_its_key(vllm_server):
    key = os.environ.get(API_KEY_ENV)
    assert key and key == read_api_key()  # kept beside the pid files, and exported for this process's generators
    assert httpx.get(f"{vllm_server}/models", timeout=TIMEOUT).status_code == 401
    assert httpx.get(f"{vllm_server}/models", headers=bearer("wrong"), timeout=TIMEOUT).status_code == 401
    assert httpx.get(f"{vllm_server}/models", headers=bearer(key), timeout=TIMEOUT).status_code == 200


def test_a_key_file_others_may_read_is_refused_at_start(made, tmp_path):
    shared = tmp_path / "shared-keys.json"
    shutil.copy(made["path"], shared)
    shared.chmod(0o644)
    result = subprocess.run(serve_command("--port", str(find_free_port()), "--keys-file", str(shared)),
                            env=serve_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and f"chmod 600 {shared}" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_every_address_without_keys_is_refused_at_start(specs, tmp_path):
    result = subprocess.run(serve_command("--host", "0.0.0.0", "--port", str(find_free_port()), *index_flags(specs)),
                            env=serve_env(tmp_path / "no-keys.json"), capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert "rag-mag keys add" in result.stderr and "--no-auth" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
