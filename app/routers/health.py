"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter

from ..dependencies import ReadyServiceDep
from ..errors import ErrorBody
from ..responses import Health, Readiness
from .get_and_head import get_and_head

router = APIRouter(tags=["health"])


@get_and_head(router, "/healthz", response_model=Health, summary="Liveness: the process answers")
async def healthz() -> Health:
    return Health(status="ok")


@get_and_head(
    router,
    "/readyz",
    response_model=Readiness,
    summary="Readiness: 200 once the models are loaded; 503 while loading or draining",
    responses={503: {"model": ErrorBody, "description": "loading, draining, or no model could be loaded"}},
)
async def readyz(service: ReadyServiceDep) -> Readiness:
    return Readiness(status="ready", models=list(service.models))
