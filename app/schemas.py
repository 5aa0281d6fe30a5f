"""Response bodies of the JSON endpoints (they are also the OpenAPI schemas)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from densecnn.padding import PADDING_MODES

from .registry import ServedModel


class ClassInfo(BaseModel):
    id: int
    name: str
    color: list[int] = Field(description="[r, g, b], 0..255: the class colour in label PNGs and overlays")


class Normalization(BaseModel):
    mean: list[float]
    std: list[float]


class ModelInfo(BaseModel):
    name: str
    patch_size: list[int] = Field(description="[height, width] of the patches the model was trained on")
    receptive_field: list[int] = Field(description="[height, width] of the pixels each label depends on")
    in_channels: int
    num_classes: int
    classes: list[ClassInfo]
    padding_mode: str = Field(
        description=f"how the image is extended beyond its border: {', '.join(PADDING_MODES)}"
    )
    normalization: Normalization | None = Field(description="applied to images scaled to [0, 1]")

    @classmethod
    def of(cls, served: ServedModel) -> ModelInfo:
        loaded = served.loaded
        return cls(
            name=served.name,
            patch_size=list(loaded.patch_size),
            receptive_field=list(served.dense.receptive_field),
            in_channels=loaded.in_channels,
            num_classes=loaded.num_classes,
            classes=[
                ClassInfo(id=k, name=name, color=colour)
                for k, (name, colour) in enumerate(zip(loaded.class_names, loaded.palette))
            ],
            padding_mode=loaded.padding_mode,
            normalization=loaded.normalization,
        )


class ModelList(BaseModel):
    default: str | None = Field(description="the model the web page selects first")
    models: list[ModelInfo]


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str
    models: list[str]


class SegmentJson(BaseModel):
    """``Accept: application/json`` answer of the segment endpoint."""

    width: int
    height: int
    classes: list[ClassInfo]
    labels_png_base64: str = Field(
        description="the label map as a PNG (palette PNG, or 16-bit above 256 classes)"
    )
    pixel_counts: list[int] = Field(description="pixels per class id")
    overlay_png_base64: str | None = Field(None, description="only with ?view=overlay: the RGB overlay PNG")
