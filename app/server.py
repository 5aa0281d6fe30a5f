"""How uvicorn runs the app: its limits for slow and idle clients, and the connection limits and header deadline it
lacks.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``), but waits forever for the headers of a request
that trickle in one byte at a time (slowloris), caps header size only for headers still incomplete after a read
(``h11_max_incomplete_event_size``), and its own connection cap answers in plain text and lets one client take every
connection. :class:`ServiceProtocol` closes a connection whose request headers have not all arrived
``header_timeout`` seconds after it opened, or after its previous answer; answers headers past ``max_header_bytes``
with 431; and refuses a connection past ``max_connections`` in all, or past ``max_connections_per_client`` from one
address, with 503 and ``Retry-After`` — all in the service's JSON error shape. The body has its
own deadline in the app (``upload_timeout``, 408), and an inference its own (``request_timeout``, 503).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
from collections import Counter
from typing import ClassVar

from uvicorn.config import LOGGING_CONFIG
from uvicorn.protocols.http.h11_impl import H11Protocol

from .settings import Settings

WORKER_HEALTHCHECK_SECONDS = 60
LINGER_SECONDS = 1.0  # a refused connection is read and dropped this long before it is closed


_STATUS_LINES = {431: "431 Request Header Fields Too Large", 503: "503 Service Unavailable"}


def _refusal(status: int, code: str, message: str, retry_after: int | None = None) -> bytes:
    """A whole HTTP answer in the service's error shape, sent by the protocol itself (before or instead of the
    request reaching the app), after which the connection is closed."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    retry = f"retry-after: {retry_after}\r\n" if retry_after is not None else ""
    head = (
        f"HTTP/1.1 {_STATUS_LINES[status]}\r\ncontent-type: application/json\r\n{retry}"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class ServiceProtocol(H11Protocol):
    """uvicorn's h11 protocol, plus: a request's headers must arrive within the header timeout, and connections are
    capped in all and per client address (in this worker)."""

    open_by_client: ClassVar[Counter[str]] = Counter()  # this worker's open connections per client address

    def __init__(self, *args, settings: Settings, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.settings = settings

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._client_host: str | None = None
        self._refused = False
        settings = self.settings
        host = str((transport.get_extra_info("peername") or ("unknown",))[0])
        self._header_bytes, self._header_tail = (
            0,
            b"",
        )  # the request headers read so far, and their last 3 bytes
        if len(self.connections) > settings.max_connections:
            message = f"the server has {settings.max_connections} connections open; retry later"
            self._refuse(_refusal(503, "overloaded", message, settings.retry_after), message)
            return
        if self.open_by_client[host] >= settings.max_connections_per_client:
            message = (
                f"{settings.max_connections_per_client} connections from your address are open already; close "
                "some (or reuse one: keep-alive) and retry"
            )
            self._refuse(_refusal(503, "overloaded", message, settings.retry_after), message)
            return
        self._client_host = host
        self.open_by_client[host] += 1
        self._start_header_deadline()

    def data_received(self, data: bytes) -> None:
        """Count a request's line and headers as they arrive: past ``max_header_bytes`` the answer is 431, however
        the bytes are split into reads (h11's own limit holds only for headers still incomplete after a read)."""
        if self._refused:
            return  # answered already: what still comes is dropped
        if self.cycle is None or self.cycle.response_complete:  # awaiting a request's headers
            limit = self.settings.max_header_bytes
            seen = self._header_tail + data
            end = seen.find(b"\r\n\r\n")
            header_bytes = self._header_bytes + (len(data) if end < 0 else end + 4 - len(self._header_tail))
            if header_bytes > limit:
                message = (
                    f"the request line and headers exceed {limit:,} bytes (max_header_bytes); send fewer"
                )
                self._refuse(_refusal(431, "headers_too_large", message), message)
                return
            self._header_bytes, self._header_tail = (header_bytes, seen[-3:]) if end < 0 else (0, b"")
        super().data_received(data)

    def _refuse(self, answer: bytes, why: str) -> None:
        """Answer and close gracefully: send the answer and a FIN, read and drop what the client still sends for a
        moment (a close with unread input would reset the connection, and the client could lose the answer)."""
        self.logger.info("refusing a connection: %s", why)
        self._refused = True
        self.transport.write(answer)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, self.transport.close)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._start_header_deadline()  # the next request on this connection gets the same deadline

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        if self._client_host is not None:
            self.open_by_client[self._client_host] -= 1
            if not self.open_by_client[self._client_host]:
                del self.open_by_client[self._client_host]
        super().connection_lost(exc)

    def _start_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        waiting_after = self.cycle  # a new request replaces the cycle once its headers are complete
        self._header_deadline = self.loop.call_later(
            self.settings.header_timeout, self._header_deadline_passed, waiting_after
        )

    def _header_deadline_passed(self, waiting_after) -> None:
        still_waiting = self.cycle is waiting_after and (self.cycle is None or self.cycle.response_complete)
        if still_waiting and not self.transport.is_closing():
            self.logger.info(
                "closing a connection whose request headers took over %g s", self.settings.header_timeout
            )
            self.transport.close()


def uvicorn_options(settings: Settings) -> dict:
    """uvicorn.run keyword arguments for these settings (besides host, port and workers)."""
    log_config = copy.deepcopy(
        LOGGING_CONFIG
    )  # the service's own lines (models loaded, clients gone) as uvicorn's
    log_config["loggers"]["densecnn.app"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return {
        # uvicorn builds a protocol per connection from this (pickled into each worker with --workers)
        "http": functools.partial(ServiceProtocol, settings=settings),
        "log_config": log_config,
        "timeout_keep_alive": settings.keep_alive_timeout,
        "h11_max_incomplete_event_size": settings.max_header_bytes,
        "timeout_graceful_shutdown": int(settings.request_timeout) + 5,  # in-flight requests finish first
        # with --workers, the supervisor restarts a worker that does not answer its ping within this time; importing
        # torch and loading the models can hold the interpreter longer than uvicorn's 5 s on a busy machine
        "timeout_worker_healthcheck": WORKER_HEALTHCHECK_SECONDS,
    }
