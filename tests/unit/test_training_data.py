"""build-data: gold pairs, trusted mined pairs, answer-free negatives, and no evaluation question ever trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag_mag.data import Passage
from rag_mag.errors import ConfigError
from rag_mag.metrics.answers import contains_answer
from rag_mag.retriever.data.build import AnswerFrequency, answer_problem, build_training_data
from rag_mag.retriever.data.linked_positives import linked_positives
from rag_mag.retriever.data.spec import DataSpec, SourceSpec, load_data_spec


def write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def passage(pid: str, text: str, title: str = "T") -> dict:
    return {"id": pid, "title": title, "text": text}


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, str]:
    corpus = [passage(f"c{i}", f"filler passage number {i} about rivers and mountains") for i in range(30)]
    corpus += [passage("paris", "Paris is the capital of France on the Seine"),
               passage("nile", "The Nile is the longest river of Africa"),
               passage("everest", "Mount Everest is the highest mountain above sea level")]
    triples = [{"id": "t1", "query": "Which river flows through Paris?", "answers": ["Seine"],
                "positives": [passage("p1", "The Seine flows through Paris")],
                "hard_negatives": [passage("n1", "The Seine is long"),          # holds the answer: dropped
                                   passage("n2", "The Loire is a river")]},
               {"id": "t2", "query": "What is the capital of Spain?", "answers": ["Madrid"],
                "positives": [passage("p2", "Madrid is the capital of Spain")], "hard_negatives": []}]
    gold = [{"id": f"g{i}", "question": f"Gold question number {i}?", "answers": [f"gold{i}"],
             "contexts": [{**passage(f"gp{i}", f"gold{i} is here"), "is_supporting": True},
                          {**passage(f"gn{i}", "distractor"), "is_supporting": False}]} for i in range(6)]
    gold.append({"id": "leak", "question": "  What is the CAPITAL of Spain ", "answers": ["Madrid"],
                 "contexts": [{**passage("gx", "Madrid"), "is_supporting": True}]})
    pairs = [{"id": "m1", "question": "Which is the longest river of Africa?", "answers": ["Nile"]},
             {"id": "m2", "question": "Is Paris the capital of France?", "answers": ["yes"]},
             {"id": "m3", "question": "What passage is about rivers and mountains?", "answers": ["rivers"]},
             {"id": "m4", "question": "How many filler passages?", "answers": ["42"]},
             {"id": "m5", "question": "Which mountain is the highest above sea level?", "answers": ["Everest"]}]
    evaluation = [{"id": "e1", "question": "what is the capital of spain?", "answers": ["Madrid"]},
                  {"id": "e2", "question": "Which mountain is the highest above sea level?", "answers": ["x"]}]
    return {"corpus": write(tmp_path / "corpus.jsonl", corpus), "triples": write(tmp_path / "t.jsonl", triples),
            "gold": write(tmp_path / "gold.jsonl", gold), "pairs": write(tmp_path / "pairs.jsonl", pairs),
            "eval": write(tmp_path / "eval.jsonl", evaluation), "out": str(tmp_path / "out")}


def spec(files: dict[str, str], **overrides) -> DataSpec:
    values = dict(out=files["out"], exclude=[files["eval"]], negatives_corpus=files["corpus"], hard_negatives=2,
                  negative_top_k=10, positive_top_k=5, max_answer_passages=5, val_queries=2, sources=[
                      SourceSpec(name="hot", kind="triples", path=files["triples"]),
                      SourceSpec(name="nq", kind="gold", path=files["gold"]),
                      SourceSpec(name="mined", kind="mined", path=files["pairs"], corpus=files["corpus"])])
    values.update(overrides)
    return DataSpec(**values)


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def test_build_keeps_trusted_pairs_and_excludes_every_evaluation_question(files):
    stats = build_training_data(spec(files))
    out = Path(files["out"])
    train, val = read(out / "train.jsonl"), read(out / "val.jsonl")
    everything = train + val
    queries = {row["query"] for row in everything}
    # normalized-text exclusion: the triple, the leaked gold question and the mined question all go
    assert "What is the capital of Spain?" not in queries and "  What is the CAPITAL of Spain " not in queries
    assert "Which mountain is the highest above sea level?" not in queries
    assert stats["sources"]["hot"]["excluded_eval_overlap"] == 1
    assert stats["sources"]["nq"]["excluded_eval_overlap"] == 1
    # mined: only the specific answer with an answer-bearing BM25 passage survives
    mined = [row for row in everything if row["source"] == "mined"]
    assert [row["id"] for row in mined] == ["m1"] and mined[0]["positives"][0]["id"] == "nile"
    dropped = stats["sources"]["mined"]["dropped"]
    assert dropped["yes/no or generic"] == 1 and dropped["bare small number"] == 1
    assert dropped["answer in more than 5 passages"] == 1
    # hard negatives never hold an answer, and are topped up to hard_negatives
    for row in everything:
        for negative in row["hard_negatives"]:
            text = f"{negative['title']} {negative['text']}".lower()
            assert not any(answer.lower() in text for answer in row["answers"]), (row["id"], negative)
    triple = next(row for row in everything if row["id"] == "t1")
    assert "n1" not in {n["id"] for n in triple["hard_negatives"]} and len(triple["hard_negatives"]) == 2
    assert stats["sources"]["hot"]["negatives_with_answer_dropped"] == 1
    # validation: gold sources only, disjoint from training
    assert len(val) == 2 and all(row["source"] != "mined" for row in val)
    assert not {row["query"] for row in val} & {row["query"] for row in train}
    assert stats["train"] == len(train)


def test_ablation_only_sources_never_reach_the_training_file(files):
    unfiltered = SourceSpec(name="loose", kind="mined", path=files["pairs"], corpus=files["corpus"], filters=False,
                            ablation_only=True)
    base = spec(files)
    stats = build_training_data(spec(files, sources=[*base.sources, unfiltered]))
    out = Path(files["out"])
    assert all(row["source"] != "loose" for row in read(out / "train.jsonl") + read(out / "val.jsonl"))
    ablation = read(out / "ablation.jsonl")
    assert ablation and {row["source"] for row in ablation} == {"loose"} and stats["ablation"] == len(ablation)
    # unfiltered mining keeps the yes/no and generic answers the filters drop (the noise the ablation measures)
    assert {"m2", "m3"} & {row["id"] for row in ablation}
    assert not {"m2", "m3"} & {row["id"] for row in read(out / "train.jsonl")}


@pytest.mark.parametrize("miner", ["mixed", "dense"])
def test_dense_negatives_replace_lexical_ones_in_training_rows_only(files, tmp_path: Path, miner: str):
    from tests.tiny import tiny_encoder

    # A corpus small enough that the dense miner ranks all of it: every eligible passage is taken, so a rule
    # that let through a positive's title ("T") or an answer would show.
    corpus = [passage(f"c{i}", f"the river {i} of the city of rome in italy", title=f"C{i}") for i in range(3)]
    corpus.append(passage("same_title", "the capital city of the river", title="T"))
    corpus.append(passage("answer", "Madrid and the Seine and gold1 gold2 gold3 gold4 gold5", title="A"))
    files["corpus"] = write(tmp_path / "titled.jsonl", corpus)
    model = tmp_path / "model"
    tiny_encoder(tmp_path / "tiny").save(model)
    build_training_data(spec(files, hard_negatives=4, negative_top_k=50))
    out = Path(files["out"])
    lexical_train, lexical_val = read(out / "train.jsonl"), read(out / "val.jsonl")
    stats = build_training_data(spec(files, hard_negatives=4, negative_top_k=50, negative_miner=miner,
                                     dense_model=str(model), out=str(tmp_path / miner)))
    train, val = read(tmp_path / miner / "train.jsonl"), read(tmp_path / miner / "val.jsonl")
    assert val == lexical_val                       # validation keeps its lexical negatives
    assert [row["id"] for row in train] == [row["id"] for row in lexical_train]
    assert any("T" in {p["title"] for p in row["positives"]} for row in train)  # the title rule is exercised
    keep = 2 if miner == "mixed" else 0
    dense_total = 0
    for row, lexical in zip(train, lexical_train, strict=True):
        kept = lexical["hard_negatives"][:keep]
        assert row["hard_negatives"][:len(kept)] == kept
        dense = row["hard_negatives"][len(kept):]
        titles = {positive["title"] for positive in row["positives"]}
        eligible = [c for c in corpus if c["title"] not in titles and c["id"] not in {n["id"] for n in kept}
                    and not contains_answer(c["text"], row["answers"])]
        assert {n["id"] for n in dense} <= {c["id"] for c in eligible}
        assert len(dense) == min(4 - len(kept), len(eligible))
        dense_total += len(dense)
    assert dense_total and sum(s["dense_negatives"] for s in stats["sources"].values()) == dense_total


@pytest.mark.parametrize(("precision", "bf16"), [("fp32", False), ("bf16", True)])
def test_the_dense_miner_encodes_in_the_specs_precision(files, monkeypatch, precision: str, bf16: bool):
    from rag_mag.retriever.data import negative_miners

    seen = []

    class Recording:
        def __init__(self, corpus_path: str, model: str, bf16: bool = False) -> None:
            seen.append(bf16)

        def ranked(self, questions, k):
            return [[] for _ in questions]

    monkeypatch.setattr(negative_miners, "DenseNegativeMiner", Recording)
    build_training_data(spec(files, negative_miner="dense", precision=precision))
    assert seen == [bf16]


def test_linked_positives_keep_what_the_question_names_in_training_rows_only(files, tmp_path: Path):
    bridge = [passage("k1", "Kiss and Tell is a 1945 comedy film", title="Kiss and Tell (1945 film)"),
              passage("k2", "Shirley Temple was an American actress and diplomat", title="Shirley Temple")]
    both = [passage("b1", "Dune is a novel", title="Dune"), passage("b2", "Emma is a novel", title="Emma")]
    assert linked_positives("Who starred in Kiss and Tell?", bridge) == bridge[:1]     # "(1945 film)" ignored
    assert linked_positives("Is Dune older than Emma?", both) == both                 # comparison: both named
    assert linked_positives("Which novel came first?", both) == both                  # none named: all kept
    assert linked_positives("Was Emmanuel in Dune?", both) == both[:1]                # whole words only
    rows = [{"id": f"h{i}", "query": f"Who starred in Kiss and Tell, question {i}?", "answers": ["Temple"],
             "positives": bridge, "hard_negatives": []} for i in range(6)]
    files["triples"] = write(tmp_path / "bridge.jsonl", rows)
    base = spec(files, sources=[SourceSpec(name="hot", kind="triples", path=files["triples"])], val_queries=2)
    build_training_data(base)
    all_train, all_val = read(Path(files["out"]) / "train.jsonl"), read(Path(files["out"]) / "val.jsonl")
    stats = build_training_data(spec(files, sources=base.sources, val_queries=2, positives="linked",
                                     out=str(tmp_path / "linked")))
    train, val = read(tmp_path / "linked" / "train.jsonl"), read(tmp_path / "linked" / "val.jsonl")
    assert val == all_val and all(len(row["positives"]) == 2 for row in val)          # validation keeps both
    assert len(train) == len(all_train) == 4
    assert all([p["id"] for p in row["positives"]] == ["k1"] for row in train)
    assert stats["sources"]["hot"]["unlinked_positives_dropped"] == 4


def test_answer_problems_and_frequency():
    assert answer_problem(["Yes"], 2) == "yes/no or generic"
    assert answer_problem(["a"], 2) == "too short"
    assert answer_problem(["42"], 2) == "bare small number"
    assert answer_problem(["1969"], 2) == "" and answer_problem(["yes", "Nile"], 2) == ""
    frequency = AnswerFrequency([Passage(id="1", title="", text="New York City"),
                                 Passage(id="2", title="", text="York minster"),
                                 Passage(id="3", title="", text="Yorkshire")])
    assert frequency.passages_with("York") == 2 and frequency.passages_with("New York") == 1
    assert frequency.passages_with("") == 0


def test_bad_specs_get_one_clear_error(files, tmp_path: Path):
    with pytest.raises(ConfigError, match="unknown kind 'web'"):
        SourceSpec(name="x", kind="web", path="p")
    with pytest.raises(ConfigError, match="needs a corpus"):
        SourceSpec(name="x", kind="mined", path="p")
    with pytest.raises(ConfigError, match="unique"):
        spec(files, sources=[SourceSpec(name="a", kind="triples", path="p")] * 2)
    with pytest.raises(ConfigError, match="negative_miner must be one of bm25, dense, mixed"):
        spec(files, negative_miner="random")
    with pytest.raises(ConfigError, match="positives must be one of all, linked"):
        spec(files, positives="gold")
    with pytest.raises(ConfigError, match="needs a negatives_corpus"):
        spec(files, negative_miner="dense", negatives_corpus="")
    with pytest.raises(ConfigError, match="unknown precision 'half'"):
        spec(files, precision="half")
    with pytest.raises(ConfigError, match="does not exist"):
        load_data_spec(tmp_path / "missing.yaml", None)
    bad = tmp_path / "bad.yaml"
    bad.write_text("out: x\nsources: [{name: a, kind: triples, path: p, colour: red}]\n")
    with pytest.raises(ConfigError, match="invalid data spec"):
        load_data_spec(bad, None)


def test_the_shipped_spec_loads_and_excludes_the_four_evaluation_sets(tmp_path: Path):
    from rag_mag.models import REPO_ROOT

    loaded = load_data_spec(REPO_ROOT / "eval" / "configs" / "train_data.yaml", tmp_path)
    excluded = " ".join(loaded.exclude)
    for name in ("triviaqa_test1000", "nq_test1000", "hotpotqa_dev500", "musique_train100"):
        assert name in excluded
    assert [s.name for s in loaded.sources if not s.ablation_only] == ["hotpotqa_gold", "nq_oracle_gold", "mined"]
