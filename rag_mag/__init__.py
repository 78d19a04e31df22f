"""rag-mag: retrieval-augmented QA with magnitude-aware dense retrieval."""

__version__ = "0.1.0"
