"""Training configuration: one typed dataclass, settable from one YAML/JSON file and from CLI flags.

Every field carries its help text; ``add_dataclass_arguments`` turns the fields into ``--flags`` and
``load_train_config`` merges defaults < file < flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml

from rag_mag.errors import ConfigError
from rag_mag.precision import parse_device, parse_precision
from rag_mag.retriever.strategies import Strategy
from rag_mag.retriever.training.selection import RULES


def _f(default: Any, help: str) -> Any:  # noqa: A002 - "help" mirrors argparse
    return field(default=default, metadata={"help": help})


@dataclass
class TrainConfig:
    strategy: str = _f("qnorm", "similarity strategy: cosine, dot, qnorm, dnorm or learnable")
    train_data: str = _f("", "training triples JSONL ({query, positives[], hard_negatives[]}); .gz is fine")
    out: str = _f("", "output folder: best/ (chosen on validation, see selection), last/ (for resuming), "
                      "train_log.jsonl")
    val_data: str = _f("", "held-out triples JSONL for validation; empty: hold out val_fraction of train_data")
    val_fraction: float = _f(0.1, "share of training queries held out for validation when val_data is empty")
    val_max_queries: int = _f(300, "at most this many validation queries (their passages form the search pool)")
    val_corpus: str = _f("", "corpus JSONL ({id, title, text}) whose passages join the validation search pool, "
                             "so that validation ranks a whole corpus as a test does (rag-mag adapt: every chunk); "
                             "empty: the validation queries' own passages alone")
    base_model: str = _f("", "Hugging Face encoder: local folder or hub id (empty: packaged all-MiniLM-L6-v2)")
    pooling: str = _f("mean", "pooling of token vectors: mean or cls")
    query_max_length: int = _f(32, "max query tokens")
    document_max_length: int = _f(128, "max passage tokens")
    temperature: float = _f(0.05, "softmax temperature of InfoNCE (the paper's 0.05)")
    calibrate_norms: bool = _f(True, "divide each raw side by its mean norm at initialization, so every strategy "
                                      "starts at the same effective temperature (see PRODUCT.md)")
    calibration_samples: int = _f(256, "training texts per side used to measure the initial mean norm")
    steps: int = _f(200, "optimizer steps")
    batch_size: int = _f(32, "queries per step (each with one positive and hard_negatives negatives); under "
                              "torchrun the global batch, shared by the processes")
    hard_negatives: int = _f(1, "hard negatives per query (0: in-batch negatives only)")
    short_negatives: int = _f(0, "short negatives per query: the first 4 to 16 words of another query's positive, "
                                 "so that a short, generic text (a heading, a navigation line) learns no large score "
                                 "from its length alone (0: none)")
    learning_rate: float = _f(2e-5, "AdamW learning rate of the encoder")
    gamma_learning_rate: float = _f(1e-2, "learning rate of the learnable normalization degrees (learnable only)")
    weight_decay: float = _f(0.01, "AdamW weight decay (not applied to biases, LayerNorm or degrees)")
    warmup_ratio: float = _f(0.1, "share of steps with linear warm-up before the cosine decay")
    max_grad_norm: float = _f(1.0, "gradient clipping norm")
    train_layers: int = _f(0, "train only the top N transformer layers; the embeddings and the layers below stay "
                              "as the base model has them (0: train every weight)")
    anchor_weight: float = _f(0.0, "L2-SP as decoupled decay toward the starting weights: after each step every "
                                   "trained weight moves learning_rate x anchor_weight of its distance back to its "
                                   "start (0: off; at learning rate 2e-5, 500 pulls back one hundredth a step)")
    distill_weight: float = _f(0.0, "keep the base model's rankings: add this weight x the KL divergence from the "
                                     "starting encoder's in-batch score distribution of each query to the trained "
                                     "one's (0: off; it costs one more forward pass a step)")
    wise_alpha: float = _f(0.5, "WiSE-FT while training: every model the run validates, hands its step hook or "
                                "saves as best/ is its trained weights interpolated with the starting ones at this "
                                "weight (1: the trained weights, plain fine-tuning; last/ always keeps them, so "
                                "training goes on from there). The default 0.5 was chosen on sources the runs did "
                                "not train on (eval/README.md, \"Recipes against a held-out source\")")
    length_bucket_size: int = _f(16, "encode each step's texts in length-sorted chunks of this size, each padded "
                                     "to its own longest text (0: one padded batch per side)")
    precision: str = _f("auto", "auto, bf16 or fp32: auto uses bfloat16 autocast only where the hardware computes "
                                "it natively (CPUs with avx512_bf16/amx_bf16, bf16-capable GPUs), else fp32")
    device: str = _f("auto", "auto, cpu, cuda or cuda:N (auto: the first CUDA GPU torch sees, else the CPU)")
    seed: int = _f(0, "random seed (data order, sampling, initialization of nothing else)")
    eval_every: int = _f(50, "validate every N steps (0: only at the end)")
    selection: str = _f("one_se", "which validated checkpoint becomes best/: one_se (the earliest within one "
                                  "standard error of the best, the untrained step 0 included) or max (the "
                                  "highest validation nDCG@10)")
    log_every: int = _f(10, "log training statistics every N steps")
    save_every: int = _f(50, "write the resumable last/ checkpoint every N steps")
    threads: int = _f(0, "torch CPU threads (0: torch's default)")
    resume: bool = _f(True, "continue from out/last when it exists (refused when its settings or data differ)")
    resume_anyway: bool = _f(False, "resume from out/last even when settings or data differ (the checkpoint's "
                                    "model settings are kept)")

    def __post_init__(self) -> None:
        check_field_types(self)
        self.strategy = Strategy.parse(self.strategy).value
        positive_ints = ("steps", "batch_size", "query_max_length", "document_max_length", "calibration_samples",
                         "log_every", "save_every", "val_max_queries")
        for name in positive_ints:
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}")
        for name in ("hard_negatives", "short_negatives", "eval_every", "threads", "length_bucket_size",
                     "train_layers"):
            if int(getattr(self, name)) < 0:
                raise ConfigError(f"{name} must be 0 or more, got {getattr(self, name)}")
        for name in ("temperature", "learning_rate", "gamma_learning_rate", "max_grad_norm"):
            value = float(getattr(self, name))
            if not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{name} must be a positive number, got {value}")
        if not 0.0 <= self.anchor_weight or self.anchor_weight * self.learning_rate >= 1.0:
            raise ConfigError(f"anchor_weight must be 0 or more and anchor_weight x learning_rate below 1 (a step "
                              f"would overshoot the start), got {self.anchor_weight} at {self.learning_rate}")
        if not (math.isfinite(self.wise_alpha) and 0.0 < self.wise_alpha <= 1.0):
            raise ConfigError(f"wise_alpha must be in (0, 1] (1: no interpolation), got {self.wise_alpha}")
        if not (math.isfinite(self.distill_weight) and self.distill_weight >= 0.0):
            raise ConfigError(f"distill_weight must be 0 or more, got {self.distill_weight}")
        for name in ("val_fraction", "warmup_ratio", "weight_decay"):
            value = float(getattr(self, name))
            if not 0.0 <= value < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {value}")
        self.precision = parse_precision(self.precision)
        self.device = parse_device(self.device)
        if self.selection not in RULES:
            raise ConfigError(f"unknown selection {self.selection!r}; valid rules are: {', '.join(RULES)}")
        if self.pooling not in ("mean", "cls"):
            raise ConfigError(f"unknown pooling {self.pooling!r}; valid poolings are: mean, cls")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_KIND_NAMES = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}


def _check_value(name: str, value: Any, kind: Any) -> Any:
    """``value`` as ``kind`` (int, float, bool, str or an optional one); ConfigError naming the field otherwise."""
    options = get_args(kind) if get_origin(kind) in (Union, UnionType) else (kind,)
    if value is None and NoneType in options:
        return None
    for option in options:
        if option is bool and isinstance(value, bool):
            return value
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(f"{name} must be a finite number, got {value!r}")
            return float(value)
        if option is str and isinstance(value, str):
            return value
        if option not in _KIND_NAMES and option is not NoneType:
            return value  # lists, dicts and other structures are checked by the dataclass itself
    expected = " or ".join(_KIND_NAMES.get(option, "null") for option in options)
    raise ConfigError(f"{name} must be {expected}, got {value!r} ({type(value).__name__})")


def check_field_types(instance: Any) -> None:
    """Check (and normalize: 3 -> 3.0 for a float field) every field of a dataclass against its type hint."""
    hints = get_type_hints(type(instance))
    for spec in fields(instance):
        setattr(instance, spec.name, _check_value(spec.name, getattr(instance, spec.name), hints[spec.name]))


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls: type = TrainConfig) -> None:
    """One ``--flag`` per field, defaulting to ``None`` so that only flags given on the command line override."""
    hints = get_type_hints(cls)
    for spec in fields(cls):
        flag = "--" + spec.name.replace("_", "-")
        kind = hints[spec.name]
        help_text = f"{spec.metadata.get('help', '')} (default: {spec.default!r})"
        if kind is bool:
            parser.add_argument(flag, dest=spec.name, default=None, action=argparse.BooleanOptionalAction,
                                help=help_text)
        else:
            parser.add_argument(flag, dest=spec.name, default=None, type=kind, help=help_text)


def read_config_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) if path.suffix in (".yaml", ".yml") else json.loads(path.read_text())
    except (yaml.YAMLError, json.JSONDecodeError) as error:
        raise ConfigError(f"config file {path} is not valid {'YAML' if path.suffix != '.json' else 'JSON'}: "
                          f"{error}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of field: value")
    return data


# Fields that were renamed: an old config file gets one line that says what to write instead.
RENAMED_FIELDS = {"bf16": "precision: auto, bf16 or fp32 (auto picks bf16 only where the hardware computes it "
                          "natively)",
                  "encode_bf16": "encode_precision: auto, bf16 or fp32"}


def make_config(cls: type, values: dict[str, Any], source: str = "config") -> Any:
    known = {spec.name for spec in fields(cls)}
    for old, new in RENAMED_FIELDS.items():
        if old in values and old not in known:
            raise ConfigError(f"{source} field {old!r} was replaced by {new}; edit the config")
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown {source} field(s): {', '.join(unknown)}; valid fields are: "
                          f"{', '.join(sorted(known))}")
    try:
        return cls(**values)
    except (TypeError, ConfigError) as error:
        raise ConfigError(f"invalid {source}: {error}") from None


def load_train_config(args: argparse.Namespace, config_file: str | None = None, cls: type = TrainConfig,
                      source: str = "training config") -> Any:
    """Defaults, then the file's values, then the flags given on the command line (any config dataclass)."""
    values: dict[str, Any] = read_config_file(config_file) if config_file else {}
    for spec in fields(cls):
        flag_value = getattr(args, spec.name, None)
        if flag_value is not None:
            values[spec.name] = flag_value
    return make_config(cls, values, source=source)
