"""An output that cannot be written: a read-only filesystem, a folder without write permission, a file where the
output folder should go. Every writer command refuses it before any model loads, with one line naming the path,
the reason and what to do, exits 2 without a traceback, and leaves what was there as it was.

The read-only case mounts a small tmpfs and remounts it read-only (root only; skipped elsewhere). The
permission case makes the folder mode 0o555 (skipped for root, whom permissions do not stop). A file in the
way fails for everyone.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from rag_mag import durable, writable
from rag_mag.cli.main import main
from rag_mag.errors import OutputNotWritableError
from tests.faults.test_fault_locks import command, inputs, no_model_loads  # noqa: F401 (fixtures)

pytestmark = pytest.mark.faults

WRITERS = ["train", "train-reader", "index", "build-data", "bench", "crossover", "synth", "adapt"]
REASONS = {"read-only": "read-only filesystem", "no-permission": "permission denied",
           "file-in-the-way": "a file is where a folder should be"}


def snapshot(folder: Path) -> dict[str, bytes]:
    if folder.is_file():
        return {folder.name: folder.read_bytes()}
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(params=list(REASONS))
def unwritable(request, tmp_path):
    """(the output to write, the folder whose content must not change, the reason the line must give)."""
    kind = request.param
    if kind == "file-in-the-way":
        (tmp_path / "a-file").write_text("previous")
        yield tmp_path / "a-file" / "out", tmp_path / "a-file", REASONS[kind]
        return
    place = tmp_path / kind
    place.mkdir()
    if kind == "read-only":
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(place)],
                                 capture_output=True, text=True, timeout=30)
        if mounted.returncode:
            pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or 'not permitted'}; it needs root)")
    (place / "out").mkdir()
    (place / "out" / "previous.txt").write_text("a previous run's output")
    if kind == "read-only":
        subprocess.run(["mount", "-o", "remount,ro", str(place)], check=True, timeout=30)
    elif os.geteuid() == 0:
        pytest.skip("root is not stopped by folder permissions (the read-only case covers root)")
    else:
        for folder in (place / "out", place):
            folder.chmod(0o555)
    yield place / "out", place, REASONS[kind]
    if kind == "read-only":
        subprocess.run(["umount", "-l", str(place)], check=False)
    else:
        for folder in (place, place / "out"):
            folder.chmod(0o755)


def writer_arguments(name: str, inputs: dict[str, Path], out: Path) -> list[str]:  # noqa: F811
    if name != "crossover":
        return command(name, inputs, out)[0]
    config = inputs["root"] / "crossover.yaml"
    config.write_text(f"name: outputs-test\noutput_dir: {out}\nruns: [{{strategy: cosine}}]\n")
    return ["crossover", str(config)]


@pytest.mark.usefixtures("no_model_loads")
@pytest.mark.parametrize("name", WRITERS)
def test_an_unwritable_output_is_one_line_before_any_model_loads(inputs, unwritable, capsys, name, fault_case):  # noqa: F811,E501
    out, kept, reason = unwritable
    before = snapshot(kept)
    assert main(writer_arguments(name, inputs, out)) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith(f"rag-mag {name}: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "cannot write" in lines[0] and reason in lines[0] and "write somewhere else" in lines[0], lines[0]
    assert snapshot(kept) == before  # the previous state as it was, no probe or lock file left
    fault_case.clear_error()


def test_a_later_write_that_meets_a_read_only_filesystem_is_one_line(tmp_path, monkeypatch, fault_case):
    target = tmp_path / "cells" / "cell.json"
    durable.write_text(target, "old")

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp_path / "cells"))

    monkeypatch.setattr(durable.tempfile, "NamedTemporaryFile", read_only)
    with pytest.raises(OutputNotWritableError, match=r"cannot write cell\.json at .*read-only filesystem"):
        durable.write_text(target, "new")
    assert target.read_text() == "old"
    fault_case.clear_error()


def test_the_check_leaves_nothing_behind_on_a_writable_output(tmp_path, fault_case):
    writable.check_writable(tmp_path / "new" / "out", "the test's output")
    (tmp_path / "existing").mkdir()
    writable.check_writable(tmp_path / "existing", "the test's output")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["existing"]
    fault_case.survived()
