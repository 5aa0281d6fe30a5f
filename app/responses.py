"""Response bodies of the JSON endpoints (they are also the OpenAPI schemas)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from densecnn.padding import PADDING_MODES

from .negotiation import OFFERED
from .registry import ServedModel

AXES = {1: ("length",), 2: ("height", "width"), 3: ("depth", "height", "width")}
ACCEPTS = {
    1: ("application/x-npy",),
    2: ("image/png", "image/jpeg", "image/tiff", "image/webp", "image/bmp", "image/gif", "application/x-npy"),
    3: ("image/tiff", "application/x-npy"),
}


class ClassInfo(BaseModel):
    id: int
    name: str
    color: list[int] = Field(description="[r, g, b], 0..255: the class colour in label PNGs and overlays")


class Normalization(BaseModel):
    mean: list[float]
    std: list[float]


class ModelInfo(BaseModel):
    name: str
    version: str = Field(
        description="the version served now: a digest of the model's files (paths, sizes, modification times); "
        "it changes when they are replaced, and a job's `model_version` is the one it ran with"
    )
    dims: int = Field(description="spatial axes: 1 (signals), 2 (images), 3 (volumes)")
    axes: list[str] = Field(
        description='the names of the spatial axes: ["length"], ["height", "width"] or '
        '["depth", "height", "width"]'
    )
    patch_size: list[int] = Field(
        description="per spatial axis (as `axes`): the patches the model was trained on"
    )
    receptive_field: list[int] = Field(
        description="per spatial axis (as `axes`): the input each label depends on"
    )
    accepts: list[str] = Field(description="upload formats this model takes")
    answers: list[str] = Field(description="media types of its answers (Accept), the default first")
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
        dims = served.dense.dims
        return cls(
            name=served.name,
            version=served.identity,
            dims=dims,
            axes=list(AXES[dims]),
            accepts=list(ACCEPTS[dims]),
            answers=[output.value for output in OFFERED[dims]],
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

    shape: list[int] = Field(
        description="the spatial shape: [height, width], [depth, height, width] or [length]"
    )
    classes: list[ClassInfo]
    counts: list[int] = Field(description="pixels (voxels, samples) per class id")
    no_data_count: int = Field(0, description="pixels labelled no-data (only with ?nonfinite=propagate)")
    width: int | None = Field(None, description="images only")
    height: int | None = Field(None, description="images only")
    labels_png_base64: str | None = Field(
        None, description="images: the label map as a PNG (palette PNG, or 16-bit above 255 classes)"
    )
    pixel_counts: list[int] | None = Field(None, description="images: pixels per class id (as `counts`)")
    labels_tiff_base64: str | None = Field(
        None,
        description="volumes: the label volume as a multi-page TIFF (uint8 ids, uint16 above 255 classes)",
    )
    labels_npy_base64: str | None = Field(
        None, description="signals: the labels as a .npy (L,) of uint8 ids (uint16 above 255 classes)"
    )
    overlay_png_base64: str | None = Field(None, description="only with ?view=overlay: the RGB overlay PNG")
