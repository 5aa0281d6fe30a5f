"""Ctrl-C and SIGTERM during a run: the run stops and writes its model; one that lands while a model directory is
written is held until it is written, then raised.

A run stopped by Ctrl-C writes its model directory on the way out (:mod:`densecnn.train.from_strokes`,
:mod:`densecnn.train.loop`). Under :func:`sigterm_stops_runs` (``densecnn train``), SIGTERM (``kill``, ``docker
stop``, a scheduler's preemption) stops it the same way: it raises :class:`Terminated`, a KeyboardInterrupt. A second
signal, or one that lands just as the run ends, must not cut that write short: :func:`interrupts_deferred` holds them
while the block runs and raises after it, so the directory is whole and the run still stops.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Terminated(KeyboardInterrupt):
    """SIGTERM during a run under :func:`sigterm_stops_runs`: the run stops as on Ctrl-C."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated


# the handler a signal has when Python's own (None: not installed from Python) is put back
_DEFAULT_HANDLERS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}


@contextlib.contextmanager
def _signal_handlers(handlers: dict) -> Iterator[None]:
    """Run the block with ``handlers`` (signal -> handler) installed and the previous ones put back afterwards;
    outside the main thread (where Python delivers signals), or where there are no signals (an embedded
    interpreter), the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        previous = {signum: signal.signal(signum, handler) for signum, handler in handlers.items()}
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else _DEFAULT_HANDLERS[signum])


@contextlib.contextmanager
def sigterm_stops_runs() -> Iterator[None]:
    """Run the block with SIGTERM raising :class:`Terminated`, so that a run stopped by it writes its model as on
    Ctrl-C; the previous handler is put back afterwards. Outside the main thread (where Python delivers signals) the
    block runs as it is."""
    with _signal_handlers({signal.SIGTERM: _raise_terminated}):
        yield


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Run the block with SIGINT held (and SIGTERM, under :func:`sigterm_stops_runs`); the first that arrived
    meanwhile raises KeyboardInterrupt (:class:`Terminated` for SIGTERM) when it is done.

    Outside the main thread (where Python delivers signals) the block runs as it is.
    """
    held = [signal.SIGINT]
    if signal.getsignal(signal.SIGTERM) is _raise_terminated:  # under sigterm_stops_runs
        held.append(signal.SIGTERM)
    received: list[int] = []

    def hold(signum, frame) -> None:
        received.append(signum)

    with _signal_handlers(dict.fromkeys(held, hold)):
        yield
    if received:
        raise Terminated if received[0] == signal.SIGTERM else KeyboardInterrupt


def stop_signal(interrupt: KeyboardInterrupt) -> signal.Signals:
    """The signal that stopped a run: SIGTERM for :class:`Terminated`, a :class:`TrainingInterrupted`'s own, else
    SIGINT (Ctrl-C)."""
    if isinstance(interrupt, TrainingInterrupted):
        return interrupt.signum
    return signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM: ``signum``) during a run, with how far it got: ``steps`` taken and ``model_dir`` if it was
    written (None)."""

    def __init__(self, steps: int, model_dir=None, signum: signal.Signals = signal.SIGINT):
        super().__init__(steps, model_dir, signum)
        self.steps, self.model_dir, self.signum = steps, model_dir, signum

    @classmethod
    def by(cls, interrupt: KeyboardInterrupt, steps: int, model_dir=None) -> TrainingInterrupted:
        """The run stopped by ``interrupt`` (a KeyboardInterrupt or :class:`Terminated`) after ``steps``."""
        return cls(steps, model_dir, stop_signal(interrupt))

    def message(self) -> str:
        """What ``densecnn train`` says: what stopped the run, the steps taken and where the model is."""
        how = "interrupted" if self.signum == signal.SIGINT else f"stopped by {self.signum.name}"
        if self.model_dir is None:
            when = "before the first step" if self.steps == 0 else f"after {self.steps} step(s)"
            return f"{how} {when}; no model written"
        if self.steps == 0:
            return f"{how} before the first step; {self.model_dir} holds the untrained model"
        return f"{how} after {self.steps} step(s); the model so far is in {self.model_dir}"
