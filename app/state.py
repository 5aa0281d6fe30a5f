"""What the service knows at run time: its models, whether it is ready, whether it is draining."""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass, field

from .executor import InferencePool
from .receiving import ReceivingLimit
from .registry import ServedModel


@dataclass
class ServiceState:
    """Lives in ``app.state.service``; filled by the lifespan."""

    models: dict[str, ServedModel] = field(default_factory=dict)
    default_model: str | None = None
    pool: InferencePool | None = None
    receiving: ReceivingLimit | None = None
    loading: bool = True
    load_error: str | None = None
    draining: bool = False

    @property
    def ready(self) -> bool:
        return not self.loading and not self.draining and self.load_error is None and self.pool is not None

    def not_ready_reason(self) -> str:
        if self.draining:
            return "the server is shutting down"
        if self.loading:
            return "models are still loading"
        return f"no model is loaded: {self.load_error}"


def drain_on_signals(state: ServiceState) -> None:
    """Mark ``state`` draining on SIGTERM/SIGINT, then let the server's own handler shut down gracefully.

    uvicorn installs its handlers before the lifespan starts; wrapping them makes /readyz answer 503 while
    in-flight requests finish. Signals can only be handled in the main thread (not under TestClient).
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(signum)
        if not callable(previous):
            continue

        def handler(sig, frame, previous=previous):
            state.draining = True
            previous(sig, frame)

        signal.signal(signum, handler)
