"""The dataset registry (``data/datasets.yaml``): the spec of each named dataset, validated, and NAME=PATH arguments."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from rag_mag.errors import ConfigError
from rag_mag.models import REPO_ROOT

REGISTRY_PATH = REPO_ROOT / "data" / "datasets.yaml"
RELEVANCE = ("auto", "supporting", "answer")
CONTEXT_FORMATS = ("list", "columnar")


@dataclass(frozen=True)
class ContextFormat:
    """Where a row keeps its passages. ``list``: a list of objects; ``columnar``: ``{title: [...],
    text: [[sentence, ...], ...]}`` (or ``[[title, [sentences]], ...]``) with supporting *titles*."""

    format: str = "list"
    field: str = "contexts"
    id: str | None = "id"              # None: id = name + md5(title, text), as in shared/data
    title: str = "title"
    text: str = "text"
    supporting: str | None = "is_supporting"
    joiner: str = " "                  # columnar: how sentences join into a passage


@dataclass(frozen=True)
class FieldMap:
    """How a row becomes an ``EvalRecord``: dotted column names; all ``answers`` columns are pooled."""

    id: str | None = "id"
    question: str = "question"
    answers: tuple[str, ...] = ("answers", "answer", "golden_answers")
    contexts: ContextFormat | None = field(default_factory=ContextFormat)


@dataclass(frozen=True)
class LocalSource:
    eval: str
    corpus: str | None = None
    root: str = "data"                 # "data": relative to the data root; "repo": to this repository;
                                       # "cwd": the working directory, then the data root (NAME=PATH)
    fields: FieldMap = field(default_factory=FieldMap)


@dataclass(frozen=True)
class HubSource:
    path: str
    split: str
    name: str | None = None
    revision: str | None = None
    fields: FieldMap = field(default_factory=FieldMap)
    corpus: str | None = None          # "contexts": the union of the questions' passages


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    description: str = ""
    relevance: str = "auto"
    local: LocalSource | None = None
    hub: HubSource | None = None


_NESTED: dict[type, dict[str, type]] = {
    DatasetSpec: {"local": LocalSource, "hub": HubSource},
    LocalSource: {"fields": FieldMap},
    HubSource: {"fields": FieldMap},
    FieldMap: {"contexts": ContextFormat},
}


def _build(kind: type, values: Any, where: str) -> Any:
    """A spec dataclass from a YAML mapping: unknown keys are errors, nested specs are built too."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(values).__name__}")
    allowed = set(kind.__dataclass_fields__)
    unknown = set(values) - allowed
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
                          f"allowed: {', '.join(sorted(allowed))}")
    values = dict(values)
    for key, nested_kind in _NESTED.get(kind, {}).items():
        if values.get(key) is not None:
            values[key] = _build(nested_kind, values[key], f"{where}.{key}")
    if isinstance(values.get("answers"), str):
        values["answers"] = (values["answers"],)
    elif isinstance(values.get("answers"), list):
        values["answers"] = tuple(values["answers"])
    return kind(**values)


def spec_from_mapping(name: str, values: Mapping, where: str = "") -> DatasetSpec:
    """One registry entry -> ``DatasetSpec`` (validated; messages name the entry and key)."""
    where = where or f"dataset {name!r}"
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where}: expected a mapping of settings, got {type(values).__name__}")
    spec = _build(DatasetSpec, {"name": name, **values}, where)
    if spec.relevance not in RELEVANCE:
        raise ConfigError(f"{where}: relevance {spec.relevance!r} is not one of {', '.join(RELEVANCE)}")
    if spec.local and spec.local.root not in ("data", "repo"):
        raise ConfigError(f"{where}: local.root {spec.local.root!r} must be 'data' or 'repo'")
    for source in (spec.local, spec.hub):
        contexts = source.fields.contexts if source else None
        if contexts is not None and contexts.format not in CONTEXT_FORMATS:
            raise ConfigError(f"{where}: contexts format {contexts.format!r} is not one of "
                              f"{', '.join(CONTEXT_FORMATS)}")
    if spec.hub and spec.hub.corpus not in (None, "contexts"):
        raise ConfigError(f"{where}: hub.corpus must be 'contexts' or absent, got {spec.hub.corpus!r}")
    if spec.local is None and spec.hub is None:
        raise ConfigError(f"{where}: give a 'local' or a 'hub' source")
    return spec


def load_registry(path: str | os.PathLike | None = None) -> dict[str, DatasetSpec]:
    """Read ``data/datasets.yaml`` (or ``path``) into ``name -> DatasetSpec``."""
    path = Path(path) if path else REGISTRY_PATH
    if not path.is_file():
        raise ConfigError(f"dataset registry {path} does not exist; restore data/datasets.yaml from git")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"dataset registry {path} is not valid YAML: {error}") from None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"dataset registry {path} must map dataset names to entries")
    return {str(name): spec_from_mapping(str(name), values, f"{path}: {name}") for name, values in raw.items()}


def parse_dataset_arg(text: str, registry: Mapping[str, DatasetSpec] | None = None) -> DatasetSpec:
    """``NAME`` (registered) or ``NAME=EVAL.jsonl[,CORPUS.jsonl]`` (any file in the unified schema)."""
    text = text.strip()
    if "=" not in text:
        registry = load_registry() if registry is None else registry
        if text not in registry:
            raise ConfigError(f"unknown dataset {text!r}; registered datasets are: {', '.join(sorted(registry))}. "
                              "Other files in the unified schema can be given as NAME=EVAL.jsonl[,CORPUS.jsonl]")
        return registry[text]
    name, _, paths = text.partition("=")
    parts = [part.strip() for part in paths.split(",")]
    if not name.strip() or not parts[0] or len(parts) > 2:
        raise ConfigError(f"cannot read dataset argument {text!r}; the form is NAME=EVAL.jsonl[,CORPUS.jsonl]")
    local = LocalSource(eval=parts[0], corpus=parts[1] if len(parts) == 2 and parts[1] else None, root="cwd")
    return DatasetSpec(name=name.strip(), description=f"user files {paths}", local=local)


def with_corpus(spec: DatasetSpec, corpus: str) -> DatasetSpec:
    """The same questions searched in another corpus (for example the pooled wiki_pool corpus)."""
    if spec.local is None:
        raise ConfigError(f"dataset {spec.name!r} has no local files to pair with corpus {corpus}")
    return replace(spec, local=replace(spec.local, corpus=corpus))
