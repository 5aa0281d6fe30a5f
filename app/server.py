"""How uvicorn runs the app: its limits for slow and idle clients, and a header deadline it lacks.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) and caps connections (``limit_concurrency``) and
header size (``h11_max_incomplete_event_size``), but waits forever for the headers of a request that trickle in one
byte at a time (slowloris). :class:`HeaderDeadlineProtocol` closes a connection whose request headers have not all
arrived ``header_timeout`` seconds after it opened, or after its previous answer. The body has its own deadline in
the app (``upload_timeout``, 408), and an inference its own (``request_timeout``, 503).
"""

from __future__ import annotations

import asyncio
import copy
import functools

from uvicorn.config import LOGGING_CONFIG
from uvicorn.protocols.http.h11_impl import H11Protocol

from .settings import Settings

WORKER_HEALTHCHECK_SECONDS = 60


@functools.cache
def header_timeout() -> float:
    """The header deadline, from the settings of this worker's process: uvicorn builds the protocol itself, from its
    import path, in every worker, so the setting comes the way all settings do, from the environment (read once, on
    the first connection; validated by Settings when `densecnn serve` starts)."""
    return Settings().header_timeout


class HeaderDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol, plus: a request's headers must arrive within the header timeout."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._start_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._start_header_deadline()  # the next request on this connection gets the same deadline

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        super().connection_lost(exc)

    def _start_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        waiting_after = self.cycle  # a new request replaces the cycle once its headers are complete
        self._header_deadline = self.loop.call_later(
            header_timeout(), self._header_deadline_passed, waiting_after
        )

    def _header_deadline_passed(self, waiting_after) -> None:
        still_waiting = self.cycle is waiting_after and (self.cycle is None or self.cycle.response_complete)
        if still_waiting and not self.transport.is_closing():
            self.logger.info("closing a connection whose request headers took over %g s", header_timeout())
            self.transport.close()


def uvicorn_options(settings: Settings) -> dict:
    """uvicorn.run keyword arguments for these settings (besides host, port and workers)."""
    log_config = copy.deepcopy(
        LOGGING_CONFIG
    )  # the service's own lines (models loaded, clients gone) as uvicorn's
    log_config["loggers"]["densecnn.app"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return {
        "http": f"{HeaderDeadlineProtocol.__module__}:{HeaderDeadlineProtocol.__qualname__}",
        "log_config": log_config,
        "timeout_keep_alive": settings.keep_alive_timeout,
        "limit_concurrency": settings.max_connections,
        "h11_max_incomplete_event_size": settings.max_header_bytes,
        "timeout_graceful_shutdown": int(settings.request_timeout) + 5,  # in-flight requests finish first
        # with --workers, the supervisor restarts a worker that does not answer its ping within this time; importing
        # torch and loading the models can hold the interpreter longer than uvicorn's 5 s on a busy machine
        "timeout_worker_healthcheck": WORKER_HEALTHCHECK_SECONDS,
    }
