"""Every file of eval/configs/ loads with its own loader and names things that exist: pipelines, strategies,
datasets, training data, retrievers and the data recipe they came from. A new file there needs an entry in
LOADERS. Files of the shared data are checked where it is present (RAG_MAG_DATA_ROOT, else ../shared/data)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml

from rag_mag.bench.abstention.runner import AbstentionConfig, load_abstention_config
from rag_mag.bench.config import BenchConfig, load_bench_config, resolve_path
from rag_mag.bench.crossover.config import CrossoverConfig, load_crossover_config
from rag_mag.bench.dataset_specs import load_registry, parse_dataset_arg
from rag_mag.bench.datasets import data_root
from rag_mag.bench.folders.runner import FoldersConfig, load_folders_config
from rag_mag.models import REPO_ROOT
from rag_mag.reader.config import ReaderConfig
from rag_mag.retriever.data.spec import DataSpec, load_data_spec
from rag_mag.retriever.strategies import Strategy
from rag_mag.retriever.training.config import TrainConfig, load_train_config
from rag_mag.serving.llm.readers import resolve_model, served_name
from rag_mag.serving.llm.settings import BASE_SERVED_MODEL_NAME, DEFAULT_SERVED_MODEL_NAME

CONFIGS = REPO_ROOT / "eval" / "configs"
ROOT = data_root()
# The data spec loader needs a root to fill {data_root}; without the shared data only its schema is checked.
SPEC_ROOT = ROOT or Path("/shared-data-not-present")
needs_data = pytest.mark.skipif(ROOT is None, reason="shared data not present (RAG_MAG_DATA_ROOT or ../shared/data)")


def load_data_recipe(path: Path) -> DataSpec:
    """What `rag-mag build-data PATH` reads."""
    return load_data_spec(path, SPEC_ROOT)


def load_reader_config(path: Path) -> ReaderConfig:
    """What `rag-mag train-reader --config PATH` reads when no flag is given."""
    return load_train_config(argparse.Namespace(), str(path), ReaderConfig, source="reader config")


BENCH = ("quick.yaml", "cpu.yaml", "gpu.yaml")
LOADERS: dict[str, tuple[Callable[[Path], Any], type]] = {
    **{name: (load_bench_config, BenchConfig) for name in BENCH},
    "crossover.yaml": (load_crossover_config, CrossoverConfig),
    "train_data.yaml": (load_data_recipe, DataSpec),
    "reader.yaml": (load_reader_config, ReaderConfig),
    "writer.yaml": (load_reader_config, ReaderConfig),
    "reader_abstain.yaml": (load_reader_config, ReaderConfig),
    "reader_abstain_light.yaml": (load_reader_config, ReaderConfig),
    "abstention.yaml": (lambda path: load_abstention_config(path, SPEC_ROOT), AbstentionConfig),
    "realdocs.yaml": (load_folders_config, FoldersConfig),
    "realdocs-training.yaml": (load_folders_config, FoldersConfig),
    "realdocs-strategies.yaml": (load_folders_config, FoldersConfig),
    "realdocs-long.yaml": (load_folders_config, FoldersConfig),
}


def load(name: str) -> Any:
    return LOADERS[name][0](CONFIGS / name)


def existing(path: str) -> bool:
    """A config's path ({data_root}, working directory, then repository) names a file; skipped without data."""
    if "{data_root}" in path and ROOT is None:
        pytest.skip("shared data not present")
    return resolve_path(path, ROOT).is_file()


def placeholder(value: Any, root: str | Path) -> Any:
    """Paths under ``root`` written as {data_root}/..., in a value or a list of values."""
    if isinstance(value, list):
        return [placeholder(item, root) for item in value]
    return value.replace(str(root), "{data_root}") if isinstance(value, str) else value


def test_every_config_file_has_its_loader():
    assert {path.name for path in CONFIGS.iterdir()} == set(LOADERS)


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_every_config_loads_with_its_loader(name):
    assert isinstance(load(name), LOADERS[name][1])


# ------------------------------------------------------------------------------------- benchmark configs
@pytest.mark.parametrize("name", BENCH)
def test_bench_pipelines_exist(name):
    config = load(name)
    paths = [entry.path for entry in config.pipeline_entries()] + [config.retrieval_pipeline, config.reader_pipeline]
    for path in paths:
        assert (REPO_ROOT / path).is_file(), f"{name}: {path}"
        assert isinstance(yaml.safe_load((REPO_ROOT / path).read_text())["components"], dict), path


@pytest.mark.parametrize("name", BENCH)
def test_bench_strategies_train_or_name_their_retrievers(name):
    config = load(name)
    assert config.strategies and set(config.strategies) <= {strategy.value for strategy in Strategy}
    for strategy in config.strategies:
        assert strategy in config.retrievers or config.train_files(), f"{name}: {strategy} has no retriever"
        for seed in config.seeds_of(strategy):
            assert isinstance(config.train_config(seed, strategy), TrainConfig)


@pytest.mark.parametrize("name", BENCH)
def test_bench_datasets_rows_and_readers_are_known(name):
    config = load(name)
    registry, names = load_registry(), config.dataset_names()
    for text in config.datasets:
        spec = parse_dataset_arg(text, registry)
        if "=" in text:  # NAME=EVAL[,CORPUS]: files of this repository
            assert all((REPO_ROOT / path).is_file() for path in (spec.local.eval, spec.local.corpus) if path), text
    assert set(config.in_domain) <= set(names) and set(config.dataset_max_questions) <= set(names)
    if config.base_reader:
        assert set(config.base_reader_rows) <= set(config.baselines), "a base reader row that is never scored"
    for reader in (config.reader, config.base_reader):
        if reader is not None:
            assert served_name(reader)  # a packaged reader, a model folder or a hub id


@pytest.mark.parametrize("name", BENCH)
def test_bench_training_files_exist(name):
    config = load(name)
    for path in config.train_files() + ([config.train["val_data"]] if "val_data" in config.train else []):
        assert existing(path), f"{name}: {path}"


@pytest.mark.parametrize("name", BENCH)
def test_bench_retrievers_are_committed_crossover_runs(name):
    """A listed retriever is a main run of the crossover config of its strategy; where the run's cell is
    committed (a finished run, re-created by `crossover --rebuild --only LABEL`), it trained that strategy. The
    bench's training data is the study's."""
    config, crossover = load(name), load("crossover.yaml")
    labels = {spec.label: spec for spec in crossover.run_specs()}
    for strategy, folders in config.retrievers.items():
        for folder in folders:
            assert Path(folder).parent == Path("artifacts/crossover/retrievers"), folder
            spec = labels[Path(folder).name]
            assert (spec.group, spec.strategy) == ("main", strategy)
            cell = crossover.out_dir() / "cells" / f"{spec.label}.json"
            if cell.is_file():
                assert json.loads(cell.read_text())["run"]["strategy"] == strategy
    if config.retrievers:
        assert config.train_files() == [crossover.train_data]
        assert config.train["val_data"] == crossover.val_data


def test_gpu_trains_the_current_recipe_from_a_hub_encoder_and_answers_with_a_hub_reader():
    gpu, cpu = load("gpu.yaml"), load("cpu.yaml")
    assert gpu.train_files() == ["data/train_default/train.jsonl.gz"]
    assert gpu.train["val_data"] == "data/train_default/val.jsonl.gz"
    base_model = gpu.train["base_model"]
    assert base_model.count("/") == 1 and not (REPO_ROOT / base_model).exists(), "a hub id (org/name)"
    assert not gpu.retrievers and not gpu.mine, "gpu.yaml trains every retriever itself"
    assert gpu.reader not in (DEFAULT_SERVED_MODEL_NAME, BASE_SERVED_MODEL_NAME)
    assert resolve_model(gpu.reader) == (gpu.reader, gpu.reader), "a hub id, served under that name"
    assert [(e.path, e.datasets) for e in gpu.pipeline_entries()] == \
        [(e.path, e.datasets) for e in cpu.pipeline_entries()]
    assert (gpu.datasets, gpu.in_domain, set(gpu.baselines)) == (cpu.datasets, cpu.in_domain, set(cpu.baselines))


# ------------------------------------------------------------------------------------- the crossover study
def test_crossover_runs_are_valid_training_runs(tmp_path):
    config = load("crossover.yaml")
    specs = config.run_specs()
    assert len({spec.label for spec in specs}) == len(specs)
    for spec in specs:
        assert isinstance(config.train_config(spec, Path(config.train_data), tmp_path / spec.label), TrainConfig)
    groups = {spec.group for spec in specs}
    assert set(config.test_last_only) <= set(config.test_groups) <= groups
    assert set(config.tuned) <= {field.name for field in fields(TrainConfig)}
    for entry in config.runs:
        assert set(entry.get("grid", {})) <= set(config.tuned), entry


def test_crossover_data_and_sources_are_the_committed_build():
    config, recipe = load("crossover.yaml"), load("train_data.yaml")
    for path in (config.train_data, config.val_data, config.ablation_data):
        assert (REPO_ROOT / path).is_file(), path
    built = json.loads((REPO_ROOT / Path(config.train_data).parent / "stats.json").read_text())
    names = {source.name for source in recipe.sources}
    assert set(built["sources"]) == names
    for spec in config.run_specs():
        assert set(spec.sources) <= names, spec.label
    registry = load_registry()
    assert all(registry[name].local is not None for name in config.datasets)  # the study reads local files


# ------------------------------------------------------------------------------------- the data recipe
def test_the_recipe_is_the_committed_build_and_excludes_every_evaluation_set():
    recipe = load("train_data.yaml")
    built = json.loads((REPO_ROOT / "data" / "train_default" / "stats.json").read_text())["spec"]
    built_root = str(Path(built["negatives_corpus"]).parents[1])  # the build's data root: .../wiki_pool/FILE
    assert {key: placeholder(getattr(recipe, key), SPEC_ROOT) for key in built} == \
        {key: placeholder(value, built_root) for key, value in built.items()}
    excluded = {Path(path).relative_to(SPEC_ROOT).as_posix() for path in recipe.exclude}
    registry = load_registry()
    evaluated = {name for bench in BENCH for name in load(bench).dataset_names()} | set(load("crossover.yaml").datasets)
    for spec in (registry[name] for name in evaluated if name in registry):
        if spec.local is not None and spec.local.root == "data":
            assert spec.local.eval in excluded, f"{spec.name}'s questions could train"


@needs_data
def test_the_recipe_files_exist():
    recipe = load("train_data.yaml")
    paths = [recipe.negatives_corpus, *recipe.exclude] + \
        [path for source in recipe.sources for path in (source.path, source.corpus) if path]
    assert [path for path in paths if not Path(path).is_file()] == []


# ------------------------------------------------------------------------------------- the reader
def test_reader_config_builds_the_shipped_reader():
    config = load("reader.yaml")
    exclude_from = REPO_ROOT / config.exclude_from
    assert exclude_from.parent == CONFIGS and LOADERS[exclude_from.name][1] is DataSpec
    assert existing(config.mined_rows)
    for path in (config.base_model, config.retrieval_model):
        assert not path or resolve_path(path).exists(), path
    shipped = json.loads((REPO_ROOT / "data" / "reader_default" / "reader.json").read_text())["config"]
    ours = config.to_dict()
    assert {key: ours[key] for key in shipped if key in ours} == {key: v for key, v in shipped.items() if key in ours}


def test_writer_config_builds_the_shipped_question_writer():
    config = load("writer.yaml")
    assert config.task == "question" and not config.retrieval_corpus
    shipped = json.loads((REPO_ROOT / "data" / "writer_default" / "reader.json").read_text())["config"]
    ours, defaults = config.to_dict(), ReaderConfig().to_dict()
    assert {key: ours[key] for key in shipped} == shipped
    # settings added since the writer was trained are at their defaults, which train as before
    assert {key: ours[key] for key in ours if key not in shipped} == {
        key: defaults[key] for key in ours if key not in shipped}


@needs_data
@pytest.mark.parametrize("field", ["gold_triples", "gold_eval", "retrieval_corpus"])
def test_reader_data_files_exist(field):
    path = getattr(load("reader.yaml"), field)
    assert not path or existing(path), path


# ------------------------------------------------------------------------------------- shared data
@needs_data
@pytest.mark.parametrize("name", BENCH + ("crossover.yaml",))
def test_registered_datasets_have_their_local_files(name):
    config, registry = load(name), load_registry()
    names = config.dataset_names() if isinstance(config, BenchConfig) else config.datasets
    for spec in (registry[name] for name in names if name in registry):
        if spec.local is not None and spec.local.root == "data":
            assert all((ROOT / path).is_file() for path in (spec.local.eval, spec.local.corpus) if path), spec.name
