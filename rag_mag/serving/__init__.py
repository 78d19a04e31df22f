"""Serving: the YAML pipelines (load, override, pre-flight, run), indexing, and the servers of llm/ and db/."""
