"""The EM/F1 and retrieval benchmark behind ``rag-mag bench`` (see rag_mag/bench/runner.py)."""
