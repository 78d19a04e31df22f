"""The dataset registry and loaders: unified JSONL, NAME=PATH, hub formats on local files, errors."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from rag_mag.bench.dataset_specs import DatasetSpec, load_registry, parse_dataset_arg, spec_from_mapping, with_corpus
from rag_mag.bench.datasets import data_root, load_eval_dataset
from rag_mag.data import EvalRecord, Passage
from rag_mag.errors import ConfigError, DataError

REQUIRED = ("trivia_qa", "nq_open", "hotpot_qa", "musique", "2wikimultihopqa")


def _write(path: Path, rows, blank_after: int | None = None) -> Path:
    lines = []
    for index, row in enumerate(rows):
        lines.append(row if isinstance(row, str) else json.dumps(row))
        if blank_after == index:
            lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _unified(tmp_path: Path) -> tuple[Path, Path]:
    eval_rows = [
        {"id": "q1", "question": "Where is the Eiffel Tower?", "answers": ["Paris"],
         "contexts": [{"id": "p1", "title": "Eiffel Tower", "text": "It stands in Paris.", "is_supporting": True},
                      {"id": "p2", "title": "Louvre", "text": "A museum.", "is_supporting": False}]},
        {"id": "q2", "question": "Who wrote Hamlet?", "answers": ["Shakespeare", "William Shakespeare"],
         "contexts": [{"id": "p3", "title": "Hamlet", "text": "A play by Shakespeare.", "has_answer": True}]},
    ]
    corpus_rows = [{"id": f"p{i}", "title": title, "text": text} for i, (title, text) in enumerate([
        ("Eiffel Tower", "It stands in Paris."), ("Louvre", "A museum."), ("Hamlet", "A play by Shakespeare."),
        ("Macbeth", "Another play."), ("William Shakespeare", "An English playwright.")], start=1)]
    return _write(tmp_path / "eval.jsonl", eval_rows), _write(tmp_path / "corpus.jsonl", corpus_rows)


def test_registry_names_every_required_dataset_with_local_and_hub_sources():
    registry = load_registry()
    for name in REQUIRED:
        spec = registry[name]
        assert spec.local is not None and spec.local.eval.endswith(".jsonl")
        assert spec.hub is not None and spec.hub.path and spec.hub.split
    assert registry["2wikimultihopqa"].local.fields.contexts is None  # answers only


def test_registry_rejects_unknown_keys_and_values(tmp_path):
    with pytest.raises(ConfigError, match="unknown key.*evall"):
        spec_from_mapping("x", {"local": {"evall": "a.jsonl"}})
    with pytest.raises(ConfigError, match="relevance 'gold'"):
        spec_from_mapping("x", {"relevance": "gold", "local": {"eval": "a.jsonl"}})
    with pytest.raises(ConfigError, match="give a 'local' or a 'hub'"):
        spec_from_mapping("x", {"description": "nothing"})
    bad = tmp_path / "registry.yaml"
    bad.write_text("x: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_registry(bad)


def test_unified_files_load_as_typed_records(tmp_path):
    eval_path, corpus_path = _unified(tmp_path)
    dataset = load_eval_dataset(parse_dataset_arg(f"toy={eval_path},{corpus_path}"), cache_dir=tmp_path / "cache")
    assert dataset.name == "toy" and len(dataset) == 2 and len(dataset.corpus) == 5
    first, second = dataset.records
    assert isinstance(first, EvalRecord) and isinstance(dataset.corpus[0], Passage)
    assert first.supporting_ids == ("p1",) and second.answers == ("Shakespeare", "William Shakespeare")
    assert dataset.mode_of(first) == "supporting" and dataset.mode_of(second) == "answer"
    # answer mode: aliases are matched in title + text; p5's title holds "William Shakespeare"
    assert dataset.known_answer_ids(second) == ("p3",)
    judgement = dataset.judge(second, ["p4", "p5", "p3"])
    assert judgement.relevant == (False, True, True) and judgement.n_relevant == 2
    assert dataset.judge(first, ["p2", "p1"]).relevant == (False, True)
    assert dataset.relevant_passage_mask().tolist() == [True, False, True, False, False]
    with pytest.raises(ValueError, match="not in the corpus"):
        dataset.judge(second, ["elsewhere"])
    assert len(dataset.judge_all([["p1"], ["p3"]])) == 2


def test_limit_and_corpus_from_contexts(tmp_path):
    eval_path, _ = _unified(tmp_path)
    dataset = load_eval_dataset(parse_dataset_arg(f"toy={eval_path}"), limit=1, cache_dir=tmp_path / "cache")
    assert [record.id for record in dataset.records] == ["q1"]
    assert [passage.id for passage in dataset.corpus] == ["p1", "p2"]
    assert "corpus from its contexts" in dataset.source


def test_answer_only_eval_needs_a_corpus(tmp_path):
    eval_path = _write(tmp_path / "qa.jsonl", [{"idx": 7, "question": "Capital of France?", "answer": "Paris"}])
    with pytest.raises(DataError, match="no corpus file"):
        load_eval_dataset(parse_dataset_arg(f"qa={eval_path}"), cache_dir=tmp_path / "cache")
    corpus_path = _write(tmp_path / "c.jsonl", [{"id": "a", "title": "France", "text": "Its capital is Paris."},
                                                {"id": "b", "title": "Spain", "text": "Madrid."}])
    spec = DatasetSpec(name="qa", local=replace(parse_dataset_arg(f"qa={eval_path},{corpus_path}").local,
                                                fields=load_registry()["2wikimultihopqa"].local.fields))
    dataset = load_eval_dataset(spec, cache_dir=tmp_path / "cache")
    record = dataset.records[0]
    assert record.id == "7" and record.answers == ("Paris",) and record.contexts == ()
    assert dataset.mode_of(record) == "answer"
    assert dataset.judge(record, ["b", "a"]).relevant == (False, True)


@pytest.mark.parametrize("bad_line, message", [
    ('{"id": "q3", "question": "broken", ', "not valid JSON"),
    ('{"id": "q3", "answers": ["x"]}', "missing or empty question"),
    ('{"id": "q3", "question": "no answer", "answers": []}', "no gold answer"),
    ('{"id": "q1", "question": "again", "answers": ["x"]}', "duplicate question id"),
])
def test_malformed_records_are_reported_with_file_and_line(tmp_path, bad_line, message):
    good = [{"id": "q1", "question": "a?", "answers": ["a"]}, {"id": "q2", "question": "b?", "answers": ["b"]}]
    # a blank line after the first record: the bad record sits on line 4 of the file
    path = _write(tmp_path / "bad.jsonl", [*good, bad_line], blank_after=0)
    corpus = _write(tmp_path / "c.jsonl", [{"id": "p", "title": "", "text": "x"}])
    with pytest.raises(DataError, match=rf"bad\.jsonl:4: .*{message}"):
        load_eval_dataset(parse_dataset_arg(f"bad={path},{corpus}"), cache_dir=tmp_path / "cache")


def test_duplicate_corpus_ids_are_reported_with_line(tmp_path):
    eval_path, _ = _unified(tmp_path)
    corpus = _write(tmp_path / "dup.jsonl", [{"id": "p1", "title": "", "text": "x"},
                                             {"id": "p1", "title": "", "text": "y"}])
    with pytest.raises(DataError, match=r"dup\.jsonl:2: duplicate passage id 'p1'"):
        load_eval_dataset(parse_dataset_arg(f"toy={eval_path},{corpus}"), cache_dir=tmp_path / "cache")


def test_data_root_is_configurable(tmp_path, monkeypatch):
    (tmp_path / "musique").mkdir()
    eval_path, corpus_path = _unified(tmp_path / "musique")
    eval_path.rename(tmp_path / "musique" / "musique_train100_closed_eval.jsonl")
    corpus_path.rename(tmp_path / "musique" / "musique_train100_corpus.jsonl")
    monkeypatch.setenv("RAG_MAG_DATA_ROOT", str(tmp_path))
    assert data_root() == tmp_path.resolve()
    dataset = load_eval_dataset("musique", cache_dir=tmp_path / "cache")
    assert len(dataset) == 2 and str(tmp_path) in dataset.source
    with pytest.raises(DataError, match="not found .*RAG_MAG_DATA_ROOT"):
        load_eval_dataset("hotpot_qa", source="local", cache_dir=tmp_path / "cache")


def test_unknown_names_and_bad_arguments():
    with pytest.raises(ConfigError, match="registered datasets are: .*trivia_qa"):
        parse_dataset_arg("squad")
    with pytest.raises(ConfigError, match="NAME=EVAL.jsonl"):
        parse_dataset_arg("x=a.jsonl,b.jsonl,c.jsonl")
    with pytest.raises(ConfigError, match="valid sources"):
        load_eval_dataset("sample", source="web")


def test_bundled_sample_mixes_supporting_and_answer_questions(tmp_path):
    dataset = load_eval_dataset("sample", cache_dir=tmp_path / "cache")
    modes = {dataset.mode_of(record) for record in dataset.records}
    assert len(dataset) == 45 and len(dataset.corpus) == 455 and modes == {"supporting", "answer"}
    pooled = load_eval_dataset(with_corpus(load_registry()["sample"], "data/sample/corpus.jsonl"), limit=3,
                               cache_dir=tmp_path / "cache")
    assert len(pooled) == 3 and len(pooled.corpus) == 455


# ------------------------------------------------------------------------------ hub formats, local files
def _hub_folder(tmp_path: Path, name: str, rows) -> str:
    folder = tmp_path / name
    folder.mkdir()
    _write(folder / "validation.jsonl", rows)
    return str(folder)


def _hub_spec(name: str, folder: str) -> DatasetSpec:
    spec = load_registry()[name]
    return replace(spec, hub=replace(spec.hub, path=folder, name=None))


def test_hub_hotpot_format(tmp_path):
    row = {"id": "h1", "question": "Which band?", "answer": "Queen", "type": "bridge", "level": "hard",
           "supporting_facts": {"title": ["Queen (band)", "Freddie"], "sent_id": [0, 1]},
           "context": {"title": ["Queen (band)", "Other", "Freddie"],
                       "sentences": [["Queen are a band.", " They formed in 1970."], ["Noise."], ["Freddie sang."]]}}
    dataset = load_eval_dataset(_hub_spec("hotpot_qa", _hub_folder(tmp_path, "hotpot", [row])), source="hub",
                                cache_dir=tmp_path / "cache")
    record = dataset.records[0]
    assert record.answers == ("Queen",)
    assert [c.text for c in record.contexts][0] == "Queen are a band. They formed in 1970."  # joiner ""
    assert [c.is_supporting for c in record.contexts] == [True, False, True]
    assert len(dataset.corpus) == 3 and all(p.id.startswith("hotpot_qa_") for p in dataset.corpus)
    assert "hub" in dataset.source and "corpus from its contexts" in dataset.source


def test_hub_2wiki_original_pair_format(tmp_path):
    row = {"_id": "w1", "question": "Who is older?", "answer": "Alice",
           "context": [["Alice", ["Alice was born in 1900.", "She sang."]], ["Bob", ["Bob was born in 1910."]]],
           "supporting_facts": [["Alice", 0], ["Bob", 0]]}
    spec = _hub_spec("2wikimultihopqa", _hub_folder(tmp_path, "twowiki", [row]))
    dataset = load_eval_dataset(spec, source="hub", cache_dir=tmp_path / "cache")
    record = dataset.records[0]
    assert record.id == "w1" and record.contexts[0].text == "Alice was born in 1900. She sang."
    assert record.supporting_ids == tuple(c.id for c in record.contexts)


def test_hub_musique_and_trivia_formats(tmp_path):
    musique = {"id": "m1", "question": "Q?", "answer": "Stanley Hall", "answer_aliases": ["G. Stanley Hall"],
               "answerable": True,
               "paragraphs": [
                   {"idx": 0, "title": "T", "paragraph_text": "G. Stanley Hall led it.", "is_supporting": True},
                   {"idx": 1, "title": "U", "paragraph_text": "Unrelated.", "is_supporting": False}]}
    dataset = load_eval_dataset(_hub_spec("musique", _hub_folder(tmp_path, "musique", [musique])), source="hub",
                                cache_dir=tmp_path / "cache")
    assert dataset.records[0].answers == ("Stanley Hall", "G. Stanley Hall")
    assert dataset.records[0].supporting_ids == (dataset.corpus[0].id,)
    trivia = {"question_id": "tc_1", "question": "Which city?", "question_source": "x",
              "answer": {"value": "Paris", "aliases": ["Paris", "City of Light"], "normalized_value": "paris"}}
    spec = _hub_spec("trivia_qa", _hub_folder(tmp_path, "trivia", [trivia]))
    corpus = _write(tmp_path / "tc.jsonl", [{"id": "a", "title": "Paris", "text": "City of Light."}])
    dataset = load_eval_dataset(spec, source="hub", corpus=corpus, cache_dir=tmp_path / "cache")
    assert dataset.records[0].id == "tc_1" and dataset.records[0].answers == ("Paris", "City of Light")
    assert dataset.judge(dataset.records[0], ["a"]).relevant == (True,)


def test_unreachable_hub_is_a_clear_error(tmp_path):
    spec = _hub_spec("nq_open", str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match="from the hub.*source='local'"):
        load_eval_dataset(spec, source="hub", cache_dir=tmp_path / "cache")


@pytest.mark.skipif(data_root() is None or not (data_root() / "hotpotqa").is_dir(),
                    reason="shared data not present")
def test_shared_hotpot_qa_loads(tmp_path):
    dataset = load_eval_dataset("hotpot_qa", limit=50, cache_dir=tmp_path / "cache")
    assert len(dataset) == 50 and len(dataset.corpus) == 4858
    assert all(len(record.supporting_ids) == 2 for record in dataset.records)
