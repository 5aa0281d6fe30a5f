"""Typed dependencies of the endpoints."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from .errors import ApiError
from .executor import InferencePool
from .prometheus import Metrics
from .receiving import ReceivingLimit
from .registry import ServedModel
from .settings import Settings
from .state import ServiceState


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_service(request: Request) -> ServiceState:
    return request.app.state.service


def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


SettingsDep = Annotated[Settings, Depends(get_settings)]
ServiceDep = Annotated[ServiceState, Depends(get_service)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]


def require_ready(service: ServiceDep, settings: SettingsDep) -> ServiceState:
    """The service, or 503 + Retry-After while it loads or drains."""
    if not service.ready:
        raise ApiError(
            503, "not_ready", service.not_ready_reason(), {"Retry-After": str(settings.retry_after)}
        )
    return service


ReadyServiceDep = Annotated[ServiceState, Depends(require_ready)]


def get_pool(service: ReadyServiceDep) -> InferencePool:
    return service.pool


PoolDep = Annotated[InferencePool, Depends(get_pool)]


def get_receiving(service: ReadyServiceDep) -> ReceivingLimit:
    return service.receiving


ReceivingDep = Annotated[ReceivingLimit, Depends(get_receiving)]


def get_model(
    name: Annotated[str, Path(description="model name, see GET /v1/models")], service: ReadyServiceDep
):
    """The served model called ``name`` as its files are now, or 404 naming the ones that exist (a sync
    dependency: a model whose files changed is loaded again off the event loop)."""
    served = service.model(name)
    if served is None:
        raise unknown_model(service, name)
    return served


def unknown_model(service: ServiceState, name: str) -> ApiError:
    return ApiError(404, "unknown_model", f"no model named {name!r}; models: {', '.join(service.models)}")


ModelDep = Annotated[ServedModel, Depends(get_model)]
