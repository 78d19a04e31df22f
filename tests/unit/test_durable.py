"""rag_mag.durable: atomic writes keep the old file on failure, folder swaps never leave no target, leftovers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rag_mag import durable


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "f.txt"
    durable.write_text(target, "old")
    with pytest.raises(RuntimeError), durable.atomic_write(target) as handle:
        handle.write("half of the new")
        raise RuntimeError("disk on fire")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["f.txt"]
    durable.write_bytes(target, b"new")
    assert target.read_bytes() == b"new"


@pytest.mark.parametrize("exchange", [True, False])
def test_replace_dir_swaps_whole_folders(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(durable, "_exchange", lambda first, second: False)
    target = tmp_path / "folder"
    for version in ("one", "two"):
        staging = durable.staging_dir(target)
        (staging / "data").write_text(version)
        durable.sync_tree(staging)
        durable.replace_dir(staging, target)
        assert (target / "data").read_text() == version
        assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]


def test_recover_dir_restores_a_moved_aside_target_and_removes_staging(tmp_path):
    target = tmp_path / "last"
    (tmp_path / ".last.old").mkdir()
    (tmp_path / ".last.old" / "state").write_text("good")
    (tmp_path / ".last.staging-abc").mkdir()
    (tmp_path / ".lastly").mkdir()  # not ours: left alone
    actions = durable.recover_dir(target)
    assert (target / "state").read_text() == "good" and len(actions) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lastly", "last"]


def test_an_incomplete_backup_is_left_in_place(tmp_path):
    (tmp_path / ".last.old").mkdir()
    actions = durable.recover_dir(tmp_path / "last", is_complete=lambda folder: False)
    assert (tmp_path / ".last.old").is_dir() and not (tmp_path / "last").exists() and "incomplete" in actions[0]


def test_fault_point_kills_at_the_nth_pass_only():
    code = ("from rag_mag import durable\n"
            "for i in range(3):\n"
            "    print(i, flush=True)\n"
            "    durable.fault_point('here')\n")
    env = {**os.environ, durable.KILL_ENV: "here#2"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                            cwd=Path(durable.__file__).parents[1], timeout=60)
    assert result.returncode == -signal.SIGKILL and result.stdout.split() == ["0", "1"]
    durable.fault_point("here")  # without the variable: nothing happens
