"""Mining: positives contain an answer, hard negatives rank high and contain none, no eval overlap."""

import json

from rag_mag.cli.main import main
from rag_mag.data import EvalRecord, Passage, QAPair, write_jsonl
from rag_mag.retriever.data.mining import evaluation_keys, mine_triples

CORPUS = [
    Passage("p1", "Paris", "Paris is the capital and largest city of France."),
    Passage("p2", "France", "France is a country in Western Europe; its capital city is famous."),
    Passage("p3", "Berlin", "Berlin is the capital of Germany."),
    Passage("p4", "Rhine", "The Rhine is a river in Germany and the Netherlands."),
    Passage("p5", "Lyon", "Lyon is a city in France, not the capital."),
]


def test_positives_contain_the_answer_and_negatives_do_not():
    pairs = [QAPair("a", "What is the capital city of France?", ("Paris",))]
    triples, stats = mine_triples(pairs, CORPUS, top_k=5, max_positives=1, hard_negatives=2, show_progress=False)
    assert stats.written == 1
    triple = triples[0]
    assert [p["id"] for p in triple["positives"]] == ["p1"]
    negative_ids = [p["id"] for p in triple["hard_negatives"]]
    assert len(negative_ids) == 2 and "p1" not in negative_ids
    assert set(negative_ids) <= {"p2", "p5", "p3"}  # lexically close passages, not the river


def test_questions_without_an_answer_passage_are_dropped():
    pairs = [QAPair("b", "Who painted the Mona Lisa?", ("Leonardo da Vinci",))]
    triples, stats = mine_triples(pairs, CORPUS, show_progress=False)
    assert triples == [] and stats.without_positive == 1


def test_evaluation_questions_are_excluded_by_id_and_by_text():
    evaluation = [EvalRecord("e1", "What is the capital of Germany?", ("Berlin",)),
                  EvalRecord("shared-id", "Something else entirely?", ("x",))]
    ids, texts = evaluation_keys(evaluation)
    pairs = [QAPair("t1", "what is the capital of germany", ("Berlin",)),  # same text, other case/punctuation
             QAPair("shared-id", "Which river flows through Germany?", ("Rhine",)),
             QAPair("t3", "Which city is the capital of France?", ("Paris",))]
    triples, stats = mine_triples(pairs, CORPUS, ids, texts, show_progress=False)
    assert stats.excluded_by_text == 1 and stats.excluded_by_id == 1
    assert [t["id"] for t in triples] == ["t3"]


def test_mine_cli_writes_triples(tmp_path, capsys):
    write_jsonl(tmp_path / "corpus.jsonl", [{"id": p.id, "title": p.title, "text": p.text} for p in CORPUS])
    write_jsonl(tmp_path / "pairs.jsonl", [{"question": "What is the capital city of France?", "answer": "Paris"}])
    write_jsonl(tmp_path / "eval.jsonl", [{"id": "x", "question": "What is the capital of Germany?",
                                           "answers": ["Berlin"]}])
    code = main(["mine", "--pairs", str(tmp_path / "pairs.jsonl"), "--corpus", str(tmp_path / "corpus.jsonl"),
                 "--exclude", str(tmp_path / "eval.jsonl"), "--out", str(tmp_path / "triples.jsonl")])
    assert code == 0
    rows = [json.loads(line) for line in (tmp_path / "triples.jsonl").read_text().splitlines()]
    assert rows[0]["positives"][0]["id"] == "p1"
    assert json.loads(capsys.readouterr().out)["written"] == 1
