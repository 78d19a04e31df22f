"""A retriever's training data: triples mined with BM25, hard negatives, linked positives, and build-data's spec."""
