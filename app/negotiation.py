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


def _media_ranges(accept: str) -> list[tuple[str, float]]:
    """The media ranges of an Accept header with their quality (``q``, its name in any case; 1 when absent, 0 when
    unreadable or outside 0 to 1), in the header's order."""
    ranges = []
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
                q = q if 0.0 <= q <= 1.0 else 0.0  # NaN too
        if media:
            ranges.append((media.lower(), q))
    return ranges


def _specificity(media: str, output: Output) -> int:
    """How closely the media range ``media`` names ``output``: 3 by its type (or an alias), 2 by ``type/*``, 1 by
    ``*/*``, 0 not at all."""
    if media == output.value or ALIASES.get(media) is output:
        return 3
    if media == f"{output.value.split('/')[0]}/*":
        return 2
    return 1 if media == "*/*" else 0


def _quality(ranges: list[tuple[str, float]], output: Output) -> tuple[float, int]:
    """``output``'s quality and the position of the range that gives it: the most specific range naming it decides
    (RFC 9110, 12.5.1), so ``image/png;q=0, */*`` refuses PNG; (0, 0) when no range names it."""
    best = (0, 0.0, 0)  # specificity, quality, position
    for position, (media, q) in enumerate(ranges):
        specificity = _specificity(media, output)
        if specificity > best[0]:
            best = (specificity, q, position)
    return best[1], best[2]


def choose_output(accept: str | None, view: View | None, dims: int = 2) -> Output:
    """The response format for a model of ``dims`` spatial axes: the first of ``OFFERED[dims]`` when nothing is
    asked; 422 for ``?view=overlay`` on a volume or signal; 406 (with ``Vary: Accept``) when nothing offered fits.

    Of the formats offered, the one of the highest quality wins (a type's quality is its most specific range's,
    so ``q=0`` refuses it even where a wildcard would take it); ties go to the range named first in the header,
    then to the order of ``OFFERED``."""
    if view is View.overlay and dims != 2:
        raise ApiError(422, "overlay_needs_image", "?view=overlay is for 2-D images; this model is not 2-D")
    offered = [o for o in OFFERED[dims] if not (view is View.overlay and o is Output.NPY)]
    ranges = _media_ranges(accept or "*/*")
    ranked = []
    for order, output in enumerate(offered):
        q, position = _quality(ranges, output)
        if q > 0:
            ranked.append((-q, position, order, output))
    if ranked:
        return min(ranked)[-1]
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
