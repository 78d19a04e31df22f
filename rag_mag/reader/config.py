"""The reader's training configuration: one typed dataclass, settable from one YAML/JSON file and CLI flags."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from rag_mag.errors import ConfigError
from rag_mag.precision import parse_precision
from rag_mag.retriever.training.config import check_field_types


def _f(default: Any, help: str) -> Any:  # noqa: A002 - "help" mirrors argparse
    return field(default=default, metadata={"help": help})


def _ints(text: str, name: str, minimum: int) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"{name} must be comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < minimum:
        raise ConfigError(f"{name} must list whole numbers of at least {minimum}, got {text!r}")
    return values


METHODS = ("lora", "full")
TASKS = ("answer", "question")


@dataclass
class ReaderConfig:
    out: str = _f("", "output folder: adapter/ (the best validated LoRA adapter), last/ (resumable), "
                      "data/ (the examples), train_log.jsonl")
    task: str = _f("answer", "answer: the reader (a short span from the passages); question: the question writer "
                             "(one passage in, a question it answers and that answer out, for `rag-mag synth`)")
    base_model: str = _f("", "the causal LM to fine-tune: a local Hugging Face folder (empty: the packaged "
                             "SmolLM2-135M-Instruct as converted by `rag-mag serve-llm --convert-only`)")
    gold_triples: str = _f("{data_root}/hotpotqa/hotpotqa_train_triples.jsonl.gz",
                           "training triples whose positives are gold passages (HotpotQA supporting paragraphs)")
    gold_eval: str = _f("{data_root}/nq_open/nq_open_oracle_eval.jsonl",
                        "eval-schema file whose supporting contexts are gold passages (NQ-open oracle)")
    mined_rows: str = _f("data/train_default/train.jsonl.gz",
                         "a built training file (rag-mag build-data); its rows with source 'mined' are used")
    exclude_from: str = _f("eval/configs/train_data.yaml",
                           "a build-data spec whose `exclude:` evaluation sets never train the reader either")
    retrieval_corpus: str = _f("{data_root}/wiki_pool/wiki_pool_corpus.jsonl.gz",
                               "corpus searched for the retrieved view (empty: gold view only)")
    retrieval_model: str = _f("", "retriever of the retrieved view: a rag-mag checkpoint or encoder folder "
                                  "(empty: the packaged all-MiniLM-L6-v2, cosine)")
    max_passages: int = _f(5, "most passages in a gold-view example (gold passages plus distractors)")
    passage_counts: str = _f("3,5", "passage counts of the retrieved view, drawn per question (the pipelines' "
                                    "top_k: rag.yaml 5, the benchmark's rag_top_k 3)")
    passage_chars: str = _f("700,500", "passage truncations, drawn per example (the AnswerPromptBuilder "
                                       "max_passage_chars of the pipelines: rag.yaml 700, rag_multihop.yaml 500)")
    followup_chars: int = _f(500, "passage truncation of the follow-up view, which teaches rag_multihop.yaml's "
                                  "follow-up query (its FollowUpPromptBuilder's max_passage_chars); 0: no such view")
    no_answer_share: float = _f(0.0, "share of the examples (training and validation) whose passages hold no answer, "
                                     "with the target 'unanswerable': the reader learns to abstain (0: never)")
    init_adapter: str = _f("", "a LoRA adapter folder to continue training from (e.g. data/reader_default, checked "
                               "against its SHA256SUMS; its rank must be lora_rank); empty: a new adapter")
    val_questions: int = _f(200, "held-out gold questions for validation (whole questions, both views)")
    val_max_examples: int = _f(200, "at most this many validation examples are answered at each validation")
    method: str = _f("lora", "lora: train a LoRA adapter of rank lora_rank on every linear layer; full: train every "
                             "linear weight of the decoder layers (embeddings and norms frozen), published as a LoRA "
                             "adapter of rank export_rank cut from the weight change by truncated SVD")
    lora_rank: int = _f(16, "LoRA rank r of every linear layer of the model")
    lora_alpha: int = _f(32, "LoRA alpha (the update is scaled by alpha / r)")
    lora_dropout: float = _f(0.05, "dropout on the LoRA inputs")
    export_rank: int = _f(64, "method full: rank of the adapter cut from the weight change (validated as cut)")
    steps: int = _f(300, "optimizer steps")
    batch_size: int = _f(8, "examples per optimizer step")
    learning_rate: float = _f(5e-4, "AdamW learning rate (of the LoRA weights, or with method full of the "
                                    "linear weights: about 5e-5)")
    warmup_ratio: float = _f(0.05, "share of steps with linear warm-up before the linear decay")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    max_length: int = _f(1536, "longest training sequence in tokens (longer examples are dropped, not cut)")
    max_new_tokens: int = _f(16, "answer tokens generated at validation (the benchmark's max_tokens)")
    precision: str = _f("auto", "auto, bf16 or fp32: auto uses bfloat16 autocast only where the hardware computes "
                                "it natively")
    eval_every: int = _f(50, "validate every N steps (and at the end); the best validation EM becomes adapter/")
    save_every: int = _f(25, "write the resumable last/ checkpoint every N steps")
    log_every: int = _f(5, "log loss and learning rate every N steps")
    seed: int = _f(0, "random seed (example views, data order, LoRA initialization)")
    threads: int = _f(0, "torch CPU threads (0: torch's default)")
    resume: bool = _f(True, "continue from out/last when it exists (refused when its settings or data differ)")

    def __post_init__(self) -> None:
        check_field_types(self)
        for name in ("max_passages", "val_questions", "val_max_examples", "lora_rank", "lora_alpha", "export_rank",
                     "steps", "batch_size", "max_length", "max_new_tokens", "eval_every", "save_every", "log_every"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.task not in TASKS:
            raise ConfigError(f"unknown task {self.task!r}; valid tasks are: {', '.join(TASKS)}")
        if self.method not in METHODS:
            raise ConfigError(f"unknown method {self.method!r}; valid methods are: {', '.join(METHODS)}")
        if self.followup_chars < 0:
            raise ConfigError(f"followup_chars must be 0 or more, got {self.followup_chars}")
        if self.threads < 0:
            raise ConfigError(f"threads must be 0 or more, got {self.threads}")
        if not math.isfinite(self.learning_rate) or self.learning_rate <= 0:
            raise ConfigError(f"learning_rate must be a positive number, got {self.learning_rate}")
        if self.init_adapter and self.method != "lora":
            raise ConfigError("init_adapter continues a LoRA adapter; it needs --method lora")
        for name in ("warmup_ratio", "weight_decay", "lora_dropout", "no_answer_share"):
            if not 0.0 <= float(getattr(self, name)) < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not (self.gold_triples or self.gold_eval):
            raise ConfigError("no gold source: set gold_triples or gold_eval")
        _ints(self.passage_counts, "passage_counts", 1)
        _ints(self.passage_chars, "passage_chars", 20)
        self.precision = parse_precision(self.precision)

    @property
    def passage_count_values(self) -> tuple[int, ...]:
        return _ints(self.passage_counts, "passage_counts", 1)

    @property
    def passage_char_values(self) -> tuple[int, ...]:
        return _ints(self.passage_chars, "passage_chars", 20)

    def data_settings(self) -> dict[str, Any]:
        """The settings that decide the examples (a change means building them again)."""
        names = ("task", "gold_triples", "gold_eval", "mined_rows", "exclude_from", "retrieval_corpus",
                 "retrieval_model", "max_passages", "passage_counts", "passage_chars", "followup_chars",
                 "val_questions", "seed", "no_answer_share")
        return {name: getattr(self, name) for name in names}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
