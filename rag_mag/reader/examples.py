"""The reader's training and validation examples: a question, the passages the pipeline would show, a span.

Every example comes from the training side only; every question of the ``exclude`` evaluation sets is
dropped by SQuAD-normalized text (the same list as ``eval/configs/train_data.yaml``, read from there).
Two views of each training question, so the reader learns what it faces in the pipelines:

* ``gold``: its gold passages (HotpotQA's two supporting paragraphs, the NQ-open oracle passage, a mined
  answer-bearing passage) among distractors (the question's own hard negatives), shuffled, 1 to
  ``max_passages`` passages in all, like ``oracle`` and a good retrieval;
* ``retrieved``: the top ``k`` of a dense retriever over ``retrieval_corpus`` (k drawn from the pipelines'
  passage counts), kept only when a gold answer occurs in them (a HotpotQA yes/no question: when a gold
  passage is among them), so the reader learns to pick the right passage among wrong ones, never to answer
  from memory.

The target is the first gold alias that occurs in the shown passages (yes/no answers as they are). The
passages are cut at one of the pipelines' truncations (``passage_chars``) when the prompt is rendered.

A third view teaches ``rag_multihop.yaml``'s first step, so that one model serves both: ``followup``, a two-hop
question's first round (the gold passage the question names, among distractors), whose target is the title
of the other gold passage, the fact still missing.

The question writer (``task: question``) learns the reverse task from the same training-side questions: its
``question`` view shows one gold passage that holds an answer (within the truncation it is shown at), and its
target is that question with the answer found there (``question_target``). Two-passage questions (HotpotQA's) are
left out: one passage does not answer them.
With ``no_answer_share`` the reader also learns to abstain: a ``no_answer`` view shows passages that hold no
alias of the answer, with the target ``NO_ANSWER_REPLY``. Its passages are, for each question, the retrieved
top k when no answer occurs in it (what a retriever returns for a question its corpus cannot answer), the
question's own distractors (on-topic, without the answer), or another question's gold passages, the first of these
(hardest first) that the question has; yes/no questions
are left out (a passage may imply the answer without naming it). That view is drawn until it is that share of
the examples, in training and in validation alike.

Validation holds out whole questions (``val_questions`` of them, from the gold sources) before any view is made.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rag_mag.data import Passage, read_eval, read_triples
from rag_mag.errors import ConfigError
from rag_mag.metrics.answers import NO_ANSWER_REPLY, contains_answer, normalize_answer
from rag_mag.retriever.data.linked_positives import title_words

logger = logging.getLogger(__name__)

YES_NO = frozenset({"yes", "no"})
# The no-answer view's passages, hardest first: what a retriever returns (on topic, without the answer), the
# question's own distractors, then another question's passages (off topic, the easiest to refuse).
NO_ANSWER_SOURCES = ("retrieved", "distractors", "other_question")


@dataclass(frozen=True)
class ReaderExample:
    id: str
    question: str
    answers: tuple[str, ...]
    target: str
    passages: tuple[tuple[str, str], ...]  # (title, text), in the order shown
    view: str                              # gold or retrieved
    source: str
    passage_chars: int
    task: str = "answer"                   # answer, followup (the multi-hop search query; target: a title), or
                                           # question (the question writer; target: "Question: ...\nAnswer: ...")


@dataclass
class Question:
    """A training-side question with its gold and distractor passages, before any view is made."""

    id: str
    question: str
    answers: tuple[str, ...]
    gold: list[Passage]
    distractors: list[Passage]
    source: str


@dataclass
class ExampleStats:
    questions: dict[str, int] = field(default_factory=dict)
    excluded_eval_overlap: int = 0
    no_answer_in_gold: int = 0
    retrieved_without_answer: int = 0
    no_answer_sources: dict[str, int] = field(default_factory=dict)
    examples: dict[str, int] = field(default_factory=dict)


def answer_target(answers: Sequence[str], passages: Sequence[Passage]) -> str:
    """The first gold alias found in the passages ('' if none); a yes/no answer is its own target."""
    for answer in answers:
        if normalize_answer(answer) in YES_NO:
            return answer.strip()
    for answer in answers:
        if any(contains_answer(p.text, [answer]) or contains_answer(p.title, [answer]) for p in passages):
            return answer.strip()
    return ""


def excluded_questions(paths: Sequence[str | Path]) -> set[str]:
    return {normalize_answer(record.question) for path in paths for record in read_eval(path)}


def read_questions(gold_triples: str, gold_eval: str, mined_rows: str) -> list[Question]:
    """HotpotQA-style triples (gold = positives), NQ-oracle-style eval rows (gold = supporting contexts) and
    the mined rows of a built training file (``source == "mined"``)."""
    questions: list[Question] = []
    if gold_triples:
        for number, triple in enumerate(read_triples(gold_triples)):
            questions.append(Question(triple.id or f"triples_{number}", triple.query, tuple(triple.answers),
                                      list(triple.positives), list(triple.hard_negatives), "hotpotqa_gold"))
    if gold_eval:
        for record in read_eval(gold_eval):
            gold = [Passage(c.id, c.title, c.text) for c in record.contexts if c.is_supporting]
            others = [Passage(c.id, c.title, c.text) for c in record.contexts if not c.is_supporting]
            questions.append(Question(record.id, record.question, record.answers, gold, others, "nq_oracle_gold"))
    if mined_rows:
        for line in _read_rows(mined_rows):
            if line.get("source") == "mined":
                questions.append(Question(line["id"], line["query"], tuple(line["answers"]),
                                          [Passage(**p) for p in line["positives"]],
                                          [Passage(**p) for p in line["hard_negatives"]], "mined"))
    for question in questions:
        if not question.answers:
            raise ConfigError(f"training question {question.id!r} ({question.source}) has no answers; the reader "
                              "needs a gold answer for every question")
    return questions


def _read_rows(path: str) -> list[dict]:
    from rag_mag.data import iter_jsonl

    return [record for _, record in iter_jsonl(path)]


def split_questions(questions: list[Question], val_questions: int, seed: int) -> tuple[list[Question], list[Question]]:
    """Hold out ``val_questions`` whole questions of the gold sources (mined answers are noisier judges)."""
    gold = [q for q in questions if q.source != "mined"]
    order = sorted(gold, key=lambda q: hashlib.sha256(f"{seed}:{q.source}:{q.id}".encode()).hexdigest())
    held = {id(q) for q in order[:val_questions]}
    return [q for q in questions if id(q) not in held], [q for q in order[:val_questions]]


Retrieve = Callable[[list[str], int], list[list[Passage]]]


def build_examples(questions: list[Question], *, max_passages: int, passage_counts: Sequence[int],
                   passage_chars: Sequence[int], seed: int, retrieve: Retrieve | None,
                   stats: ExampleStats, followup_chars: int = 0, no_answer_share: float = 0.0) -> list[ReaderExample]:
    """Both views of every question (the retrieved one only with a ``retrieve`` function), with
    ``followup_chars`` the follow-up view of every two-passage question, and with ``no_answer_share`` the
    no-answer view until it is that share of the examples."""
    rng = random.Random(seed)
    examples: list[ReaderExample] = []
    for question in questions:
        example = _gold_view(question, max_passages, passage_chars, rng)
        if example is None:
            stats.no_answer_in_gold += 1
        else:
            examples.append(example)
    unanswered: dict[int, list[Passage]] = {}  # question index -> its retrieved passages that hold no answer
    if retrieve is not None:
        counts = [rng.choice(list(passage_counts)) for _ in questions]
        ranked = retrieve([q.question for q in questions], max(counts))
        for number, (question, count, passages) in enumerate(zip(questions, counts, ranked, strict=True)):
            example = _retrieved_view(question, passages[:count], passage_chars, rng)
            if example is None:
                stats.retrieved_without_answer += 1
                if passages[:count] and not _holds_answer(question, passages[:count]):
                    unanswered[number] = passages[:count]
            else:
                examples.append(example)
    if followup_chars:
        for question in questions:
            example = _followup_view(question, followup_chars, rng)
            if example is not None:
                examples.append(example)
    if no_answer_share > 0:
        wanted = round(len(examples) * no_answer_share / (1.0 - no_answer_share))
        examples += _no_answer_views(questions, unanswered, wanted, max_passages, passage_chars, rng, stats)
    for example in examples:
        stats.examples[example.view] = stats.examples.get(example.view, 0) + 1
    rng.shuffle(examples)
    return examples


def _holds_answer(question: Question, passages: Sequence[Passage]) -> bool:
    return any(contains_answer(p.text, question.answers) or contains_answer(p.title, question.answers)
               for p in passages)


def _no_answer_views(questions: list[Question], unanswered: dict[int, list[Passage]], wanted: int,
                     max_passages: int, passage_chars: Sequence[int], rng: random.Random,
                     stats: ExampleStats) -> list[ReaderExample]:
    """Up to ``wanted`` examples whose passages hold no alias of the answer, each question at most once; the
    passages of each are the first of ``NO_ANSWER_SOURCES`` that it has: its retrieved top k without the answer,
    its own distractors without the answer, or another question's gold passages."""
    order = [n for n, q in enumerate(questions) if not any(normalize_answer(a) in YES_NO for a in q.answers)]
    rng.shuffle(order)
    examples: list[ReaderExample] = []
    for number in order:
        if len(examples) >= wanted:
            break
        question = questions[number]
        own = [p for p in question.distractors if not _holds_answer(question, [p])]
        other = questions[rng.randrange(len(questions))]
        choices = {"retrieved": unanswered.get(number, []),
                   "distractors": rng.sample(own, min(len(own), rng.randint(1, max_passages))),
                   "other_question": [] if other is question else (other.gold + other.distractors)[:max_passages]}
        choices = {name: passages for name, passages in choices.items()
                   if passages and not _holds_answer(question, passages)}
        if not choices:
            continue
        source = next(name for name in NO_ANSWER_SOURCES if name in choices)
        shown = list(choices[source])
        rng.shuffle(shown)
        stats.no_answer_sources[source] = stats.no_answer_sources.get(source, 0) + 1
        examples.append(ReaderExample(f"{question.id}#no_answer", question.question, (NO_ANSWER_REPLY,),
                                      NO_ANSWER_REPLY, tuple((p.title, p.text) for p in shown), "no_answer",
                                      question.source, rng.choice(passage_chars)))
    return examples


def _gold_view(question: Question, max_passages: int, passage_chars: Sequence[int],
               rng: random.Random) -> ReaderExample | None:
    gold = question.gold[:max_passages]
    target = answer_target(question.answers, gold)
    if not gold or not target:
        return None
    extra = rng.randint(0, max(0, max_passages - len(gold)))
    shown = gold + rng.sample(question.distractors, min(extra, len(question.distractors)))
    rng.shuffle(shown)
    return ReaderExample(f"{question.id}#gold", question.question, question.answers, target,
                         tuple((p.title, p.text) for p in shown), "gold", question.source, rng.choice(passage_chars))


def _retrieved_view(question: Question, passages: list[Passage], passage_chars: Sequence[int],
                    rng: random.Random) -> ReaderExample | None:
    gold_ids = {p.id for p in question.gold}
    yes_no = any(normalize_answer(a) in YES_NO for a in question.answers)
    if yes_no and not gold_ids & {p.id for p in passages}:
        return None
    target = answer_target(question.answers, passages)
    if not passages or not target:
        return None
    return ReaderExample(f"{question.id}#retrieved", question.question, question.answers, target,
                         tuple((p.title, p.text) for p in passages), "retrieved", question.source,
                         rng.choice(passage_chars))


def _followup_view(question: Question, passage_chars: int, rng: random.Random) -> ReaderExample | None:
    """A two-hop question's first round: the gold passage the question names, among up to two distractors
    (rag_multihop.yaml's top 3); the target query is the title of the other gold passage, the missing fact."""
    if len(question.gold) != 2:
        return None
    text = f" {normalize_answer(question.question)} "
    named = [p for p in question.gold if (words := title_words(p.title)) and f" {words} " in text]
    first = named[0] if named else question.gold[0]
    missing = question.gold[1] if first is question.gold[0] else question.gold[0]
    shown = [first] + rng.sample(question.distractors, min(2, len(question.distractors)))
    rng.shuffle(shown)
    return ReaderExample(f"{question.id}#followup", question.question, question.answers, missing.title,
                         tuple((p.title, p.text) for p in shown), "followup", question.source, passage_chars,
                         task="followup")


def build_question_examples(questions: list[Question], *, passage_chars: Sequence[int], seed: int,
                            stats: ExampleStats) -> list[ReaderExample]:
    """The question writer's view of every one-passage question whose gold passage holds an answer where it is
    shown (cut at the drawn truncation)."""
    from rag_mag.components.question_prompt import question_target

    rng = random.Random(seed)
    examples: list[ReaderExample] = []
    for question in questions:
        if len(question.gold) != 1 or any(normalize_answer(a) in YES_NO for a in question.answers):
            continue
        chars = rng.choice(list(passage_chars))
        passage = question.gold[0]
        shown = Passage(passage.id, passage.title, passage.text[: max(20, chars - 5)])  # what truncate() keeps
        answer = answer_target(question.answers, [shown])
        if not answer:
            stats.no_answer_in_gold += 1
            continue
        examples.append(ReaderExample(f"{question.id}#question", question.question, (answer,),
                                      question_target(question.question, answer),
                                      ((passage.title, passage.text),), "question", question.source, chars,
                                      task="question"))
    for example in examples:
        stats.examples[example.view] = stats.examples.get(example.view, 0) + 1
    rng.shuffle(examples)
    return examples


def dense_retriever(model: str, corpus: Sequence[Passage], precision: str, batch_size: int = 64) -> Retrieve:
    """Top-k passages of ``corpus`` under a rag-mag retriever checkpoint (or a base encoder folder; empty:
    the packaged all-MiniLM-L6-v2, cosine), searched exactly by inner product of the treated vectors."""
    import faiss
    import numpy as np

    from rag_mag.precision import use_bf16
    from rag_mag.retriever.encoder import CONFIG_NAME, MagnitudeEncoder

    if model and (Path(model) / CONFIG_NAME).is_file():
        encoder = MagnitudeEncoder.load(model)
    else:
        encoder = MagnitudeEncoder.build(model or None, strategy="cosine")
    encoder.eval()
    bf16 = use_bf16(precision, encoder.device)

    index = None  # the corpus is encoded once, on the first call

    def retrieve(queries: list[str], k: int) -> list[list[Passage]]:
        nonlocal index
        if index is None:
            logger.info("encoding %d passages to retrieve from", len(corpus))
            documents = encoder.encode([p.content for p in corpus], "document", batch_size=batch_size,
                                       show_progress=True, bf16=bf16)
            index = faiss.IndexFlatIP(documents.shape[1])
            index.add(np.ascontiguousarray(documents, dtype=np.float32))
        query_vectors = encoder.encode(queries, "query", batch_size=batch_size, bf16=bf16)
        _, rows = index.search(np.ascontiguousarray(query_vectors, dtype=np.float32), k)
        return [[corpus[i] for i in row if i >= 0] for row in rows]

    return retrieve


def write_examples(path: Path, examples: list[ReaderExample]) -> str:
    """Write the examples as JSONL (atomically); return their sha256."""
    from rag_mag.data import write_jsonl

    write_jsonl(path, [asdict(example) for example in examples])
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_examples(path: Path) -> list[ReaderExample]:
    rows = _read_rows(str(path))
    return [ReaderExample(**{**row, "answers": tuple(row["answers"]),
                             "passages": tuple(tuple(p) for p in row["passages"])}) for row in rows]


def stats_json(stats: ExampleStats) -> str:
    return json.dumps(asdict(stats), indent=2)
