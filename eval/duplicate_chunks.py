"""How many chunks of an index repeat another chunk's text, within one file and across files (issue 60).

Exact duplicates have the same text once lowercased with punctuation and whitespace collapsed; near duplicates share
at least 80% of their 5-word shingles (Jaccard), found among chunks whose four smallest shingle hashes agree (a
MinHash-style bucket, so a lower bound).

    .venv/bin/python eval/duplicate_chunks.py artifacts/bench/folders/*/cosine-*

Prints one line per index folder.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SHINGLE = 5
NEAR = 0.8


def normalized(text: str) -> str:
    return re.sub(r"\W+", " ", (text or "").lower()).strip()


def shingles(text: str) -> set[str]:
    words = normalized(text).split()
    return {" ".join(words[i:i + SHINGLE]) for i in range(max(1, len(words) - SHINGLE + 1))}


def count(documents) -> dict[str, int]:
    exact: dict[str, list] = defaultdict(list)
    for document in documents:
        exact[normalized(document.content)].append(document.meta.get("file"))
    buckets: dict[tuple, list] = defaultdict(list)
    for document in documents:
        hashes = sorted(int(hashlib.md5(s.encode()).hexdigest()[:8], 16) for s in shingles(document.content))
        buckets[tuple(hashes[:4])].append(document)
    near = 0
    for group in buckets.values():
        first = shingles(group[0].content)
        near += sum(len(first & (other := shingles(d.content))) / len(first | other) >= NEAR for d in group[1:])
    return {"chunks": len(documents),
            "exact_duplicates": sum(len(files) - 1 for files in exact.values()),
            "exact_across_files": sum(len(files) - 1 for files in exact.values() if len(set(files)) > 1),
            "near_duplicates": near}


def main() -> int:
    from rag_mag.components.faiss_document_store import FAISSDocumentStore

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("indexes", nargs="+", help="FAISS index folders of files (rag-mag index PATH --out DIR)")
    args = parser.parse_args()
    for folder in args.indexes:
        figures = count(FAISSDocumentStore(path=folder).filter_documents())
        share = 100 * figures["exact_duplicates"] / max(1, figures["chunks"])
        print(f"{folder}: {figures['chunks']} chunks; exact duplicates {figures['exact_duplicates']} ({share:.1f}%), "
              f"{figures['exact_across_files']} of them of another file's chunk; near duplicates (>= {NEAR:.0%} "
              f"of 5-word shingles) {figures['near_duplicates']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
