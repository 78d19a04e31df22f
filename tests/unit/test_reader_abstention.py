"""The reader learns to abstain: its no-answer examples, the settings that ask for them, and how they are scored."""

from __future__ import annotations

import pytest

from rag_mag.data import Passage
from rag_mag.errors import ConfigError
from rag_mag.metrics.answers import NO_ANSWER_REPLY, contains_answer, is_no_answer
from rag_mag.reader.config import ReaderConfig
from rag_mag.reader.examples import ExampleStats, Question, build_examples
from rag_mag.retriever.training.config import make_config


def _questions(count: int, clean_distractors: int = 4) -> list[Question]:
    questions = []
    for n in range(count):
        gold = [Passage(f"g{n}", f"City {n}", f"The treaty number {n} was signed in Town{n}.")]
        distractors = [Passage(f"d{n}-{i}", f"Other {n}-{i}", f"Unrelated fact {n}-{i} about rivers.")
                       for i in range(clean_distractors)]
        distractors.append(Passage(f"d{n}-x", "Leak", f"It is said that Town{n} hosted it."))  # holds the answer
        questions.append(Question(f"q{n}", f"Where was treaty {n} signed?", (f"Town{n}",), gold, distractors,
                                  "hotpotqa_gold"))
    return questions


def test_no_answer_examples_show_passages_without_the_answer_hardest_first_at_the_asked_share():
    # q0-q9: the retriever misses the answer; q10-q29: it finds it; q30-q39: no distractor is free of the answer
    questions = _questions(30) + _questions(40, clean_distractors=0)[30:]
    found = [[Passage(f"r{n}", "Rivers", "Rivers flow to the sea.")] if n < 10 else questions[n].gold
             for n in range(40)]
    stats = ExampleStats()
    examples = build_examples(questions, max_passages=3, passage_counts=(1,), passage_chars=(700,), seed=0,
                              retrieve=lambda queries, k: [row[:k] for row in found], stats=stats,
                              no_answer_share=0.5)
    no_answer = [e for e in examples if e.view == "no_answer"]
    answered = [e for e in examples if e.view != "no_answer"]
    assert len(no_answer) == 40 <= len(answered)  # every question once, at most the share asked
    for example in no_answer:
        assert example.target == NO_ANSWER_REPLY and example.answers == (NO_ANSWER_REPLY,)
        town = example.question.split()[2]  # "Where was treaty N signed?" -> its answer is TownN
        assert not any(contains_answer(f"{title} {text}", [f"Town{town}"]) for title, text in example.passages)
    # the retrieved passages where they miss the answer, else the question's own distractors, else another's
    assert stats.no_answer_sources == {"retrieved": 10, "distractors": 20, "other_question": 10}
    few = build_examples(questions, max_passages=3, passage_counts=(1,), passage_chars=(700,), seed=0,
                         retrieve=None, stats=ExampleStats(), no_answer_share=0.2)
    assert sum(e.view == "no_answer" for e in few) == round(sum(e.view != "no_answer" for e in few) * 0.2 / 0.8)


def test_no_share_means_no_no_answer_examples_and_yes_no_questions_never_get_one():
    questions = _questions(10)
    plain = build_examples(questions, max_passages=3, passage_counts=(1,), passage_chars=(700,), seed=0,
                           retrieve=None, stats=ExampleStats())
    assert all(e.view != "no_answer" for e in plain)
    yes_no = [Question("y", "Is it?", ("yes",), q.gold, q.distractors, q.source) for q in questions[:1]]
    examples = build_examples(yes_no, max_passages=3, passage_counts=(1,), passage_chars=(700,), seed=0,
                              retrieve=None, stats=ExampleStats(), no_answer_share=0.5)
    assert all(e.view != "no_answer" for e in examples)


@pytest.mark.parametrize("values, message", [
    ({"no_answer_share": 1.0}, "no_answer_share"), ({"no_answer_share": -0.1}, "no_answer_share"),
    ({"init_adapter": "data/reader_default", "method": "full"}, "init_adapter"),
])
def test_bad_abstention_settings_are_refused_by_name(values, message):
    with pytest.raises(ConfigError, match=message):
        make_config(ReaderConfig, {"out": "x", **values}, source="reader config")


def test_an_adapter_of_another_rank_is_refused_before_training(tmp_path):
    from rag_mag.reader.trainer import ReaderTrainer

    trainer = ReaderTrainer(ReaderConfig(out=str(tmp_path / "out"), init_adapter="data/reader_default",
                                         lora_rank=8))
    with pytest.raises(ConfigError, match="rank 16.*lora-rank 16"):
        trainer._continued_adapter(object())


@pytest.mark.parametrize("reply, abstains", [("unanswerable", True), ("Unanswerable.", True), ("", True),
                                             ("  ", True), ("Paris", False), ("unanswerable question", False)])
def test_the_abstention_reply_is_recognised_and_nothing_else(reply, abstains):
    assert is_no_answer(reply.rstrip(".")) is abstains
