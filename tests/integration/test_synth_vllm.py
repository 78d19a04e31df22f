"""``rag-mag synth`` with the real parts: the packaged question writer and the trained reader on vLLM, the packaged
MiniLM as the round trip's base retriever, real converters on a folder of real files."""

from __future__ import annotations

import json

import pytest

from rag_mag.cli.main import main
from rag_mag.metrics.answers import contains_answer
from rag_mag.serving.llm.readers import reader_checksum
from rag_mag.serving.llm.settings import WRITER_SERVED_MODEL_NAME
from tests.files import write_folder

pytestmark = pytest.mark.integration


def test_synth_writes_checked_pairs_with_provenance(vllm_server, tmp_path, capsys):
    docs, out = write_folder(tmp_path / "docs"), tmp_path / "pairs"
    files = {str(path.relative_to(docs)) for path in docs.rglob("*") if path.is_file()}
    code = main(["synth", str(docs), "--out", str(out), "--llm-url", vllm_server, "--min-words", "5",
                 "--base-top-k", "3"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    manifest = json.loads((out / "synth.json").read_text())
    counts = manifest["counts"]
    assert counts["sampled"] == counts["chunks"] >= 5  # a tiny folder: every chunk is asked about
    assert counts["kept"] + counts["unparsed"] + counts["answer_not_in_chunk"] + counts["base_rank_beyond_k"] \
        + counts["reader_disagrees"] == counts["sampled"]
    pairs = [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]
    assert len(pairs) == counts["kept"] >= 1, counts  # the trained writer gets some questions through both checks
    for pair in pairs:
        chunk = pair["positives"][0]
        assert pair["file"] in files and pair["chunk_id"] == chunk["id"]
        assert contains_answer(chunk["text"], pair["answers"]) and 1 <= pair["checks"]["base_rank"] <= 3
        assert pair["generator"] == WRITER_SERVED_MODEL_NAME
        assert pair["generator_sha256"] == reader_checksum(WRITER_SERVED_MODEL_NAME)
        assert pair["query"].endswith("?")
    assert f"{counts['kept']} pairs kept" in captured.out

    # run again: nothing is asked twice, the same pairs come out
    written = (out / "written.jsonl").read_text()
    assert main(["synth", str(docs), "--out", str(out), "--llm-url", vllm_server, "--min-words", "5",
                 "--base-top-k", "3"]) == 0
    assert (out / "written.jsonl").read_text() == written
    assert [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()] == pairs
