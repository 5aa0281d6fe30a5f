"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter

from ..dependencies import ReadyServiceDep
from ..errors import ErrorBody
from ..responses import Health, Readiness

router = APIRouter(tags=["health"])


@router.api_route(
    "/healthz", methods=["GET", "HEAD"], response_model=Health, summary="Liveness: the process answers"
)
async def healthz() -> Health:
    return Health(status="ok")


@router.api_route(
    "/readyz",
    methods=["GET", "HEAD"],
    response_model=Readiness,
    summary="Readiness: 200 once the models are loaded; 503 while loading or draining",
    responses={503: {"model": ErrorBody, "description": "loading, draining, or no model could be loaded"}},
)
async def readyz(service: ReadyServiceDep) -> Readiness:
    return Readiness(status="ready", models=list(service.models))
