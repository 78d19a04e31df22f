"""Which indexes the demo serves: ``NAME=INDEX_DIR:RETRIEVER_DIR`` specs, or every built pair under artifacts/.

An index folder (``rag-mag index --out``) records the fingerprint and strategy of the retriever checkpoint
that embedded it; the demo pairs it with that checkpoint, so queries are embedded the same way.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from rag_mag.errors import ConfigError

logger = logging.getLogger(__name__)

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class IndexSpec:
    """One selectable index: a name shown on the page (and used as the OpenAI ``model``), and its two folders;
    or, for a pipeline on pgvector, the PostgreSQL ``table`` instead of the index folder (``index_dir`` None)."""

    name: str
    index_dir: Path | None
    retriever_dir: Path
    table: str | None = None


def check_name(name: str, where: str) -> str:
    if not NAME_PATTERN.match(name):
        raise ConfigError(f"{where}: invalid index name {name!r}; use letters, digits, '-', '_' or '.' "
                          "(at most 64), e.g. qnorm")
    return name


def parse_index_spec(text: str) -> IndexSpec:
    """``"NAME=INDEX_DIR:RETRIEVER_DIR"`` -> IndexSpec (the last ':' separates the two folders)."""
    name, sep, folders = text.partition("=")
    index_dir, colon, retriever_dir = folders.rpartition(":")
    if not sep or not colon or not name.strip() or not index_dir.strip() or not retriever_dir.strip():
        raise ConfigError(f"bad --index {text!r}: expected NAME=INDEX_DIR:RETRIEVER_DIR, e.g. "
                          "qnorm=artifacts/index-default:artifacts/retriever-default")
    return IndexSpec(check_name(name.strip(), f"--index {text!r}"), Path(index_dir.strip()),
                     Path(retriever_dir.strip()))


def index_manifest(index_dir: Path) -> dict:
    """The manifest of an index folder ({} when it has none or it cannot be read)."""
    path = Path(index_dir) / "manifest.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        logger.warning("cannot read %s: %s", path, error)
        return {}


def discover_indexes(root: Path) -> list[IndexSpec]:
    """Every ``index-SUFFIX`` folder under ``root`` with a ``retriever-SUFFIX`` checkpoint beside it.

    Each is named by the strategy its manifest records (``qnorm``, ``cosine``...); the suffix is used
    instead when two share a strategy. ``index-default`` comes first: it is what ``rag-mag ask`` uses.
    """
    pairs: list[tuple[str, Path, Path, str | None]] = []
    for index_dir in sorted(Path(root).glob("index-*")):
        suffix = index_dir.name[len("index-"):]
        retriever_dir = Path(root) / f"retriever-{suffix}"
        manifest = index_manifest(index_dir)
        if not manifest:
            continue
        if not (retriever_dir / "rag_mag.json").is_file():
            logger.warning("skipping index %s: no retriever checkpoint at %s", index_dir, retriever_dir)
            continue
        pairs.append((suffix, index_dir, retriever_dir, manifest.get("strategy")))
    pairs.sort(key=lambda pair: (pair[0] != "default", pair[0]))
    strategies = [strategy for _, _, _, strategy in pairs]
    specs = []
    for suffix, index_dir, retriever_dir, strategy in pairs:
        name = strategy if strategy and strategies.count(strategy) == 1 else suffix
        specs.append(IndexSpec(check_name(name, str(index_dir)), index_dir, retriever_dir))
    return specs


def check_unique(specs: list[IndexSpec]) -> list[IndexSpec]:
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise ConfigError(f"two indexes are named {spec.name!r}; give each --index a different NAME")
        seen.add(spec.name)
    return specs
