"""Serving: the YAML pipelines (load, override, pre-flight, run), answers, and the servers of llm/ and db/.

Indexing a user's files or a corpus is ``rag_mag.ingestion``, the layer above this one."""
