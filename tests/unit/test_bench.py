"""The benchmark's pipeline path without a vLLM server: config, system names, scoring at budget, the oracle
row, and the generator's retries (scripted chat components stand in for VLLMChatGenerator)."""

from __future__ import annotations

from dataclasses import replace

import httpx
import numpy as np
import openai
import pytest
from haystack import component
from haystack.dataclasses import ChatMessage

from rag_mag.bench.cells import budget_recall, gold_documents
from rag_mag.bench.config import BenchConfig, PipelineEntry, split_system, system_name
from rag_mag.bench.datasets import EvalDataset
from rag_mag.bench.generation import BenchPipeline, CellFailed, GenerationCache, generator_overrides
from rag_mag.bench.report.aggregate import aggregate
from rag_mag.bench.report.compare import compare_to_baseline
from rag_mag.bench.report.findings import of_pipeline
from rag_mag.bench.scoring import CellScorer
from rag_mag.bench.systems import Row, System
from rag_mag.data import Context, EvalRecord, Passage
from rag_mag.errors import ConfigError
from rag_mag.serving.pipelines import PIPELINES_DIR
from tests.tiny import tiny_encoder
from tests.unit.test_pipelines import ScriptedChat

CORPUS = [Passage("p0", "Paris", "paris is the capital city of france"),
          Passage("p1", "Berlin", "berlin is the capital of germany"),
          Passage("p2", "Rome", "rome is the capital of italy"),
          Passage("p3", "Thames", "the thames is a river in london england"),
          Passage("p4", "Ocean", "the ocean is a war of the king")]


def supporting_dataset() -> EvalDataset:
    records = [EvalRecord("q1", "which river is in the capital of england", ("thames",),
                          (Context("p3", "Thames", CORPUS[3].text, True),
                           Context("p0", "Paris", CORPUS[0].text, True))),
               EvalRecord("q2", "capital of italy", ("rome",), (Context("p2", "Rome", CORPUS[2].text, True),))]
    return EvalDataset("toy", records, list(CORPUS), source="test")


def answer_dataset() -> EvalDataset:
    records = [EvalRecord("a1", "capital of germany", ("berlin",), (Context("p1", "Berlin", CORPUS[1].text),)),
               EvalRecord("a2", "who wrote the book", ("tolstoy",), ())]
    return EvalDataset("open", records, list(CORPUS), source="test")


def config(**values) -> BenchConfig:
    return BenchConfig(**{"datasets": ["toy=a.jsonl", "open=b.jsonl"], **values})


@component
class FlakyChat:
    """Raises the given errors in turn, then answers."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage]) -> dict:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return {"replies": [ChatMessage.from_assistant("Rome")]}


def timeout_error() -> openai.APITimeoutError:
    return openai.APITimeoutError(request=httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions"))


# ------------------------------------------------------------------------------ config and names
def test_pipelines_default_to_rag_yaml_and_accept_entries_with_datasets_and_question_caps():
    assert config().pipeline_entries() == [PipelineEntry("pipelines/rag.yaml")]
    entries = config(pipelines=["pipelines/rag.yaml", {"path": "pipelines/rag_multihop.yaml", "datasets": ["toy"],
                                                       "answer_questions": 50}]).pipeline_entries()
    assert [e.name for e in entries] == ["rag", "rag_multihop"]
    assert entries[1].covers("toy") and not entries[1].covers("open") and entries[0].covers("open")
    assert entries[1].answer_questions == 50
    # an entry's own count wins; other rows (and the reader baselines) answer the config's answer_questions
    settings = config(answer_questions=7, pipelines=["pipelines/rag.yaml", {"path": "pipelines/rag_multihop.yaml",
                                                                            "max_questions": 3}])  # older spelling
    assert [settings.answered_by(e) for e in settings.pipeline_entries()] == [7, 3] and settings.answered_by(None) == 7
    assert config().answered_by(None) is None  # all of them
    assert config(pipeline="my/own.yaml").pipeline_entries() == [PipelineEntry("my/own.yaml")]  # older configs


@pytest.mark.parametrize(("values", "message"), [
    ({"pipelines": [{"path": "p.yaml", "datasets": ["nope"]}]}, "names nope, which the config does not list"),
    ({"pipelines": ["a/rag.yaml", "b/rag.yaml"]}, "share the name 'rag'"),
    ({"pipelines": [{"path": "p.yaml", "max_questions": 0}]}, "answer_questions must be a positive integer"),
    ({"pipelines": [{"path": "p.yaml", "max_questions": 2, "answer_questions": 2}]}, "older spelling"),
    ({"answer_questions": 0}, "answer_questions must be a positive integer"),
    ({"max_questions": "all"}, "max_questions must be a positive integer"),
    ({"pipelines": [{"path": "p.yaml", "top_k": 3}]}, "unknown field"),
    ({"pipelines": []}, "non-empty list"),
    ({"pipelines": ["oracle.yaml"]}, "baseline's"),
    ({"pipeline": "x.yaml", "pipelines": ["y.yaml"]}, "either pipeline"),
    ({"llm_timeout": 0}, "llm_timeout must be a positive number"),
    ({"llm_max_retries": -1}, "llm_max_retries must be a non-negative integer"),
    ({"llm_retry_waits": [10, "soon"]}, "llm_retry_waits"),
    ({"baselines": ["oracle", "psychic"]}, "unknown baseline"),
    ({"reader": ""}, "reader must name the generator"),
    ({"base_reader": "smollm2-135m-reader"}, "base_reader is the reader itself"),
    ({"base_reader": "b", "base_reader_rows": ["rag"]}, "base_reader_rows must list reader baselines"),
    ({"base_reader_questions": 0}, "base_reader_questions must be a positive integer"),
])
def test_bad_pipeline_and_generator_settings_are_refused_clearly(values, message):
    with pytest.raises(ConfigError, match=message):
        config(**values)


def test_system_names_carry_the_pipeline_and_reader_baselines_stay_plain():
    assert system_name("rag_multihop", "qnorm") == "rag_multihop:qnorm" and system_name(None, "oracle") == "oracle"
    assert split_system("rag_multihop:qnorm") == ("rag_multihop", "qnorm") and split_system("bm25") == (None, "bm25")
    dense = Row(System("qnorm", 1, None), PipelineEntry("pipelines/rag_multihop.yaml"))
    assert dense.name == "rag_multihop:qnorm" and dense.label == "rag_multihop__qnorm__s1"
    assert Row(System("oracle", 0, None), None).name == "oracle"


def test_a_base_reader_adds_its_own_rows_with_their_own_questions_and_key(tmp_path):
    from rag_mag.bench.runner import BenchRunner

    plain = BenchRunner(config(output_dir=str(tmp_path), answer_questions=5), "t.yaml", "t")
    systems = [System("oracle", 0, None), System("closed_book", 0, None), System("bm25", 0, None)]
    assert [row.name for row in plain.rows(systems)] == ["oracle", "closed_book", "bm25"]
    runner = BenchRunner(config(output_dir=str(tmp_path), answer_questions=5, base_reader="smollm2-135m-instruct",
                                base_reader_questions=2), "t.yaml", "t")
    rows = runner.rows(systems)
    assert [row.name for row in rows] == ["oracle", "closed_book", "bm25", "oracle@base", "closed_book@base"]
    base = rows[3]
    assert base.label == "oracle@base__s0" and runner.config.answered_by(None, base.base) == 2
    assert runner.config.answered_by(None) == 5
    dataset, scorer = supporting_dataset(), CellScorer(runner.config, None, GenerationCache(tmp_path / "c.jsonl"))
    assert runner._key(dataset, base, scorer) != runner._key(dataset, rows[0], scorer)
    assert runner.readers()[1] == {"name": "smollm2-135m-instruct", "checksum": runner.readers()[1]["checksum"]}
    assert runner.readers()[1]["checksum"].startswith("gguf:")


def test_every_generator_asks_for_the_configured_reader(tmp_path):
    from rag_mag.bench.generation import resolve_pipeline

    overrides = generator_overrides(resolve_pipeline("pipelines/rag_multihop.yaml"), "http://h:1/v1", 5.0, 0,
                                    model="other-reader")
    assert overrides["llm.model"] == overrides["followup_llm.model"] == "other-reader"
    assert "llm.model" not in generator_overrides(resolve_pipeline("pipelines/rag.yaml"), "http://h:1/v1", 5.0, 0)


def test_comparisons_stay_within_a_pipeline_and_findings_use_the_primary_one():
    rng = np.random.default_rng(0)
    names = ["rag:cosine", "rag:qnorm", "rag_multihop:cosine", "rag_multihop:qnorm", "bm25", "oracle"]
    rows = [{"dataset": "toy", "system": name, "seed": 0, "n_questions": 20, "rag": {"em": 10.0}} for name in names]
    per_example = {("toy", name, 0): {"ids": [str(i) for i in range(20)], "em": rng.integers(0, 2, 20).astype(float)}
                   for name in names}
    cells = aggregate(rows, per_example, n_resamples=50)
    comparisons = compare_to_baseline(cells, per_example, n_resamples=50, n_permutations=50, primary_pipeline="rag")
    against = {entry["system"]: entry["baseline"] for entry in comparisons}
    assert against == {"rag:qnorm": "rag:cosine", "rag_multihop:qnorm": "rag_multihop:cosine",
                       "bm25": "rag:cosine", "oracle": "rag:cosine"}
    plain_cells, plain_comparisons = of_pipeline(cells, comparisons, "rag")
    assert sorted(cell.system for cell in plain_cells) == ["bm25", "cosine", "oracle", "qnorm"]
    assert {entry["baseline"] for entry in plain_comparisons} == {"cosine"}


# ------------------------------------------------------------------------------ scoring
def test_union_of_rounds_is_judged_at_its_own_budget_against_round_one_at_the_same_budget():
    dataset = supporting_dataset()
    # q1 needs p3 and p0: round 1 ranks p3 first but p0 only 4th; the second round brought p0 in at 2 passages.
    given = [["p3", "p0"], ["p2", "p2", "p1"]]  # a repeated passage counts once: budget 2
    ranked = [["p3", "p1", "p2", "p0"], ["p1", "p2", "p4"]]
    scores = budget_recall(dataset, given, ranked)
    assert scores["budget"].tolist() == [2, 2]
    assert scores["recall@budget"].tolist() == [1.0, 1.0]
    assert scores["round1_recall@budget"].tolist() == [0.5, 1.0]  # top-2 of round 1: p3 only / p1, p2
    no_passages = budget_recall(dataset, [[], []], ranked)
    assert no_passages["recall@budget"].tolist() == [0.0, 0.0]
    assert no_passages["round1_recall@budget"].tolist() == [0.0, 0.0]


def test_answer_recall_at_budget_on_a_dataset_without_gold_passages():
    dataset = answer_dataset()
    scores = budget_recall(dataset, [["p0", "p1"], ["p0"]], [["p0", "p2", "p1"], ["p1"]])
    assert scores["recall@budget"].tolist() == [1.0, 0.0]  # p1 holds "berlin"; nothing holds "tolstoy"
    assert scores["round1_recall@budget"].tolist() == [0.0, 0.0]  # round 1's top 2 (p0, p2) lacks berlin


def test_gold_documents_are_supporting_passages_or_answer_bearing_contexts():
    gold = gold_documents(supporting_dataset(), cap=1)
    assert [[d.id for d in docs] for docs in gold] == [["p3", "p0"], ["p2"]]  # supporting passages are never cut
    assert gold[0][0].content == CORPUS[3].text and gold[0][0].meta["title"] == "Thames"
    assert [[d.id for d in docs] for docs in gold_documents(answer_dataset(), cap=3)] == [["p1"], []]
    unaligned = EvalDataset("2wiki", [EvalRecord("w", "who?", ("x",), ())], list(CORPUS), source="test")
    assert gold_documents(unaligned, cap=3) is None  # no oracle row where the data names no gold passage


def test_oracle_row_answers_from_the_gold_passages_through_the_reader_pipeline(tmp_path):
    llm = ScriptedChat("Answer: Thames.", "rome is the capital")
    scorer = CellScorer(config(concurrency=1), "http://127.0.0.1:9/v1", GenerationCache(tmp_path / "cache.jsonl"),
                        components={"reader": {"llm": llm}})
    cell = scorer.evaluate(supporting_dataset(), Row(System("oracle", 0, None), None))
    assert "thames is a river in london" in llm.prompts[0] and "[2] Paris" in llm.prompts[0]
    assert "[1] Rome: rome is the capital of italy" in llm.prompts[1] and "Berlin" not in "".join(llm.prompts)
    assert cell["predictions"] == ["Thames", "rome is the capital"]
    assert cell["rag"]["em"] == 50.0 and cell["rag"]["accuracy"] == 100.0
    assert cell["budget"] == {"mean": 1.5, "max": 2} and cell["oracle_without_gold"] == 0
    closed = scorer.evaluate(supporting_dataset(), Row(System("closed_book", 0, None), None))
    assert "own knowledge" in llm.prompts[2] and "Passages" not in llm.prompts[2]
    assert closed["n_questions"] == 2
    # answers are cached by pipeline file, settings and inputs: asking again does not reach the generator
    scorer.evaluate(supporting_dataset(), Row(System("oracle", 0, None), None))
    assert len(llm.prompts) == 4


def test_oracle_row_asks_only_questions_with_gold_passages_and_names_them(tmp_path):
    """A question without gold passages would be a closed-book question in the oracle's row: it is skipped, and
    the row takes the next questions that have some, up to answer_questions, naming them for paired tests."""
    records = list(reversed(answer_dataset().records))  # a2 (no gold passage) first, then a1
    dataset = EvalDataset("open", records, list(CORPUS), source="test")
    llm = ScriptedChat("Berlin.")
    scorer = CellScorer(config(concurrency=1, answer_questions=1), "http://127.0.0.1:9/v1",
                        GenerationCache(tmp_path / "cache.jsonl"), components={"reader": {"llm": llm}})
    cell = scorer.evaluate(dataset, Row(System("oracle", 0, None), None))
    assert len(llm.prompts) == 1 and "capital of germany" in llm.prompts[0] and "[1] Berlin" in llm.prompts[0]
    assert cell["question_ids"] == ["a1"] and cell["n_questions"] == 1 and cell["rag"]["em"] == 100.0
    assert cell["oracle_without_gold"] == 1  # a2, the first question, has none
    closed = scorer.evaluate(dataset, Row(System("closed_book", 0, None), None))
    assert closed["n_questions"] == 1 and "question_ids" not in closed  # every other row: the first questions


def test_an_oracle_row_without_gold_passages_is_left_out_before_any_server_is_needed(tmp_path):
    scorer = CellScorer(config(concurrency=1), None, GenerationCache(tmp_path / "cache.jsonl"))
    oracle, closed = Row(System("oracle", 0, None), None), Row(System("closed_book", 0, None), None)
    unaligned = EvalDataset("2wiki", [EvalRecord("w", "who?", ("x",), ())], list(CORPUS), source="test")
    assert not scorer.applies(unaligned, oracle) and scorer.applies(unaligned, closed)
    assert scorer.applies(supporting_dataset(), oracle)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    return tiny_encoder(root / "tok", "qnorm").save(root / "ckpt")


def test_dense_rows_run_the_yaml_pipelines_and_judge_the_union_of_rounds(tmp_path, checkpoint, monkeypatch):
    monkeypatch.setenv("RAG_MAG_ARTIFACTS", str(tmp_path / "artifacts"))
    entries = ["pipelines/rag.yaml", {"path": "pipelines/rag_multihop.yaml", "datasets": ["toy"],
                                      "answer_questions": 1}]
    answer, followup = ScriptedChat("thames"), ScriptedChat("capital of france")
    scorer = CellScorer(config(concurrency=1, rag_top_k=2, pipelines=entries), "http://127.0.0.1:9/v1",
                        GenerationCache(tmp_path / "cache.jsonl"),
                        components={"rag": {"llm": ScriptedChat("rome")},
                                    "rag_multihop": {"llm": answer, "followup_llm": followup}})
    dataset = supporting_dataset()
    single = scorer.evaluate(dataset, Row(System("qnorm", 0, checkpoint), PipelineEntry(entries[0])))
    assert single["n_questions"] == 2 and single["budget"]["max"] == 2 and single["rounds"] == 1.0
    assert {"recall@1", "recall@20", "ndcg@10", "recall@budget"} <= set(single["retrieval"])  # primary: ranking
    assert single["retrieval"]["recall@budget"] == single["retrieval"]["round1_recall@budget"]
    assert "document_norm_cohens_d" in single["diagnostics"]
    multi = scorer.evaluate(dataset, Row(System("qnorm", 0, checkpoint), PipelineEntry(**entries[1])))
    assert multi["n_questions"] == 1 and multi["rounds"] == 2.0
    assert 2 <= multi["budget"]["max"] <= 5  # top_k 2 in round 1, then at most 3 new ones (max_new_per_hop)
    assert "ndcg@10" not in multi["retrieval"] and "diagnostics" not in multi  # shown once, on the rag row
    assert len(multi["retrieval_per_example"]["round1_recall@budget"]) == 1
    assert "Search query" in "".join(followup.prompts) and len(answer.prompts) == 1


def test_every_question_is_ranked_and_only_the_first_answer_questions_are_answered(tmp_path, checkpoint,
                                                                                 monkeypatch):
    monkeypatch.setenv("RAG_MAG_ARTIFACTS", str(tmp_path / "artifacts"))
    llm, reader = ScriptedChat("thames"), ScriptedChat("thames")
    scorer = CellScorer(config(concurrency=1, rag_top_k=2, answer_questions=1), "http://127.0.0.1:9/v1",
                        GenerationCache(tmp_path / "cache.jsonl"), components={"rag": {"llm": llm},
                                                                              "reader": {"llm": reader}})
    dataset = supporting_dataset()
    dense = scorer.evaluate(dataset, Row(System("qnorm", 0, checkpoint), PipelineEntry("pipelines/rag.yaml")))
    assert dense["n_questions"] == 1 and dense["n_ranked"] == 2 and len(llm.prompts) == 1
    assert len(dense["retrieval_per_example"]["ndcg@10"]) == 2  # the ranking: every question
    assert len(dense["retrieval_per_example"]["recall@budget"]) == 1 and len(dense["rag_per_example"]["f1"]) == 1
    bm25 = scorer.evaluate(dataset, Row(System("bm25", 0, None), None))
    assert bm25["n_questions"] == 1 and bm25["n_ranked"] == 2 and len(bm25["retrieval_per_example"]["ndcg@10"]) == 2
    for name in ("oracle", "closed_book"):
        assert scorer.evaluate(dataset, Row(System(name, 0, None), None))["n_questions"] == 1
    assert len(reader.prompts) == 3  # one question each, not two


def test_paired_tests_pair_each_metric_on_the_questions_it_covers():
    ids = [f"q{i}" for i in range(40)]
    rng = np.random.default_rng(3)
    ndcg = rng.random(40)
    per_example = {("toy", "rag:cosine", 0): {"ids": ids, "f1": np.zeros(10), "ndcg@10": ndcg},
                   ("toy", "rag:qnorm", 0): {"ids": ids, "f1": np.ones(10), "ndcg@10": ndcg + 0.1}}
    rows = [{"dataset": "toy", "system": name, "seed": 0, "n_questions": 10, "n_ranked": 40,
             "rag": {"f1": 0.0}, "retrieval": {"ndcg@10": 0.0}} for name in ("rag:cosine", "rag:qnorm")]
    cells = aggregate(rows, per_example, n_resamples=50)
    assert {cell.ranked for cell in cells} == {40}
    comparisons = {c["metric"]: c for c in compare_to_baseline(cells, per_example, n_resamples=50,
                                                                n_permutations=50)}
    assert comparisons["f1"]["n"] == 10 and comparisons["f1"]["delta"] == pytest.approx(100.0)
    assert comparisons["ndcg@10"]["n"] == 40 and comparisons["ndcg@10"]["delta"] == pytest.approx(10.0)


# ------------------------------------------------------------------------------ a slow server
def test_generator_overrides_reach_every_vllm_generator_by_type():
    overrides = generator_overrides(PIPELINES_DIR / "rag_multihop.yaml", "http://h:1/v1", timeout=900, max_retries=4)
    assert overrides == {f"{name}.{param}": value for name in ("followup_llm", "llm")
                         for param, value in (("api_base_url", "http://h:1/v1"), ("timeout", 900.0),
                                              ("max_retries", 4))}


def test_a_slow_server_is_asked_again_after_the_configured_waits(tmp_path):
    llm = FlakyChat(timeout_error(), timeout_error())
    pipeline = BenchPipeline(PIPELINES_DIR / "reader.yaml", {}, GenerationCache(tmp_path / "c.jsonl"), concurrency=1,
                             retry_waits=[0, 0], components={"llm": llm})
    assert pipeline.run_many([{"question": "capital of italy", "documents": []}], lambda out: out["answers"][0].data
                             ) == ["Rome"]
    assert llm.calls == 3


def test_a_cell_fails_clearly_when_the_server_keeps_failing(tmp_path):
    llm = FlakyChat(timeout_error(), timeout_error())
    pipeline = BenchPipeline(PIPELINES_DIR / "reader.yaml", {}, GenerationCache(tmp_path / "c.jsonl"), concurrency=1,
                             retry_waits=[0], components={"llm": llm})
    with pytest.raises(CellFailed, match="after 2 tries: APITimeoutError"):
        pipeline.run_many([{"question": "capital of italy", "documents": []}], lambda out: out["answers"][0].data)
    rejected = FlakyChat(openai.BadRequestError("prompt too long", response=httpx.Response(
        400, request=httpx.Request("POST", "http://127.0.0.1:9/v1")), body=None))
    pipeline = BenchPipeline(PIPELINES_DIR / "reader.yaml", {}, GenerationCache(tmp_path / "d.jsonl"), concurrency=1,
                             retry_waits=[0, 0], components={"llm": rejected})
    with pytest.raises(CellFailed, match="after 1 try: BadRequestError"):  # a rejected request is not retried
        pipeline.run_many([{"question": "capital of italy", "documents": []}], lambda out: out["answers"][0].data)
    assert rejected.calls == 1


@component
class TruncatingChat:
    """Answers as the OpenAI-compatible generator does when an answer stops at max_tokens: with its warning."""

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage]) -> dict:
        from haystack.components.generators.chat.openai import _check_finish_reason

        _check_finish_reason({"finish_reason": "length", "index": 0})
        return {"replies": [ChatMessage.from_assistant("Rome")]}


def test_answers_cut_at_max_tokens_are_counted_once_per_cell_not_warned_one_by_one(tmp_path, caplog):
    from haystack.components.generators.chat.openai import _check_finish_reason

    pipeline = BenchPipeline(PIPELINES_DIR / "reader.yaml", {}, GenerationCache(tmp_path / "c.jsonl"), concurrency=2,
                             components={"llm": TruncatingChat()})
    questions = [{"question": f"capital of italy {i}", "documents": []} for i in range(3)]
    with caplog.at_level("INFO"):
        assert pipeline.run_many(questions, lambda out: out["answers"][0].data, progress="toy/rag") == ["Rome"] * 3
    assert "truncated before reaching" not in caplog.text
    assert "toy/rag: 3 generations stopped at the max_tokens limit" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):  # outside the benchmark the generator's own warning is untouched
        _check_finish_reason({"finish_reason": "length", "index": 0})
    assert "truncated before reaching" in caplog.text


def test_shipped_configs_load_and_score_both_pipelines():
    from rag_mag.bench.config import load_bench_config
    from rag_mag.models import REPO_ROOT

    configs = {name: load_bench_config(REPO_ROOT / "eval" / "configs" / f"{name}.yaml")
               for name in ("quick", "cpu", "gpu")}
    assert [entry.name for entry in configs["quick"].pipeline_entries()] == ["rag", "rag_multihop"]
    assert [entry.name for entry in configs["cpu"].pipeline_entries()] == ["rag", "rag_multihop", "rag_hybrid"]
    for name in ("quick", "cpu"):
        assert "oracle" in configs[name].baselines, name
    hybrid = configs["cpu"].pipeline_entries()[2]  # every set, the same questions as rag.yaml: paired with rag rows
    assert not hybrid.datasets and configs["cpu"].answered_by(hybrid) == configs["cpu"].answered_by(None)
    multihop = configs["cpu"].pipeline_entries()[1]
    assert set(multihop.datasets) == {"hotpot_qa", "musique", "2wikimultihopqa"} and multihop.answer_questions
    assert "2wikimultihopqa" in configs["cpu"].datasets


def test_report_of_pipeline_rows_has_a_rounds_section_and_plots_recall_without_a_fixed_k(tmp_path):
    from rag_mag.bench.report.write import write_report
    from rag_mag.bench.summary import rounds_section

    rng = np.random.default_rng(1)
    union, first = rng.integers(0, 2, 30).astype(float), np.zeros(30)
    cell = {"dataset": "toy", "system": "rag_multihop:qnorm", "n_questions": 30, "rounds": 2.0,
            "budget": {"mean": 5.5, "max": 6},
            "retrieval_per_example": {"recall@budget": union.tolist(), "round1_recall@budget": first.tolist()}}
    section = rounds_section([cell, {**cell, "system": "rag:qnorm", "rounds": 1.0}], resamples=200)
    assert "| toy | rag_multihop:qnorm | 0 | 30 | 2.00 | 5.5 | 0.0 |" in section and "rag:qnorm" not in section
    assert "helps" in section
    # two seeds of one system make one row, averaged per question; a difference that is not significant
    # (here 1 question of 30 in one seed) is not called either way
    few = np.zeros(30)
    few[0] = 1.0
    seeds = [{**cell, "seed": seed, "retrieval_per_example": {"recall@budget": (few if seed else first).tolist(),
                                                             "round1_recall@budget": first.tolist()}}
             for seed in (1, 0)]
    section = rounds_section(seeds, resamples=200)
    assert section.count("rag_multihop:qnorm") == 1 and "| toy | rag_multihop:qnorm | 0, 1 | 30 |" in section
    assert "| 0.0 | 1.7 |" in section and "no clear difference" in section
    rows = [{"dataset": "toy", "system": name, "seed": 0, "n_questions": 30, "rag": {"em": 1.0, "f1": 2.0},
             "retrieval": {"recall@budget": 40.0, "round1_recall@budget": 30.0}}
            for name in ("rag_multihop:cosine", "rag_multihop:qnorm")]
    files = write_report(tmp_path, rows, environment={"command": "test"}, primary_pipeline="rag_multihop",
                         n_resamples=50, n_permutations=50)
    assert files.report_md.is_file() and "recall@budget" in files.report_md.read_text()


def test_a_failed_cell_is_recorded_and_the_next_cells_still_run(tmp_path):
    from rag_mag.bench.runner import BenchRunner
    from rag_mag.bench.summary import failures_section

    class Scorer:
        def primary_pipeline(self, dataset):
            return "rag"

        def evaluate(self, dataset, row):
            if row.system.name == "closed_book":
                raise CellFailed("reader.yaml: the generator failed on 'q' after 3 tries: APITimeoutError: timed out")
            return {"n_questions": len(dataset.records)}

    runner = BenchRunner(config(output_dir=str(tmp_path)), "test.yaml", "rag-mag bench test.yaml")
    rows = [Row(System(name, 0, None), None) for name in ("closed_book", "oracle")]
    cells, failures = runner.score_cells([(supporting_dataset(), row) for row in rows], Scorer())
    assert [cell["system"] for cell in cells] == ["oracle"]
    assert failures == [{"dataset": "toy", "system": "closed_book", "seed": 0,
                         "error": "reader.yaml: the generator failed on 'q' after 3 tries: APITimeoutError: timed out"}]
    assert (tmp_path / "cells" / "toy__oracle__s0.json").is_file()
    assert not (tmp_path / "cells" / "toy__closed_book__s0.json").exists()  # a rerun computes it again
    assert "| toy | closed_book | reader.yaml: the generator failed" in failures_section(failures)


def test_corpora_are_ranked_before_the_server_starts_and_only_for_unfinished_cells(tmp_path, checkpoint):
    from rag_mag.bench.runner import BenchRunner

    class Scorer:
        def __init__(self):
            self.ranked = []

        def primary_pipeline(self, dataset):
            return "rag"

        def ranking(self, dataset, checkpoint):
            self.ranked.append((dataset.name, checkpoint))

        def evaluate(self, dataset, row):
            return {"n_questions": len(dataset.records)}

    runner = BenchRunner(config(output_dir=str(tmp_path)), "test.yaml", "rag-mag bench test.yaml")
    other = replace(supporting_dataset(), name="other")
    dense = Row(System("qnorm", 0, checkpoint, "digest"), PipelineEntry("pipelines/rag.yaml"))
    multihop = Row(dense.system, PipelineEntry("pipelines/rag_multihop.yaml"))
    work = [(dataset, row) for dataset in (supporting_dataset(), other)
            for row in (dense, multihop, Row(System("bm25", 0, None), None))]
    scorer = Scorer()
    assert runner.rank_first(work, scorer) == 2  # one ranking per retriever and dataset, however many pipelines
    runner.score_cells([(supporting_dataset(), dense), (other, dense), (other, multihop)], scorer)
    assert runner.rank_first(work, scorer) == 1  # toy's ranking: its rag_multihop cell is still unfinished
    assert scorer.ranked[-1] == ("toy", checkpoint)
    runner.score_cells([(supporting_dataset(), multihop)], scorer)
    assert runner.rank_first(work, scorer) == 0 and len(scorer.ranked) == 3  # every dense cell done: no encoding


def test_a_retriever_gone_from_the_machine_counts_with_the_cells_it_scored_and_no_others(tmp_path, checkpoint):
    import json
    import shutil

    from rag_mag.bench.runner import BenchRunner
    from rag_mag.bench.summary import training_curves
    from rag_mag.retriever.encoder import checkpoint_digest

    class Scorer:
        def __init__(self):
            self.scored = []

        def primary_pipeline(self, dataset):
            return "rag"

        def evaluate(self, dataset, row):
            self.scored.append(dataset.name)
            return {"n_questions": len(dataset.records)}

    run = tmp_path / "run"
    shutil.copytree(checkpoint, run / "best")
    (run / "train_log.jsonl").write_text(json.dumps({"step": 2, "validation": {"ndcg@10": 0.5}}) + "\n" +
                                         json.dumps({"step": 2, "loss": 1.25, "g_query": 1.0, "g_document": 0.0}))
    settings = config(output_dir=str(tmp_path / "report"), strategies=["qnorm"], retrievers={"qnorm": [str(run)]})

    def systems() -> tuple[BenchRunner, list[System]]:
        runner = BenchRunner(settings, "test.yaml", "rag-mag bench test.yaml")
        runner.catalog.read_records()
        found = runner.catalog.given_systems("qnorm")
        runner.catalog.write_records()
        return runner, found

    runner, (system,) = systems()
    assert not system.missing and system.digest == checkpoint_digest(run)
    row = Row(system, PipelineEntry("pipelines/rag.yaml"))
    scorer = Scorer()
    runner.score_cells([(supporting_dataset(), row)], scorer)
    assert scorer.scored == ["toy"]

    shutil.rmtree(run)  # a fresh machine: the run folder is gone, the report folder (committed) is not
    runner, (gone,) = systems()
    assert gone.missing and gone.digest == system.digest
    scorer = Scorer()
    cells, failures = runner.score_cells([(supporting_dataset(), Row(gone, row.pipeline)),
                                          (answer_dataset(), Row(gone, row.pipeline))], scorer)
    assert scorer.scored == [] and [c["dataset"] for c in cells] == ["toy"]  # reused, not scored again
    assert [f["dataset"] for f in failures] == ["open"] and "not on this machine" in failures[0]["error"]
    curve = training_curves([gone], runner.catalog.records)[gone.label]
    assert curve["validation"] == [{"step": 2, "ndcg@10": 0.5}] and curve["final_loss"] == 1.25

    # retrained at the same path with other weights: a new digest, so its old cells are scored again
    shutil.copytree(checkpoint, run / "best")
    (run / "best" / "rag_mag.json").write_text((run / "best" / "rag_mag.json").read_text() + " ")
    runner, (retrained,) = systems()
    assert retrained.digest != system.digest
    scorer = Scorer()
    runner.score_cells([(supporting_dataset(), Row(retrained, row.pipeline))], scorer)
    assert scorer.scored == ["toy"]

    # a path that is missing and was never recorded is refused up front
    other = config(output_dir=str(tmp_path / "other"), strategies=["qnorm"],
                   retrievers={"qnorm": [str(tmp_path / "never")]})
    with pytest.raises(ConfigError, match="no record of it"):
        BenchRunner(other, "test.yaml", "c").catalog.given_systems("qnorm")


def test_only_scores_the_named_systems_and_skips_retrievers_not_trained_yet(tmp_path, checkpoint):
    from rag_mag.bench.runner import BenchRunner

    settings = config(output_dir=str(tmp_path / "report"), strategies=["qnorm", "dot"],
                      baselines=["bm25", "closed_book"],
                      retrievers={"qnorm": [str(checkpoint), str(tmp_path / "seed1-not-yet")],
                                  "dot": [str(tmp_path / "never")]})
    runner = BenchRunner(settings, "test.yaml", "c", only=["qnorm", "bm25"])
    found = runner.catalog.train_systems(tmp_path / "unused.jsonl") + runner.catalog.baseline_systems()
    assert [(s.name, s.seed) for s in found] == [("qnorm", 0), ("bm25", 0)]  # dot and the untrained seed left out
    with pytest.raises(ConfigError, match="--only: cosine is not a system of this config; its systems are: "
                                          "qnorm, dot, bm25, closed_book"):
        BenchRunner(settings, "test.yaml", "c", only=["cosine"])
    with pytest.raises(ConfigError, match="no record of it"):  # without --only an untrained retriever is refused
        BenchRunner(settings, "test.yaml", "c").catalog.train_systems(tmp_path / "unused.jsonl")


def test_a_user_pipeline_without_the_benchmark_parameters_is_refused_clearly(tmp_path):
    from rag_mag.bench.generation import parameter_overrides

    own = tmp_path / "my_rag.yaml"
    text = (PIPELINES_DIR / "rag.yaml").read_text()
    own.write_text(text.replace("      index: [retriever.document_store.path]\n", ""))
    with pytest.raises(ConfigError, match=r"my_rag.yaml: metadata.rag_mag.parameters has no 'index' entry; the bench"):
        parameter_overrides(own, {"index": "x", "retriever": "y"}, required=("index", "retriever"))
    with pytest.raises(ConfigError, match="set max_tokens: null in the benchmark config"):
        parameter_overrides(PIPELINES_DIR / "retrieve.yaml", {"max_tokens": 16}, required=())
    assert parameter_overrides(own, {"retriever": "y", "top_k": None}, required=()) == {"retriever": "y"}


def test_the_pipeline_flag_replaces_the_configs_pipelines(tmp_path, monkeypatch):
    import argparse

    from rag_mag.cli import bench

    parser = argparse.ArgumentParser()
    bench.add_parser(parser.add_subparsers())
    args = parser.parse_args(["bench", "eval/configs/quick.yaml", "--pipeline", "mine.yaml", "--pipeline", "b.yaml"])
    seen = {}

    class Runner:
        def __init__(self, config, path, command, only=None, pg_url=None):
            seen["entries"] = config.pipeline_entries()
            seen["pg_url"] = pg_url

        def run(self):
            return tmp_path

    monkeypatch.setattr("rag_mag.bench.runner.BenchRunner", Runner)
    assert bench.run(args) == 0
    assert [entry.path for entry in seen["entries"]] == ["mine.yaml", "b.yaml"] and seen["pg_url"] is None
    args = parser.parse_args(["bench", "eval/configs/quick.yaml", "--pg-url", "postgresql://u@db:5432/rag"])
    assert bench.run(args) == 0 and seen["pg_url"] == "postgresql://u@db:5432/rag"
