"""Choosing the segment response's format from the ``Accept`` header (and ``?view=overlay``)."""

from __future__ import annotations

from enum import Enum

from .errors import ApiError


class Output(str, Enum):
    PNG = "image/png"
    TIFF = "image/tiff"
    JSON = "application/json"
    NPY = "application/x-npy"


# What a model of 1, 2 or 3 spatial axes answers with, the default (for */*) first.
OFFERED = {
    1: (Output.JSON, Output.NPY),
    2: (Output.PNG, Output.JSON, Output.NPY),
    3: (Output.TIFF, Output.JSON, Output.NPY),
}
_WHAT = {1: "a signal model answers with labels per sample", 3: "a volume model answers with a label volume"}


class View(str, Enum):
    overlay = "overlay"


ECHO_LIMIT = 200  # characters of the Accept header quoted back in a 406
# other names clients give a format (uploads take .npy under either name): answered as the format itself
ALIASES = {"application/npy": Output.NPY}


def _preferences(accept: str) -> list[str]:
    """Media ranges of an Accept header, most preferred first (by q, then by order); q=0 ranges dropped."""
    ranked = []
    for position, part in enumerate(accept.split(",")):
        media, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for param in params:
            if param.startswith("q="):
                try:
                    q = float(param[2:])
                except ValueError:
                    q = 0.0
        if media and q > 0:
            ranked.append((-q, position, media.lower()))
    return [media for _, _, media in sorted(ranked)]


def choose_output(accept: str | None, view: View | None, dims: int = 2) -> Output:
    """The response format for a model of ``dims`` spatial axes: the first of ``OFFERED[dims]`` when nothing is
    asked; 422 for ``?view=overlay`` on a volume or signal; 406 (with ``Vary: Accept``) when nothing offered fits."""
    if view is View.overlay and dims != 2:
        raise ApiError(422, "overlay_needs_image", "?view=overlay is for 2-D images; this model is not 2-D")
    offered = [o for o in OFFERED[dims] if not (view is View.overlay and o is Output.NPY)]
    ranges = {"*/*": offered[0], "application/*": Output.JSON}
    ranges["image/*"] = next((o for o in offered if o.value.startswith("image/")), None)
    for media in _preferences(accept or "*/*"):
        output = (
            ranges.get(media) or ALIASES.get(media) or next((o for o in Output if o.value == media), None)
        )
        if output in offered:
            return output
    names = ", ".join(o.value for o in offered)
    why = f" ({_WHAT[dims]})" if dims in _WHAT else ""
    echoed = (
        accept
        if len(accept or "") <= ECHO_LIMIT
        else f"{accept[:ECHO_LIMIT]}... ({len(accept):,} characters)"
    )
    raise ApiError(
        406,
        "not_acceptable",
        f"cannot answer Accept: {echoed}{why}; ask for one of {names}",
        {"Vary": "Accept"},
    )
