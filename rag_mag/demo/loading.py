"""Loading the demo's pipelines: one RAG pipeline per index, built from the same YAML and warmed up once.

An index is a FAISS folder (``FAISSEmbeddingRetriever``), or a PostgreSQL table for a pipeline on pgvector
(``PgvectorEmbeddingRetriever``, and ``PgvectorKeywordRetriever`` in pipelines/rag_hybrid.yaml; see
``rag_mag.demo.tables``).

Thread safety: the query encoder of one checkpoint is shared by every pipeline that uses it (see
``rag_mag.components.checkpoints``); ``MagnitudeEncoder.encode`` serializes its callers itself. The
retriever only reads its FAISS index (or its table, on a connection of its own); prompt and answer builders
keep no state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rag_mag.demo.indexes import IndexSpec
from rag_mag.errors import CheckpointError, ConfigError

logger = logging.getLogger(__name__)


@dataclass
class LoadedIndex:
    """An index with its warmed-up pipeline and what the demo needs to know about it."""

    spec: IndexSpec
    pipeline: Any
    strategy: str
    documents: int
    top_k: int
    retrievers: tuple[str, ...]
    answer_generators: tuple[str, ...]
    llm_model: str
    # The components whose documents are the sources shown before the answer (default: the retrievers), and the
    # joiners that also take the request's top_k (pipelines/rag_hybrid.yaml fuses two retrievers' lists).
    source_components: tuple[str, ...] = ()
    joiners: tuple[str, ...] = ()


# ------------------------------------------------------------------------------------------ loading


def components_of(pipeline, class_name: str) -> list[str]:
    return [name for name, instance in pipeline.walk() if type(instance).__name__ == class_name]


def answer_builder_name(pipeline) -> str:
    """The component that builds the answers (``metadata.rag_mag.outputs.answers``)."""
    from rag_mag.serving.pipelines import pipeline_section

    target = str(pipeline_section(pipeline, "outputs").get("answers", "")).split(".")[0]
    if not target:
        raise ConfigError("the pipeline does not declare its answers (metadata.rag_mag.outputs.answers); the demo "
                          "needs it, e.g. answers: answer_builder.answers")
    return target


def answer_generators(pipeline) -> tuple[str, ...]:
    """The vLLM generators whose replies reach the component that builds the answers (these are streamed)."""
    from rag_mag.serving.llm.preflight import iter_vllm_generators

    target = answer_builder_name(pipeline)
    senders = {sender for sender, _ in pipeline.graph.in_edges(target)}
    generators = tuple(name for name, _ in iter_vllm_generators(pipeline) if name in senders)
    if not generators:
        raise ConfigError(f"no VLLMChatGenerator sends its replies to {target!r}; the demo streams the answer from "
                          "the generator connected to the answer builder")
    return generators


def warm_pipeline(pipeline_path: str | Path, overrides: dict[str, Any], llm_url: str):
    """The pipeline with ``overrides``, every vLLM generator pointed at ``llm_url``, warmed up."""
    from rag_mag.serving.pipelines import VLLM_GENERATOR_TYPE, load_pipeline, read_pipeline_dict

    overrides = dict(overrides)
    for name, component in read_pipeline_dict(pipeline_path)["components"].items():
        if isinstance(component, dict) and component.get("type") == VLLM_GENERATOR_TYPE:
            overrides[f"{name}.api_base_url"] = llm_url
    pipeline = load_pipeline(pipeline_path, overrides)
    pipeline.warm_up()
    return pipeline


def load_index(spec: IndexSpec, pipeline_path: str | Path, llm_url: str) -> LoadedIndex:
    """Build and warm up the pipeline of one index; check that the index was built with its retriever."""
    from rag_mag.components.faiss_index import is_index_folder

    if spec.table is not None:
        raise ConfigError(f"index {spec.name!r} is the table {spec.table}: load it with rag_mag.demo.tables.load_table")
    if not is_index_folder(spec.index_dir):
        raise CheckpointError(f"index {spec.name!r}: {spec.index_dir} is not an index folder; build it with "
                              f"`rag-mag index --retriever {spec.retriever_dir} --out {spec.index_dir}`")
    overrides: dict[str, Any] = {"index": str(spec.index_dir), "retriever": str(spec.retriever_dir)}
    pipeline = warm_pipeline(pipeline_path, overrides, llm_url)
    embedders = components_of(pipeline, "RagMagTextEmbedder")
    retrievers = tuple(components_of(pipeline, "FAISSEmbeddingRetriever"))
    if not embedders or not retrievers:
        raise ConfigError(f"{pipeline_path} needs a RagMagTextEmbedder and a FAISSEmbeddingRetriever for the demo; "
                          "for a pipeline on PostgreSQL, pass --table (rag-mag serve --help)")
    embedder = pipeline.get_component(embedders[0])
    store = pipeline.get_component(retrievers[0]).document_store
    indexed_with = store.manifest.get("checkpoint")
    if indexed_with and indexed_with != embedder.checkpoint.fingerprint:
        raise CheckpointError(
            f"index {spec.name!r}: {spec.index_dir} was built with retriever checkpoint {indexed_with}, but "
            f"{spec.retriever_dir} is {embedder.checkpoint.fingerprint}; pair the index with the retriever that "
            "built it, or re-index with `rag-mag index`")
    return loaded_index(spec, pipeline, pipeline_path, retrievers, store.count_documents())


def loaded_index(spec: IndexSpec, pipeline, pipeline_path: str | Path, retrievers: tuple[str, ...],
                 documents: int, **extra: Any) -> LoadedIndex:
    """What the demo keeps of a warmed-up pipeline (its first text embedder gives the strategy)."""
    embedder = pipeline.get_component(components_of(pipeline, "RagMagTextEmbedder")[0])
    generators = answer_generators(pipeline)
    loaded = LoadedIndex(spec=spec, pipeline=pipeline, strategy=embedder.checkpoint.strategy, documents=documents,
                         top_k=pipeline.get_component(retrievers[0]).top_k, retrievers=retrievers,
                         answer_generators=generators, llm_model=pipeline.get_component(generators[0]).model,
                         **extra)
    logger.info("index %s: %d passages, strategy %s, pipeline %s", spec.name, loaded.documents, loaded.strategy,
                pipeline_path)
    return loaded
