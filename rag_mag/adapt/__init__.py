"""Adapting the retriever to a folder of documents (``rag-mag adapt``): synthetic pairs, splits, training, test."""
