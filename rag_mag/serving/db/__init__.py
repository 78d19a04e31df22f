"""The PostgreSQL server of ``rag-mag db`` (start, stop, status) and the pgvector tables of indexed passages."""
