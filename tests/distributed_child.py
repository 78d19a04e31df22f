"""One process of a multi-process training run: ``python -m tests.distributed_child ARGS_JSON``.

The test starts it once per rank with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), so the trainer joins a real gloo group. The encoder is the tiny random BERT; ``dropout``
(default 0) is off so that N processes and one process compute the same function. Rank 0 writes each
step's averaged gradients to ``OUT/gradients/step-K.safetensors`` (``gradient_recorder``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from safetensors.torch import save_file


def gradient_recorder(folder: Path) -> Callable:
    """A Trainer ``on_step`` hook that saves the gradients of the step just taken (they live until the next
    step's ``zero_grad``)."""
    folder.mkdir(parents=True, exist_ok=True)

    def record(step: int, encoder) -> None:
        gradients = {name: parameter.grad.detach().clone().contiguous()
                     for name, parameter in encoder.named_parameters() if parameter.grad is not None}
        if step > 0:
            save_file(gradients, str(folder / f"step-{step}.safetensors"))

    return record


def tiny_build(tokenizer_dir: Path, dropout: float) -> classmethod:
    """A stand-in for ``MagnitudeEncoder.build``: the tiny random BERT (the same weights in every process)."""
    from tests.tiny import tiny_encoder

    return classmethod(lambda cls, base, strategy, *a, **k: tiny_encoder(tokenizer_dir, strategy, dropout=dropout))


def signal_at(step: int) -> None:
    """This rank sends itself SIGTERM in the middle of ``step`` (after its optimizer step, before its checks)."""
    import os
    import signal

    from rag_mag.retriever.training.trainer import Trainer

    finish_step = Trainer._finish_step

    def signalled(self, encoder, optimizer, current, *rest):
        if current == step:
            os.kill(os.getpid(), signal.SIGTERM)
        return finish_step(self, encoder, optimizer, current, *rest)

    Trainer._finish_step = signalled


def main(args: dict) -> None:
    import os

    from rag_mag import stopping
    from rag_mag.retriever.encoder import MagnitudeEncoder
    from rag_mag.retriever.training.config import TrainConfig
    from rag_mag.retriever.training.trainer import Trainer

    MagnitudeEncoder.build = tiny_build(Path(args.pop("tokenizer_dir")), args.pop("dropout", 0.0))
    record = args.pop("record_gradients", False)
    if os.environ.get("RAG_MAG_TEST_SIGTERM_AT_STEP"):  # set by the test for one rank only
        signal_at(int(os.environ["RAG_MAG_TEST_SIGTERM_AT_STEP"]))
    config = TrainConfig(**args)
    try:
        Trainer(config, on_step=gradient_recorder(Path(config.out) / "gradients") if record else None).train()
    except stopping.Stopped as stopped:
        print(f"STOPPED {stopped}", flush=True)
        sys.exit(stopping.exit_code(stopped.signum))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
