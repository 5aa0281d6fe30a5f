"""What the library does with NaN and ±Inf input pixels: refuse them (the default), or treat them as no-data.

The fast solvers (FFT, Winograd) mix every pixel of a tile, so one non-finite pixel would poison scores far beyond
the patches that contain it, where patch scanning confines it. Every call that computes scores
(:meth:`densecnn.DenseCNN.forward`, ``predict``, ``masked_loss``, tiled or not, signals, images and volumes) therefore
takes a keyword ``nonfinite``:

- ``"refuse"`` (default): a non-finite input raises :class:`~densecnn.errors.NonFiniteInputError`, naming how many
  values and the first position;
- ``"propagate"``: non-finite pixels are no-data. They are read as 0 by the solvers, and afterwards every output
  pixel whose patch reads one of them (its *footprint*: the patch offsets the net actually reads) is NaN, as patch
  scanning gives for a NaN input; every other pixel is exact. ``predict`` labels those pixels
  :data:`NO_DATA_LABEL`; ``masked_loss`` leaves them out of the mask.

The footprint comes from the net's geometry alone: the no-data mask through a chain of dilated max-pools with each
windowed layer's kernel and dilation (:func:`no_data_pixels`), so a pixel the pools floor away never taints a score.

>>> dense(torch.tensor([[[0.0, float("nan"), 1.0]]]))
Traceback (most recent call last):
NonFiniteInputError: the input holds 1 non-finite value(s) (NaN or ±Inf), the first at [0, 0, 1] ...
>>> dense.predict(image_with_nan_holes, nonfinite="propagate")  # (N, *S) int64, NO_DATA_LABEL where a patch reads a hole
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .errors import Fix, InvalidInputError, NonFiniteInputError
from .layers import WindowLayer

# the label predict gives a pixel whose scores are NaN (its patch reads a non-finite input pixel)
NO_DATA_LABEL = -1
POLICIES = ("refuse", "propagate")
# the fix a refused non-finite input carries, which each front end names its own way (--nonfinite propagate, ...)
NO_DATA_FIX = Fix("if they mark missing data, label them as no-data", (("nonfinite", "propagate"),))
_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}


def check_policy(nonfinite: str) -> str:
    """``nonfinite`` if it names a policy.

    Raises:
        InvalidInputError: it does not.
    """
    if nonfinite not in POLICIES:
        raise InvalidInputError(
            f"nonfinite must be 'refuse' (raise on NaN/Inf input) or 'propagate' (NaN/Inf pixels are no-data), "
            f"got {nonfinite!r}"
        )
    return nonfinite


def all_finite(x: torch.Tensor) -> bool:
    """Whether every value of ``x`` is finite, by one sum (NaN and ±Inf make any sum non-finite; a sum that overflows
    on finite values is settled by ``isfinite``): a reduction allocates nothing, an elementwise test a mask as large
    as ``x``."""
    with torch.no_grad():
        return bool(torch.isfinite(x.sum())) or bool(torch.isfinite(x).all())


def check_finite(x: torch.Tensor) -> None:
    """Raise unless every value of ``x`` is finite (:func:`all_finite`; the count and position only on failure).

    Raises:
        NonFiniteInputError: naming the count, the first position and the fix.
    """
    if x.dtype.is_floating_point and not all_finite(x):
        bad = ~torch.isfinite(x)
        first = [int(i) for i in bad.nonzero()[0]]
        raise NonFiniteInputError(
            f"the input holds {int(bad.sum()):,} non-finite value(s) (NaN or ±Inf), the first at {first} "
            "(batch, channel, spatial axes): replace them (torch.nan_to_num), or get NaN scores (label -1) where a "
            "patch reads them",
            fix=NO_DATA_FIX,
        )


def no_data_input(padded: torch.Tensor) -> torch.Tensor | None:
    """(N, C, *P) padded input -> (N, 1, *P) bool, the pixels with a non-finite value in any channel; None if all are
    finite."""
    if all_finite(padded):
        return None
    return ~torch.isfinite(padded).all(dim=1, keepdim=True)


def no_data_pixels(layers, no_data: torch.Tensor) -> torch.Tensor:
    """(N, 1, *P) bool no-data input pixels -> (N, *S) bool output pixels whose footprint reads one: the mask through
    a stride-1 max-pool with each windowed layer's kernel and dilation (pointwise layers read one pixel), computed
    over the box of outputs whose windows can reach a no-data pixel only."""
    windows = [layer for layer in layers if isinstance(layer, WindowLayer)]
    reach = [
        sum((w.kernel[axis] - 1) * w.dilation[axis] for w in windows) for axis in range(no_data.dim() - 2)
    ]
    size = [p - r for p, r in zip(no_data.shape[2:], reach)]  # S per axis
    tainted = torch.zeros(no_data.shape[0], *size, dtype=torch.bool, device=no_data.device)  # (N, *S)
    box = []
    for axis, (r, s) in enumerate(zip(reach, size), start=2):
        hit = no_data.amax(
            dim=tuple(a for a in range(no_data.dim()) if a != axis)
        ).nonzero()  # (n, 1) positions
        if len(hit) == 0:
            return tainted
        box.append(
            (max(int(hit[0]) - r, 0), min(int(hit[-1]), s - 1) + 1)
        )  # outputs [first, stop) it can reach
    if any(first >= stop for first, stop in box):
        return tainted
    window = tuple(slice(first, stop + r) for (first, stop), r in zip(box, reach))
    # (N, 1, *(box + R - 1)), as floats: max_pool has no bool kernels
    mask = no_data[(slice(None), slice(None), *window)].to(torch.float32)
    for layer in windows:
        mask = _MAX_POOL[layer.dims](mask, layer.kernel, 1, 0, layer.dilation)  # (N, 1, *(shrinking))
    tainted[(slice(None), *(slice(first, stop) for first, stop in box))] = mask[:, 0] > 0
    return tainted


def zero_filled(padded: torch.Tensor, no_data: torch.Tensor) -> torch.Tensor:
    """(N, C, *P) with every channel of the no-data pixels set to 0 (a new tensor; autograd flows to the others)."""
    return padded.masked_fill(no_data, 0)


def run_with_no_data(run_padded, layers, padded: torch.Tensor) -> torch.Tensor:
    """``run_padded(padded)`` ((N, C, *P) -> (N, K, *S)) with non-finite pixels as no-data: the solvers read them as
    0, and the scores of every output pixel whose footprint reads one are NaN."""
    no_data = no_data_input(padded)
    if no_data is None:
        return run_padded(padded)
    scores = run_padded(zero_filled(padded, no_data))  # (N, K, *S)
    tainted = no_data_pixels(layers, no_data).unsqueeze(1)  # (N, 1, *S)
    return scores.masked_fill(tainted, float("nan"))
