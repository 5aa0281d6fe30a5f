"""Prometheus metrics endpoint."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..dependencies import MetricsDep

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    summary="Prometheus metrics (of all worker processes together when there are several)",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "metrics"}},
)
async def metrics(metrics: MetricsDep) -> Response:
    return Response(generate_latest(metrics.scrape_registry()), media_type=CONTENT_TYPE_LATEST)
