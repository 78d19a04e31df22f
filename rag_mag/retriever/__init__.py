"""The magnitude-aware retriever, without Haystack: strategies, loss, encoder, BM25, diagnostics, interpolation."""
