"""Haystack components of rag-mag (one per module). The YAML pipelines in pipelines/ name them by
their module path, e.g. ``rag_mag.components.faiss_retriever.FAISSEmbeddingRetriever``."""

from rag_mag.components.corpus_reader import CorpusReader
from rag_mag.components.document_embedder import RagMagDocumentEmbedder
from rag_mag.components.faiss_document_store import FAISSDocumentStore
from rag_mag.components.faiss_retriever import FAISSEmbeddingRetriever
from rag_mag.components.followup_query import FollowUpQuery
from rag_mag.components.hop_accumulator import HopAccumulator
from rag_mag.components.score_explainer import ScoreExplainer
from rag_mag.components.text_embedder import RagMagTextEmbedder

__all__ = ["CorpusReader", "FAISSDocumentStore", "FAISSEmbeddingRetriever", "FollowUpQuery", "HopAccumulator",
           "RagMagDocumentEmbedder", "RagMagTextEmbedder", "ScoreExplainer"]
