"""Prometheus metrics, one registry per app: requests by route and status, latency, inference time, queue depth,
abandoned jobs, image sizes; jobs by state (from the database), jobs finished, blocks computed.

With several worker processes (``densecnn serve --workers N``) prometheus-client's multiprocess mode is on: each
worker writes its values to files under ``PROMETHEUS_MULTIPROC_DIR`` and /metrics, whichever worker answers, sums
them (gauges of work in flight: the live workers' sum).

A request whose client disconnected before its answer is counted with status "499" (no answer is sent).

Every label takes a bounded set of values, whatever clients send: a route is a template of the app's (or
"unmatched"), a method one of :data:`STANDARD_METHODS` (or "other"), a status one the app answers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

STANDARD_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def multiprocess() -> bool:
    """Whether the metrics are shared by several worker processes (prometheus-client reads this at import)."""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


class JobsCollector:
    """``densecnn_jobs{state}``: the jobs in the database by state, counted when /metrics is read."""

    def __init__(self, count_by_state: Callable[[], dict[str, int]]):
        self.count_by_state = count_by_state

    def collect(self):
        family = GaugeMetricFamily("densecnn_jobs", "jobs in the database by state", labels=["state"])
        counts = self.count_by_state()
        for state in ("queued", "running", "succeeded", "failed", "cancelled"):
            family.add_metric([state], counts.get(state, 0))
        yield family


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.jobs: JobsCollector | None = None  # set once the job database is open
        if not multiprocess():  # process metrics are per process: with several workers, the answering one's
            ProcessCollector(registry=self.registry)  # process_resident_memory_bytes and kin: watch the RSS
        self.requests = Counter(
            "densecnn_http_requests", "HTTP requests by route and status", ["route", "method", "status"],
            registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "densecnn_http_request_duration_seconds",
            "HTTP request latency",
            ["route"],
            registry=self.registry,
        )
        self.inference = Histogram(
            "densecnn_inference_seconds", "time in the dense net per image", ["model"], registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )  # fmt: skip
        self.queue_depth = Gauge(
            "densecnn_inference_queue_depth", "requests waiting for an inference slot", registry=self.registry,
            multiprocess_mode="livesum",
        )  # fmt: skip
        self.running = Gauge(
            "densecnn_inferences_running", "inferences running now", registry=self.registry,
            multiprocess_mode="livesum",
        )  # fmt: skip
        self.abandoned = Counter(
            "densecnn_inferences_abandoned", "jobs given up: the client left, or the request deadline passed",
            ["reason"], registry=self.registry,
        )  # fmt: skip
        self.image_pixels = Histogram(
            "densecnn_image_pixels", "pixels per segmented image", registry=self.registry,
            buckets=(1e3, 1e4, 1e5, 2.5e5, 1e6, 4e6, 8e6, 16e6, 64e6),
        )  # fmt: skip
        self.jobs_finished = Counter(
            "densecnn_jobs_finished",
            "jobs that ended, by their final state",
            ["state"],
            registry=self.registry,
        )
        self.job_blocks = Counter(
            "densecnn_job_blocks", "output chunks (or images) computed by jobs", registry=self.registry
        )

    def watch_jobs(self, count_by_state: Callable[[], dict[str, int]]) -> None:
        if self.jobs is not None:  # the app started again (its database opened again)
            self.jobs.count_by_state = count_by_state
            return
        self.jobs = JobsCollector(count_by_state)
        if not multiprocess():
            self.registry.register(self.jobs)

    def scrape_registry(self) -> CollectorRegistry:
        """What /metrics reports: this process's registry, or with several workers the sum of theirs."""
        if not multiprocess():
            return self.registry
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        if self.jobs is not None:
            registry.register(self.jobs)
        return registry


def method_label(method: str) -> str:
    """The method a request is counted under: a standard one as sent, any other token (HTTP allows any) "other"."""
    return method if method in STANDARD_METHODS else "other"


class MetricsMiddleware:
    """Count every HTTP request under its route template (``/v1/models/{name}/segment``), never the raw path, and
    its method under :func:`method_label`, never an arbitrary token."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.requests.labels(route, method_label(scope["method"]), str(status)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - start)
