"""Synthetic training pairs for a corpus without questions: ``rag-mag synth FOLDER|INDEX --out PAIRS``.

1. **Chunks** (``adapt.chunks``): every chunk of the corpus, written to ``PAIRS/corpus.jsonl``.
2. **Questions**: ``chunks`` of them, drawn at random (seeded) among those of at least ``min_words`` words, each
   shown to the question writer (``smollm2-135m-writer`` on vLLM, the QuestionPromptBuilder prompt, greedy), which
   replies with one question and its answer. Replies are appended to ``PAIRS/written.jsonl`` as they come back.
3. **Round trips**, two checks a question must pass to be kept:
   - the untrained base retriever ranks its chunk within the top ``base_top_k`` of all chunks;
   - the reader (the trained reader on vLLM, the pipelines' AnswerPromptBuilder) answers it from the chunk alone
     with a span of the chunk that agrees with the writer's answer (token F1 at least ``min_agreement``).
   The reader's answers are appended to ``PAIRS/answered.jsonl``.
4. **Pairs**: each kept question with its chunk as the positive and BM25's best-ranked chunks that are neither
   it nor hold the answer as hard negatives (the training data's miner), with its provenance (chunk, file, page,
   the writer's checksum, the checks), in ``PAIRS/pairs.jsonl``; ``PAIRS/synth.json`` counts what was kept and why
   the rest was not.

Stages 2 and 3 resume: a rerun sends only the chunks and questions not answered yet. ``synth.json`` records the
settings; a rerun with other settings, or on another corpus, is refused rather than mixed in.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import random
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from rag_mag import durable
from rag_mag.adapt.chunks import Chunk, load_chunks
from rag_mag.errors import ConfigError

logger = logging.getLogger(__name__)

MANIFEST = "synth.json"


@dataclass(frozen=True)
class SynthSettings:
    chunks: int = 1000          # chunks sampled for a question each
    seed: int = 0
    min_words: int = 30         # shorter chunks (headings, captions) are not sampled
    base_top_k: int = 20        # round trip 1: the base retriever's rank of the chunk
    min_agreement: float = 0.5  # round trip 2: the reader's answer against the writer's (token F1)
    hard_negatives: int = 4
    passage_chars: int = 700    # what the writer and the reader are shown of a chunk
    writer: str = "smollm2-135m-writer"
    reader: str = "smollm2-135m-reader"
    base_model: str = ""        # the untrained base retriever (empty: the packaged all-MiniLM-L6-v2)

    def __post_init__(self) -> None:
        for name in ("chunks", "min_words", "base_top_k", "passage_chars"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.hard_negatives < 0:
            raise ConfigError(f"hard_negatives must be 0 or more, got {self.hard_negatives}")
        if not 0.0 <= self.min_agreement <= 1.0:
            raise ConfigError(f"min_agreement must be in [0, 1], got {self.min_agreement}")


Generate = Callable[[list[list[dict]]], list[str]]  # chat prompts in, replies out (in order)


def sample_chunks(chunks: Sequence[Chunk], settings: SynthSettings) -> list[Chunk]:
    eligible = [chunk for chunk in chunks if len(chunk.text.split()) >= settings.min_words]
    rng = random.Random(settings.seed)
    return sorted(rng.sample(eligible, min(settings.chunks, len(eligible))), key=lambda chunk: chunk.id)


def corpus_digest(chunks: Sequence[Chunk]) -> str:
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(f"{chunk.id}\0{chunk.text}\0".encode())
    return digest.hexdigest()


def _done(path: Path, key: str) -> dict[str, dict]:
    from rag_mag.data import iter_jsonl

    return {record[key]: record for _, record in iter_jsonl(path)} if path.is_file() else {}


def _in_batches(todo: list, work: Callable[[list], list[dict]], path: Path, what: str, progress: bool,
                batch_size: int = 64) -> None:
    """Send ``todo`` through ``work`` a batch at a time, appending each result to ``path`` as one line."""
    from tqdm.auto import tqdm

    with tqdm(total=len(todo), desc=what, unit="question", disable=not progress) as bar:
        for start in range(0, len(todo), batch_size):
            for record in work(todo[start:start + batch_size]):
                durable.append_line(path, json.dumps(record))
            bar.update(min(batch_size, len(todo) - start))


def write_questions(sampled: Sequence[Chunk], out: Path, generate: Generate, settings: SynthSettings,
                    progress: bool = True) -> dict[str, dict]:
    """``{chunk id: {chunk_id, reply, question, answer}}`` for every sampled chunk (question None: no parse)."""
    from rag_mag.components.question_prompt import parse_question, question_messages

    path = out / "written.jsonl"
    done = _done(path, "chunk_id")

    def work(batch: list[Chunk]) -> list[dict]:
        replies = generate([question_messages(c.title, c.text, settings.passage_chars) for c in batch])
        records = []
        for chunk, reply in zip(batch, replies, strict=True):
            parsed = parse_question(reply)
            records.append({"chunk_id": chunk.id, "reply": reply, "question": parsed[0] if parsed else None,
                            "answer": parsed[1] if parsed else None})
        return records

    _in_batches([c for c in sampled if c.id not in done], work, path, "writing questions", progress)
    return _done(path, "chunk_id")


def answer_questions(written: dict[str, dict], by_id: dict[str, Chunk], out: Path, generate: Generate,
                     settings: SynthSettings, progress: bool = True) -> dict[str, dict]:
    """``{chunk id: {chunk_id, reader_answer}}``: the reader's answer to each parsed question from its chunk alone."""
    from rag_mag.components.answer_prompt import answer_messages
    from rag_mag.metrics.answers import clean_answer

    path = out / "answered.jsonl"
    done = _done(path, "chunk_id")

    def work(batch: list[dict]) -> list[dict]:
        prompts = [answer_messages(w["question"], [(by_id[w["chunk_id"]].title, by_id[w["chunk_id"]].text)],
                                   settings.passage_chars) for w in batch]
        return [{"chunk_id": w["chunk_id"], "reader_answer": clean_answer(reply)}
                for w, reply in zip(batch, generate(prompts), strict=True)]

    todo = [w for w in written.values() if w["question"] and w["chunk_id"] not in done]
    _in_batches(sorted(todo, key=lambda w: w["chunk_id"]), work, path, "answering them", progress)
    return _done(path, "chunk_id")


def base_ranks(questions: dict[str, str], chunks: Sequence[Chunk], base: Path, top_k: int) -> dict[str, int | None]:
    """``{chunk id: rank}`` (1-based) of each question's own chunk among all chunks under the base retriever;
    None beyond ``top_k``."""
    from rag_mag.adapt.scoring import rank_dense
    from rag_mag.precision import use_bf16
    from rag_mag.retriever.encoder import MagnitudeEncoder

    encoder = MagnitudeEncoder.load(base, inference=True)
    ids = list(questions)
    ranked = rank_dense(encoder, chunks, [questions[i] for i in ids], bf16=use_bf16("auto", encoder.device),
                        top_k=top_k, progress=True)
    return {chunk_id: row.index(chunk_id) + 1 if chunk_id in row else None
            for chunk_id, row in zip(ids, ranked, strict=True)}


def reader_agrees(text: str, writer_answer: str, reader_answer: str, min_agreement: float) -> bool:
    """Round trip 2: the reader's answer from the passage alone is a span of it that agrees with the writer's
    (token F1 at least ``min_agreement``)."""
    from rag_mag.metrics.answers import contains_answer, f1

    return bool(reader_answer and writer_answer) and contains_answer(text, [reader_answer]) and \
        f1(reader_answer, [writer_answer]) >= min_agreement


@dataclass
class SynthCounts:
    chunks: int = 0
    sampled: int = 0
    unparsed: int = 0
    answer_not_in_chunk: int = 0
    base_rank_beyond_k: int = 0
    reader_disagrees: int = 0
    kept: int = 0


def vllm_generate(url: str, model: str, max_tokens: int, in_flight: int = 16) -> Generate:
    """Greedy replies of ``model`` served at ``url``, ``in_flight`` requests at a time, through vllm-haystack's
    ``VLLMChatGenerator`` (the pipelines' generator)."""
    from haystack.dataclasses import ChatMessage
    from haystack_integrations.components.generators.vllm import VLLMChatGenerator

    from rag_mag.bench.generation import TruncatedAnswers

    generator = VLLMChatGenerator(model=model, api_base_url=url, timeout=300.0, max_retries=3,
                                  generation_kwargs={"max_tokens": max_tokens, "temperature": 0.0})
    generator.warm_up()
    builders = {"system": ChatMessage.from_system, "user": ChatMessage.from_user}

    def one(messages: list[dict]) -> str:
        chat = [builders[message["role"]](message["content"]) for message in messages]
        return generator.run(messages=chat)["replies"][0].text or ""

    def generate(prompts: list[list[dict]]) -> list[str]:
        # a reply cut at max_tokens is counted, not warned about one by one: it fails to parse, or is judged
        with TruncatedAnswers() as truncated, ThreadPoolExecutor(max_workers=in_flight) as pool:
            replies = list(pool.map(one, prompts))
        if truncated.count:
            logger.info("%d of %d %s replies reached max_tokens (%d)", truncated.count, len(prompts), model,
                        max_tokens)
        return replies

    return generate


def mine_negatives(kept: list[dict], corpus_path: Path, count: int) -> dict[str, list[Chunk]]:
    """``{chunk id: hard negatives}``: BM25's best-ranked chunks for the question that are neither its own chunk
    nor hold its answer (``BM25NegativeMiner``, the training data's miner)."""
    from rag_mag.metrics.answers import contains_answer
    from rag_mag.retriever.data.negative_miners import BM25NegativeMiner

    if not count or not kept:
        return {record["chunk_id"]: [] for record in kept}
    miner = BM25NegativeMiner(str(corpus_path))
    ranked = miner.ranked([record["question"] for record in kept], count * 4 + 1)
    negatives = {}
    for record, passages in zip(kept, ranked, strict=True):
        chosen = [p for p in passages if p.id != record["chunk_id"]
                  and not contains_answer(p.text, [record["answer"]])][:count]
        negatives[record["chunk_id"]] = chosen
    return negatives


def _claim(out: Path, source: str, settings: SynthSettings, digest: str) -> None:
    """Record the settings and the corpus before any reply is written, or refuse a folder that holds another
    run's: replies of two settings or two corpora are never mixed, also after an interrupted run."""
    path = out / MANIFEST
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("settings") != asdict(settings) or saved.get("corpus_sha256") != digest:
            raise ConfigError(f"{out} holds pairs written with other settings or for another corpus ({path}); use "
                              "the same settings, another --out, or delete it to start over")
        return
    durable.write_text(path, json.dumps({"source": str(source), "corpus_sha256": digest,
                                         "settings": asdict(settings)}, indent=2) + "\n")


def judge(written: dict[str, dict], answered: dict[str, dict], ranks: dict[str, int | None],
          by_id: dict[str, Chunk], settings: SynthSettings, counts: SynthCounts) -> list[dict]:
    """The written questions that pass both round trips (with their checks), counting why the others fail."""
    from rag_mag.metrics.answers import contains_answer

    kept = []
    for chunk_id, record in sorted(written.items()):
        chunk = by_id[chunk_id]
        reader_answer = answered.get(chunk_id, {}).get("reader_answer", "")
        if not record["question"]:
            counts.unparsed += 1
        elif not contains_answer(chunk.text, [record["answer"]]):
            counts.answer_not_in_chunk += 1
        elif ranks.get(chunk_id) is None:
            counts.base_rank_beyond_k += 1
        elif not reader_agrees(chunk.text, record["answer"], reader_answer, settings.min_agreement):
            counts.reader_disagrees += 1
        else:
            kept.append({**record, "base_rank": ranks[chunk_id], "reader_answer": reader_answer})
    counts.kept = len(kept)
    return kept


def pair_record(record: dict, chunk: Chunk, negatives: list, generator_sha256: str, writer: str) -> dict:
    passage = {"id": chunk.id, "title": chunk.title, "text": chunk.text}
    key = hashlib.sha256(f"{chunk.id}\0{record['question']}".encode()).hexdigest()[:16]
    return {"id": f"synth-{key}", "query": record["question"], "answers": [record["answer"]],
            "positives": [passage], "hard_negatives": [{"id": p.id, "title": p.title, "text": p.text}
                                                       for p in negatives],
            "source": "synthetic", "file": chunk.file, "page": chunk.page, "chunk_id": chunk.id,
            "generator": writer, "generator_sha256": generator_sha256,
            "checks": {"base_rank": record["base_rank"], "reader_answer": record["reader_answer"]}}


def synthesize(source: str, out: Path, *, settings: SynthSettings | None = None, llm_url: str | None = None,
               progress: bool = True, writer_generate: Generate | None = None,
               reader_generate: Generate | None = None) -> Path:
    """Write ``out/pairs.jsonl`` for the corpus at ``source`` (the module doc says how); return ``out``.

    ``writer_generate`` / ``reader_generate`` replace the vLLM servers (tests); by default the writer is served
    on a server of its own (started and stopped here unless one at ``llm_url`` already serves it), then the reader
    at ``llm_url`` (the running one, or one started here)."""
    from rag_mag.adapt.chunks import base_retriever
    from rag_mag.data import write_jsonl
    from rag_mag.serving.llm.readers import reader_checksum

    settings = settings or SynthSettings()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    chunks = load_chunks(source, out, base_model=settings.base_model, progress=progress)
    digest = corpus_digest(chunks)
    _claim(out, source, settings, digest)
    by_id = {chunk.id: chunk for chunk in chunks}
    corpus_path = out / "corpus.jsonl"
    write_jsonl(corpus_path, [chunk.record() for chunk in chunks])
    sampled = sample_chunks(chunks, settings)
    logger.info("%d chunks, %d sampled for a question each", len(chunks), len(sampled))
    written = _done(out / "written.jsonl", "chunk_id")
    if any(chunk.id not in written for chunk in sampled):  # a server is started only for work left to do
        with served(settings.writer, llm_url, writer_generate, max_tokens=64) as generate:
            written = write_questions(sampled, out, generate, settings, progress)
    answered = _done(out / "answered.jsonl", "chunk_id")
    if any(record["question"] and chunk_id not in answered for chunk_id, record in written.items()):
        with served(settings.reader, llm_url, reader_generate, max_tokens=32) as generate:
            answered = answer_questions(written, by_id, out, generate, settings, progress)
    asked = {chunk_id: record["question"] for chunk_id, record in written.items() if record["question"]}
    ranks = base_ranks(asked, chunks, base_retriever(out, settings.base_model), settings.base_top_k)
    counts = SynthCounts(chunks=len(chunks), sampled=len(sampled))
    kept = judge(written, answered, ranks, by_id, settings, counts)
    negatives = mine_negatives(kept, corpus_path, settings.hard_negatives)
    generator_sha256 = reader_checksum(settings.writer) if writer_generate is None else "test"
    pairs = [pair_record(record, by_id[record["chunk_id"]], negatives[record["chunk_id"]], generator_sha256,
                         settings.writer) for record in kept]
    write_jsonl(out / "pairs.jsonl", pairs)
    manifest = {"source": str(source), "corpus_sha256": digest, "settings": asdict(settings),
                "counts": asdict(counts), "files": len({chunk.file for chunk in chunks}),
                "files_with_pairs": len({pair["file"] for pair in pairs}), "generator_sha256": generator_sha256}
    durable.write_text(out / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    logger.info("synthetic pairs: %d kept of %d written (%s)", counts.kept, counts.sampled, json.dumps(asdict(counts)))
    return out


@contextlib.contextmanager
def served(model: str, url: str | None, given: Generate | None, *, max_tokens: int) -> Iterator[Generate]:
    """A generate function for ``model``: the given one, the server at ``url`` if it serves ``model``, else a
    server started for it on a free port and stopped afterwards."""
    if given is not None:
        yield given
        return
    from rag_mag.errors import ServerNotRunningError
    from rag_mag.serving.llm.preflight import check_server
    from rag_mag.serving.llm.server import running_server
    from rag_mag.serving.llm.settings import default_api_base_url

    target = url or default_api_base_url()
    try:
        check_server(target, model=model)
        serving = contextlib.nullcontext(target)
    except (ServerNotRunningError, ConfigError):  # none there, or one that serves another model
        logger.info("starting vLLM for %s (about a minute and a half on CPU)", model)
        serving = running_server(model=model, free_port=True)
    with serving as base_url:
        yield vllm_generate(base_url, model, max_tokens)
