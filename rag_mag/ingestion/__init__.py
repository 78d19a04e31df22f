"""Ingestion: a user's files and corpora found, checked, converted, split, planned and written into an index.

``files`` finds and checks files, ``file_indexing`` plans and runs incremental indexing of files through
pipelines/index_files.yaml, ``file_targets`` writes the chunks into FAISS or PostgreSQL, and ``indexing`` indexes a
JSONL corpus in streamed, resumable shards. It sits above ``serving`` (it builds serving's pipelines and uses its
database) and below ``bench``, ``adapt``, ``demo`` and ``cli``, which index through it.
"""
