"""The abstention benchmark's questions: each with the passages the reader is shown and whether they answer it.

Three kinds of set, SQuAD 2.0's convention (questions that have an answer against questions that have none):

* **Wikipedia sets** (TriviaQA, NQ-open, HotpotQA): the questions a committed benchmark report answered, with the
  very passages each retrieval system gave the reader there (a cell's ``top_ids``), so that EM is paired with
  that report's; and the same questions again with another question's passages (the next question whose
  passages hold no alias of the answer): a question the documents do not answer.
* **ClapNQ** (dev split, never trained on): 300 real questions whose on-topic Wikipedia passage answers them and
  300 whose passage does not.
* **Real documents**: the questions of the real-documents benchmark's collections, with the chunks each system
  ranked first (its committed cells), the unanswerable ones among them included.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rag_mag.errors import ConfigError, DataError
from rag_mag.metrics.answers import contains_answer

RAG_TOP_K = 3  # the passages a benchmark row gives the reader (eval/configs/cpu.yaml and realdocs.yaml: 3)


@dataclass(frozen=True)
class Item:
    set: str                                  # trivia_qa, clapnq, stici, ...
    system: str                               # the retrieval system whose passages are shown ("" for ClapNQ)
    id: str
    question: str
    answers: tuple[str, ...]                  # empty when the question has no answer
    passages: tuple[tuple[str, str], ...]     # (title, text), in the order shown
    answerable: bool                          # the question has an answer (somewhere)
    held: bool                                # an answer occurs in the passages shown
    short: bool = True                        # a short reference answer (EM and F1 apply)
    today: float | None = None                # the committed report's EM on this question (Wikipedia sets)


def _holds(passages, answers) -> bool:
    return bool(answers) and any(contains_answer(text, answers) or contains_answer(title, answers)
                                 for title, text in passages)


def wiki_items(report_dir: Path, dataset: str, system: str, data_root: Path | None) -> list[Item]:
    """A committed report's row ``rag:SYSTEM`` on ``dataset``: its questions with their own passages, then each
    with the passages of the next question that hold none of its answers."""
    from rag_mag.bench.datasets import load_eval_dataset

    path = Path(report_dir) / "cells" / f"{dataset}__rag__{system}__s0.json"
    if not path.is_file():
        raise ConfigError(f"no cell {path}: the abstention benchmark answers again the passages of a committed "
                          f"report's rag:{system} row on {dataset}; run that benchmark or drop them from the config")
    cell = json.loads(path.read_text())
    top_ids, em_today = cell["top_ids"], cell["rag_per_example"]["em"]
    loaded = load_eval_dataset(dataset, data_root, source="local", limit=len(top_ids))
    corpus = {passage.id: passage for passage in loaded.corpus}
    if len(loaded.records) != len(top_ids):
        raise DataError(f"{path} answered {len(top_ids)} questions, but {dataset} has {len(loaded.records)}")
    shown = [tuple((corpus[i].title, corpus[i].text) for i in ids[:RAG_TOP_K]) for ids in top_ids]
    items = []
    for number, record in enumerate(loaded.records):
        answers = tuple(record.answers)
        items.append(Item(dataset, system, record.id, record.question, answers, shown[number], True,
                          _holds(shown[number], answers), today=float(em_today[number])))
    for number, record in enumerate(loaded.records):
        answers = tuple(record.answers)
        for step in range(1, len(shown)):
            other = shown[(number + step) % len(shown)]
            if not _holds(other, answers):
                items.append(Item(dataset, system, f"{record.id}#other", record.question, answers, other, False,
                                  False))
                break
    return items


def clapnq_items(folder: Path) -> list[Item]:
    """ClapNQ's dev questions with their one passage: 300 it answers, 300 it does not."""
    items = []
    for kind in ("answerable", "unanswerable"):
        path = Path(folder) / f"clapnq_dev_{kind}.jsonl"
        if not path.is_file():
            raise DataError(f"{path} does not exist; ClapNQ's dev files are in the shared data (data/clapnq/)")
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            answers = tuple(o["answer"] for o in record["output"] if o.get("answer"))
            passages = tuple((p["title"], p["text"]) for p in record["passages"])
            items.append(Item("clapnq", "", record["id"], record["input"], answers, passages, kind == "answerable",
                              kind == "answerable", short=False))
    return items


def realdocs_items(report_dir: Path, collection, questions, system: str) -> list[Item]:
    """A real-documents collection's questions with the chunks ``system`` ranked first in a committed report."""
    path = Path(report_dir) / "cells" / f"{collection}__{system}.json"
    if not path.is_file():
        raise ConfigError(f"no cell {path}: run the real-documents benchmark (rag-mag bench "
                          "eval/configs/realdocs.yaml --split test) or drop the collection from the config")
    passages = json.loads(path.read_text())["passages"]
    items = []
    for question in questions:
        if question.id not in passages:
            continue
        shown = tuple(("", text) for text in passages[question.id][:RAG_TOP_K])
        answers = tuple(question.answers)
        items.append(Item(collection, system, question.id, question.question, answers, shown, question.answerable,
                          question.answerable and _holds(shown, answers), short=question.answer_type == "short"))
    return items
