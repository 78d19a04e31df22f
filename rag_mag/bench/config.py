"""The benchmark configuration: one YAML file (see eval/configs/*.yaml)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from rag_mag.errors import ConfigError
from rag_mag.models import REPO_ROOT
from rag_mag.precision import parse_precision
from rag_mag.retriever.strategies import Strategy
from rag_mag.retriever.training.config import TrainConfig, check_field_types, make_config, read_config_file

BASELINES = ("bm25", "base_cosine", "closed_book", "oracle")
READER_BASELINES = ("bm25", "closed_book", "oracle")  # answered by the reader pipeline, not a scored pipeline
SYSTEM_SEPARATOR = ":"
BASE_READER_SUFFIX = "@base"  # oracle@base: a reader baseline answered by the untrained (base) reader


@dataclass(frozen=True)
class PipelineEntry:
    """One scored pipeline: its YAML file, the datasets it answers (empty: all) and how many questions of
    each it answers (None: the config's ``answer_questions``)."""

    path: str
    datasets: tuple[str, ...] = ()
    answer_questions: int | None = None

    @property
    def name(self) -> str:
        """The prefix of its system names: the file name without .yaml (``rag_multihop``)."""
        return Path(self.path).stem

    def covers(self, dataset: str) -> bool:
        return not self.datasets or dataset in self.datasets


def system_name(pipeline: str | None, system: str) -> str:
    """``rag_multihop:qnorm`` for a pipeline's row; a reader baseline (``bm25``, ``oracle``) has no prefix."""
    return f"{pipeline}{SYSTEM_SEPARATOR}{system}" if pipeline else system


def split_system(name: str) -> tuple[str | None, str]:
    """``"rag:qnorm"`` -> ``("rag", "qnorm")``; ``"bm25"`` -> ``(None, "bm25")``."""
    pipeline, separator, system = name.rpartition(SYSTEM_SEPARATOR)
    return (pipeline, system) if separator else (None, name)


@dataclass
class MineConfig:
    """Optional: mine extra triples from question/answer pairs before training (rag-mag mine)."""

    pairs: str = ""
    corpus: str = ""
    top_k: int = 100
    max_positives: int = 1
    hard_negatives: int = 4

    def __post_init__(self) -> None:
        check_field_types(self)
        for name, minimum in (("top_k", 1), ("max_positives", 1), ("hard_negatives", 0)):
            if getattr(self, name) < minimum:
                raise ConfigError(f"{name} must be at least {minimum}, got {getattr(self, name)}")


@dataclass
class BenchConfig:
    name: str = "bench"
    datasets: list[str] = field(default_factory=list)  # registry names or NAME=EVAL[,CORPUS]
    max_questions: int | None = None  # per dataset (None: all); the first N, in file order; all are ranked
    # The first N of those are also answered, by every row (None: all). Retrieval metrics cover max_questions,
    # answers (EM, F1, recall@budget) answer_questions: generation is what costs. A pipeline entry may set its own.
    answer_questions: int | None = None
    dataset_max_questions: dict[str, int] = field(default_factory=dict)  # per-dataset override
    data_root: str | None = None
    strategies: list[str] = field(default_factory=lambda: [s.value for s in Strategy])
    seeds: list[int] = field(default_factory=lambda: [0])
    extra_seeds: dict[str, list[int]] = field(default_factory=dict)  # e.g. {cosine: [1], qnorm: [1]}
    baselines: list[str] = field(default_factory=lambda: list(BASELINES))
    train: dict[str, Any] = field(default_factory=dict)  # TrainConfig fields; train_data may be a list
    # Already trained retrievers to score instead of training them: {strategy: [folder, ...]}, one folder per
    # seed (a training output folder means its best/ checkpoint). Strategies not listed are trained.
    retrievers: dict[str, list[str]] = field(default_factory=dict)
    mine: dict[str, Any] = field(default_factory=dict)  # MineConfig fields (empty: no mining)
    retrieval_top_k: int = 20
    encode_precision: str = "auto"  # corpus encoding: auto (bf16 autocast only on native-bf16 hardware), bf16, fp32
    rag_top_k: int | None = 3  # passages per retrieval round, set through each pipeline's top_k (None: its own)
    # The pipelines scored, each (pipeline, retriever) pair a system row named PIPELINE:SYSTEM. An entry is a
    # path, or {path, datasets: [...] (default: all), max_questions: N (the first N of each dataset)}.
    pipelines: list[Any] = field(default_factory=lambda: ["pipelines/rag.yaml"])
    pipeline: str | None = None  # older configs: one pipeline; the same as pipelines: [PATH]
    retrieval_pipeline: str = "pipelines/retrieve.yaml"  # ranks each corpus (recall@k, nDCG@10) per retriever
    reader_pipeline: str = "pipelines/reader.yaml"  # answers for the bm25, closed_book and oracle baselines
    # The generator every row answers with: a served model name (the packaged smollm2-135m-reader, the trained
    # reader, or smollm2-135m-instruct, its untrained base), a model folder or a hub id. It is the `model` of
    # every VLLMChatGenerator in the pipelines, and what a server the benchmark starts serves.
    reader: str = "smollm2-135m-reader"
    # A second reader for the rows of base_reader_rows, named ROW@base (oracle@base), served by a second server
    # after the first one stops; base_reader_questions of each dataset (None: answer_questions). None: no such rows.
    base_reader: str | None = None
    base_reader_rows: list[str] = field(default_factory=lambda: ["oracle", "closed_book"])
    base_reader_questions: int | None = None
    base_reader_url: str | None = None  # a server already serving base_reader (None: one is started on a free port)
    llm_url: str | None = None  # default: RAG_MAG_VLLM_URL or http://127.0.0.1:8000/v1
    start_llm: bool = True  # start the vLLM server if it is not running (stopped again at the end)
    max_tokens: int | None = 24  # the pipelines' max_tokens (answer length); None keeps each pipeline's own
    concurrency: int = 16  # questions run through a pipeline at once (vLLM batches concurrent requests)
    llm_timeout: float = 600.0  # seconds per generation request (every VLLMChatGenerator's timeout)
    llm_max_retries: int = 3  # the generators' own retries (OpenAI client, exponential backoff up to 8 s)
    llm_retry_waits: list[float] = field(default_factory=lambda: [30.0, 120.0])  # then wait and ask again
    bootstrap_resamples: int = 2000
    fisher_examples: int = 64
    output_dir: str = ""  # default: eval/reports/<name>
    in_domain: list[str] = field(default_factory=list)  # datasets from the training distribution
    notes: list[str] = field(default_factory=list)  # printed in the report

    def __post_init__(self) -> None:
        if not self.datasets:
            raise ConfigError("the benchmark config lists no datasets; add `datasets: [trivia_qa, ...]`")
        self.strategies = [Strategy.parse(s).value for s in self.strategies]
        self.encode_precision = parse_precision(self.encode_precision)
        unknown = sorted(set(self.baselines) - set(BASELINES))
        if unknown:
            raise ConfigError(f"unknown baseline(s) {unknown}; valid baselines are: {', '.join(BASELINES)}")
        for strategy, folders in self.retrievers.items():
            if Strategy.parse(strategy).value not in self.strategies:
                raise ConfigError(f"retrievers names {strategy!r}, which is not in strategies")
            if not isinstance(folders, list) or not folders or not all(isinstance(f, str) for f in folders):
                raise ConfigError(f"retrievers.{strategy} must be a list of checkpoint folders, got {folders!r}")
        self.retrievers = {Strategy.parse(k).value: v for k, v in self.retrievers.items()}
        for strategy in self.extra_seeds:
            if Strategy.parse(strategy).value not in self.strategies:
                raise ConfigError(f"extra_seeds names {strategy!r}, which is not in strategies")
        if not isinstance(self.reader, str) or not self.reader.strip():
            raise ConfigError(f"reader must name the generator (e.g. smollm2-135m-reader), got {self.reader!r}")
        if self.base_reader is not None and (not isinstance(self.base_reader, str) or not self.base_reader.strip()):
            raise ConfigError(f"base_reader must name a generator (e.g. smollm2-135m-instruct) or be null, got "
                              f"{self.base_reader!r}")
        if self.base_reader == self.reader:
            raise ConfigError(f"base_reader is the reader itself ({self.reader}); name another model or leave it out")
        wrong = [row for row in self.base_reader_rows if row not in READER_BASELINES]
        if not isinstance(self.base_reader_rows, list) or wrong:
            raise ConfigError(f"base_reader_rows must list reader baselines ({', '.join(READER_BASELINES)}), got "
                              f"{self.base_reader_rows!r}")
        for name in ("retrieval_top_k", "rag_top_k", "max_tokens", "concurrency", "bootstrap_resamples",
                     "llm_max_retries", "max_questions", "answer_questions", "base_reader_questions"):
            value = getattr(self, name)
            if value is None and name in ("rag_top_k", "max_tokens", "max_questions", "answer_questions",
                                          "base_reader_questions"):
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < (0 if name == "llm_max_retries" else 1):
                raise ConfigError(f"{name} must be a {'non-negative' if name == 'llm_max_retries' else 'positive'} "
                                  f"integer, got {value!r}")
        if self.rag_top_k is not None and self.rag_top_k > self.retrieval_top_k:
            raise ConfigError("rag_top_k cannot exceed retrieval_top_k")
        timeout = self.llm_timeout
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ConfigError(f"llm_timeout must be a positive number of seconds, got {self.llm_timeout!r}")
        if not isinstance(self.llm_retry_waits, list) or any(
                isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0 for w in self.llm_retry_waits):
            raise ConfigError(f"llm_retry_waits must be a list of non-negative seconds, got {self.llm_retry_waits!r}")
        if self.pipeline is not None:
            if self.pipelines != ["pipelines/rag.yaml"]:
                raise ConfigError("give either pipeline (one file, the older form) or pipelines (a list), not both")
            self.pipelines = [self.pipeline]
        self.pipeline_entries()  # validate the pipelines section early
        self.train_config(0, "cosine")  # validate the training fields early
        if self.mine:
            make_config(MineConfig, self.mine, source="mine config")

    # ---- derived
    def seeds_of(self, strategy: str) -> list[int]:
        return sorted(set(self.seeds) | set(self.extra_seeds.get(strategy, [])))

    def questions_for(self, dataset: str) -> int | None:
        return self.dataset_max_questions.get(dataset, self.max_questions)

    def answered_by(self, entry: PipelineEntry | None, base_reader: bool = False) -> int | None:
        """How many questions of each dataset a row answers (the first N; None: all): a pipeline entry's own
        ``answer_questions``, else the config's; a reader baseline (``entry`` None) answers the config's, and
        with the base reader ``base_reader_questions`` when that is set."""
        if base_reader and self.base_reader_questions is not None:
            return self.base_reader_questions
        if entry is not None and entry.answer_questions is not None:
            return entry.answer_questions
        return self.answer_questions

    def dataset_names(self) -> list[str]:
        """The names the datasets' rows carry (registry names, or NAME of NAME=EVAL[,CORPUS])."""
        return [text.partition("=")[0].strip() for text in self.datasets]

    def pipeline_entries(self) -> list[PipelineEntry]:
        """The ``pipelines`` section, checked: known fields, known datasets, distinct names."""
        if not isinstance(self.pipelines, list) or not self.pipelines:
            raise ConfigError("pipelines must be a non-empty list of pipeline files, e.g. [pipelines/rag.yaml]")
        entries, known = [], self.dataset_names()
        for index, item in enumerate(self.pipelines):
            where = f"pipelines[{index}]"
            if isinstance(item, str):
                item = {"path": item}
            if not isinstance(item, dict) or not isinstance(item.get("path"), str) or not item["path"].strip():
                raise ConfigError(f"{where}: give a pipeline file, or a mapping with path (and optionally datasets, "
                                  f"answer_questions); got {item!r}")
            unknown = sorted(set(item) - {"path", "datasets", "answer_questions", "max_questions"})
            if unknown:
                raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}; valid fields are: path, "
                                  "datasets, answer_questions")
            if "max_questions" in item:  # the older spelling of an entry's answer_questions
                if "answer_questions" in item:
                    raise ConfigError(f"{where}: give answer_questions only (max_questions is its older spelling)")
                item = {**item, "answer_questions": item["max_questions"]}
            datasets = item.get("datasets") or []
            if isinstance(datasets, str) or not isinstance(datasets, list):
                raise ConfigError(f"{where}.datasets must be a list of dataset names, got {datasets!r}")
            missing = [name for name in datasets if name not in known]
            if missing:
                raise ConfigError(f"{where}.datasets names {', '.join(map(str, missing))}, which the config does not "
                                  f"list under datasets ({', '.join(known)})")
            limit = item.get("answer_questions")
            if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
                raise ConfigError(f"{where}.answer_questions must be a positive integer, got {limit!r}")
            entries.append(PipelineEntry(path=item["path"], datasets=tuple(datasets), answer_questions=limit))
        names = [entry.name for entry in entries]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ConfigError(f"two pipelines share the name {repeated[0]!r} (the file name names their rows); "
                              "rename one of the files")
        clash = sorted(set(names) & set(READER_BASELINES))
        if clash:
            raise ConfigError(f"a pipeline file may not be named {clash[0]}.yaml: that name is a baseline's")
        return entries

    def out_dir(self) -> Path:
        return resolve_path(self.output_dir) if self.output_dir else REPO_ROOT / "eval" / "reports" / self.name

    def train_config(self, seed: int, strategy: str, train_data: str = "", out: str = "") -> TrainConfig:
        values = {k: v for k, v in self.train.items() if k != "train_data"}
        values.update(seed=seed, strategy=strategy, train_data=train_data, out=out)
        return make_config(TrainConfig, values, source="train section of the benchmark config")

    def train_files(self) -> list[str]:
        files = self.train.get("train_data", [])
        return [files] if isinstance(files, str) else list(files)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve_path(path: str | Path, data_root: Path | None = None) -> Path:
    """``{data_root}`` is replaced by the dataset root; a relative path is tried from the working directory,
    then from the repository root."""
    text = str(path)
    if "{data_root}" in text:
        if data_root is None:
            raise ConfigError(f"{text} needs the data root: set data_root in the config or RAG_MAG_DATA_ROOT")
        text = text.replace("{data_root}", str(data_root))
    candidate = Path(text).expanduser()
    if candidate.is_absolute() or candidate.exists():
        return candidate.resolve()
    return (REPO_ROOT / candidate).resolve()


def load_bench_config(path: str | Path, overrides: dict[str, Any] | None = None) -> BenchConfig:
    values = read_config_file(path)
    values.update(overrides or {})
    known = {spec.name for spec in fields(BenchConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown benchmark field(s) {', '.join(unknown)}; valid fields are: "
                          f"{', '.join(sorted(known))}")
    return make_config(BenchConfig, values, source=f"benchmark config {path}")


def fingerprint(*parts: Any) -> str:
    """A short stable hash of JSON-able parts (config sections, file digests)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]
