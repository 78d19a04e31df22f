"""Processes the fault suite kills: ``python -m tests.faults.children train|index|cli|reader_cli ARGS_JSON``.

Each runs one real save path of rag-mag (a training run on the tiny random BERT, an index write) with
``RAG_MAG_KILL_AT`` set by the test, so it dies with SIGKILL at a chosen point of the save. With
``RAG_MAG_TEST_NO_EXCHANGE=1`` the folder swap takes its two-rename fallback (filesystems without
renameat2), so the moment between the renames can be killed too.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def train(args: dict) -> None:
    from rag_mag.retriever.encoder import MagnitudeEncoder
    from rag_mag.retriever.training.config import TrainConfig
    from rag_mag.retriever.training.trainer import Trainer
    from tests.tiny import tiny_encoder

    tokenizer_dir = Path(args.pop("tokenizer_dir"))
    MagnitudeEncoder.build = classmethod(lambda cls, base, strategy, *a, **k: tiny_encoder(tokenizer_dir, strategy))
    Trainer(TrainConfig(**args)).train()


def cli(args: dict) -> None:
    """``rag-mag ARGV`` on the tiny random BERT; with ``signal_at_step`` S the process sends itself SIGTERM in
    the middle of step S (after its optimizer step, before its log and checkpoint)."""
    import signal

    from rag_mag.cli.main import main
    from rag_mag.retriever.encoder import MagnitudeEncoder
    from rag_mag.retriever.training.trainer import Trainer
    from tests.tiny import tiny_encoder

    tokenizer_dir = Path(args["tokenizer_dir"])
    MagnitudeEncoder.build = classmethod(lambda cls, base, strategy, *a, **k: tiny_encoder(tokenizer_dir, strategy))
    finish_step = Trainer._finish_step

    def signalled(self, encoder, optimizer, step, *rest):
        if step == args.get("signal_at_step"):
            os.kill(os.getpid(), signal.SIGTERM)
        return finish_step(self, encoder, optimizer, step, *rest)

    Trainer._finish_step = signalled
    sys.exit(main(args["argv"]))


def reader_cli(args: dict) -> None:
    """``rag-mag ARGV`` (train-reader, on the real packaged SmolLM2); with ``signal_at_step`` S the process sends
    itself SIGTERM at the end of step S, after its optimizer step and before the trainer's checks."""
    import signal

    from rag_mag.cli.main import main
    from rag_mag.reader.callbacks import ReaderCallbacks

    on_step_end = ReaderCallbacks.on_step_end

    def signalled(self, train_args, state, control, **kwargs):
        if state.global_step == args.get("signal_at_step"):
            os.kill(os.getpid(), signal.SIGTERM)
        return on_step_end(self, train_args, state, control, **kwargs)

    ReaderCallbacks.on_step_end = signalled
    sys.exit(main(args["argv"]))


def index(args: dict) -> None:
    import numpy as np
    from haystack import Document

    from rag_mag.components.faiss_document_store import FAISSDocumentStore

    rng = np.random.default_rng(args["seed"])
    documents = [Document(id=f"d{i}", content=f"passage {i} of version {args['seed']}",
                          embedding=rng.normal(size=8).astype(np.float32).tolist(),
                          meta={"embedding_checkpoint": "fault-suite", "embedding_strategy": "dot"})
                 for i in range(args["count"])]
    store = FAISSDocumentStore(path=args["out"], recreate=True)
    store.write_documents(documents)


if __name__ == "__main__":
    if os.environ.get("RAG_MAG_TEST_NO_EXCHANGE"):
        from rag_mag import durable

        durable._exchange = lambda first, second: False
    command, arguments = sys.argv[1], json.loads(sys.argv[2])
    {"train": train, "index": index, "cli": cli, "reader_cli": reader_cli}[command](arguments)
