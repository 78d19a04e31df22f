"""Requests the demo must refuse once it has keys: none, an unknown, malformed or revoked one (401 with
WWW-Authenticate), a read key on upload and delete, an index the key is not granted (403), a key over its rate and
an address that keeps sending wrong keys (429 with Retry-After); a key file others may read and a server bound to
every address without keys, which ``rag-mag serve`` refuses to start with one line. No key appears in an answer or
in the log."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from rag_mag.cli.main import main
from rag_mag.demo import keys
from rag_mag.demo.access import Access
from rag_mag.demo.app import create_app
from rag_mag.demo.indexes import IndexSpec
from rag_mag.demo.loading import load_index
from rag_mag.demo.service import DemoService
from rag_mag.serving.pipelines import PIPELINES_DIR
from rag_mag.serving.processes import find_free_port
from tests.local import closed_port_url
from tests.tiny import paris_index

pytestmark = pytest.mark.faults

ASK = {"question": "What is the capital of France?"}
UPLOAD = {"X-RagMag-Upload": "1"}
API_ROUTES = [("GET", "/api/indexes"), ("POST", "/api/ask"), ("POST", "/api/ask/stream"), ("GET", "/v1/models"),
              ("POST", "/v1/chat/completions"), ("GET", "/api/documents?index=qnorm"),
              ("POST", "/api/documents?index=qnorm"), ("DELETE", "/api/documents?index=qnorm&file=a.txt"),
              ("GET", "/api/documents/jobs/0123456789ab")]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("auth-faults")
    paris_index(root)
    return root


@pytest.fixture(scope="module")
def service(root) -> DemoService:
    """One index served under two names: ``qnorm`` and ``other`` (for keys granted one of them)."""
    url = closed_port_url()
    return DemoService([load_index(IndexSpec(name, root / "index-qnorm", root / "retriever-qnorm"),
                                   PIPELINES_DIR / "rag.yaml", url) for name in ("qnorm", "other")], url)


@pytest.fixture
def made(tmp_path) -> dict[str, str]:
    """A key file with a write key, a read key and a read key for ``other`` only: ``{name: key}``."""
    path = tmp_path / "keys.json"
    made = {"path": str(path)}
    for name, role, indexes in (("writer", "write", None), ("reader", "read", None), ("other", "read", ["other"])):
        made[name] = keys.add_key(path, name, role, indexes)[1]
    return made


def app_with(service, made, **limits):
    return create_app(service, access=Access("keys", keys.KeyStore(Path(made["path"])), **limits))


@pytest.fixture
def client(service, made):
    with TestClient(app_with(service, made), base_url="http://127.0.0.1") as test_client:
        yield test_client


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def call(client, method: str, path: str, headers: dict[str, str]):
    if method == "POST" and path.startswith("/api/documents"):
        return client.post(path, headers={**UPLOAD, **headers}, files=[("files", ("a.txt", b"hello\n", "text/plain"))])
    if method == "POST":
        body = {"model": "qnorm", "messages": [{"role": "user", "content": ASK["question"]}]} if "/v1/" in path else ASK
        return client.post(path, json=body, headers=headers)
    return client.request(method, path, headers={**UPLOAD, **headers})


def refused(response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"], error
    return error["message"]


# ------------------------------------------------------------------------------------------------- 401
@pytest.mark.parametrize("method, path", API_ROUTES)
def test_every_api_route_wants_a_key(client, made, method, path, fault_case):
    response = call(client, method, path, {})
    assert "rag-mag keys add" in refused(response, 401, "key_missing")
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    fault_case.clear_error()


@pytest.mark.parametrize("wrong", ["rmk_00000000_" + "A" * 43, "not-a-key", "Basic dXNlcjpwYXNz", "Bearer ",
                                   "Bearer rmk_zz"])
def test_an_unknown_or_malformed_key_is_401(client, made, wrong, fault_case, caplog):
    caplog.set_level(logging.DEBUG)
    header = wrong if wrong.startswith(("Basic", "Bearer")) else f"Bearer {wrong}"
    for method, path in API_ROUTES:
        response = call(client, method, path, {"Authorization": header})
        message = refused(response, 401, "invalid_key")
        assert 'error="invalid_token"' in response.headers["WWW-Authenticate"]
        assert "rmk_" not in message and "dXNlcjpwYXNz" not in message and "not-a-key" not in message
    assert "rmk_" not in caplog.text
    fault_case.clear_error()


def test_a_revoked_key_is_401_on_its_next_request(client, made, fault_case):
    assert client.get("/api/indexes", headers=bearer(made["reader"])).status_code == 200
    assert main(["keys", "revoke", "reader", "--keys-file", made["path"]]) == 0
    refused(client.get("/api/indexes", headers=bearer(made["reader"])), 401, "invalid_key")
    assert client.get("/api/indexes", headers=bearer(made["writer"])).status_code == 200
    fault_case.clear_error()


def test_the_page_and_health_answer_without_a_key_and_health_says_nothing_of_the_indexes(client, root, fault_case):
    assert client.get("/").status_code == 200 and client.get("/static/auth.js").status_code == 200
    health = client.get("/health")
    assert health.status_code == 503  # vLLM is down in this test; still no key needed
    body = health.json()
    assert body["auth"] == "keys" and set(body) == {"status", "auth", "llm"} and body["llm"] == {"reachable": False}
    assert "qnorm" not in health.text and "127.0.0.1" not in health.text and str(root) not in health.text
    fault_case.survived()


# ------------------------------------------------------------------------------------------------- 403
def test_a_read_key_may_ask_but_not_upload_or_delete(client, made, root, fault_case):
    reader = bearer(made["reader"])
    uploads = root / "index-qnorm.uploads"
    before = sorted(uploads.iterdir()) if uploads.exists() else None
    assert client.get("/api/indexes", headers=reader).status_code == 200
    assert client.post("/api/ask", json=ASK, headers=reader).status_code == 503  # allowed; vLLM is down here
    assert client.get("/api/documents?index=qnorm", headers=reader).status_code == 200
    for method, path in (("POST", "/api/documents?index=qnorm"), ("DELETE", "/api/documents?index=qnorm&file=a.txt")):
        message = refused(call(client, method, path, reader), 403, "key_read_only")
        assert "'reader'" in message and "--role write" in message
    assert (sorted(uploads.iterdir()) if uploads.exists() else None) == before
    fault_case.clear_error()


def test_a_write_key_uploads(client, made, root, fault_case):
    response = call(client, "POST", "/api/documents?index=qnorm", bearer(made["writer"]))
    assert response.status_code == 202, response.text
    job = response.json()["job"]["id"]
    assert (root / "index-qnorm.uploads" / "a.txt").read_bytes() == b"hello\n"
    assert client.get(f"/api/documents/jobs/{job}", headers=bearer(made["writer"])).status_code == 200
    refused(client.get(f"/api/documents/jobs/{job}", headers=bearer(made["other"])), 403, "index_not_granted")
    fault_case.survived()


def test_an_index_the_key_is_not_granted_is_403(client, made, fault_case):
    other = bearer(made["other"])
    listed = client.get("/api/indexes", headers=other).json()
    assert [info["name"] for info in listed["indexes"]] == ["other"] and listed["default"] == "other"
    assert [model["id"] for model in client.get("/v1/models", headers=other).json()["data"]] == ["other"]
    cases = [client.post("/api/ask", json={**ASK, "index": "qnorm"}, headers=other),
             client.post("/api/ask", json=ASK, headers=other),  # the default index, qnorm
             client.post("/api/ask/stream", json={**ASK, "index": "qnorm"}, headers=other),
             client.post("/api/ask", json={**ASK, "index": ["other"]}, headers=other),
             client.post("/v1/chat/completions", json={"model": "qnorm", "messages": [
                 {"role": "user", "content": "hi"}]}, headers=other),
             client.get("/api/documents?index=qnorm", headers=other)]
    for response in cases:
        assert "may use: other" in refused(response, 403, "index_not_granted")
    assert client.post("/api/ask", json={**ASK, "index": "other"}, headers=other).status_code == 503  # granted
    fault_case.clear_error()


# ------------------------------------------------------------------------------------------------- 429
def test_a_key_over_its_rate_is_429_with_retry_after(service, made, fault_case):
    with TestClient(app_with(service, made, rate_per_minute=3), base_url="http://127.0.0.1") as client:
        statuses = [client.get("/api/indexes", headers=bearer(made["reader"])).status_code for _ in range(3)]
        response = client.get("/api/indexes", headers=bearer(made["reader"]))
        assert statuses == [200, 200, 200]
        assert "--rate-limit" in refused(response, 429, "rate_limited")
        assert 1 <= int(response.headers["Retry-After"]) <= 20
        assert client.get("/api/indexes", headers=bearer(made["writer"])).status_code == 200  # per key
    fault_case.clear_error()


def test_an_address_sending_wrong_keys_is_429_even_with_a_good_one(service, made, fault_case):
    with TestClient(app_with(service, made), base_url="http://127.0.0.1") as client:
        wrong = bearer("rmk_00000000_" + "B" * 43)
        assert [client.get("/api/indexes", headers=wrong).status_code for _ in range(20)] == [401] * 20
        for headers in (wrong, bearer(made["writer"]), {}):
            response = client.get("/api/indexes", headers=headers)
            assert "too many wrong keys" in refused(response, 429, "too_many_failed_keys")
            assert 1 <= int(response.headers["Retry-After"]) <= 60
        assert client.get("/health").status_code in (200, 503)  # not an API route
    fault_case.clear_error()


def test_missing_keys_do_not_count_as_wrong_ones(service, made, fault_case):
    with TestClient(app_with(service, made), base_url="http://127.0.0.1") as client:
        assert {client.get("/api/indexes").status_code for _ in range(25)} == {401}
        assert client.get("/api/indexes", headers=bearer(made["reader"])).status_code == 200
    fault_case.survived()


# ------------------------------------------------------------------------------------------------- serve refuses
def test_serve_refuses_a_key_file_others_may_read(made, capsys, fault_case):
    Path(made["path"]).chmod(0o644)
    code = main(["serve", "--port", str(find_free_port()), "--keys-file", made["path"]])
    err = capsys.readouterr().err
    assert code == 2 and f"`chmod 600 {made['path']}`" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    fault_case.clear_error()


def test_serve_on_every_address_without_keys_refuses_and_names_both_ways(tmp_path, capsys, fault_case):
    code = main(["serve", "--host", "0.0.0.0", "--port", str(find_free_port()), "--keys-file",
                 str(tmp_path / "none.json")])
    err = capsys.readouterr().err
    assert code == 2 and "rag-mag keys add" in err and "--no-auth" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    fault_case.clear_error()


def test_no_auth_says_so_on_health(service, fault_case):
    with TestClient(create_app(service, access=Access("off")), base_url="http://127.0.0.1") as client:
        body = client.get("/health").json()
        assert body["auth"] == "off" and "anyone who can reach this server" in body["warning"]
        assert client.get("/api/indexes").status_code == 200
    fault_case.survived()
