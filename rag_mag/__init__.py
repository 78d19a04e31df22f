"""rag-mag: retrieval-augmented QA with magnitude-aware dense retrieval."""

import os

# Haystack's telemetry would post to the network from every process that imports rag_mag before Haystack (the
# CLI, most eval scripts, the tests): off unless the user turns it on. A script that imports Haystack first sets
# it itself (eval/bench_retriever.py).
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

__version__ = "0.1.0"
