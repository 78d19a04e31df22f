"""The real-documents benchmark: every system indexes every collection's folder and ranks its chunks for the
questions of one split; file@1, file@5, page@1 and page@5 per question, hubness and norm-by-length per index.

A config (``eval/configs/realdocs.yaml``) names the collections, the split and the systems. Work is split into
cells, a collection x a system, each saved as JSON under ``<report>/cells/`` with the key of what it depends on (the
system's settings, the retriever's checkpoint, the questions file); a rerun reuses a cell whose key still matches,
so an interrupted run resumes. Indexes live under ``artifacts/bench/folders/`` and are incremental (a rerun of
``index_files`` on an unchanged folder encodes nothing).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rag_mag import durable
from rag_mag.bench.folders.answers import MAX_TOKENS, RAG_TOP_K
from rag_mag.bench.folders.systems import split_overrides
from rag_mag.components.keyword_index import KEYWORD_TITLE_WEIGHT
from rag_mag.errors import ConfigError
from rag_mag.ingestion.hubness import sampled_hubness
from rag_mag.metrics.files import file_at_k, hubness, norm_by_length, page_at_k

logger = logging.getLogger(__name__)

SPLITS = ("validation", "test")
SYSTEM_KINDS = ("rag_mag", "haystack", "haystack_bm25")
RANK_K = 10
CELL_FORMAT = 2  # what a cell holds; a cell of another format is scored again
# How rag-mag's systems rank, in their cells' keys: chunks of the same text are one result citing every file
# (FAISSEmbeddingRetriever.merge_duplicates), dense hits, keyword hits and files fused (its `hybrid`); their cells of
# before are ranked again, their indexes reused.
RAG_MAG_RANKING = f"merged-duplicates hybrid title-x{KEYWORD_TITLE_WEIGHT} file-list-all"


@dataclass(frozen=True)
class SystemSpec:
    name: str
    kind: str
    retriever: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)

    def retriever_path(self) -> Path:
        """The checkpoint folder; a relative path is relative to the repository."""
        from rag_mag.models import REPO_ROOT

        path = Path(self.retriever or "")
        return path if path.is_absolute() else REPO_ROOT / path

    def key(self) -> str:
        """What the system's cells depend on: what its index depends on, and how it ranks."""
        _, ranking = split_overrides(self.overrides)
        if not ranking:
            return self.index_key()
        return hashlib.sha256(json.dumps([self.index_key(), ranking], sort_keys=True).encode()).hexdigest()[:12]

    def index_key(self) -> str:
        """What the system's index depends on: its kind, indexing settings and checkpoint, and the files
        pipeline's text (both kinds read its converters). Systems that differ only in how they rank share it."""
        from rag_mag.components.checkpoints import checkpoint_fingerprint
        from rag_mag.serving.pipelines import default_pipeline

        checkpoint = checkpoint_fingerprint(self.retriever_path()) if self.retriever else None
        pipeline = durable.sha256_of(default_pipeline("index_files"))
        indexing, _ = split_overrides(self.overrides)
        return hashlib.sha256(json.dumps([self.kind, checkpoint, indexing, pipeline], sort_keys=True).encode()
                              ).hexdigest()[:12]


@dataclass(frozen=True)
class FoldersConfig:
    name: str
    collections: list[str]
    systems: list[SystemSpec]
    split: str = "validation"
    output_dir: str | None = None
    reader: str | None = "smollm2-135m-reader"  # None: rank only, no answers
    llm_url: str | None = None
    answer_collections: list[str] | None = None  # None: answer the questions of every collection

    def out_dir(self) -> Path:
        from rag_mag.models import REPO_ROOT

        return Path(self.output_dir) if self.output_dir else REPO_ROOT / "eval" / "reports" / self.name


def load_folders_config(path: str | Path, overrides: dict[str, Any] | None = None) -> FoldersConfig:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"cannot read the benchmark config {path}: {error}") from None
    data = {**(data or {}), **(overrides or {})}
    unknown = set(data) - {"name", "collections", "systems", "split", "output_dir", "notes", "reader", "llm_url",
                           "answer_collections"}
    if unknown:
        raise ConfigError(f"{path}: unknown keys {sorted(unknown)}; a real-documents config has name, collections, "
                          "systems, split, reader, llm_url, answer_collections, output_dir and notes")
    answering = data.get("answer_collections")
    if answering is not None and not set(answering) <= set(data.get("collections") or []):
        raise ConfigError(f"{path}: answer_collections must be some of the collections, got {answering}")
    if data.get("split", "validation") not in SPLITS:
        raise ConfigError(f"{path}: split must be one of {', '.join(SPLITS)}, got {data.get('split')!r}")
    systems = []
    for entry in data.get("systems") or []:
        if not isinstance(entry, dict) or entry.get("kind") not in SYSTEM_KINDS or not entry.get("name"):
            raise ConfigError(f"{path}: each system needs a name and a kind ({', '.join(SYSTEM_KINDS)}), got "
                              f"{entry!r}")
        if entry["kind"] == "rag_mag" and not entry.get("retriever"):
            raise ConfigError(f"{path}: system {entry['name']} (rag_mag) needs a retriever checkpoint folder")
        systems.append(SystemSpec(entry["name"], entry["kind"], entry.get("retriever"), dict(entry.get("set") or {})))
    if not systems or not data.get("collections") or not data.get("name"):
        raise ConfigError(f"{path}: name, collections and systems are required")
    return FoldersConfig(name=str(data["name"]), collections=list(data["collections"]), systems=systems,
                         split=data.get("split", "validation"), output_dir=data.get("output_dir"),
                         reader=data.get("reader", "smollm2-135m-reader"), llm_url=data.get("llm_url"),
                         answer_collections=answering)


def make_system(spec: SystemSpec):
    from rag_mag.bench.folders.systems import HaystackStockSystem, RagMagSystem

    if spec.kind == "rag_mag":
        retriever = spec.retriever_path()
        if not retriever.is_dir():
            raise ConfigError(f"system {spec.name}: no retriever checkpoint at {retriever}")
        return RagMagSystem(spec.name, retriever, dict(spec.overrides))
    return HaystackStockSystem(spec.name, mode="bm25" if spec.kind == "haystack_bm25" else "embedding")


def score_rankings(questions, rankings: list[list[str]], chunks: dict) -> dict[str, Any]:
    """Per-question file@1/5 and page@1/5 of answerable questions (page only where a page is known)."""
    per: dict[str, list[float]] = {"file@1": [], "file@5": [], "page@1": [], "page@5": []}
    ids: dict[str, list[str]] = {"file": [], "page": []}
    for question, ranking in zip(questions, rankings, strict=True):
        if not question.answerable:
            continue
        files = [(chunks[chunk_id].file, *chunks[chunk_id].copies) for chunk_id in ranking]
        per["file@1"].append(file_at_k(files, question.files, 1))
        per["file@5"].append(file_at_k(files, question.files, 5))
        ids["file"].append(question.id)
        if question.pages:
            pages = [(chunks[c].file, chunks[c].page, chunks[c].page_end) for c in ranking]
            per["page@1"].append(page_at_k(pages, question.files, question.pages, 1))
            per["page@5"].append(page_at_k(pages, question.files, question.pages, 5))
            ids["page"].append(question.id)
    return {"per_question": per, "question_ids": ids}


def run_cell(spec: SystemSpec, collection, questions, index_dir: Path) -> dict[str, Any]:
    started = time.perf_counter()
    system = make_system(spec)
    system.index(collection.folder / "files" if (collection.folder / "files").is_dir() else collection.folder,
                 index_dir)
    chunks = {chunk.id: chunk for chunk in system.chunks()}
    rankings = system.rank([q.question for q in questions], RANK_K)
    cell = score_rankings(questions, rankings, chunks)
    norms = [(c.raw_norm, c.words) for c in chunks.values() if c.raw_norm is not None]
    cell.update({
        "system": spec.name, "collection": collection.name, "n_chunks": len(chunks),
        "chunk_words": sorted(c.words for c in chunks.values()),
        "hubness@5": hubness(rankings, len(chunks), k=5, share=0.01),
        "chunk_hubness": sampled_hubness([(c.id, c.text) for c in chunks.values()], system.rank),
        "norm_by_length": norm_by_length(*zip(*norms, strict=True)) if len(norms) > 1 else None,
        "rankings": {q.id: ranking for q, ranking in zip(questions, rankings, strict=True)},
        "passages": {q.id: [chunks[c].text for c in ranking[:RAG_TOP_K]] for q, ranking in zip(questions, rankings,
                                                                                               strict=True)},
        "seconds": round(time.perf_counter() - started, 1)})
    return cell


def read_cell(path: Path) -> dict[str, Any] | None:
    """A saved cell, or None where there is none or it cannot be read (it is scored again)."""
    try:
        cell = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        logger.warning("cell %s cannot be read (%s): scoring it again", path, error)
        return None
    return cell if isinstance(cell, dict) else None


class FoldersRunner:
    def __init__(self, config: FoldersConfig, data_root: Path, only: list[str] | None = None) -> None:
        names = [s.name for s in config.systems]
        unknown = [name for name in only or () if name not in names]
        if unknown:
            raise ConfigError(f"--only: {', '.join(unknown)} is not a system of this config; its systems are: "
                              + ", ".join(names))
        self.config, self.data_root, self.only = config, data_root, list(only or ())

    def collection(self, entry: str):
        """A collection of the registry by name (prepared once under artifacts/), or a folder of a user's own
        (``files/`` and ``questions.jsonl``, see rag_mag/bench/folders/collections.py) by path."""
        from rag_mag.bench.folders.collections import COLLECTIONS, load_collection, prepare_collection
        from rag_mag.models import artifacts_dir

        if entry in COLLECTIONS:
            return prepare_collection(entry, artifacts_dir() / "bench" / "collections" / entry, self.data_root)
        if not Path(entry).is_dir():
            raise ConfigError(f"collection {entry!r} is neither a known collection ({', '.join(COLLECTIONS)}) nor a "
                              "folder holding files/ and questions.jsonl")
        return load_collection(Path(entry))

    def run(self) -> Path:
        """Rank every (collection, system) cell first (encoding has both cores to itself), then answer from the
        rankings on one vLLM server, then write the report."""
        from rag_mag.bench.folders.collections import question_split, read_questions
        from rag_mag.bench.folders.report import write_report

        out = self.config.out_dir()
        cells, names, questions_of = {}, [], {}
        for entry in self.config.collections:
            collection = self.collection(entry)
            names.append(collection.name)
            questions = question_split(read_questions(collection.questions_path), self.config.split)
            questions_of[collection.name] = questions
            digest = durable.sha256_of(collection.questions_path)
            for spec in self.config.systems:
                if not self.only or spec.name in self.only:
                    cells[(collection.name, spec.name)] = self.ranked(spec, collection, questions, digest, out)
        if self.config.reader:
            self.answer(cells, questions_of, out)
        if not self.only:
            write_report(self.config, names, cells, out)
        return out

    def ranked(self, spec: SystemSpec, collection, questions, digest: str, out: Path) -> dict[str, Any]:
        """The cell of ``spec`` on ``collection``: reused where its key matches, else indexed and ranked now."""
        from rag_mag.models import artifacts_dir

        system_key = spec.key()
        ranking = RAG_MAG_RANKING if spec.kind == "rag_mag" else ""
        key = hashlib.sha256(f"{CELL_FORMAT} {system_key} {digest} {self.config.split}{ranking}".encode()
                             ).hexdigest()[:12]
        path = out / "cells" / f"{collection.name}__{spec.name}.json"
        cell = read_cell(path)
        if cell is None or cell.get("key") != key:
            logger.info("scoring %s on %s (%d questions)", spec.name, collection.name, len(questions))
            folders = artifacts_dir() / "bench" / "folders" / collection.name
            index_key = spec.index_key()  # an index another system of the same indexing built is reused
            index_dir = next(iter(sorted(folders.glob(f"*-{index_key}"))), folders / f"{spec.name}-{index_key}")
            cell = {**run_cell(spec, collection, questions, index_dir), "key": key}
            path.parent.mkdir(parents=True, exist_ok=True)
            durable.write_text(path, json.dumps(cell))
        return cell

    def answer(self, cells: dict, questions_of: dict, out: Path) -> None:
        """The reader's answers of every cell that has none for this reader yet, on one vLLM server."""
        from rag_mag.bench.folders.answers import answer_cell, score_answers
        from rag_mag.serving.llm.readers import reader_checksum
        from rag_mag.serving.llm.server import running_server
        from rag_mag.serving.pipelines import default_pipeline

        reader = durable.sha256_of(default_pipeline("reader"))
        weights = reader_checksum(self.config.reader)  # a retrained reader of the same name answers again
        settings = f"{self.config.reader} {weights} {reader} {RAG_TOP_K} {MAX_TOKENS}"
        cache = out / "cache" / f"answers-{hashlib.sha256(weights.encode()).hexdigest()[:12]}.jsonl"
        answering = self.config.answer_collections
        pending = {pair: cell for pair, cell in cells.items() if (answering is None or pair[0] in answering)
                   and cell.get("answers_key") != hashlib.sha256(f"{settings} {cell['key']}".encode()).hexdigest()}
        if not pending:
            return
        with running_server(self.config.llm_url, start=True, model=self.config.reader) as url:
            for (collection, system), cell in pending.items():
                questions = questions_of[collection]
                cell["predictions"] = answer_cell(cell, questions, url, self.config.reader, cache)
                cell["answer_scores"] = score_answers(questions, cell["predictions"])
                cell["answers_key"] = hashlib.sha256(f"{settings} {cell['key']}".encode()).hexdigest()
                durable.write_text(out / "cells" / f"{collection}__{system}.json", json.dumps(cell))
