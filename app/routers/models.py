"""What models are served and what they are."""

from __future__ import annotations

from fastapi import APIRouter

from ..dependencies import ModelDep, ReadyServiceDep
from ..errors import ErrorBody
from ..responses import ModelInfo, ModelList

router = APIRouter(prefix="/v1/models", tags=["models"])

NOT_READY = {503: {"model": ErrorBody, "description": "models are loading or the server is draining"}}


@router.get("", response_model=ModelList, summary="The served models", responses=NOT_READY)
def list_models(service: ReadyServiceDep) -> ModelList:
    # as the models' files are now (a model updated in place is described as segment and jobs will run it)
    current = service.current_models()
    return ModelList(default=service.default_model, models=[ModelInfo.of(m) for m in current.values()])


@router.get(
    "/{name}",
    response_model=ModelInfo,
    summary="One model: patch size, input channels, classes with names and colours, padding mode",
    responses={
        404: {"model": ErrorBody, "description": "no such model"},
        422: {"model": ErrorBody, "description": "invalid model name"},
        **NOT_READY,
    },
)
def get_model(served: ModelDep) -> ModelInfo:
    return ModelInfo.of(served)
