"""The demo's keys without a server: the key file (hashed, 0600, refused when others may read it), ``rag-mag keys``,
the rate limits' arithmetic and the choice ``rag-mag serve`` makes between keys, loopback without keys and a refusal.
The HTTP answers (401, 403, 429) are in tests/faults/test_fault_auth.py, the real server in
tests/integration/test_demo_auth.py."""

from __future__ import annotations

import argparse
import json
import os
import stat

import pytest

from rag_mag.cli.main import build_parser, main
from rag_mag.cli.serve import access_policy, is_loopback
from rag_mag.demo import keys
from rag_mag.demo.access import Access, FailedKeys, TokenBucket
from rag_mag.errors import ConfigError


def add(path, name="alice", role="read", indexes=None):
    return keys.add_key(path, name, role, indexes)


def test_a_key_is_random_shown_once_and_kept_only_as_its_hash(tmp_path):
    path = tmp_path / "keys.json"
    record, key = add(path, "alice", "write", ["qnorm", "qnorm", "cosine"])
    other_record, other = add(path, "bob")
    assert keys.KEY_PATTERN.fullmatch(key) and key != other and record.id != other_record.id
    assert key.startswith(f"rmk_{record.id}_") and len(key.split("_", 2)[2]) == 43  # 32 random bytes, base64
    text = path.read_text()
    assert key not in text and key.split("_", 2)[2] not in text and other not in text
    assert keys.digest(key) in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert record.indexes == ("qnorm", "cosine") and other_record.indexes is None
    assert [r.name for r in keys.read_records(path)] == ["alice", "bob"]


def test_the_store_knows_good_keys_only(tmp_path):
    path = tmp_path / "keys.json"
    _, key = add(path, role="write")
    store = keys.KeyStore(path)
    assert store.verify(key).name == "alice" and store.verify(key).may_write()
    key_id, secret = key.split("_", 2)[1:]
    flipped = secret[:-1] + ("A" if secret[-1] != "A" else "B")
    for wrong in (f"rmk_{key_id}_{flipped}", f"rmk_00000000_{secret}", key[:-1], key + "x", "", "Bearer " + key,
                  key.upper(), f"rmk_{key_id}"):
        assert store.verify(wrong) is None, wrong


def test_a_revoke_applies_to_a_running_store_at_once(tmp_path):
    path = tmp_path / "keys.json"
    _, alice = add(path, "alice")
    _, bob = add(path, "bob")
    store = keys.KeyStore(path)
    assert store.verify(alice) and store.verify(bob)
    keys.revoke_key(path, "alice")
    assert store.verify(alice) is None and store.verify(bob).name == "bob"
    with pytest.raises(ConfigError, match="no key named 'alice'.*keys: bob"):
        keys.revoke_key(path, "alice")


def test_last_used_is_written_beside_the_keys_and_never_brings_a_revoked_key_back(tmp_path):
    path = tmp_path / "keys.json"
    _, alice = add(path, "alice")
    _, bob = add(path, "bob")
    store = keys.KeyStore(path)
    store.verify(alice)
    store.verify(bob)
    store.flush_used()  # less than a minute since the store started: not yet
    assert not keys.used_path(path).exists()
    keys.revoke_key(path, "bob")  # a revoke between the last use and the write
    store.flush_used(force=True)
    used = keys.read_last_used(path)
    assert list(used) == [keys.read_records(path)[0].id]
    assert [r.name for r in keys.read_records(path)] == ["alice"]
    assert stat.S_IMODE(keys.used_path(path).stat().st_mode) == 0o600


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o622])
def test_a_key_file_others_may_read_or_change_is_refused_with_the_chmod(tmp_path, mode):
    path = tmp_path / "keys.json"
    add(path)
    os.chmod(path, mode)
    for action in (lambda: keys.read_records(path), lambda: keys.KeyStore(path), lambda: add(path, "bob")):
        with pytest.raises(ConfigError, match=f"mode {mode:04o}") as error:
            action()
        assert f"`chmod 600 {path}`" in str(error.value) and "\n" not in str(error.value)


def test_a_malformed_key_file_is_one_line(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text("{not json")
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="is malformed"):
        keys.read_records(path)
    path.write_text(json.dumps({"version": 1, "keys": [{"name": "x", "id": "1", "sha256": "nothex", "role": "read",
                                                        "indexes": None, "created": 0}]}))
    with pytest.raises(ConfigError, match="is malformed"):
        keys.read_records(path)


@pytest.mark.parametrize("name, role, indexes, message", [
    ("a b", "read", None, "invalid key name"), ("", "read", None, "invalid key name"),
    ("-x", "read", None, "invalid key name"), ("alice", "admin", None, "invalid role 'admin'"),
    ("alice", "read", ["../x"], "invalid index name"), ("alice", "read", [""], "invalid index name")])
def test_bad_names_roles_and_indexes_are_refused(tmp_path, name, role, indexes, message):
    with pytest.raises(ConfigError, match=message):
        keys.add_key(tmp_path / "keys.json", name, role, indexes)
    assert not (tmp_path / "keys.json").exists()


def test_the_keys_command(tmp_path, capsys, monkeypatch):
    path = tmp_path / "sub" / "keys.json"
    monkeypatch.setenv(keys.KEYS_FILE_ENV, str(path))
    assert main(["keys", "add", "alice", "--role", "write"]) == 0
    key = capsys.readouterr().out.strip().splitlines()[-1]
    assert keys.KeyStore(path).verify(key).name == "alice"
    assert main(["keys", "add", "bob", "--role", "read", "--index", "qnorm", "--keys-file", str(path)]) == 0
    capsys.readouterr()
    assert main(["keys", "list"]) == 0
    listing = capsys.readouterr().out
    assert key not in listing and "rmk_" not in listing
    lines = listing.splitlines()
    assert lines[0].split() == ["NAME", "ROLE", "INDEXES", "CREATED", "LAST", "USED"]
    assert lines[1].split()[:3] == ["alice", "write", "all"] and lines[1].endswith("never")
    assert lines[2].split()[:3] == ["bob", "read", "qnorm"]
    assert main(["keys", "add", "alice", "--role", "read"]) == 2
    assert "revoke it first" in capsys.readouterr().err
    assert main(["keys", "revoke", "alice"]) == 0 and "revoked key 'alice'" in capsys.readouterr().out
    assert keys.KeyStore(path).verify(key) is None
    path.chmod(0o644)
    assert main(["keys", "list"]) == 2
    err = capsys.readouterr().err
    assert f"chmod 600 {path}" in err and len(err.strip().splitlines()) == 1


def test_the_help_describes_the_flags():
    parser = build_parser()
    subparsers = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    serve_help = subparsers.choices["serve"].format_help()
    for flag in ("--keys-file", "--no-auth", "--rate-limit", "RAG_MAG_KEYS_FILE", "Authorization: Bearer"):
        assert flag in serve_help, flag
    keys_help = subparsers.choices["keys"].format_help()
    for word in ("add", "list", "revoke", "read", "write", "0600"):
        assert word in keys_help


# ---------------------------------------------------------------------------------------------- rate limits
def test_the_token_bucket_allows_the_rate_with_bursts():
    bucket = TokenBucket(rate_per_minute=3)
    assert [bucket.take("k", 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take("k", 0.0) == pytest.approx(20.0)  # one request every 20 s
    assert bucket.take("other", 0.0) == 0.0  # per key
    assert bucket.take("k", 19.0) == pytest.approx(1.0)
    assert bucket.take("k", 20.0) == 0.0


def test_failed_keys_shut_an_address_out_for_the_rest_of_the_minute():
    failed = FailedKeys(max_failures=3)
    for when in (0.0, 10.0, 20.0):
        assert failed.blocked_for("1.2.3.4", when) == 0.0
        failed.add("1.2.3.4", when)
    assert failed.blocked_for("1.2.3.4", 30.0) == pytest.approx(30.0)  # until the first failure is a minute old
    assert failed.blocked_for("5.6.7.8", 30.0) == 0.0
    assert failed.blocked_for("1.2.3.4", 60.5) == 0.0


# ---------------------------------------------------------------------------------------------- serve's choice
@pytest.mark.parametrize("host, expected", [("127.0.0.1", True), ("127.0.1.1", True), ("::1", True),
                                            ("[::1]", True), ("localhost", True), ("0.0.0.0", False), ("::", False),
                                            ("192.168.1.5", False), ("demo.lan", False)])
def test_loopback(host, expected):
    assert is_loopback(host) is expected


def serve_args(tmp_path, host="127.0.0.1", no_auth=False):
    return argparse.Namespace(host=host, port=7860, keys_file=str(tmp_path / "keys.json"), no_auth=no_auth,
                              rate_limit=120)


def test_serve_chooses_keys_local_off_or_refuses(tmp_path, caplog):
    assert access_policy(serve_args(tmp_path)).mode == "local"
    assert "anyone on this machine" in caplog.text and "rag-mag keys add" in caplog.text
    with pytest.raises(ConfigError) as error:
        access_policy(serve_args(tmp_path, host="0.0.0.0"))
    message = str(error.value)
    assert "rag-mag keys add" in message and "--no-auth" in message and "\n" not in message
    assert access_policy(serve_args(tmp_path, host="0.0.0.0", no_auth=True)).mode == "off"
    add(tmp_path / "keys.json")
    for host in ("127.0.0.1", "0.0.0.0"):
        assert access_policy(serve_args(tmp_path, host=host)).mode == "keys"
    assert access_policy(serve_args(tmp_path, no_auth=True)).health()["auth"] == "off"


def test_access_needs_a_store_in_keys_mode_only(tmp_path):
    with pytest.raises(ValueError, match="key store"):
        Access("keys")
    with pytest.raises(ValueError, match="mode"):
        Access("open")
    with pytest.raises(ValueError, match="rate_per_minute"):
        Access(rate_per_minute=0)
