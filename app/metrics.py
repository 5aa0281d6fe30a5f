"""Prometheus metrics, one registry per app: requests by route and status, latency, inference time, queue depth,
abandoned jobs, image sizes. With several worker processes each worker reports its own.

A request whose client disconnected before its answer is counted with status "499" (no answer is sent).
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
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
            "densecnn_inference_queue_depth", "requests waiting for an inference slot", registry=self.registry
        )
        self.running = Gauge("densecnn_inferences_running", "inferences running now", registry=self.registry)
        self.abandoned = Counter(
            "densecnn_inferences_abandoned", "jobs given up: the client left, or the request deadline passed",
            ["reason"], registry=self.registry,
        )  # fmt: skip
        self.image_pixels = Histogram(
            "densecnn_image_pixels", "pixels per segmented image", registry=self.registry,
            buckets=(1e3, 1e4, 1e5, 2.5e5, 1e6, 4e6, 8e6, 16e6, 64e6),
        )  # fmt: skip


class MetricsMiddleware:
    """Count every HTTP request under its route template (``/v1/models/{name}/segment``), never the raw path."""

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
            self.metrics.requests.labels(route, scope["method"], str(status)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - start)
