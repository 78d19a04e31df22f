"""The abstention benchmark's scoring and sets, on hand-made items (the real run needs vLLM: eval/README.md)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rag_mag.bench.abstention.runner import load_abstention_config
from rag_mag.bench.abstention.scoring import abstains, prf, score_group
from rag_mag.bench.abstention.sets import Item, clapnq_items
from rag_mag.errors import ConfigError


def _item(answerable: bool, answers=("Paris",), text="Paris is the capital of France.", today=None) -> Item:
    return Item("set", "qnorm", "q", "What is the capital of France?", answers if answerable else answers,
                (("France", text),), answerable, answerable and "Paris" in text, today=today)


def _reply(text: str) -> dict:
    return {"reply": text, "answerable": text != "unanswerable"}


def test_an_abstention_is_the_reader_reply_or_with_the_passage_signal_an_answer_not_in_the_passages():
    item = _item(True)
    assert abstains(item, _reply("unanswerable"), "reader")
    assert not abstains(item, _reply("Paris"), "reader")
    assert not abstains(item, _reply("Lyon"), "reader")
    assert abstains(item, _reply("Lyon"), "reader+passages")
    assert not abstains(item, _reply("paris"), "reader+passages")


def test_precision_recall_and_f1_of_abstention():
    answerable = np.array([0, 0, 1, 0], dtype=float)      # one false abstention
    unanswerable = np.array([1, 1, 1, 0], dtype=float)    # three of four abstained
    precision, recall, f1 = prf(answerable, unanswerable)
    assert precision == pytest.approx(3 / 4) and recall == pytest.approx(3 / 4) and f1 == pytest.approx(3 / 4)
    assert prf(np.zeros(3), np.zeros(3)) == (0.0, 0.0, 0.0)


def test_a_group_is_scored_on_both_kinds_of_question_and_paired_with_the_report():
    items = [_item(True, today=1.0), _item(True, today=0.0), _item(True, today=1.0),
             _item(False, text="Berlin is in Germany."), _item(False, text="Rome is in Italy.")]
    replies = [_reply("Paris"), _reply("Paris"), _reply("unanswerable"), _reply("unanswerable"), _reply("Rome")]
    group = score_group(items, replies, "reader")
    assert group["n_answerable"] == 3 and group["n_unanswerable"] == 2
    assert group["em"]["value"] == pytest.approx(200 / 3)             # the abstention scores 0
    assert group["false_abstain"]["value"] == pytest.approx(100 / 3)
    assert group["abstain"]["value"] == pytest.approx(50.0)
    assert group["abstention"]["precision"]["value"] == pytest.approx(50.0)
    assert group["em_vs_report"]["delta"] == pytest.approx(0.0)        # 2/3 now, 2/3 in the report
    low, high = group["abstain"]["ci"]
    assert 0.0 <= low <= 50.0 <= high <= 100.0


def test_clapnq_items_come_from_both_files(tmp_path):
    for kind, answer in (("answerable", "Seasonality."), ("unanswerable", "")):
        record = {"id": kind, "input": f"question {kind}", "passages": [{"title": "T", "text": "some text"}],
                  "output": [{"answer": answer}]}
        (tmp_path / f"clapnq_dev_{kind}.jsonl").write_text(json.dumps(record) + "\n")
    items = clapnq_items(tmp_path)
    assert [(i.id, i.answerable, i.answers) for i in items] == [("answerable", True, ("Seasonality.",)),
                                                               ("unanswerable", False, ())]
    (tmp_path / "clapnq_dev_answerable.jsonl").unlink()
    with pytest.raises(Exception, match="clapnq_dev_answerable.jsonl does not exist"):
        clapnq_items(tmp_path)


def test_a_bad_abstention_config_is_refused_by_name(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("name: a\nreaders: {reader: smollm2-135m-reader}\nabstention: {datasetz: [x]}\n")
    with pytest.raises(ConfigError, match="abstention.datasetz"):
        load_abstention_config(path, None)
    path.write_text("name: a\nabstention: {datasets: [trivia_qa]}\n")
    with pytest.raises(ConfigError, match="readers"):
        load_abstention_config(path, None)
