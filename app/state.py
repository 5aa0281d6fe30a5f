"""What the service knows at run time: its models, whether it is ready, whether it is draining."""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

from densecnn import DenseCNNError
from densecnn.modelfile import CONFIG_FILE

from .errors import ApiError
from .executor import InferencePool
from .receiving import ReceivingLimit
from .registry import ServedModel, load_model, model_dirs, model_identity, warm_model

logger = logging.getLogger("densecnn.app")


@dataclass
class ServiceState:
    """Lives in ``app.state.service``; filled by the lifespan."""

    models: dict[str, ServedModel] = field(default_factory=dict)
    default_model: str | None = None
    pool: InferencePool | None = None
    receiving: ReceivingLimit | None = None
    load_error: str | None = None
    draining: bool = False
    model_dir: Path | None = None  # where the models are read from (set once they are loaded)
    backend: str = "auto"
    # the sizes a model loaded or reloaded runs on before it serves, under the inference memory cap, as at start-up
    warm_sizes: list[list[int]] = field(default_factory=list)
    max_memory: int | None = None
    _reloading: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _loaded: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def loading(self) -> bool:
        """True until the lifespan has loaded the models (or given up on them)."""
        return not self._loaded.is_set()

    @loading.setter
    def loading(self, loading: bool) -> None:
        if loading:
            self._loaded.clear()
        else:
            self._loaded.set()

    def wait_loaded(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the models to be loaded (or given up on); whether they are."""
        return self._loaded.wait(timeout)

    @property
    def ready(self) -> bool:
        return not self.loading and not self.draining and self.load_error is None and self.pool is not None

    def model(self, name: str) -> ServedModel | None:
        """The served model ``name`` as its files are now, so that every path (segment, jobs, the model list)
        serves the same model: loaded again (and warmed as at start-up) when its directory's files changed since it
        was loaded, None when its directory (or its model.json) is gone; 503 ``model_unavailable`` while its files
        cannot be loaded (being replaced, or broken). Its ``identity`` is the version it is. Blocking: call it off
        the event loop."""
        if self.model_dir is None:
            return self.models.get(name)
        if name in ("", ".", "..") or any(c in name for c in "/\\\0"):
            return None  # never a directory outside the model directory
        directory = self.model_dir / name
        served = self.models.get(name)
        if not (directory / CONFIG_FILE).is_file():
            if served is not None:
                self._drop(name, "its directory or model.json was removed")
            return None
        if served is not None and served.identity == model_identity(directory):
            return served
        with self._reloading:  # one reload at a time; a request that waited finds the reloaded model
            served = self.models.get(name)
            if served is not None and served.identity == model_identity(directory):
                return served
            try:
                fresh = load_model(directory, backend=self.backend)
            except (DenseCNNError, OSError) as exc:
                self._drop(name, f"its files cannot be loaded ({exc})")
                raise ApiError(503, "model_unavailable",
                               f"model {name!r} is being updated on the server or its files are broken; try again "
                               "in a moment, or choose another model (GET /v1/models)",
                               {"Retry-After": "1"}) from None  # fmt: skip
            warm_model(fresh, self.warm_sizes, max_memory=self.max_memory)  # before any request gets it
            self.models = {**self.models, name: fresh}  # replaced, never changed in place: readers iterate it
            logger.info("model %s %s from %s", name, "reloaded" if served else "loaded", directory)
            if self.default_model is None:
                self.default_model = name
            return fresh

    def current_models(self) -> dict[str, ServedModel]:
        """Every model served now (as :meth:`model` gives it): those whose directory is gone are left out, those
        changed are loaded again, new directories holding a model.json are added; one that cannot be loaded is
        left out."""
        if self.model_dir is None:
            return dict(self.models)
        names = sorted({*self.models, *(directory.name for directory in model_dirs(self.model_dir))})
        current = {}
        for name in names:
            try:
                served = self.model(name)
            except ApiError:
                continue
            if served is not None:
                current[name] = served
        return current

    def _drop(self, name: str, why: str) -> None:
        if name in self.models:
            self.models = {key: value for key, value in self.models.items() if key != name}
            logger.warning("model %s is no longer served: %s", name, why)
        if self.default_model == name:
            self.default_model = next(iter(self.models), None)

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
