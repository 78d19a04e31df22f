"""Ingestion of a folder of files: rag-mag's incremental indexer against Haystack's stock indexing pipeline.

The folder: ``--files`` documents (default 1,000) made from the shared wiki_pool passages, ``--passages-per-file``
consecutive passages each, written in turn as Markdown, HTML and PDF (fpdf2, one page per passage).

In one run, each in its own process (for its peak memory, from getrusage):

1. ``stock``: Haystack's stock pipeline: FileTypeRouter, the same converters, DocumentCleaner, DocumentSplitter
   (100 words, overlap 20; without NLTK's punkt data it cannot keep sentences whole), the same MiniLM in
   ``SentenceTransformersDocumentEmbedder`` (fp32, as it ships), DocumentWriter into an ``InMemoryDocumentStore``.
2. ``rag-mag``: ``rag-mag index FOLDER`` (pipelines/index_files.yaml) with the default retriever (MiniLM trained
   in-repo, qnorm), at ``precision: auto``, into a FAISS index folder, from empty;
3. ``rag-mag incremental``: then ``--changed`` percent of the files (default 1%) get a sentence more, and the same
   command runs again on the index of step 2.
Then the index is verified (``rag-mag index --verify``).

    .venv/bin/python eval/bench_ingest.py          # about 10 minutes on 2 cores; stop the vLLM server first

Prints one JSON object and writes it to ``--out``. ``seconds`` include loading the model, as a user's command does
(Python's start and imports of the command line are in ``process_seconds``); rag-mag's rows also give the model's
load time apart, a fixed cost that a small incremental run cannot spread.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CORPUS = REPO_ROOT.parent / "shared" / "data" / "wiki_pool" / "wiki_pool_corpus.jsonl.gz"
RETRIEVER = REPO_ROOT / "artifacts" / "retriever-default"
OUT = REPO_ROOT / "eval" / "reports" / "ingest" / "results.json"
KINDS = ("md", "html", "pdf")


def read_passages(count: int) -> list[dict]:
    opener = gzip.open if CORPUS.suffix == ".gz" else open
    passages = []
    with opener(CORPUS, "rt", encoding="utf-8") as handle:
        for line in handle:
            passages.append(json.loads(line))
            if len(passages) == count:
                break
    return passages


def write_document(path: Path, kind: str, passages: list[dict]) -> None:
    if kind == "md":
        path.write_text("".join(f"# {p['title']}\n\n{p['text']}\n\n" for p in passages))
    elif kind == "html":
        import html

        body = "".join(f"<h2>{html.escape(p['title'])}</h2><p>{html.escape(p['text'])}</p>" for p in passages)
        path.write_text(f"<html><head><title>{html.escape(passages[0]['title'])}</title></head><body><article>"
                        f"{body}</article></body></html>")
    else:
        from fpdf import FPDF

        pdf = FPDF()
        for passage in passages:  # the core fonts are Latin-1: other characters become "?"
            pdf.add_page()
            pdf.set_font("Helvetica", size=11)
            text = f"{passage['title']}\n{passage['text']}"
            pdf.multi_cell(0, 6, text.encode("latin-1", "replace").decode("latin-1"))
        pdf.output(str(path))


def make_folder(folder: Path, files: int, per_file: int) -> None:
    passages = read_passages(files * per_file)
    folder.mkdir(parents=True, exist_ok=True)
    for number in range(files):
        kind = KINDS[number % len(KINDS)]
        write_document(folder / f"doc{number:05d}.{kind}", kind, passages[number * per_file:(number + 1) * per_file])


def change_files(folder: Path, percent: float) -> list[str]:
    """Append a sentence to every (100 / percent)-th Markdown or HTML file: ``percent`` of the files change."""
    names = sorted(p.name for p in folder.iterdir())
    step = max(1, round(100 / percent))
    changed = names[::step]
    for name in changed:
        path = folder / name
        if name.endswith(".pdf"):  # rewrite a PDF with one passage more
            from pypdf import PdfReader, PdfWriter

            writer = PdfWriter(clone_from=PdfReader(path))
            writer.add_blank_page()
            writer.write(path)
        else:
            path.write_text(path.read_text().replace("</article>", "<p>An edited line.</p></article>")
                            if name.endswith(".html") else path.read_text() + "\nAn edited line.\n")
    return changed


# ------------------------------------------------------------------------------------------- children
def child_stock(folder: Path) -> dict:
    from haystack import Pipeline
    from haystack.components.converters import HTMLToDocument, MarkdownToDocument, PyPDFToDocument
    from haystack.components.joiners import DocumentJoiner
    from haystack.components.preprocessors import DocumentCleaner, DocumentSplitter
    from haystack.components.routers import FileTypeRouter
    from haystack.components.writers import DocumentWriter
    from haystack.document_stores.in_memory import InMemoryDocumentStore
    from haystack_integrations.components.embedders.sentence_transformers import (
        SentenceTransformersDocumentEmbedder,
    )

    from rag_mag.models import default_retriever_base

    started = time.perf_counter()
    store = InMemoryDocumentStore(embedding_similarity_function="dot_product")
    pipeline = Pipeline()
    pipeline.add_component("router", FileTypeRouter(mime_types=["text/markdown", "text/html", "application/pdf"]))
    pipeline.add_component("markdown", MarkdownToDocument(progress_bar=False))
    pipeline.add_component("html", HTMLToDocument())
    pipeline.add_component("pdf", PyPDFToDocument())
    pipeline.add_component("joiner", DocumentJoiner())
    pipeline.add_component("cleaner", DocumentCleaner())
    pipeline.add_component("splitter", DocumentSplitter(split_by="word", split_length=100, split_overlap=20))
    pipeline.add_component("embedder", SentenceTransformersDocumentEmbedder(model=default_retriever_base(),
                                                                            batch_size=32, progress_bar=False))
    pipeline.add_component("writer", DocumentWriter(document_store=store))
    for mime, name in (("text/markdown", "markdown"), ("text/html", "html"), ("application/pdf", "pdf")):
        pipeline.connect(f"router.{mime}", f"{name}.sources")
        pipeline.connect(f"{name}.documents", "joiner.documents")
    for sender, receiver in (("joiner", "cleaner"), ("cleaner", "splitter"), ("splitter", "embedder"),
                             ("embedder", "writer")):
        pipeline.connect(f"{sender}.documents", f"{receiver}.documents")
    import mimetypes

    mimetypes.add_type("text/markdown", ".md")
    sources = sorted(folder.iterdir())
    pipeline.run({"router": {"sources": sources}})
    return {"files": len(sources), "chunks": store.count_documents(), "seconds": time.perf_counter() - started}


def child_rag_mag(folder: Path, out: Path) -> dict:
    from rag_mag.components.checkpoints import load_checkpoint
    from rag_mag.ingestion.file_indexing import index_files

    started = time.perf_counter()
    load_checkpoint(str(RETRIEVER))  # the encoder, loaded once per process (index_files reuses it): timed apart
    model_seconds = time.perf_counter() - started
    precision = os.environ.get("BENCH_INGEST_PRECISION", "auto")
    summary = index_files([str(folder)], out, RETRIEVER, progress=False,
                          overrides={"embedder.precision": precision})
    assert not summary.plan.skipped, summary.plan.skipped
    return {"files": len(summary.plan.added) + len(summary.plan.changed), "chunks": summary.chunks_encoded,
            "chunks_removed": summary.chunks_removed, "unchanged_files": len(summary.plan.unchanged),
            "index_chunks": summary.index_chunks, "seconds": model_seconds + summary.seconds,
            "model_load_seconds": round(model_seconds, 2), "seconds_without_model_load": round(summary.seconds, 2)}


def run_child(args: list[str]) -> dict:
    """Run this script as a child for one system; its result and its peak RSS."""
    code = ("import resource, subprocess, sys; c = subprocess.call(sys.argv[1:]); "
            "print('PEAK_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(c)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HAYSTACK_TELEMETRY_ENABLED": "False",
           "TOKENIZERS_PARALLELISM": "false"}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, sys.executable, __file__, "--child", *args], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{args} failed:\n{done.stderr[-3000:]}")
    lines = done.stdout.splitlines()
    result = json.loads(next(line for line in lines if line.startswith("{")))
    result["peak_rss_mb"] = round(int(lines[-1].split()[1]) / 1024, 1)
    result["process_seconds"] = round(time.perf_counter() - started, 2)
    result["files_per_s"] = round(result["files"] / result["seconds"], 2)
    result["chunks_per_s"] = round(result["chunks"] / result["seconds"], 2)
    result["seconds"] = round(result["seconds"], 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--passages-per-file", type=int, default=2)
    parser.add_argument("--changed", type=float, default=1.0, help="percent of the files changed before the rerun")
    parser.add_argument("--precision", choices=["auto", "fp32"], default="auto",
                        help="rag-mag's encoding precision; fp32 is what `auto` picks on a CPU without native bf16")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        system, folder = args.child[0], Path(args.child[1])
        result = child_stock(folder) if system == "stock" else child_rag_mag(folder, Path(args.child[2]))
        print(json.dumps(result))
        return
    from rag_mag.precision import use_bf16

    os.environ["BENCH_INGEST_PRECISION"] = args.precision

    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        folder, index = Path(tmp) / "docs", Path(tmp) / "index"
        started = time.perf_counter()
        make_folder(folder, args.files, args.passages_per_file)
        made = time.perf_counter() - started
        stock = run_child(["stock", str(folder)])
        full = run_child(["rag-mag", str(folder), str(index)])
        changed = change_files(folder, args.changed)
        incremental = run_child(["rag-mag", str(folder), str(index)])
        verified = subprocess.run([sys.executable, "-m", "rag_mag.cli.main", "index", "--verify", str(index)],
                                  cwd=REPO_ROOT, capture_output=True, text=True).returncode == 0
    report = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "bf16_native": use_bf16("auto", "cpu")}, "rag_mag_precision": args.precision,
        "folder": {"files": args.files, "passages_per_file": args.passages_per_file, "kinds": list(KINDS),
                   "seconds_to_make": round(made, 1)},
        "stock_haystack": stock, "rag_mag_full": full,
        "rag_mag_incremental": {**incremental, "files_changed": len(changed)},
        "ratios": {"chunks_per_s_rag_mag_over_stock": round(full["chunks_per_s"] / stock["chunks_per_s"], 2),
                   "files_per_s_rag_mag_over_stock": round(full["files_per_s"] / stock["files_per_s"], 2),
                   "incremental_over_full_seconds": round(incremental["seconds"] / full["seconds"], 3),
                   "incremental_over_full_without_model_load": round(
                       incremental["seconds_without_model_load"] / full["seconds_without_model_load"], 3),
                   "incremental_over_full_process_seconds": round(incremental["process_seconds"]
                                                                  / full["process_seconds"], 3)},
        "index_verified": verified,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
