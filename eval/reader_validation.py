"""Score reader adapters on the validation examples of a `rag-mag train-reader` run, side by side.

    .venv/bin/python eval/reader_validation.py --run artifacts/reader/arms/full \
        --adapter data/reader_default --adapter artifacts/reader/arms/full/adapter

Every adapter is merged into the base model in memory and answers the run's held-out validation examples
(``OUT/data/val.jsonl``: whole training-side questions no adapter trained on, gold and retrieved views) with
greedy decoding, as train-reader validates. Printed: EM and F1 overall and per view, and each adapter's EM
difference from the first one on the same examples with a paired permutation p. No evaluation question is read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rag_mag.bench.stats import paired_permutation_test  # noqa: E402
from rag_mag.metrics.answers import score_answers  # noqa: E402
from rag_mag.models import default_llm_dir  # noqa: E402
from rag_mag.precision import cpu_kind, resolve_device, use_bf16  # noqa: E402
from rag_mag.reader.examples import read_examples  # noqa: E402
from rag_mag.reader.merge import verify_adapter  # noqa: E402
from rag_mag.reader.prompts import validation_scores  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="a train-reader output folder (its data/val.jsonl is used)")
    parser.add_argument("--adapter", action="append", required=True, help="an adapter folder (repeatable)")
    parser.add_argument("--max-examples", type=int, default=0, help="the first N examples only (0: all)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    validation = read_examples(Path(args.run) / "data" / "val.jsonl")
    if args.max_examples:
        validation = validation[: args.max_examples]
    base = default_llm_dir()
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.padding_side = "left"
    bf16 = use_bf16("auto", resolve_device("auto"))
    results, first = [], None
    for adapter in args.adapter:
        verify_adapter(Path(adapter))
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                                          adapter).merge_and_unload()
        scores, answers = validation_scores(model, tokenizer, validation, max_new_tokens=16, bf16=bf16)
        per_example = score_answers(answers, [e.answers for e in validation]).em_per_example  # for the paired test
        row = {"adapter": adapter, **{name: round(value, 1) if isinstance(value, float) else value
                                      for name, value in scores.items() if not name.startswith("n_")}}
        if first is None:
            first = per_example
        else:
            row["em_gain"] = round(100.0 * float((per_example - first).mean()), 1)
            row["p"] = round(float(paired_permutation_test(per_example, first)), 4)
        results.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_kind(), "run": args.run, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
