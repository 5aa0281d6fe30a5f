"""The bounded inference executor with admission control: inference never runs on the event loop.

At most ``workers`` jobs run at once and at most ``queue_size`` more wait; a job beyond that is refused at once
(:class:`Overloaded`, which the API answers with 503 + Retry-After), so load never piles up into timeouts or 500s.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class Overloaded(Exception):
    """Every inference slot and queue place is taken."""


class InferenceTimeout(Exception):
    """A job did not finish within the request timeout."""


class InferencePool:
    """Run blocking jobs on ``workers`` threads with at most ``queue_size`` waiting.

    >>> pool = InferencePool(workers=1, queue_size=4)
    >>> result = await pool.run(lambda: expensive(), timeout=60)
    """

    def __init__(self, workers: int, queue_size: int, *, thread_setup: Callable[[], None] | None = None):
        self.workers, self.queue_size = workers, queue_size
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="inference", initializer=thread_setup)
        self._lock = threading.Lock()
        self._admitted = 0  # running + waiting
        self._running = 0

    @property
    def queued(self) -> int:
        """Jobs admitted but not yet running."""
        with self._lock:
            return self._admitted - self._running

    @property
    def running(self) -> int:
        with self._lock:
            return self._running

    def _admit(self) -> None:
        with self._lock:
            if self._admitted >= self.workers + self.queue_size:
                raise Overloaded(
                    f"the server is busy ({self._running} inferences running, {self._admitted - self._running} "
                    "waiting); retry after the time in the Retry-After header"
                )
            self._admitted += 1

    def _release(self, _future=None) -> None:
        with self._lock:
            self._admitted -= 1

    def _call(self, job: Callable[[], T]) -> T:
        with self._lock:
            self._running += 1
        try:
            return job()
        finally:
            with self._lock:
                self._running -= 1

    async def run(self, job: Callable[[], T], *, timeout: float) -> T:
        """Run ``job()`` on a worker thread; raises Overloaded at once when full, InferenceTimeout after ``timeout``."""
        self._admit()
        try:
            future = self._executor.submit(self._call, job)
        except RuntimeError:  # shut down
            self._release()
            raise Overloaded("the server is shutting down; retry on another instance") from None
        future.add_done_callback(self._release)  # the slot is held until the work really ends
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except asyncio.TimeoutError:
            raise InferenceTimeout(
                f"the inference did not finish within {timeout:g} s; send a smaller image or retry later"
            ) from None

    def shutdown(self) -> None:
        """Wait for running and queued jobs to finish, then stop the threads."""
        self._executor.shutdown(wait=True)
