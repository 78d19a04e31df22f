"""The magnitude-aware retriever: similarity strategies, loss, encoder, trainer and its config, mined
training data (BM25), and the norm diagnostics. Nothing here knows of Haystack."""
