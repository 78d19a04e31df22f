"""The question writer: its prompt, its reply format, its training examples and how a reply is scored."""

from __future__ import annotations

import json

import pytest
from haystack import Document

from rag_mag.components.question_prompt import (
    QuestionPromptBuilder,
    parse_question,
    question_messages,
    question_target,
)
from rag_mag.errors import ConfigError
from rag_mag.reader.config import ReaderConfig
from rag_mag.reader.examples import ReaderExample
from rag_mag.reader.prompts import read_reply
from rag_mag.retriever.training.config import make_config


@pytest.mark.parametrize("reply, parsed", [
    ("Question: Who built the tower?\nAnswer: Gustave Eiffel.", ("Who built the tower?", "Gustave Eiffel")),
    ("  question : When did it open?  \n\nANSWER: 1889", ("When did it open?", "1889")),
    ("Question: Who built the tower?\nAnswer: Eiffel\nQuestion: another?\nAnswer: x", ("Who built the tower?",
                                                                                         "Eiffel")),
    ("Question: Who built the tower\nAnswer: Eiffel", None),          # not a question
    ("Question: Who built the tower?\nAnswer:", None),                # no answer
    ("The tower was built by Eiffel.", None),
    ("Question: Why?\nAnswer: x", None),                              # too short to be a question
])
def test_a_reply_parses_only_as_one_question_and_one_answer(reply, parsed):
    assert parse_question(reply) == parsed


def test_the_target_is_what_parses_back_with_a_question_mark_added():
    target = question_target("who sang the song wonderwall", "Oasis")
    assert target == "Question: who sang the song wonderwall?\nAnswer: Oasis"
    assert parse_question(target) == ("who sang the song wonderwall?", "Oasis")
    assert question_target("Is it?", "yes").count("?") == 1


def test_the_prompt_shows_the_title_and_the_cut_passage_and_round_trips():
    builder = QuestionPromptBuilder(max_passage_chars=40)
    messages = builder.run(document=Document(content="word " * 40, meta={"title": "Words"}))["prompt"]
    assert "Passage: Words: word" in messages[-1].text and len(messages[-1].text) < 80
    assert QuestionPromptBuilder.from_dict(builder.to_dict()).max_passage_chars == 40
    assert question_messages("Words", "word " * 40, 40)[-1]["content"] == messages[-1].text
    with pytest.raises(ValueError, match="max_passage_chars"):
        QuestionPromptBuilder(max_passage_chars=5)


def _example(text: str, chars: int = 700) -> ReaderExample:
    return ReaderExample("q#question", "who wrote it?", ("Ann",), question_target("who wrote it", "Ann"),
                         (("Book", text),), "question", "nq_oracle_gold", chars, task="question")


def test_a_writer_reply_is_scored_by_its_answer_and_valid_only_when_the_answer_is_in_the_passage_shown():
    text = "The book was written by Ann in 1990. " + "x " * 200 + "Bob read it."
    assert read_reply(_example(text), "Question: who wrote the book?\nAnswer: Ann") == ("Ann", True)
    assert read_reply(_example(text, chars=60), "Question: who read the book?\nAnswer: Bob") == ("Bob", False)
    assert read_reply(_example(text), "Ann wrote it") == ("", False)
    answer_example = ReaderExample("a", "who?", ("Ann",), "Ann", (("Book", text),), "gold", "s", 700)
    assert read_reply(answer_example, "Answer: Ann.\nmore") == ("Ann", None)


def test_the_writer_learns_from_one_passage_questions_whose_answer_it_is_shown(tmp_path):
    from rag_mag.reader.trainer import ReaderTrainer

    rows = []
    for i in range(10):
        contexts = [{"id": f"g{i}", "title": f"T{i}", "text": f"The founder of club {i} was Person{i}.",
                     "is_supporting": True}]
        if i == 0:  # two gold passages: one passage does not answer it
            contexts.append({"id": "g0b", "title": "Other", "text": "Person0 was born in 1900.", "is_supporting": True})
        rows.append({"id": f"nq{i}", "question": f"who founded club {i}", "answers": [f"Person{i}"],
                     "contexts": contexts})
    rows[1]["answers"] = ["yes"]                                  # yes/no: not a span to ask about
    rows[2]["contexts"][0]["text"] = "A long opening. " * 60 + "Person2 founded it."  # beyond the cut
    gold_eval = tmp_path / "oracle.jsonl"
    gold_eval.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = ReaderConfig(out=str(tmp_path / "run"), task="question", gold_triples="", gold_eval=str(gold_eval),
                          mined_rows="", exclude_from="", retrieval_corpus="", val_questions=2, followup_chars=0,
                          passage_chars="300")
    train, validation, _ = ReaderTrainer(config).examples()
    examples = train + validation
    assert {e.id for e in examples} == {f"nq{i}#question" for i in range(3, 10)}
    assert all(e.task == "question" and len(e.passages) == 1 and parse_question(e.target) for e in examples)
    assert all(parse_question(e.target)[1] in e.passages[0][1][:300] for e in examples)


def test_an_unknown_task_is_refused_by_name():
    with pytest.raises(ConfigError, match="unknown task 'quiz'"):
        make_config(ReaderConfig, {"out": "x", "task": "quiz"}, source="reader config")
