"""The bounded inference executor with admission control: inference never runs on the event loop.

At most ``workers`` jobs run at once and at most ``queue_size`` more wait; a request beyond that is refused at once
(:class:`Overloaded`, which the API answers with 503 + Retry-After), so load never piles up into timeouts or 500s.
A request takes its place (:meth:`InferencePool.admit`) once its body has arrived (:mod:`.receiving` bounds the
bodies being received), so a client sending slowly holds no place.
A job whose client has gone, or whose deadline has passed, gives its slot back: a queued one never starts, a running
one stops at its next layer or tile (its ``cancel`` event is set; the job must pass it to the dense net).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from densecnn.errors import Cancelled

from .errors import ClientGone, InferenceTimeout, Overloaded

T = TypeVar("T")


class InferencePool:
    """Run blocking jobs on ``workers`` threads with at most ``queue_size`` waiting.

    >>> pool = InferencePool(workers=1, queue_size=4)
    >>> with pool.admit() as place:        # Overloaded at once when full
    ...     data = await read_the_upload()
    ...     cancel = threading.Event()
    ...     result = await pool.run(place, lambda: expensive(data, cancel), cancel=cancel, timeout=60)
    """

    def __init__(
        self,
        workers: int,
        queue_size: int,
        *,
        thread_setup: Callable[[], None] | None = None,
        on_change: Callable[[int, int], None] | None = None,
    ):
        """``on_change(queued, running)`` is called whenever either changes (the metrics' gauges)."""
        self.workers, self.queue_size, self._on_change = workers, queue_size, on_change
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="inference", initializer=thread_setup)
        self._lock = threading.Lock()
        self._admitted = 0  # running + waiting
        self._running = 0
        self.dropped = 0  # jobs whose client left, or whose deadline passed, before they started

    @property
    def queued(self) -> int:
        """Jobs admitted but not yet running."""
        with self._lock:
            return self._admitted - self._running

    @property
    def running(self) -> int:
        with self._lock:
            return self._running

    def admit(self) -> Admission:
        """A place for one request, held until its job ends (or, with no job, until the ``with`` block ends)."""
        with self._lock:
            if self._admitted >= self.workers + self.queue_size:
                raise Overloaded(
                    f"the server is busy ({self._running} inferences running, {self._admitted - self._running} "
                    "waiting); retry after the time in the Retry-After header"
                )
            self._admitted += 1
        self._changed()
        return Admission(self)

    def _changed(self) -> None:
        if self._on_change is not None:
            with self._lock:
                queued, running = self._admitted - self._running, self._running
            self._on_change(queued, running)

    def _release(self, _future=None) -> None:
        with self._lock:
            self._admitted -= 1
        self._changed()

    def _call(self, job: Callable[[], T], cancel: threading.Event) -> T:
        if cancel.is_set():  # nobody waits for it any more: drop it before it starts
            with self._lock:
                self.dropped += 1
            raise Cancelled("dropped before it started")
        with self._lock:
            self._running += 1
        self._changed()
        try:
            return job()
        finally:
            with self._lock:
                self._running -= 1
            self._changed()

    async def run(
        self,
        place: Admission,
        job: Callable[[], T],
        *,
        cancel: threading.Event,
        timeout: float,
        client_gone: Callable[[], Awaitable[None]] | None = None,
    ) -> T:
        """Run ``job()`` on a worker thread.

        Raises InferenceTimeout after ``timeout`` seconds, ClientGone when ``client_gone()`` completes first; in both
        cases ``cancel`` is set, so the job gives its place back at its next step.
        """
        try:
            future = self._executor.submit(self._call, job, cancel)
        except RuntimeError:  # shut down
            raise Overloaded("the server is shutting down; retry on another instance") from None
        place.held_by_job = True
        future.add_done_callback(self._release)  # the place is held until the work really ends
        result = asyncio.wrap_future(future)
        watcher = asyncio.ensure_future(client_gone()) if client_gone is not None else None
        try:
            done, _ = await asyncio.wait({result} | ({watcher} if watcher else set()), timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        finally:
            if watcher is not None:
                watcher.cancel()
        if result in done:
            return result.result()
        cancel.set()
        result.add_done_callback(_ignore_outcome)  # its Cancelled is expected: no "never retrieved" warning
        if watcher is not None and watcher in done:
            raise ClientGone()
        raise InferenceTimeout(timeout)

    def shutdown(self) -> None:
        """Wait for running and queued jobs to finish, then stop the threads."""
        self._executor.shutdown(wait=True)


class Admission:
    """A request's place in the pool; released when the ``with`` block ends unless a job took it over."""

    def __init__(self, pool: InferencePool):
        self.pool, self.held_by_job = pool, False

    def __enter__(self) -> Admission:
        return self

    def __exit__(self, *exc) -> None:
        if not self.held_by_job:
            self.pool._release()


def _ignore_outcome(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()
