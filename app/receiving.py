"""How many request bodies a worker receives at once: ``total`` in all and ``per_client`` from one address.

A segment request's body is received before it takes an inference place (:meth:`InferencePool.admit`), so clients
that send slowly hold no inference place while they send; this bound keeps the bodies being received, and the
memory they hold (``max_upload_bytes`` each), as few as the inferences' places, and keeps one address from holding
them all.

>>> receiving = ReceivingLimit(total=8, per_client=2)
>>> with receiving.hold("10.0.0.7"):      # Overloaded at once past either bound
...     upload = await read_upload(request, timeout=30)
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import Overloaded


class ReceivingLimit:
    def __init__(self, total: int, per_client: int):
        self.total, self.per_client = total, per_client
        self._lock = threading.Lock()
        self._by_client: Counter[str] = Counter()

    @contextmanager
    def hold(self, client: str) -> Iterator[None]:
        """One body of ``client`` (its address) being received, for the ``with`` block."""
        with self._lock:
            if self._by_client[client] >= self.per_client:
                raise Overloaded(
                    f"{self.per_client} uploads from your address are being received already; send one when "
                    "another has arrived"
                )
            if self._by_client.total() >= self.total:
                raise Overloaded(
                    f"the server is receiving {self.total} uploads already; retry after the time in the "
                    "Retry-After header"
                )
            self._by_client[client] += 1
        try:
            yield
        finally:
            with self._lock:
                self._by_client[client] -= 1
                if not self._by_client[client]:
                    del self._by_client[client]
