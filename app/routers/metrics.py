"""Prometheus metrics endpoint: behind a key where keys are required (unless ``public_metrics``), since it shows the
jobs of every key by state."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..auth import get_caller
from ..dependencies import MetricsDep

router = APIRouter(tags=["metrics"])


def metrics_access(request: Request) -> None:
    """401 (429 after too many failures) without a valid key, where keys are required and metrics are not public."""
    settings = request.app.state.settings
    if settings.require_keys and not settings.public_metrics:
        get_caller(request)


@router.get(
    "/metrics",
    summary="Prometheus metrics (of all worker processes together when there are several)",
    response_class=Response,
    dependencies=[Depends(metrics_access)],
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "metrics"},
               401: {"description": "keys are required and metrics are not public: send a key"}},
)  # fmt: skip
async def metrics(metrics: MetricsDep) -> Response:
    return Response(generate_latest(metrics.scrape_registry()), media_type=CONTENT_TYPE_LATEST)
