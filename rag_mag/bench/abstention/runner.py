"""The abstention benchmark: does the reader say "the documents do not say" when, and only when, they do not?

``rag-mag bench eval/configs/abstention.yaml`` (a config with an ``abstention:`` section). Every reader of the
config answers every item of ``sets.py`` through ``pipelines/reader.yaml`` (the product's answer builder,
``abstain: auto``) on a vLLM server started for it; each generation is cached under the report's ``cache/``
by the reader's weights, so an interrupted run resumes and a retrained reader is asked again.

Scored per reader, set and system, for two abstention signals:

* ``reader``: the reader's own reply (``unanswerable``), what the product uses;
* ``reader+passages``: also abstain when the answer does not occur in the passages shown.

On questions that have an answer: EM and F1 (an abstention scores 0), the false-abstention rate, and that rate
where the passages hold the answer; on questions that have none: the abstention rate. Abstention precision,
recall and F1 (an abstention is a positive; a question without an answer is one) with bootstrap intervals, and on
the Wikipedia sets EM paired with the committed report's on the same questions and passages.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rag_mag import durable
from rag_mag.bench.abstention.sets import Item
from rag_mag.errors import ConfigError

logger = logging.getLogger(__name__)

MAX_TOKENS = 16  # the Wikipedia benchmark's max_tokens (eval/configs/cpu.yaml)
KEYS = {"name", "abstention", "readers", "output_dir", "llm_url", "notes"}
SECTION_KEYS = {"report", "datasets", "systems", "clapnq", "realdocs_report", "collections", "realdocs_systems"}


@dataclass(frozen=True)
class AbstentionConfig:
    name: str
    readers: dict[str, str]                 # label -> served model name or merged model folder
    report: str = "eval/reports/cpu"        # committed report whose rag rows' passages are answered again
    datasets: list[str] = field(default_factory=list)
    systems: list[str] = field(default_factory=list)
    clapnq: str | None = None               # folder of clapnq_dev_{answerable,unanswerable}.jsonl
    realdocs_report: str | None = None
    collections: list[str] = field(default_factory=list)
    realdocs_systems: list[str] = field(default_factory=list)
    output_dir: str | None = None
    llm_url: str | None = None

    def out_dir(self) -> Path:
        from rag_mag.models import REPO_ROOT

        return Path(self.output_dir) if self.output_dir else REPO_ROOT / "eval" / "reports" / self.name


def is_abstention_config(data: Any) -> bool:
    return isinstance(data, dict) and "abstention" in data


def load_abstention_config(path: str | Path, data_root: Path | None) -> AbstentionConfig:
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"cannot read the benchmark config {path}: {error}") from None
    section = data.get("abstention") or {}
    unknown = (set(data) - KEYS) | {f"abstention.{key}" for key in set(section) - SECTION_KEYS}
    if unknown:
        raise ConfigError(f"{path}: unknown keys {sorted(unknown)}; an abstention config has {sorted(KEYS)} and "
                          f"under abstention: {sorted(SECTION_KEYS)}")
    readers = data.get("readers")
    if not data.get("name") or not isinstance(readers, dict) or not readers:
        raise ConfigError(f"{path}: name and readers (label: served model name or merged model folder) are required")
    clapnq = section.get("clapnq")
    if clapnq and "{data_root}" in clapnq:
        if data_root is None:
            raise ConfigError(f"{path}: clapnq refers to {{data_root}}; pass --data-root or set RAG_MAG_DATA_ROOT")
        clapnq = clapnq.replace("{data_root}", str(data_root))
    return AbstentionConfig(name=str(data["name"]), readers={str(k): str(v) for k, v in readers.items()},
                            report=section.get("report", "eval/reports/cpu"),
                            datasets=list(section.get("datasets") or []), systems=list(section.get("systems") or []),
                            clapnq=clapnq, realdocs_report=section.get("realdocs_report"),
                            collections=list(section.get("collections") or []),
                            realdocs_systems=list(section.get("realdocs_systems") or []),
                            output_dir=data.get("output_dir"), llm_url=data.get("llm_url"))


def build_items(config: AbstentionConfig, data_root: Path | None) -> list[Item]:
    from rag_mag.bench.abstention import sets
    from rag_mag.models import REPO_ROOT

    items: list[Item] = []
    for dataset in config.datasets:
        for system in config.systems:
            items += sets.wiki_items(REPO_ROOT / config.report, dataset, system, data_root)
    if config.clapnq:
        items += sets.clapnq_items(Path(config.clapnq))
    if config.collections:
        from rag_mag.bench.folders.collections import prepare_collection, question_split, read_questions
        from rag_mag.models import artifacts_dir

        if data_root is None:
            raise ConfigError("the real-documents collections need the shared data: pass --data-root")
        for name in config.collections:
            collection = prepare_collection(name, artifacts_dir() / "bench" / "collections" / name, data_root)
            questions = question_split(read_questions(collection.questions_path), "test")
            for system in config.realdocs_systems:
                items += sets.realdocs_items(REPO_ROOT / config.realdocs_report, name, questions, system)
    return items


def answer_items(items: list[Item], model: str, url: str, cache_path: Path) -> list[dict[str, Any]]:
    """The reader's reply to every item through pipelines/reader.yaml: ``{reply, answerable}``."""
    from haystack import Document

    from rag_mag.bench.generation import BenchPipeline, GenerationCache, generator_overrides
    from rag_mag.metrics.answers import clean_answer
    from rag_mag.serving.answers import first_answer
    from rag_mag.serving.pipelines import default_pipeline

    path = default_pipeline("reader")
    overrides = {**generator_overrides(path, url, timeout=900.0, max_retries=2, model=model),
                 "max_tokens": MAX_TOKENS, "abstain": "auto"}
    pipeline = BenchPipeline(path, overrides, GenerationCache(cache_path), retry_waits=(10, 30, 60))
    inputs = [{"question": item.question,
               "documents": [Document(content=text, meta={"title": title}) for title, text in item.passages]}
              for item in items]

    def extract(outputs: dict[str, Any]) -> dict[str, Any]:
        answer = first_answer(outputs)
        return {"reply": clean_answer(answer.meta.get("reply", answer.data or "")),
                "answerable": answer.meta.get("answerable", True) is not False}

    return pipeline.run_many(inputs, extract, progress=f"abstention:{Path(model).name}")


def run(config: AbstentionConfig, data_root: Path | None) -> Path:
    from rag_mag.bench.abstention.report import write_report
    from rag_mag.bench.abstention.scoring import SIGNALS, score_group
    from rag_mag.serving.llm.readers import reader_checksum
    from rag_mag.serving.llm.server import running_server

    out = config.out_dir()
    items = build_items(config, data_root)
    logger.info("abstention benchmark: %d items (%d without an answer in their passages)", len(items),
                sum(not i.held for i in items))
    results: dict[str, Any] = {"name": config.name, "readers": {}, "groups": []}
    for label, model in config.readers.items():
        identity = reader_checksum(model)
        cache = out / "cache" / f"{hashlib.sha256(identity.encode()).hexdigest()[:16]}.jsonl"
        with running_server(config.llm_url, start=True, model=model) as url:
            replies = answer_items(items, model, url, cache)
        results["readers"][label] = {"model": model, "identity": identity}
        groups: dict[tuple[str, str], list[int]] = {}
        for number, item in enumerate(items):
            groups.setdefault((item.set, item.system), []).append(number)
        for (set_name, system), numbers in groups.items():
            for signal in SIGNALS:
                results["groups"].append({"reader": label, "set": set_name, "system": system, "signal": signal,
                                          **score_group([items[n] for n in numbers], [replies[n] for n in numbers],
                                                        signal)})
        predictions = [{"set": i.set, "system": i.system, "id": i.id, "held": i.held, **r}
                       for i, r in zip(items, replies, strict=True)]
        durable.write_text(out / f"predictions-{label}.jsonl",
                           "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in predictions))
    durable.write_text(out / "results.json", json.dumps(results, indent=2) + "\n")
    write_report(config, results, out)
    return out
