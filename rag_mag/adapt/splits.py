"""The synthetic pairs of a folder, split by file into train / validation / test (``DIR/splits/``).

A pair's split is its file's, so no file is in two splits: the test figures are measured on files that neither
training nor checkpoint selection saw. A file's place is the sha256 of its path with a fixed salt, read as a
number in [0, 1): train below ``1 - val - test``, validation next, test at the top. The same file always lands
in the same split, also when files are added or removed. With few files that rule can leave a split empty; then
the file nearest the empty split's interval moves there from the largest split, so every split holds a file.

Two more rules keep the splits apart: a training pair whose question is also a validation or test question is
dropped (the trainer refuses validation questions it trains on), and a hard negative whose chunk belongs to a
file of another split is dropped from its pair (a test chunk is never shown to training).

``splits.json`` records the files and pair counts per split, the sha256 of the pairs, the corpus and each split
file, and the settings. A rerun reuses the splits when all of these match and rebuilds them otherwise.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rag_mag import durable
from rag_mag.data import iter_jsonl, write_jsonl
from rag_mag.errors import ConfigError, DataError

logger = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
SPLIT_SALT = "rag-mag adapt split v1"
MIN_FILES = 3  # one for each split
DEFAULT_VAL_FRACTION = 0.1
DEFAULT_TEST_FRACTION = 0.1
DEFAULT_MIN_PAIRS = 20  # pairs the train and test splits need at least
MANIFEST_NAME = "splits.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class PairsFolder:
    """What ``rag_mag.adapt.synth`` writes: ``pairs.jsonl``, ``corpus.jsonl`` and (optional) ``synth.json``."""

    path: Path

    @property
    def pairs(self) -> Path:
        return self.path / "pairs.jsonl"

    @property
    def corpus(self) -> Path:
        return self.path / "corpus.jsonl"

    @property
    def manifest(self) -> Path:
        return self.path / "synth.json"

    def check(self) -> PairsFolder:
        missing = [path.name for path in (self.pairs, self.corpus) if not path.is_file()]
        if missing:
            raise DataError(f"the pairs folder {self.path} lacks {' and '.join(missing)}; give the folder that "
                            "synthesis wrote (pairs.jsonl and corpus.jsonl), or leave out --pairs to synthesize")
        return self


def ids_digest(ids: Iterable[str]) -> str:
    """sha256 of the ids sorted and joined by newlines: which pairs a figure was measured on."""
    return hashlib.sha256("\n".join(sorted(ids)).encode("utf-8")).hexdigest()


def file_position(file: str) -> float:
    """The file's place in [0, 1): the first 8 bytes of sha256(salt NUL path)."""
    digest = hashlib.sha256(f"{SPLIT_SALT}\0{file}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64


def check_fractions(val_fraction: float, test_fraction: float) -> dict[str, float]:
    """The three fractions; ConfigError unless validation and test are positive and leave training a share."""
    for name, value in (("validation", val_fraction), ("test", test_fraction)):
        if not (math.isfinite(value) and 0.0 < value < 1.0):
            raise ConfigError(f"the {name} fraction must be in (0, 1), got {value}")
    if val_fraction + test_fraction >= 1.0:
        raise ConfigError(f"the validation and test fractions ({val_fraction} + {test_fraction}) must leave a share "
                          "for training: their sum must be below 1")
    return {"train": 1.0 - val_fraction - test_fraction, "val": val_fraction, "test": test_fraction}


def assign_files(files: Iterable[str], val_fraction: float = DEFAULT_VAL_FRACTION,
                 test_fraction: float = DEFAULT_TEST_FRACTION) -> dict[str, str]:
    """``{file: split}`` by the rule of the module docstring; at least ``MIN_FILES`` distinct files."""
    fractions = check_fractions(val_fraction, test_fraction)
    files = sorted(set(files))
    if len(files) < MIN_FILES:
        raise ConfigError(f"the pairs come from {len(files)} file(s) ({', '.join(files) or 'none'}); adapt splits "
                          f"by file and needs at least {MIN_FILES} (one each for train, validation and test): add "
                          "documents to the folder")
    intervals, low = {}, 0.0
    for name in SPLITS:
        intervals[name] = (low, low + fractions[name])
        low += fractions[name]
    split_of = {file: next((name for name in SPLITS if file_position(file) < intervals[name][1]), "test")
                for file in files}
    for name in ("test", "val", "train"):
        if name in split_of.values():
            continue
        counts = {split: sum(1 for s in split_of.values() if s == split) for split in SPLITS}
        donor = max(SPLITS, key=lambda split: counts[split])  # ties: train first
        center = sum(intervals[name]) / 2.0
        moved = min((file for file in files if split_of[file] == donor),
                    key=lambda file: (abs(file_position(file) - center), file))
        split_of[moved] = name
    return split_of


# ------------------------------------------------------------------------------------ reading the pairs folder
def read_pair_records(path: Path) -> list[dict]:
    """The pairs of ``pairs.jsonl`` as written (every key kept), each checked for ``id``, ``query``, ``file`` and
    a first positive with an ``id``; ids must be unique."""
    records, seen = [], set()
    for number, record in iter_jsonl(path):
        where = f"{path}:{number}"
        for name in ("id", "query", "file"):
            if not isinstance(record.get(name), str) or not record[name].strip():
                raise DataError(f"{where}: field {name!r} must be a non-empty string")
        positives = record.get("positives")
        if not isinstance(positives, list) or not positives or not isinstance(positives[0], dict) \
                or not positives[0].get("id") or "text" not in positives[0]:
            raise DataError(f"{where}: 'positives' must hold the source chunk as {{id, title, text}}")
        if record["id"] in seen:
            raise DataError(f"{where}: duplicate pair id {record['id']!r}; ids must be unique")
        seen.add(record["id"])
        records.append(record)
    if not records:
        raise DataError(f"{path} holds no pairs")
    return records


def read_chunk_files(path: Path) -> dict[str, str]:
    """``{chunk id: file}`` of ``corpus.jsonl`` (every chunk of every file)."""
    files: dict[str, str] = {}
    for number, record in iter_jsonl(path):
        chunk_id, file = record.get("id"), record.get("file")
        if not isinstance(chunk_id, (str, int)) or not isinstance(file, str) or "text" not in record:
            raise DataError(f"{path}:{number}: a chunk needs 'id', 'file' and 'text'")
        if str(chunk_id) in files:
            raise DataError(f"{path}:{number}: duplicate chunk id {chunk_id!r}; ids must be unique")
        files[str(chunk_id)] = file
    if not files:
        raise DataError(f"{path} holds no chunks")
    return files


def source_chunk(pair: Mapping[str, Any]) -> str:
    """The chunk a pair's question was written from: the one relevant passage when it is scored."""
    return str(pair["positives"][0]["id"])


# ------------------------------------------------------------------------------------ building the splits
def split_records(pairs: list[dict], chunk_files: Mapping[str, str], split_of: Mapping[str, str],
                  ) -> tuple[dict[str, list[dict]], dict[str, int]]:
    """The pairs of each split (the rules of the module docstring applied) and what was dropped."""
    for pair in pairs:
        if source_chunk(pair) not in chunk_files:
            raise DataError(f"pair {pair['id']!r}: its source chunk {source_chunk(pair)!r} is not in corpus.jsonl; "
                            "the pairs and the corpus must come from the same synthesis")
    by_split: dict[str, list[dict]] = {name: [] for name in SPLITS}
    dropped_negatives = 0
    for pair in pairs:
        split = split_of[pair["file"]]
        negatives = pair.get("hard_negatives") or []
        kept = [n for n in negatives if not isinstance(n, dict)
                or split_of.get(chunk_files.get(str(n.get("id")), ""), split) == split]
        dropped_negatives += len(negatives) - len(kept)
        by_split[split].append({**pair, "hard_negatives": kept} if negatives else pair)
    held_out = {pair["query"] for name in ("val", "test") for pair in by_split[name]}
    train = [pair for pair in by_split["train"] if pair["query"] not in held_out]
    dropped = {"train_pairs_with_held_out_questions": len(by_split["train"]) - len(train),
               "hard_negatives_from_other_splits": dropped_negatives}
    by_split["train"] = train
    return by_split, dropped


def check_counts(by_split: Mapping[str, list[dict]], min_pairs: int) -> None:
    """Refuse splits too small to train on or to test on (ConfigError naming every count); warn of a small
    validation split (it only chooses among checkpoints, and with few questions it keeps the start)."""
    counts = {name: (len(by_split[name]), len({pair["file"] for pair in by_split[name]})) for name in SPLITS}
    listing = ", ".join(f"{name} {pairs} pairs from {files} file(s)" for name, (pairs, files) in counts.items())
    short = [name for name in ("train", "test") if counts[name][0] < min_pairs]
    if short:
        raise ConfigError(f"too few pairs to adapt: the {' and '.join(short)} split{'s' if len(short) > 1 else ''} "
                          f"need at least {min_pairs} pairs each ({listing}); synthesize more pairs (--chunks), "
                          "raise --test-fraction, add documents, or lower --min-pairs")
    if counts["val"][0] < min_pairs:
        logger.warning("the validation split holds only %d pairs (%s); checkpoint selection will be noisy",
                       counts["val"][0], listing)


def build_splits(pairs_folder: PairsFolder, splits_dir: Path, val_fraction: float = DEFAULT_VAL_FRACTION,
                 test_fraction: float = DEFAULT_TEST_FRACTION, min_pairs: int = DEFAULT_MIN_PAIRS,
                 ) -> tuple[dict, bool]:
    """Write ``splits_dir/{train,val,test}.jsonl`` and ``splits.json``, or reuse them: (the manifest, reused)."""
    if min_pairs < 1:
        raise ConfigError(f"--min-pairs must be at least 1, got {min_pairs}")
    fractions = check_fractions(val_fraction, test_fraction)
    pairs_folder.check()
    identity = {"format": FORMAT_VERSION, "salt": SPLIT_SALT, "fractions": fractions, "min_pairs": min_pairs,
                "pairs_sha256": durable.sha256_of(pairs_folder.pairs),
                "corpus_sha256": durable.sha256_of(pairs_folder.corpus)}
    manifest_path = splits_dir / MANIFEST_NAME
    previous = read_manifest(manifest_path)
    if previous and all(previous.get(key) == value for key, value in identity.items()) \
            and splits_intact(splits_dir, previous):
        logger.info("splits: reusing %s (the pairs and settings are unchanged)", manifest_path)
        return previous, True
    if previous:
        logger.info("splits: the pairs, corpus or settings changed since %s was written; splitting again",
                    manifest_path)
    pairs = read_pair_records(pairs_folder.pairs)
    chunk_files = read_chunk_files(pairs_folder.corpus)
    split_of = assign_files((pair["file"] for pair in pairs), val_fraction, test_fraction)
    by_split, dropped = split_records(pairs, chunk_files, split_of)
    check_counts(by_split, min_pairs)
    splits = {}
    for name in SPLITS:
        path = splits_dir / f"{name}.jsonl"
        write_jsonl(path, by_split[name])
        splits[name] = {"files": sorted(file for file, split in split_of.items() if split == name),
                        "pairs": len(by_split[name]), "sha256": durable.sha256_of(path),
                        "ids_sha256": ids_digest(pair["id"] for pair in by_split[name])}
    manifest = {**identity, "pairs_folder": str(pairs_folder.path), "splits": splits, "dropped": dropped}
    durable.write_text(manifest_path, json_text(manifest))  # last: the split files are complete before it
    logger.info("splits: %s", ", ".join(f"{name} {splits[name]['pairs']} pairs from {len(splits[name]['files'])} "
                                        "file(s)" for name in SPLITS))
    return manifest, False


def read_manifest(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        logger.warning("%s is not valid JSON; splitting again", path)
        return None
    return manifest if isinstance(manifest, dict) else None


def splits_intact(splits_dir: Path, manifest: Mapping[str, Any]) -> bool:
    """Whether every split file is there with the sha256 the manifest records."""
    recorded = manifest.get("splits") or {}
    return all(name in recorded and (splits_dir / f"{name}.jsonl").is_file()
               and durable.sha256_of(splits_dir / f"{name}.jsonl") == recorded[name].get("sha256") for name in SPLITS)


def json_text(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
