"""Abstention signals besides the reader's reply (issue 61), each chosen on validation data and measured on the
abstention benchmark's sets (rag_mag/bench/abstention/sets.py):

* ``p_abstain``: the reader's probability that its reply starts as its abstention ("unanswerable"), from the
  log-probabilities vLLM returns for the first token. Its threshold is chosen on the reader's own validation examples
  (held-out training-side questions, answerable and not: ``OUT/data/val.jsonl`` of `rag-mag train-reader`) as the
  lowest one whose false abstentions there stay at most 5%; the greedy reply is the threshold ~0.5.
* ``retrieval score``: the best passage's score under a retriever (the product's ``min_score``). Scores differ by
  strategy and corpus, so it is calibrated per strategy and collection on the real documents' validation split
  (the same 5% rule) and measured on their test split; on ClapNQ it is reported as AUROC only (no validation
  split of that corpus exists). On the Wikipedia sets (qnorm, the corpus default) the floor is chosen on the
  reader's validation examples (the same 5% rule; their passages come from the training-side corpus) and applied
  to the abstention benchmark's questions, with the EM the cpu report's answers keep under it.

Every signal is also reported as AUROC (the probability that a question without an answer scores as less answerable
than one with an answer), which needs no threshold.

    .venv/bin/python eval/abstention_signals.py --reader-val artifacts/reader/abstain/data/val.jsonl \
        --out eval/reports/abstention/signals.json [--retrieval-only]

``--retrieval-only`` measures the retrieval floor alone (no vLLM) and keeps the reader's figures already in --out.

Needs the vLLM server of the reader (`rag-mag serve-llm`; started here if none runs, stopped after).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MAX_FALSE_ABSTAIN = 0.05
TOP_LOGPROBS = 20


def p_abstain(client, model: str, question: str, passages, chars: int = 700) -> float:
    """The reader's probability that its first token begins its abstention reply."""
    from rag_mag.components.answer_prompt import answer_messages
    from rag_mag.metrics.answers import NO_ANSWER_REPLY

    response = client.chat.completions.create(model=model, messages=answer_messages(question, passages, chars),
                                              max_tokens=1, temperature=0.0, logprobs=True,
                                              top_logprobs=TOP_LOGPROBS)
    first = response.choices[0].logprobs.content[0]
    return float(sum(math.exp(t.logprob) for t in first.top_logprobs
                     if t.token.strip() and NO_ANSWER_REPLY.startswith(t.token.strip())))


def auroc(unanswerable: np.ndarray, answerable: np.ndarray) -> float | None:
    """P(a question without an answer scores higher than one with an answer), ties half (higher: abstain)."""
    if not len(unanswerable) or not len(answerable):
        return None
    greater = (unanswerable[:, None] > answerable[None, :]).mean()
    ties = (unanswerable[:, None] == answerable[None, :]).mean()
    return float(greater + 0.5 * ties)


def choose_threshold(scores: np.ndarray, answerable: np.ndarray) -> float:
    """The lowest abstention threshold (abstain when the score is at least it) whose false-abstention rate on the
    answerable validation questions is at most MAX_FALSE_ABSTAIN."""
    answerable_scores = np.sort(scores[answerable])
    cut = int(math.floor(MAX_FALSE_ABSTAIN * len(answerable_scores)))
    return float(answerable_scores[len(answerable_scores) - cut - 1]) + 1e-9 if len(answerable_scores) else 0.5


def rates(scores: np.ndarray, answerable: np.ndarray, threshold: float) -> dict:
    abstained = scores >= threshold
    return {"threshold": threshold, "abstain": 100 * float(abstained[~answerable].mean()) if (~answerable).any()
            else None, "false_abstain": 100 * float(abstained[answerable].mean()) if answerable.any() else None,
            "n_answerable": int(answerable.sum()), "n_unanswerable": int((~answerable).sum()),
            "auroc": auroc(scores[~answerable], scores[answerable])}


def reader_signal(client, model: str, items: list, workers: int) -> np.ndarray:
    from tqdm.auto import tqdm

    with ThreadPoolExecutor(workers) as pool:
        jobs = [pool.submit(p_abstain, client, model, i.question, i.passages) for i in items]
        return np.array([job.result() for job in tqdm(jobs, desc="p_abstain", unit="q")])


def realdocs_scores(collection: str, system: str, retriever: str, questions) -> np.ndarray:
    """The best chunk's score (negated: a low score means abstain) for each question, from the benchmark's index."""
    from rag_mag.bench.folders.runner import SystemSpec
    from rag_mag.models import artifacts_dir
    from rag_mag.serving.pipelines import default_pipeline, load_pipeline, question_inputs

    spec = SystemSpec(system, "rag_mag", retriever)
    index = artifacts_dir() / "bench" / "folders" / collection / f"{system}-{spec.key()}"
    pipeline = load_pipeline(default_pipeline("retrieve"), {"index": str(index), "retriever": retriever, "top_k": 1})
    return np.array([-pipeline.run(question_inputs(pipeline, q.question))["retriever"]["documents"][0].score
                     for q in questions])


def best_passage_scores(items: list, retriever: str) -> np.ndarray:
    """Each item's best score over the passages it shows, under ``retriever`` (negated: low means abstain): the
    floor a pipeline's ``min_score`` puts on its first passage."""
    from rag_mag.retriever.encoder import MagnitudeEncoder

    encoder = MagnitudeEncoder.load(retriever)
    queries = encoder.encode([i.question for i in items], "query", treated=True)
    texts = [f"{title}\n{text}" for i in items for title, text in i.passages]
    documents = encoder.encode(texts, "document", treated=True)
    owner = np.repeat(np.arange(len(items)), [len(i.passages) for i in items])
    scores = (queries[owner] * documents).sum(axis=1)
    best = np.full(len(items), -np.inf)
    np.maximum.at(best, owner, scores)
    return -best


def floor_costs(scores: np.ndarray, items: list, threshold: float) -> dict:
    """``rates`` of a score floor on a Wikipedia set, with the EM that the committed report's answers keep under
    it (a refused question scores 0)."""
    answerable = np.array([i.answerable for i in items])
    today = np.array([i.today if i.today is not None else 0.0 for i in items if i.answerable])
    kept = scores[answerable] < threshold
    return {**rates(scores, answerable, threshold), "em_today": 100 * float(today.mean()),
            "em_with_floor": 100 * float((today * kept).mean())}


def main() -> int:
    import openai

    from rag_mag import durable
    from rag_mag.bench.abstention.runner import build_items, load_abstention_config
    from rag_mag.bench.datasets import data_root
    from rag_mag.bench.folders.collections import prepare_collection, question_split, read_questions
    from rag_mag.models import artifacts_dir
    from rag_mag.reader.examples import read_examples
    from rag_mag.serving.llm.records import read_api_key
    from rag_mag.serving.llm.server import running_server

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reader-val", required=True, help="the reader's validation examples (OUT/data/val.jsonl)")
    parser.add_argument("--config", default=str(REPO / "eval" / "configs" / "abstention.yaml"))
    parser.add_argument("--model", default="artifacts/smollm2-135m-reader-abstain")
    parser.add_argument("--sets", nargs="+", default=["clapnq", "stici", "sqlite_docs", "trivia_qa"],
                        help="sets of the abstention config to measure the reader's signal on")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--out", default=str(REPO / "eval" / "reports" / "abstention" / "signals.json"))
    parser.add_argument("--retrieval-only", action="store_true",
                        help="measure the retrieval floor only (no vLLM); the reader's figures already in --out stay")
    args = parser.parse_args()

    root = data_root(None)
    config = load_abstention_config(args.config, root)
    items = [i for i in build_items(config, root) if i.set in args.sets]
    validation = [e for e in read_examples(Path(args.reader_val)) if e.task == "answer"]
    result: dict = {"reader_signal": {}, "retrieval_signal": {}}
    if args.retrieval_only:
        previous = json.loads(Path(args.out).read_text(encoding="utf-8")) if Path(args.out).is_file() else {}
        result = {**result, **previous, "retrieval_signal": dict(previous.get("retrieval_signal", {}))}
        result["retrieval_signal"].update(wiki_floor(items, validation))
        durable.write_text(Path(args.out), json.dumps(result, indent=2) + "\n")
        print(json.dumps(result["retrieval_signal"], indent=2))
        return 0
    result["retrieval_signal"].update(wiki_floor(items, validation))
    with running_server(None, start=True, model=args.model) as url:
        client = openai.OpenAI(base_url=url, api_key=read_api_key() or "none", max_retries=3, timeout=900.0)
        val_scores = reader_signal(client, args.model, [_Item(e.question, e.passages) for e in validation],
                                   args.workers)
        val_answerable = np.array([e.view != "no_answer" for e in validation])
        threshold = choose_threshold(val_scores, val_answerable)
        result["reader_signal"]["validation"] = rates(val_scores, val_answerable, threshold)
        scores = reader_signal(client, args.model, items, args.workers)
    for name in sorted({(i.set, i.system) for i in items}):
        rows = [n for n, i in enumerate(items) if (i.set, i.system) == name]
        answerable = np.array([items[n].answerable for n in rows])
        result["reader_signal"][":".join(filter(None, name))] = {
            "chosen": rates(scores[rows], answerable, threshold), "greedy_like": rates(scores[rows], answerable, 0.5)}
    clapnq = [i for i in items if i.set == "clapnq"]
    if clapnq:
        known = np.array([i.answerable for i in clapnq])
        for system, retriever in (("qnorm", "artifacts/retriever-default"), ("cosine", "artifacts/retriever-cosine")):
            score = best_passage_scores(clapnq, retriever)  # ClapNQ shows one passage
            result["retrieval_signal"][f"clapnq:{system}"] = {"auroc": auroc(score[~known], score[known])}
    for collection in config.collections:
        folder = prepare_collection(collection, artifacts_dir() / "bench" / "collections" / collection, root)
        questions = read_questions(folder.questions_path)
        for system, retriever in (("qnorm", "artifacts/retriever-default"), ("cosine", "artifacts/retriever-cosine")):
            split = {s: question_split(questions, s) for s in ("validation", "test")}
            score = {s: realdocs_scores(collection, system, retriever, q) for s, q in split.items()}
            known = {s: np.array([q.answerable for q in split[s]]) for s in split}
            chosen = choose_threshold(score["validation"], known["validation"])
            result["retrieval_signal"][f"{collection}:{system}"] = {
                "validation": rates(score["validation"], known["validation"], chosen),
                "test": rates(score["test"], known["test"], chosen), "min_score": -chosen}
    durable.write_text(Path(args.out), json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


def wiki_floor(items: list, validation: list) -> dict:
    """The retrieval floor on the Wikipedia sets: the threshold chosen on the reader's validation examples
    (training-side questions; their gold and retrieved views answerable, their no-answer views not) at 5% false
    abstentions, then applied to each set's answerable questions (the cpu report's passages) and unanswerable ones
    (another question's passages). Measured with the corpus default, qnorm."""
    retriever = "artifacts/retriever-default"
    val_scores = best_passage_scores(validation, retriever)
    val_answerable = np.array([e.view != "no_answer" for e in validation])
    threshold = choose_threshold(val_scores, val_answerable)
    out = {"wiki:qnorm:validation": {**rates(val_scores, val_answerable, threshold), "min_score": -threshold}}
    for name in sorted({i.set for i in items if i.today is not None}):
        rows = [i for i in items if i.set == name and i.system == "qnorm"]
        out[f"{name}:qnorm"] = floor_costs(best_passage_scores(rows, retriever), rows, threshold)
    clapnq = [i for i in items if i.set == "clapnq"]
    if clapnq:  # the same floor on ClapNQ's own passages: does a floor chosen on one corpus carry to another?
        known = np.array([i.answerable for i in clapnq])
        out["clapnq:qnorm:wiki_floor"] = rates(best_passage_scores(clapnq, retriever), known, threshold)
    return out


class _Item:
    def __init__(self, question: str, passages) -> None:
        self.question, self.passages = question, passages


if __name__ == "__main__":
    raise SystemExit(main())
