"""The app factory: ``create_app(settings)`` wires settings, lifespan, middleware, error handlers and routers."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from contextlib import asynccontextmanager

import torch
from fastapi import Depends, FastAPI
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from prometheus_client.multiprocess import mark_process_dead
from sqlalchemy.engine import Engine

import densecnn

from .auth import RateLimiter, get_caller
from .cors import JsonCORSMiddleware
from .errors import install_error_handlers
from .executor import InferencePool
from .jobs.db import make_engine
from .jobs.quota import Quota
from .jobs.runner import JobRunner
from .jobs.store import JobStore
from .keys import KeyStore
from .limits import BodySizeLimitMiddleware
from .privacy import private_database, private_directory
from .prometheus import Metrics, MetricsMiddleware, multiprocess
from .query_parameters import refuse_unknown_query_parameters
from .receiving import ReceivingLimit
from .registry import load_models
from .requestid import RequestIdMiddleware
from .routers import health, jobs, models, page, segment, uploads
from .routers import metrics as metrics_router
from .routers.page import STATIC
from .routers.uploads import TUS_REQUEST_HEADERS, TUS_RESPONSE_HEADERS
from .settings import Settings
from .state import ServiceState, drain_on_signals
from .worker_settings import read_worker_settings

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
        service.model_dir, service.backend = settings.model_dir, settings.backend
        service.warm_sizes, service.max_memory = settings.warm_sizes, settings.max_inference_memory
        default = settings.default_model
        service.default_model = default if default in service.models else next(iter(service.models))
    except densecnn.DenseCNNError as exc:  # a model directory refused (ModelFileError), no model at all, ...
        service.load_error = str(exc)
        logger.error("%s", exc)
    finally:
        service.loading = False


async def _maintain_jobs(runner: JobRunner, period: float) -> None:
    """Every ``period`` seconds: heartbeats, jobs to take over, expired jobs (off the event loop)."""
    while True:
        await asyncio.sleep(period)
        try:
            await asyncio.to_thread(runner.maintain)
        except Exception:  # a database hiccup: logged, tried again next period
            logger.exception("job maintenance failed")


def create_app(settings: Settings | None = None) -> FastAPI:
    """The densecnn service. Models are loaded in the lifespan (never at import), into ``app.state.service``.

    >>> app = create_app(Settings(model_dir="models", queue_size=8))
    >>> with TestClient(app) as client: ...
    """
    settings = settings or Settings()
    metrics = Metrics()
    service = ServiceState()
    app = FastAPIOffline(  # /docs and /redoc from packaged assets: they work offline, no CDN
        title="densecnn",
        version=densecnn.__version__,
        summary="Full-resolution label maps from patch-trained CNNs, exactly as patch-by-patch scanning gives them.",
        lifespan=_lifespan(settings, service, metrics),
    )
    app.state.settings, app.state.service, app.state.metrics = settings, service, metrics
    app.state.rate_limiter = RateLimiter(settings.requests_per_minute)
    app.state.auth_failures = RateLimiter(settings.failed_auth_per_minute)
    install_error_handlers(app, retry_after=settings.retry_after)
    _add_middleware(app, settings, metrics)
    # 422 for a query parameter the endpoint does not take; the web page leaves a link's own (utm_..., cache-busting)
    # and /metrics a scrape configuration's (Prometheus's `params`), where nothing is computed from them
    checked = [Depends(refuse_unknown_query_parameters)]
    for router in (health.router, jobs.router, uploads.router):
        app.include_router(router, dependencies=checked)
    for router in (page.router, metrics_router.router):
        app.include_router(router)
    for router in (models.router, segment.router):  # keys and rate limits as for jobs
        app.include_router(router, dependencies=[*checked, Depends(get_caller)])
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


def _lifespan(settings: Settings, service: ServiceState, metrics: Metrics):
    """The app's lifespan: bounds torch's threads and the library's caches, starts loading the models and the
    inference pool, opens the database and the job runner; on shutdown, stops them in order."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        _limit_threads(settings)
        # the caches that grow with every new image size, bounded by the service's settings
        densecnn.ops.set_config(
            densecnn.ops.get_config().replace(
                output_cache_mb=settings.worker_output_cache_mb,
                plan_cache_size=settings.worker_plan_cache_size,
            )
        )
        service.loading, service.draining, service.load_error = True, False, None
        service.pool = _inference_pool(settings, metrics)
        service.receiving = ReceivingLimit(settings.max_receiving_uploads, settings.max_receiving_per_client)
        drain_on_signals(service)
        loading = asyncio.create_task(_load_models(service, settings))
        engine, runner = await _start_jobs(app, settings, service, metrics)
        maintenance = asyncio.create_task(_maintain_jobs(runner, settings.job_poll_seconds))
        try:
            yield
        finally:
            service.draining = True  # in-flight requests have finished when the server gets here
            maintenance.cancel()
            await loading
            await asyncio.to_thread(runner.stop)  # running jobs stop after their blocks in flight, to resume
            await asyncio.to_thread(service.pool.shutdown)
            engine.dispose()
            if multiprocess():  # this worker's gauges of work in flight leave the sum
                mark_process_dead(os.getpid())

    return lifespan


def _limit_threads(settings: Settings) -> None:
    torch.set_num_threads(settings.torch_threads)


def _inference_pool(settings: Settings, metrics: Metrics) -> InferencePool:
    """The bounded executor of inferences, its threads limited like the server's, its queue in the metrics."""

    def gauges(queued: int, running: int) -> None:
        metrics.queue_depth.set(queued)
        metrics.running.set(running)

    return InferencePool(
        settings.max_concurrent_inferences,
        settings.queue_size,
        thread_setup=functools.partial(_limit_threads, settings),
        on_change=gauges,
    )


async def _start_jobs(
    app: FastAPI, settings: Settings, service: ServiceState, metrics: Metrics
) -> tuple[Engine, JobRunner]:
    """Open the (private) data directory and database, the key store and the job runner (its jobs run the models
    ``service`` serves), which resumes the jobs a stopped server left; returns the database engine and the
    runner."""
    await asyncio.to_thread(private_directory, settings.data_dir)
    engine = await asyncio.to_thread(make_engine, settings.database)
    await asyncio.to_thread(private_database, settings)
    app.state.keys = KeyStore(engine)
    await asyncio.to_thread(app.state.keys.adopt_named_jobs)
    store = JobStore(engine)
    quota = Quota(engine, settings.disk_quota_bytes)
    app.state.jobs = runner = JobRunner(settings, store, quota, metrics, service)
    metrics.watch_jobs(store.count_by_state)
    await asyncio.to_thread(runner.maintain)  # resumes the jobs a stopped server left
    return engine, runner


def _add_middleware(app: FastAPI, settings: Settings, metrics: Metrics) -> None:
    """Body limits, CORS (where origins are allowed), metrics and request ids; the last added is the outermost."""
    app.add_middleware(
        BodySizeLimitMiddleware, max_bytes=settings.max_upload_bytes,
        paths={"/v1/jobs": settings.max_job_upload_bytes, "/v1/uploads": settings.max_job_upload_bytes},  # to disk
    )  # fmt: skip
    if settings.cors_origins:
        app.add_middleware(
            JsonCORSMiddleware, allow_origins=settings.cors_origins,
            allow_methods=["GET", "HEAD", "POST", "PATCH", "DELETE", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "X-Request-ID", *TUS_REQUEST_HEADERS],
            expose_headers=["Location", "Retry-After", "X-Request-ID", "Server-Timing", *TUS_RESPONSE_HEADERS],
        )  # fmt: skip
    app.add_middleware(MetricsMiddleware, metrics=metrics)  # counts every answer, 413s included
    app.add_middleware(RequestIdMiddleware)  # outermost: every answer carries its id


def create_worker_app() -> FastAPI:
    """The app of one worker process of ``densecnn serve --workers N`` (uvicorn's factory), with the settings the
    command checked (:mod:`densecnn_app.worker_settings`)."""
    return create_app(read_worker_settings())
