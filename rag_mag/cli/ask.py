"""``rag-mag ask``: answer one question with a RAG pipeline and show why each source ranked where it did."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from rag_mag.cli import DefaultsHelpFormatter
from rag_mag.errors import CheckpointError, ConfigError


def finite_number(value: str) -> float:
    """An argparse type: a float that is neither NaN nor infinite."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {value}")
    return number


def add_parser(subparsers) -> argparse.ArgumentParser:
    from rag_mag.components.answer_builder import ABSTAIN_MODES
    from rag_mag.models import default_retriever_dir
    from rag_mag.serving.pipelines import default_index_dir, default_pipeline, default_qdrant_dir

    parser = subparsers.add_parser(
        "ask", help="answer a question from the index (runs pipelines/rag.yaml)",
        description="Retrieve passages for a question, answer with the LLM served by vLLM, and print the answer "
                    "with its ranked sources: score = cosine x query norm x document norm. When the passages do "
                    "not hold the answer, it prints \"The documents do not say.\" and the closest sources.",
        formatter_class=DefaultsHelpFormatter)
    parser.add_argument("question", help="the question, in quotes")
    parser.add_argument("--index", default=str(default_index_dir()),
                        help="index folder (from `rag-mag index`); for pipelines that read a FAISS index")
    parser.add_argument("--qdrant", default=str(default_qdrant_dir()), metavar="DIR",
                        help="embedded Qdrant folder (from `rag-mag export-index`); for pipelines/rag_qdrant.yaml")
    parser.add_argument("--table", default="rag_mag_default",
                        help="PostgreSQL table; for pipelines on pgvector (pipelines/rag_pgvector.yaml)")
    parser.add_argument("--pg-url", default=None, help="PostgreSQL URL for pgvector pipelines (default: "
                        "$RAG_MAG_PG_URL, else the server of `rag-mag db start`, started if none runs)")
    parser.add_argument("--retriever", default=None,
                        help="retriever checkpoint the index was built with (default: the one under artifacts/ "
                             f"whose fingerprint the index or table records, else {default_retriever_dir()})")
    parser.add_argument("--pipeline", default=str(default_pipeline("rag")),
                        help="RAG pipeline YAML (e.g. pipelines/rag_multihop.yaml)")
    parser.add_argument("--top-k", type=int, default=None, help="passages retrieved (default: the pipeline's)")
    parser.add_argument("--llm-url", default=None, help="vLLM server base URL (default: the pipeline's, or "
                        "$RAG_MAG_VLLM_URL)")
    parser.add_argument("--abstain", choices=ABSTAIN_MODES, default=None,
                        help="auto: say \"The documents do not say.\" when the reader finds no answer in the "
                             "passages (or the best scores under --min-score); off: always print the reader's reply "
                             "(default: the pipeline's abstain)")
    parser.add_argument("--min-score", type=finite_number, default=None, metavar="X",
                        help="no answer when the best passage's score is under X (with abstain auto; scores differ "
                             "by strategy and corpus: calibrate it on your own questions; default: the pipeline's "
                             "min_score; --set min_score=null removes one)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="NAME.PARAM=VALUE",
                        help="extra override of a component parameter (repeatable)")
    parser.add_argument("--source", nargs="+", metavar="GLOB",
                        help="search only these files of an index of files (names as indexed, or globs such as "
                             "'reports/*.pdf')")
    parser.add_argument("--json", action="store_true", help="print the answer, whether the documents answer it "
                        "(answerable) and the sources (file, page, excerpt) as JSON")
    return parser


def run(args: argparse.Namespace) -> int:
    import contextlib

    from rag_mag.serving.db import pgvector
    from rag_mag.serving.pipelines import read_pipeline_dict

    question = args.question.strip()
    if not question:
        raise ConfigError("the question is empty; ask a question, e.g. rag-mag ask \"Who wrote Hamlet?\"")
    if args.top_k is not None and args.top_k < 1:
        raise ConfigError(f"--top-k must be at least 1, got {args.top_k}")
    data = read_pipeline_dict(args.pipeline)
    uses_postgres = bool(pgvector.pipeline_stores(data))
    with pgvector.using_server(args.pg_url) if uses_postgres else contextlib.nullcontext() as url:
        from rag_mag.components.checkpoints import checkpoint_fingerprint
        from rag_mag.models import default_retriever_dir
        from rag_mag.serving.retrievers import own_retriever, retriever_for

        if args.retriever is None and uses_postgres:
            tag = pgvector.check_table(url, pgvector.check_table_name(args.table), None)
            args.retriever = str(retriever_for(tag.get("checkpoint")) or default_retriever_dir())
        elif args.retriever is None:
            args.retriever = str(own_retriever(Path(args.index), default_retriever_dir()))
        overrides = _overrides(args, data)
        if uses_postgres:
            pgvector.check_table(url, args.table, checkpoint_fingerprint(args.retriever))
        report = _answer(args, question, overrides)
    print(json.dumps(report, indent=2, ensure_ascii=False) if args.json else format_report(report))
    return 0


def _overrides(args: argparse.Namespace, data: dict[str, Any]) -> dict[str, Any]:
    """The pipeline parameters the flags set; --index, --qdrant and --table only where the pipeline has them."""
    from rag_mag.serving.db import pgvector
    from rag_mag.serving.pipelines import parse_overrides

    overrides: dict[str, Any] = {"retriever": args.retriever}
    declared = ((data.get("metadata") or {}).get("rag_mag") or {}).get("parameters") or {}
    for name, value in (("index", args.index), ("qdrant", args.qdrant)):
        if name in declared:
            overrides[name] = value
    if "qdrant" in overrides and not Path(overrides["qdrant"]).is_dir():  # Qdrant would open an empty collection
        raise CheckpointError(f"no Qdrant folder at {overrides['qdrant']}; copy an index into it with "
                              f"`rag-mag export-index INDEX_DIR --qdrant {overrides['qdrant']}`")
    overrides.update(pgvector.table_overrides(data, pgvector.check_table_name(args.table)))
    if args.top_k is not None:
        overrides["top_k"] = args.top_k
    if args.llm_url:
        overrides["llm_url"] = args.llm_url
    for name, value in (("abstain", args.abstain), ("min_score", args.min_score)):
        if value is None:
            continue
        if name not in declared:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag} needs a pipeline that declares the short name {name!r} under "
                              f"metadata.rag_mag.parameters (as pipelines/rag.yaml does); {args.pipeline} declares "
                              f"{', '.join(sorted(declared)) or 'none'}; set it with --set COMPONENT.{name}=VALUE")
        overrides[name] = value
    overrides.update(parse_overrides(args.overrides))
    return overrides


def _answer(args: argparse.Namespace, question: str, overrides: dict[str, Any]) -> dict[str, Any]:
    from rag_mag.serving.answers import answer_report, first_answer
    from rag_mag.serving.pipelines import load_pipeline, named_outputs, question_inputs, run_pipeline
    from rag_mag.serving.source_filters import indexed_files, source_filter, with_filters

    pipeline = load_pipeline(args.pipeline, overrides, preflight=True)
    inputs = question_inputs(pipeline, question)
    if args.source:
        inputs = with_filters(pipeline, inputs, source_filter(args.source, indexed_files(pipeline)))
    result = run_pipeline(pipeline, inputs)
    outputs = named_outputs(pipeline, result)
    answer = first_answer(outputs, source=f"pipeline {args.pipeline}")
    return answer_report(question, answer, outputs.get("queries"))


def _number(value: Any, digits: int = 3) -> str:
    return "?" if value is None else f"{value:.{digits}f}"


def _is_product(source: dict[str, Any]) -> bool:
    """Whether the source's score is its cosine x query norm x document norm (not a fused or keyword score)."""
    parts = [source.get(key) for key in ("score", "cosine", "query_norm", "document_norm")]
    if any(part is None for part in parts):
        return False
    score, cosine, query_norm, document_norm = parts
    return abs(score - cosine * query_norm * document_norm) <= 1e-3 * max(1.0, abs(score))


# Why the sources of an abstention hold no answer, by ``abstained_by`` (RagMagAnswerBuilder).
ABSTAINED_BECAUSE = {"reader": "the reader found no answer in them",
                     "score": "the best one scores under the pipeline's min_score"}


def format_report(report: dict[str, Any]) -> str:
    """``rag_mag.serving.answers.answer_report`` as the text ``rag-mag ask`` prints (the answer marked [[so]]); for
    no answer ("The documents do not say."), the sources are the closest ones, and the heading says so."""
    from rag_mag.serving.answers import citation

    lines = [f"Answer: {report['answer'] or '(empty)'}", ""]
    if report.get("queries") and len(report["queries"]) > 1:
        lines += ["Search rounds:"] + [f"  {i}. {q}" for i, q in enumerate(report["queries"], start=1)] + [""]
    if report.get("answerable", True):
        lines.append("Sources (score = cosine x query norm x document norm):")
    else:
        why = ABSTAINED_BECAUSE.get(report.get("abstained_by"), "no answer in them")
        lines.append(f"Closest sources ({why}; score = cosine x query norm x document norm):")
    for source in report["sources"]:
        hop = f" [round {source['hop']}]" if source.get("hop") else ""
        lines.append(f"  {source['rank']}. {citation(source)} ({source['id']}){hop}")
        parts = (f"{_number(source['cosine'])} x {_number(source['query_norm'])} x "
                 f"{_number(source['document_norm'])}   (raw norms: query {_number(source['query_raw_norm'], 2)}, "
                 f"document {_number(source['document_raw_norm'], 2)})")
        if _is_product(source):
            lines.append(f"     score {_number(source['score'])} = {parts}")
        else:  # a fused score (reciprocal rank fusion, pipelines/rag_hybrid.yaml): the dense parts, where known
            dense = f"; dense score {parts}" if source.get("cosine") is not None else "; a keyword hit"
            lines.append(f"     score {_number(source['score'])} (fused rank score){dense}")
        snippet, span = source["excerpt"], source.get("answer_span")
        if span:  # the answer's words, marked where the passage holds them
            snippet = f"{snippet[:span[0]]}[[{snippet[span[0]:span[1]]}]]{snippet[span[1]:]}"
        lines.append(f"     {snippet}")
    return "\n".join(lines)
