"""``rag-mag quickstart``: the whole loop on the bundled sample, from nothing to an answer.

1. train the default retriever (qnorm) on ``data/sample/train_triples.jsonl`` (once);
2. index ``data/sample/corpus.jsonl`` with it (once);
3. start the vLLM server if it is not running, without compiling the model (``--enforce-eager``: ready a minute
   sooner, for one question), and stop it again afterwards unless --keep-server;
4. answer a sample question with ``pipelines/rag.yaml`` and print the ranked sources.

The demo's comparison retriever (cosine) is trained the same way by ``rag-mag serve`` when it first needs it
(``ensure_comparison``), so that the first answer waits for one training, not two.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from rag_mag.models import REPO_ROOT, artifacts_dir

logger = logging.getLogger(__name__)

SAMPLE = REPO_ROOT / "data" / "sample"
# SmolLM2-135M answers better from 3 passages than from rag.yaml's 5 (it loses the thread in long prompts).
TOP_K = 3
DEFAULT_QUESTION = "Hamid Karzai became the first elected president of which country in 2004?"
# Small on purpose: about a minute on 2 CPU cores with native bf16. The benchmark configs train far longer.
# 40 steps: with 60, validation nDCG@10 peaked at step 40 for both qnorm and cosine; 40 steps end 1.1 below that
# peak, one question's rank of 80, a minute sooner (eval/README.md, "The first answer").
DEFAULT_TRAINING = {"steps": 40, "batch_size": 16, "hard_negatives": 1, "learning_rate": 3e-5, "eval_every": 20,
                    "save_every": 20, "val_fraction": 0.1, "seed": 0}


def retriever_dir(strategy: str, default_strategy: str) -> Path:
    from rag_mag.models import default_retriever_dir

    return default_retriever_dir() if strategy == default_strategy else artifacts_dir() / f"retriever-{strategy}"


def index_dir(strategy: str, default_strategy: str) -> Path:
    from rag_mag.serving.pipelines import default_index_dir

    return default_index_dir() if strategy == default_strategy else artifacts_dir() / f"index-{strategy}"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "quickstart", help="train, index, start vLLM and answer a sample question (bundled data)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("question", nargs="?", default=DEFAULT_QUESTION, help="the question to answer")
    parser.add_argument("--strategies", default="qnorm",
                        help="retrievers to build, comma-separated; the first is the default one (default: qnorm; "
                             "`rag-mag serve` builds cosine, its comparison, when it first needs it)")
    parser.add_argument("--train-only", action="store_true", help="stop after training and indexing")
    parser.add_argument("--keep-server", action="store_true",
                        help="leave the vLLM server running at the end (it was started without compiling: about "
                             "0.8x the answers/s of one started by `rag-mag serve-llm`)")
    return parser


def ensure_retriever(strategy: str, folder: Path) -> None:
    from rag_mag.retriever.training.config import TrainConfig
    from rag_mag.retriever.training.trainer import Trainer

    if (folder / "rag_mag.json").is_file():
        logger.info("retriever %s: %s (already trained)", strategy, folder)
        return
    work = folder.with_name(folder.name + ".training")
    config = TrainConfig(strategy=strategy, train_data=str(SAMPLE / "train_triples.jsonl"), out=str(work),
                         **DEFAULT_TRAINING)
    logger.info("training the %s retriever on the bundled sample (%d steps)", strategy, config.steps)
    started = time.monotonic()
    result = Trainer(config).train()
    from rag_mag.retriever.encoder import MagnitudeEncoder

    MagnitudeEncoder.load(result.best_dir).save(folder)  # atomic; the resumable work folder stays beside it
    from rag_mag import durable

    durable.write_text(folder / "training.json", json.dumps({
        "validation": result.best_metrics, "seconds": round(time.monotonic() - started, 1),
        "config": config.to_dict()}, indent=2))


def ensure_index(strategy: str, retriever: Path, folder: Path) -> None:
    from rag_mag.cli.main import main
    from rag_mag.components.faiss_index import is_index_folder

    if is_index_folder(folder):
        logger.info("index %s: %s (already built)", strategy, folder)
        return
    code = main(["index", "--retriever", str(retriever), "--corpus", str(SAMPLE / "corpus.jsonl"),
                 "--out", str(folder)])
    if code:
        raise SystemExit(code)


def ensure_comparison() -> None:
    """Train and index the demo's second retriever beside the quickstart's default one, once.

    Only where the default index is the quickstart's (the bundled sample, see ``ensure_index``): cosine beside
    qnorm (qnorm beside a cosine default). Anything else under artifacts/ is left as it is.
    """
    from rag_mag import durable
    from rag_mag.demo.indexes import index_manifest
    from rag_mag.models import default_retriever_dir
    from rag_mag.serving.pipelines import default_index_dir

    manifest = index_manifest(default_index_dir())
    if not manifest or manifest.get("corpus_sha256") != durable.sha256_of(SAMPLE / "corpus.jsonl"):
        return
    default = manifest.get("strategy", "qnorm")
    other = "qnorm" if default == "cosine" else "cosine"
    retriever, index = retriever_dir(other, default), index_dir(other, default)
    if (retriever / "rag_mag.json").is_file() and index_manifest(index):
        return
    took = _training_seconds(default_retriever_dir())
    logger.info("the demo compares %s with %s: building the %s retriever and index on the bundled sample first "
                "(once%s)", default, other, other, f"; the {default} one took {took:.0f} s here" if took else "")
    ensure_retriever(other, retriever)
    ensure_index(other, retriever, index)


def _training_seconds(folder: Path) -> float | None:
    try:
        return float(json.loads((folder / "training.json").read_text())["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run(args: argparse.Namespace) -> int:
    from rag_mag.cli.main import main
    from rag_mag.errors import ConfigError
    from rag_mag.retriever.strategies import Strategy
    from rag_mag.serving.llm import server as llm_server

    strategies = [Strategy.parse(s).value for s in args.strategies.split(",") if s.strip()]
    if not strategies:
        raise ConfigError("--strategies is empty; give at least one, e.g. --strategies qnorm")
    default = strategies[0]
    for strategy in strategies:
        ensure_retriever(strategy, retriever_dir(strategy, default))
        ensure_index(strategy, retriever_dir(strategy, default), index_dir(strategy, default))
    if args.train_only:
        return 0
    # one question: a server that skips compiling answers it a minute sooner (EAGER_ARGS)
    with llm_server.running_server(keep=args.keep_server, extra_args=llm_server.EAGER_ARGS):
        return main(["ask", args.question, "--retriever", str(retriever_dir(default, default)),
                     "--index", str(index_dir(default, default)), "--top-k", str(TOP_K)])
