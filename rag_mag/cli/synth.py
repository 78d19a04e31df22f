"""``rag-mag synth``: synthetic training pairs (question, chunk, hard negatives) for a corpus that has no questions."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

from rag_mag import durable, writable
from rag_mag.cli import DefaultsHelpFormatter


def _settings_fields():
    from rag_mag.adapt.synth import SynthSettings

    return SynthSettings, {field.name: field for field in fields(SynthSettings)}


HELP = {
    "chunks": "chunks sampled, one question written for each",
    "seed": "random seed of the sample",
    "min_words": "shorter chunks (headings, captions) are not sampled",
    "base_top_k": "round trip 1: the untrained base retriever must rank the question's chunk within this top k",
    "min_agreement": "round trip 2: the reader's answer from the chunk alone must agree with the writer's this "
                     "much (token F1, 0 to 1)",
    "hard_negatives": "BM25 hard negatives per pair (chunks that are not the pair's and hold no answer)",
    "passage_chars": "characters of a chunk shown to the writer and the reader",
    "writer": "the question writer, a model name served by vLLM (rag-mag serve-llm --model ...)",
    "reader": "the reader of the round-trip check",
    "base_model": "the untrained base retriever (a Hugging Face encoder folder; empty: the packaged MiniLM)",
}


def add_parser(subparsers) -> argparse.ArgumentParser:
    settings, known = _settings_fields()
    parser = subparsers.add_parser(
        "synth", help="write synthetic question/chunk training pairs for your documents (vLLM writes the questions)",
        description="Splits FOLDER's files as `rag-mag index` does (or reads the chunks of an INDEX folder), "
                    "samples --chunks of them, and has the question writer (smollm2-135m-writer on vLLM, "
                    "data/writer_default/) write one question and its short answer for each. A question is kept "
                    "only if the untrained retriever ranks its chunk in its top --base-top-k and the trained reader "
                    "answers it from the chunk alone with a span of the chunk that agrees with the writer's answer. "
                    "Kept questions get BM25 hard negatives and their provenance (chunk, file, page, writer "
                    "checksum) in OUT/pairs.jsonl, the chunks go to OUT/corpus.jsonl and the counts to "
                    "OUT/synth.json. vLLM servers are started (and stopped) as needed. Interrupted, the same "
                    "command resumes; other settings on the same OUT are refused.",
        formatter_class=DefaultsHelpFormatter)
    parser.add_argument("source", metavar="FOLDER|INDEX", help="a folder (or file) of documents, or an index folder")
    parser.add_argument("--out", required=True, help="folder of the pairs (resumable)")
    parser.add_argument("--llm-url", default=None, help="a vLLM server to use when it serves the model asked for "
                                                         "(default: RAG_MAG_VLLM_URL, else the local default)")
    for name, field in known.items():
        kind = type(field.default)
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=field.default, help=HELP[name])
    return parser


def run(args: argparse.Namespace) -> int:
    from rag_mag.adapt.synth import synthesize

    settings_class, known = _settings_fields()
    settings = settings_class(**{name: getattr(args, name) for name in known})
    out = Path(args.out)
    writable.check_writable(out, f"the pairs folder {out}")
    with durable.job_lock(durable.lock_path(out), f"the pairs folder {out}"):
        synthesize(args.source, out, settings=settings, llm_url=args.llm_url)
    manifest = json.loads((out / "synth.json").read_text())
    counts = manifest["counts"]
    print(f"{counts['kept']} pairs kept of {counts['sampled']} questions written ({manifest['files_with_pairs']} of "
          f"{manifest['files']} files) in {out / 'pairs.jsonl'}; rejected: {counts['unparsed']} unparsed, "
          f"{counts['answer_not_in_chunk']} answer not in the chunk, {counts['base_rank_beyond_k']} chunk beyond the "
          f"base's top {settings.base_top_k}, {counts['reader_disagrees']} reader disagrees")
    return 0
