"""Stop signals: SIGTERM (a cluster scheduler's preemption, ``kill``) and SIGINT (Ctrl-C) end a long run
without losing a finished step.

Outside a ``graceful()`` block a signal interrupts at once, as a ``KeyboardInterrupt`` (``install``, called by
the CLI, does this for SIGTERM as Python does for SIGINT). Inside one it only sets a flag: the loop that
entered the block checks ``requested()`` at its step boundaries, writes its resumable state, and raises
``Stopped`` with a line that says where that state is. A second signal while the state is written is noted,
never delivered into the save. A signal the loop did not see before the block ended (its last step) is
raised as the block ends. The CLI exits with ``exit_code``: 128 + the signal, 143 for SIGTERM, 130 for SIGINT.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_state: dict = {"signal": None, "depth": 0}


class Stopped(KeyboardInterrupt):
    """A run stopped at a step boundary by ``signum``, its resumable state saved; the message says where."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum
        self.message = message

    def __str__(self) -> str:
        return self.message


def stopped(step: int, steps: int, saved: object) -> Stopped:
    """The ``Stopped`` of a run that finished ``step`` of ``steps`` and saved it in ``saved``."""
    signum = _state["signal"] or signal.SIGTERM  # a rank of torchrun that the signal did not reach
    return Stopped(signum, f"stopped at step {step} of {steps} by {signal_name(signum)}; saved {saved}; run the "
                           "same command again to resume")


def interrupted(detail: str) -> Stopped:
    """The ``Stopped`` of a command that a signal ended at once (outside a ``graceful()`` block): ``detail`` says
    what it kept and how to go on."""
    signum = _state["signal"] or signal.SIGINT
    return Stopped(signum, f"stopped by {signal_name(signum)}; {detail}")


def signal_name(signum: int | None) -> str:
    return signal.Signals(signum or signal.SIGINT).name


def exit_code(signum: int | None) -> int:
    """What a command stopped by ``signum`` exits with (130 for Ctrl-C, 143 for SIGTERM)."""
    return 128 + int(signum or signal.SIGINT)


def requested() -> int | None:
    """The stop signal received inside the current ``graceful()`` block, if any."""
    return _state["signal"]


def last_signal() -> int | None:
    """The last stop signal received (None for Python's own Ctrl-C outside a ``graceful()`` block)."""
    return _state["signal"]


def _interrupt(signum, frame) -> None:
    _state["signal"] = signum
    raise KeyboardInterrupt


def _defer(signum, frame) -> None:
    if _state["signal"] is None:
        _state["signal"] = signum
        logger.warning("%s received: stopping once the current step is finished and saved", signal_name(signum))
    else:
        logger.warning("%s received again: the state is being saved and will not be interrupted",
                       signal_name(signum))


def install() -> None:
    """SIGTERM ends a command like Ctrl-C does (the main thread only: Python delivers signals there)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)


@contextlib.contextmanager
def graceful() -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT only set ``requested()``; nested blocks share the outer one's."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outermost = _state["depth"] == 0
    previous = {}
    if outermost:
        _state["signal"] = None
        previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
        for signum in STOP_SIGNALS:
            signal.signal(signum, _defer)
    _state["depth"] += 1
    try:
        yield
    finally:
        _state["depth"] -= 1
        if outermost:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
    if outermost and _state["signal"] is not None:  # came after the loop's last check: stop now
        raise KeyboardInterrupt
