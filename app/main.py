"""The app factory: ``create_app(settings)`` wires settings, lifespan, middleware, error handlers and routers."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

import torch
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline

import densecnn

from .errors import install_error_handlers
from .executor import InferencePool
from .limits import BodySizeLimitMiddleware
from .metrics import Metrics, MetricsMiddleware
from .registry import load_models
from .routers import health, models, page, segment
from .routers import metrics as metrics_router
from .routers.page import STATIC
from .settings import Settings
from .state import ServiceState, drain_on_signals

logger = logging.getLogger("densecnn.app")


async def _load_models(service: ServiceState, settings: Settings) -> None:
    """Load the models off the event loop, so /healthz answers (and /readyz says 503) meanwhile."""
    try:
        service.models = await asyncio.to_thread(
            load_models,
            settings.model_dir,
            backend=settings.backend,
            warm_sizes=settings.warm_sizes,
            max_memory=settings.max_inference_memory,
        )
        default = settings.default_model
        service.default_model = default if default in service.models else next(iter(service.models))
    except densecnn.DenseCNNError as exc:  # a model directory refused (ModelFileError), no model at all, ...
        service.load_error = str(exc)
        logger.error("%s", exc)
    finally:
        service.loading = False


def create_app(settings: Settings | None = None) -> FastAPI:
    """The densecnn service. Models are loaded in the lifespan (never at import), into ``app.state.service``.

    >>> app = create_app(Settings(model_dir="models", queue_size=8))
    >>> with TestClient(app) as client: ...
    """
    settings = settings or Settings()
    metrics = Metrics()
    service = ServiceState()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        def limit_threads() -> None:
            torch.set_num_threads(settings.torch_threads)

        limit_threads()
        # the caches that grow with every new image size, bounded by the service's settings
        densecnn.ops.set_config(
            densecnn.ops.get_config().replace(
                output_cache_mb=settings.output_cache_mb, plan_cache_size=settings.plan_cache_size
            )
        )
        service.loading, service.draining, service.load_error = True, False, None
        service.pool = InferencePool(
            settings.max_concurrent_inferences, settings.queue_size, thread_setup=limit_threads
        )
        metrics.queue_depth.set_function(lambda: service.pool.queued)
        metrics.running.set_function(lambda: service.pool.running)
        drain_on_signals(service)
        loading = asyncio.create_task(_load_models(service, settings))
        try:
            yield
        finally:
            service.draining = True  # in-flight requests have finished when the server gets here
            await loading
            await asyncio.to_thread(service.pool.shutdown)

    app = FastAPIOffline(  # /docs and /redoc from packaged assets: they work offline, no CDN
        title="densecnn",
        version=densecnn.__version__,
        summary="Full-resolution label maps from patch-trained CNNs, exactly as patch-by-patch scanning gives them.",
        lifespan=lifespan,
    )
    app.state.settings, app.state.service, app.state.metrics = settings, service, metrics
    install_error_handlers(app, retry_after=settings.retry_after)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_upload_bytes)
    app.add_middleware(MetricsMiddleware, metrics=metrics)  # outermost: counts every answer, 413s included
    for router in (health.router, models.router, segment.router, metrics_router.router, page.router):
        app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app
