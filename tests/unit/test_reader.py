"""The reader: its one prompt, its training examples, its settings, its loss, its merge and its resume checks."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from haystack import Document
from haystack.components.builders.chat_prompt_builder import ChatPromptBuilder

from rag_mag import durable
from rag_mag.components.answer_prompt import AnswerPromptBuilder, answer_messages
from rag_mag.components.followup_prompt import FollowUpPromptBuilder
from rag_mag.data import Passage
from rag_mag.errors import CheckpointError, ConfigError
from rag_mag.reader.config import ReaderConfig
from rag_mag.reader.examples import ExampleStats, Question, answer_target, build_examples, split_questions
from rag_mag.retriever.training.config import make_config
from rag_mag.serving.pipelines import PIPELINES_DIR
from tests.tiny import tiny_llama, tiny_reader_adapter

# The answer template the pipelines carried inline before AnswerPromptBuilder became its one home.
OLD_TEMPLATE = """\
{% message role="system" %}
You answer questions briefly from these passages. Reply with the answer only, in a few words.
{% endmessage %}
{% message role="user" %}
Passages:
{%- for document in documents %}
[{{ loop.index }}] {{ document.meta.get("title", "") }}: {{ document.content | truncate(700) }}
{%- endfor %}

Question: {{ question }}
Answer:
{% endmessage %}
"""


def _components(name: str) -> dict:
    return yaml.safe_load((PIPELINES_DIR / name).read_text())["components"]


# ------------------------------------------------------------------------------------------- the prompt
def test_the_answer_prompt_renders_as_the_old_inline_template_did():
    documents = [Document(content="word " * 300, meta={"title": "Long"}), Document(content="short", meta={})]
    old = ChatPromptBuilder(template=OLD_TEMPLATE).run(question="Who?", documents=documents)["prompt"]
    new = AnswerPromptBuilder(700).run(question="Who?", documents=documents)["prompt"]
    assert [m.text for m in new] == [m.text for m in old]
    assert new[1].text.count("...") == 1 and len(new[1].text) < 900  # the long passage was cut


def test_no_documents_gives_the_closed_book_prompt():
    messages = AnswerPromptBuilder().run(question="Who wrote Hamlet?", documents=[])["prompt"]
    inputs = AnswerPromptBuilder().__haystack_input__._sockets_dict  # the declared input sockets
    assert inputs["documents"].is_mandatory and inputs["question"].is_mandatory
    assert "own knowledge" in messages[0].text and "Passages" not in messages[1].text


def test_every_pipeline_answers_through_the_one_prompt_with_the_truncations_the_reader_trains_on():
    answer_chars, followup_chars = set(), set()
    for path in sorted(PIPELINES_DIR.glob("*.yaml")):
        for name, spec in yaml.safe_load(path.read_text())["components"].items():
            text = json.dumps(spec)
            assert "Reply with the answer only" not in text, f"{path.name}:{name} writes its own answer template"
            if spec["type"].endswith("AnswerPromptBuilder"):
                answer_chars.add(spec["init_parameters"]["max_passage_chars"])
            if spec["type"].endswith("FollowUpPromptBuilder"):
                followup_chars.add(spec["init_parameters"]["max_passage_chars"])
    config = ReaderConfig(out="x")
    assert answer_chars == set(config.passage_char_values)
    assert followup_chars == {config.followup_chars}
    assert _components("rag_multihop.yaml")["followup_llm"]["init_parameters"]["model"] == \
        _components("rag.yaml")["llm"]["init_parameters"]["model"] == "smollm2-135m-reader"


def test_prompt_builders_round_trip_and_refuse_bad_truncations():
    for cls in (AnswerPromptBuilder, FollowUpPromptBuilder):
        built = cls(321)
        assert cls.from_dict(built.to_dict()).max_passage_chars == 321
        for bad in (0, 5, "700", True):
            with pytest.raises(ValueError, match="max_passage_chars"):
                cls(bad)


def test_answer_messages_are_what_the_component_builds():
    messages = answer_messages("Who?", [("T", "text")], 500)
    assert [m["role"] for m in messages] == ["system", "user"] and "[1] T: text" in messages[1]["content"]


# ----------------------------------------------------------------------------------------- the examples
def _question(qid: str, answers: tuple[str, ...], gold: list[Passage], source: str = "hotpotqa_gold",
              question: str = "Where was the author of Alpha born?") -> Question:
    distractors = [Passage(f"{qid}-d{i}", f"Other {i}", f"nothing relevant {i}") for i in range(6)]
    return Question(qid, question, answers, gold, distractors, source)


def test_answer_target_is_the_first_alias_in_the_passages_and_yes_no_stands_for_itself():
    passages = [Passage("p", "Hamlet", "Hamlet was written by William Shakespeare.")]
    assert answer_target(["Bacon", "William Shakespeare", "Shakespeare"], passages) == "William Shakespeare"
    assert answer_target(["Marlowe"], passages) == ""
    assert answer_target(["yes"], passages) == "yes"


def test_the_gold_view_shows_every_gold_passage_and_the_followup_view_asks_for_the_missing_one():
    alpha = Passage("a", "Alpha", "Alpha is a novel by Beta Writer.")
    beta = Passage("b", "Beta Writer", "Beta Writer was born in Lisbon.")
    stats = ExampleStats()
    examples = build_examples([_question("q1", ("Lisbon",), [alpha, beta])], max_passages=4, passage_counts=(3,),
                              passage_chars=(700, 500), seed=0, retrieve=None, stats=stats, followup_chars=500)
    by_view = {e.view: e for e in examples}
    gold = by_view["gold"]
    assert {("Alpha", alpha.text), ("Beta Writer", beta.text)} <= set(gold.passages) and len(gold.passages) <= 4
    assert gold.target == "Lisbon" and gold.task == "answer" and gold.passage_chars in (700, 500)
    followup = by_view["followup"]
    assert followup.task == "followup" and followup.target == "Beta Writer"  # the question names Alpha
    assert ("Alpha", alpha.text) in followup.passages and ("Beta Writer", beta.text) not in followup.passages
    assert stats.examples == {"gold": 1, "followup": 1}


def test_the_retrieved_view_is_kept_only_when_its_passages_hold_an_answer():
    gold = [Passage("g", "Paris", "Paris is the capital of France.")]
    found = [[Passage("x", "Lyon", "Lyon is a city."), Passage("g", "Paris", "Paris is the capital of France.")],
             [Passage("y", "Nice", "Nice is a city.")]]
    questions = [_question("q1", ("Paris",), gold, "nq_oracle_gold"), _question("q2", ("Paris",), gold, "nq")]
    stats = ExampleStats()
    examples = build_examples(questions, max_passages=3, passage_counts=(2,), passage_chars=(700,), seed=0,
                              retrieve=lambda queries, k: [row[:k] for row in found], stats=stats)
    retrieved = [e for e in examples if e.view == "retrieved"]
    assert [e.id for e in retrieved] == ["q1#retrieved"] and stats.retrieved_without_answer == 1


def test_validation_holds_out_whole_gold_questions():
    gold = [Passage("g", "T", "the answer is Z")]
    questions = [_question(f"q{i}", ("Z",), gold, "mined" if i % 3 == 0 else "nq_oracle_gold") for i in range(30)]
    train, validation = split_questions(questions, 8, seed=0)
    assert len(validation) == 8 and not {q.id for q in train} & {q.id for q in validation}
    assert all(q.source != "mined" for q in validation) and len(train) == 22
    assert [q.id for q in split_questions(questions, 8, seed=0)[1]] == [q.id for q in validation]


def test_evaluation_questions_never_become_examples(tmp_path):
    from rag_mag.reader.trainer import ReaderTrainer

    triples = tmp_path / "triples.jsonl"
    rows = [{"id": f"t{i}", "query": f"Question number {i}?", "answers": [f"ans{i}"],
             "positives": [{"id": f"p{i}", "title": f"T{i}", "text": f"the answer is ans{i}"}],
             "hard_negatives": [{"id": f"n{i}", "title": "N", "text": "nothing"}]} for i in range(12)]
    triples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    evaluation = tmp_path / "eval.jsonl"
    evaluation.write_text(json.dumps({"id": "e", "question": "question NUMBER 3", "answers": ["x"]}) + "\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"out": str(tmp_path / "unused"), "exclude": [str(evaluation)],
                                    "sources": [{"name": "s", "kind": "triples", "path": str(triples)}]}))
    config = ReaderConfig(out=str(tmp_path / "run"), gold_triples=str(triples), gold_eval="", mined_rows="",
                          exclude_from=str(spec), retrieval_corpus="", val_questions=2, followup_chars=0)
    train, validation, digest = ReaderTrainer(config).examples()
    questions = {e.question for e in train + validation}
    assert "Question number 3?" not in questions and len(questions) == 11 and len(validation) == 2
    again = ReaderTrainer(config).examples()  # read back, same digest
    assert again[2] == digest and [e.id for e in again[0]] == [e.id for e in train]


def test_the_retrieved_view_is_built_from_the_retrieval_corpus_through_the_trainer(tmp_path):
    from rag_mag.reader.trainer import ReaderTrainer
    from tests.tiny import tiny_encoder

    triples = tmp_path / "triples.jsonl"
    rows = [{"id": f"t{i}", "query": f"what is the capital of france {i}", "answers": ["paris"],
             "positives": [{"id": f"p{i}", "title": "paris", "text": "paris is the capital of france"}],
             "hard_negatives": [{"id": f"n{i}", "title": "rome", "text": "rome is in italy"}]} for i in range(6)]
    triples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"c{i}", "title": t, "text": x}) + "\n" for i, (t, x) in enumerate(
        [("paris", "paris is the capital of france"), ("rome", "rome is in italy"), ("berlin", "berlin is a city")])))
    retriever = tiny_encoder(tmp_path / "tiny").save(tmp_path / "retriever")
    config = ReaderConfig(out=str(tmp_path / "run"), gold_triples=str(triples), gold_eval="", mined_rows="",
                          exclude_from="", retrieval_corpus=str(corpus), retrieval_model=str(retriever),
                          passage_counts="3", val_questions=2, followup_chars=0, precision="fp32")
    train, validation, _ = ReaderTrainer(config).examples()
    retrieved = [e for e in train + validation if e.view == "retrieved"]
    assert len(retrieved) == 6  # the whole 3-passage corpus holds "paris" for every question
    assert all(len(e.passages) == 3 and e.target == "paris" for e in retrieved)


# ------------------------------------------------------------------------------------------- the settings
@pytest.mark.parametrize("values, message", [
    ({"learning_rate": -1.0}, "learning_rate"), ({"steps": 0}, "steps"),
    ({"passage_counts": "3,x"}, "passage_counts"), ({"passage_chars": "10"}, "passage_chars"),
    ({"lora_dropout": 1.5}, "lora_dropout"), ({"batch_size": "8"}, "batch_size"),
    ({"gold_triples": "", "gold_eval": ""}, "no gold source"), ({"lora_rnak": 8}, "unknown reader config field"),
    ({"method": "qlora"}, "unknown method 'qlora'"), ({"export_rank": 0}, "export_rank"),
])
def test_bad_reader_settings_are_refused_by_name(values, message):
    with pytest.raises(ConfigError, match=message):
        make_config(ReaderConfig, {"out": "x", **values}, source="reader config")


# ----------------------------------------------------------------------------------------------- the loss
def test_the_answer_token_loss_is_the_cross_entropy_of_the_full_logits_on_the_answer_tokens():
    from rag_mag.reader.sft import answer_token_loss

    model = tiny_llama()
    input_ids = torch.randint(0, 97, (2, 12))
    labels = torch.full_like(input_ids, -100)
    labels[0, 9:] = input_ids[0, 9:]
    labels[1, 6:8] = input_ids[1, 6:8]
    logits = model(input_ids=input_ids).logits
    reference = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 97), labels[:, 1:].reshape(-1),
                                                  ignore_index=-100)
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}
    assert torch.allclose(answer_token_loss(model, inputs), reference, atol=1e-5)
    summed = answer_token_loss(model, inputs, num_items=10)  # 5 answer tokens: sum / 10 is half the mean
    assert torch.allclose(summed, reference / 2, atol=1e-5)


# ---------------------------------------------------------------------------------------------- the merge
def test_a_merged_reader_answers_like_base_plus_adapter_and_a_tampered_adapter_is_refused(tmp_path):
    from rag_mag.reader.merge import merge_reader, merged_adapter_sha

    base_dir, adapter_dir, peft_model = tiny_reader_adapter(tmp_path)
    out_dir = tmp_path / "merged"
    merged_dir = merge_reader(adapter_dir, base_dir, out_dir)
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    input_ids = torch.randint(0, 97, (1, 10))
    with torch.no_grad():
        expected = peft_model.eval()(input_ids=input_ids).logits
        got = merged.eval()(input_ids=input_ids).logits
    assert torch.allclose(got, expected, atol=0.1)  # bf16 weights in the merged folder
    assert merged_adapter_sha(out_dir) is not None
    stamp = (out_dir / "model.safetensors").stat().st_mtime_ns
    merge_reader(adapter_dir, base_dir, out_dir)  # the same adapter: kept, not merged again
    assert (out_dir / "model.safetensors").stat().st_mtime_ns == stamp
    weights = adapter_dir / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(CheckpointError, match="does not match"):
        merge_reader(adapter_dir, base_dir, out_dir)


# ---------------------------------------------------------------------------------- full fine-tuning, cut
def test_full_fine_tuning_trains_only_the_decoder_linears():
    from rag_mag.reader.export import train_decoder_linears

    model = tiny_llama()
    names = train_decoder_linears(model)
    trained = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert trained == {f"{name}.weight" for name in names} and len(names) == 2 * 7  # q k v o gate up down
    assert not any("embed" in name or "norm" in name or "lm_head" in name for name in trained)


def test_a_low_rank_change_is_exported_exactly_and_merges_to_the_trained_weights(tmp_path):
    from peft import PeftModel

    from rag_mag.reader.export import low_rank_weights, snapshot, train_decoder_linears, write_adapter

    base_dir = tmp_path / "base"
    tiny_llama().save_pretrained(base_dir)
    model = tiny_llama()
    base = snapshot(model, train_decoder_linears(model))
    modules = dict(model.named_modules())
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name in base:  # a change of rank 2 in every trained weight
            weight = modules[name].weight
            weight += torch.randn(weight.shape[0], 2, generator=generator) @ torch.randn(2, weight.shape[1],
                                                                                        generator=generator)
    assert write_adapter(model, base, 3, tmp_path, str(base_dir)) == pytest.approx(1.0, abs=1e-5)
    merged = PeftModel.from_pretrained(tiny_llama(), str(tmp_path)).merge_and_unload()
    merged_modules = dict(merged.named_modules())
    for name in base:
        assert torch.allclose(merged_modules[name].weight, modules[name].weight, atol=1e-4), name
    before = {name: modules[name].weight.clone() for name in base}
    with low_rank_weights(model, base, 3):  # a cut of rank >= the change's keeps it whole
        assert all(torch.allclose(modules[n].weight, before[n], atol=1e-4) for n in base)
    with low_rank_weights(model, base, 1):  # a smaller cut changes the weights while it lasts
        assert not torch.allclose(modules[next(iter(base))].weight, before[next(iter(base))], atol=1e-3)
    assert all(torch.equal(modules[n].weight, before[n]) for n in base)  # and they are restored after it


def test_a_cut_below_the_change_rank_keeps_the_best_part_and_says_how_much():
    from rag_mag.reader.export import adapter_tensors, low_rank_factors, snapshot, train_decoder_linears

    delta = torch.diag(torch.tensor([3.0, 2.0, 1.0])) @ torch.linalg.qr(torch.randn(3, 5).T)[0].T
    a, b = low_rank_factors(delta, 2)
    assert torch.allclose(torch.linalg.svdvals(b @ a)[:2], torch.tensor([3.0, 2.0]), atol=1e-5)
    a, b = low_rank_factors(delta, 8)  # more rank than the matrix has: padded with zeros
    assert a.shape == (8, 5) and b.shape == (3, 8) and torch.allclose(b @ a, delta, atol=1e-5)
    model = tiny_llama()
    base = snapshot(model, train_decoder_linears(model))
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter += 0.1 * torch.randn_like(parameter)  # a full-rank change
    _, kept = adapter_tensors(model, base, 2)
    assert 0.0 < kept < 0.9


# --------------------------------------------------------------------------------------------- resuming
def test_a_last_checkpoint_of_other_settings_is_refused(tmp_path):
    from rag_mag.reader.trainer import RUN_FILE, ReaderTrainer

    config = ReaderConfig(out=str(tmp_path), learning_rate=1e-4)
    last = tmp_path / "last"
    last.mkdir()
    (last / "trainer_state.json").write_text("{}")
    (last / RUN_FILE).write_text(json.dumps({"config": {**config.to_dict(), "learning_rate": 5e-4, "steps": 9},
                                             "examples_digest": "abc"}))
    with pytest.raises(ConfigError, match="learning_rate: saved 0.0005, now 0.0001"):
        ReaderTrainer(config)._resume_from("abc")
    with pytest.raises(ConfigError, match="examples differ"):
        ReaderTrainer(ReaderConfig(out=str(tmp_path), learning_rate=5e-4))._resume_from("other")
    # steps may change: only how long, not what is trained
    assert ReaderTrainer(ReaderConfig(out=str(tmp_path), learning_rate=5e-4))._resume_from("abc") == last
    assert ReaderTrainer(ReaderConfig(out=str(tmp_path), learning_rate=5e-4, resume=False))._resume_from("x") is None
    (last / RUN_FILE).unlink()
    with pytest.raises(CheckpointError, match="incomplete"):
        ReaderTrainer(config)._resume_from("abc")


def test_a_run_that_reached_its_steps_reports_its_adapter_and_a_tampered_one_is_refused(tmp_path):
    from rag_mag.reader.trainer import ReaderTrainer

    last, adapter = tmp_path / "last", tmp_path / "adapter"
    last.mkdir()
    adapter.mkdir()
    weights = adapter / "adapter_model.safetensors"
    weights.write_bytes(b"weights")
    (adapter / "reader.json").write_text(json.dumps({"step": 6, "validation": {"em": 40.0, "f1": 50.0},
                                                      "adapter_sha256": durable.sha256_of(weights)}))
    (last / "trainer_state.json").write_text(json.dumps({"global_step": 8}))
    assert ReaderTrainer(ReaderConfig(out=str(tmp_path), steps=9))._completed(last) is None  # one step to go
    done = ReaderTrainer(ReaderConfig(out=str(tmp_path), steps=8))._completed(last)
    assert (done.adapter_dir, done.step, done.validation) == (adapter, 6, {"step": 6, "em": 40.0, "f1": 50.0})
    weights.write_bytes(b"other weights")
    with pytest.raises(CheckpointError, match="does not match its reader.json"):
        ReaderTrainer(ReaderConfig(out=str(tmp_path), steps=8))._completed(last)


def test_the_reader_needs_a_converted_base_model(tmp_path):
    from rag_mag.reader.trainer import base_model_dir

    with pytest.raises(ConfigError, match="serve-llm --convert-only"):
        base_model_dir(ReaderConfig(out=str(tmp_path), base_model=str(tmp_path / "missing")))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    assert base_model_dir(ReaderConfig(out="x", base_model=str(tmp_path / "model"))) == tmp_path / "model"
