"""Choosing the segment response's format from the ``Accept`` header (and ``?view=overlay``)."""

from __future__ import annotations

from enum import Enum

from .errors import ApiError


class Output(str, Enum):
    PNG = "image/png"
    JSON = "application/json"
    NPY = "application/x-npy"


class View(str, Enum):
    overlay = "overlay"


ECHO_LIMIT = 200  # characters of the Accept header quoted back in a 406
_RANGES = {"*/*": Output.PNG, "image/*": Output.PNG, "application/*": Output.JSON}


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


def choose_output(accept: str | None, view: View | None) -> Output:
    """The response format: PNG when nothing is asked; 406 (with ``Vary: Accept``) when nothing offered fits."""
    offered = [o for o in Output if not (view is View.overlay and o is Output.NPY)]
    for media in _preferences(accept or "*/*"):
        output = _RANGES.get(media) or next((o for o in Output if o.value == media), None)
        if output in offered:
            return output
    names = ", ".join(o.value for o in offered)
    echoed = (
        accept
        if len(accept or "") <= ECHO_LIMIT
        else f"{accept[:ECHO_LIMIT]}... ({len(accept):,} characters)"
    )
    raise ApiError(
        406, "not_acceptable", f"cannot answer Accept: {echoed}; ask for one of {names}", {"Vary": "Accept"}
    )
