"""Exact tiling under a memory cap: the output is cut into tiles, each computed from its input with a halo of R−1.

Tiling knows nothing of the net it tiles: it is given a function that runs one padded tile, the receptive field R,
and a memory estimate. The whole image is padded once (by the caller); output tile rows r … r+th−1 read padded rows
r … r+th+Rh−2, exactly what the untiled pass reads for them, so the stitched result equals the untiled one (to
rounding: the same ops on the same pixels, at another shape); signals and volumes are cut alike along every axis.
All tiles have the same size (the last row/column of tiles is shifted back to end at the border, overlapping its
neighbour), so one solver plan serves them all.

The memory estimate (:class:`MemoryEstimate`, built by :meth:`densecnn.DenseCNN.memory_estimate` from the layer
shapes): the padded image and the result are held throughout; per tile, the peak is the largest pair of consecutive
activations (input and output of a layer) times :data:`WORKSPACE` for solver buffers (space-to-batch copies, format
conversions). Under autograd all activations of a tile are kept.
"""

from __future__ import annotations

import itertools
import math
import numbers
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from .errors import InvalidInputError, ScoresNotFiniteError
from .geometry import Size
from .nonfinite import NO_DATA_LABEL


def class_labels(scores: torch.Tensor, *, no_data: bool = False) -> torch.Tensor:
    """(N, K, *S) scores -> (N, *S) int64 labels: the first class with the highest score, as ``argmax(1)`` gives,
    through ``max(1)``, which torch runs several times faster on the CPU for few classes.

    ``no_data``: the input may hold no-data pixels (``nonfinite="propagate"``, :mod:`densecnn.nonfinite`), and a
    pixel whose scores hold NaN gets :data:`~densecnn.nonfinite.NO_DATA_LABEL`. Otherwise the input was finite, and a
    NaN score is the net overflowing, which is refused rather than labelled.

    >>> class_labels(torch.tensor([[[0.0, float("nan")], [1.0, 0.0]]]), no_data=True)
    tensor([[ 1, -1]])

    Raises:
        ScoresNotFiniteError: NaN scores without ``no_data``.
    """
    best, labels = scores.max(1)  # max propagates NaN: a pixel with a NaN score has a NaN best
    missing = best.isnan()
    if not no_data and missing.any():
        raise ScoresNotFiniteError(
            f"the model's scores are NaN at {int(missing.sum())} of the {missing.numel()} pixels scored at once, on a "
            "finite input: the net overflows there (weights or activations beyond float range), so those pixels have no label; check "
            "the model (a training run that diverged?) and how its inputs are scaled"
        )
    return labels.masked_fill_(missing, NO_DATA_LABEL)


WORKSPACE = 3.0  # solver buffers: space-to-batch holds two extra copies of a layer's input and output
PROGRESS_FROM = 8  # show a progress bar from this many tiles on (on a terminal)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a tiled call needs: ``held`` throughout (the stitched result), plus ``tile(t)``, the peak of computing
    one output tile of spatial size ``t`` (its padded input included); ``halo``: R−1 per axis, the extra input every tile
    reads (empty: unknown, tiles are cubes)."""

    held: int
    tile: Callable[[Size], int]
    halo: Size = ()


def tile_peak_bytes(sizes: list[int], itemsize: int, *, train: bool) -> int:
    """Estimated peak bytes of one tile, from the element counts of its input and of every layer's output."""
    peak = max(a + b for a, b in itertools.pairwise(sizes))
    return int(itemsize * ((sum(sizes) if train else 0) + WORKSPACE * peak))


def physical_memory() -> int | None:
    """This machine's memory in bytes, or None where the system does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def check_max_memory(max_memory) -> int:
    """``max_memory`` as an int: a positive integer (numpy's too; not a bool or a float)."""
    if isinstance(max_memory, bool) or not isinstance(max_memory, numbers.Integral) or max_memory <= 0:
        raise InvalidInputError(f"max_memory must be a positive number of bytes (int), got {max_memory!r}")
    return int(max_memory)


def choose_tile(shape, max_memory: int, estimate: MemoryEstimate, *, labels: bool) -> Size:
    """The output tile whose estimate fits ``max_memory`` bytes and that computes the fewest input pixels in all
    (the output plus every tile's halo, :func:`halo_cost`), for an input of ``shape`` (N, C, *S).

    Two shapes are sized to the largest that fits: a cube (a square for images) and a tile shaped like the halo
    (each axis in proportion to R−1, then grown axis by axis into what memory is left), which is what minimises
    the halo for anisotropic patches and volumes: a (9, 65, 65) patch on a 64×2048×2048 stack gets tiles about
    8× wider than deep. The cheaper one is taken (the cube on a tie, as for square patches).

    Raises:
        ValueError: not even a 1×1 tile fits; the message says how much memory is needed.
    """
    size = tuple(shape[2:])
    budget = max_memory - estimate.held

    def fits(tile: Size) -> bool:
        return estimate.tile(tile) <= budget

    if fits(size):
        return size
    if not fits((1,) * len(size)):
        needed = estimate.held + estimate.tile((1,) * len(size))
        what = "labels" if labels else "scores (predict() keeps only labels)"
        raise InvalidInputError(
            f"max_memory={max_memory:,} bytes is too small for a {'x'.join(map(str, shape))} input: it needs at "
            f"least {needed:,} bytes ({estimate.held:,} for the {what}, the rest for the smallest tile and its "
            "padded input); raise max_memory or pass a smaller image or batch"
        )
    halo = estimate.halo or (0,) * len(size)
    cube = _largest(fits, lambda side: tuple(min(side, s) for s in size), max(size))
    candidates = [_equal_tiles(cube, size)]
    if len(set(halo)) > 1:
        weights = [max(h, 1) / max(max(halo), 1) for h in halo]

        def shaped(n: int) -> Size:  # n along the axis of the largest halo, the others in proportion
            return tuple(min(s, max(1, round(n * w))) for s, w in zip(size, weights))

        largest = _largest(fits, shaped, max(math.ceil(s / w) for s, w in zip(size, weights)))
        candidates.append(_equal_tiles(_grow(fits, largest, size, halo), size))
    return min(candidates, key=lambda tile: halo_cost(size, tile, halo))  # the cube first: it wins ties


def halo_cost(size: Size, tile: Size, halo: Size) -> int:
    """Input pixels computed to cover ``size`` with tiles of ``tile`` (equal tiles, the last ones shifted back),
    each reading ``halo`` more along every axis: the output's pixels plus the overhead of tiling."""
    return math.prod(math.ceil(s / t) * (t + h) for s, t, h in zip(size, tile, halo))


def _largest(fits, tile_of, high: int) -> Size:
    """``tile_of(n)`` for the largest n in [1, high] that fits (``fits`` grows monotonically false in n)."""
    low = 1
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(tile_of(mid)) else (low, mid - 1)
    return tile_of(low)


def _grow(fits, tile: Size, size: Size, halo: Size) -> Size:
    """``tile`` grown along each axis in turn (largest halo first) as far as memory allows."""
    tile = list(tile)
    for axis in sorted(range(len(tile)), key=lambda a: -halo[a]):

        def along(n: int, axis=axis) -> Size:
            return tuple(n if a == axis else t for a, t in enumerate(tile))

        tile[axis] = _largest(fits, along, size[axis])[axis] if fits(along(tile[axis])) else tile[axis]
    return tuple(tile)


def _equal_tiles(tile: Size, size: Size) -> Size:
    """The same number of tiles per axis as ``tile`` gives, made equal in size (never larger than ``tile``)."""
    return tuple(math.ceil(s / math.ceil(s / min(t, s))) for s, t in zip(size, tile))


def tile_starts(length: int, tile: int) -> list[int]:
    """Start of each tile along an axis; the last one ends at the border (overlapping its neighbour if needed)."""
    return [min(i * tile, length - tile) for i in range(math.ceil(length / tile))]


def tile_count(size: Size, tile: Size) -> int:
    """How many tiles of ``tile`` :func:`tiles` cuts an output of ``size`` into."""
    return math.prod(math.ceil(s / t) for s, t in zip(size, tile))


def tiles(
    run_padded: Callable[[torch.Tensor], torch.Tensor],
    window_of: Callable[[tuple[tuple[int, int], ...]], torch.Tensor],
    size: Size,
    tile: Size,
    receptive_field: Size,
    *,
    labels: bool,
    no_data: bool = False,
) -> Iterator[tuple[tuple[slice, ...], torch.Tensor]]:
    """Each output tile in turn, as (its region in the output's spatial axes, its (N, K, *t) scores or (N, *t)
    int64 labels if ``labels`` (``no_data`` as :func:`class_labels` takes it), computed as :func:`run_tiled` computes it. Lazy: a consumer that stops asking
    stops the work within one tile, and may put each tile where it likes (a progress bar, a file) instead of
    holding the whole output.

    >>> for region, labels in tiles(run, window_of, (300, 200), (150, 200), (40, 40), labels=True):
    ...     out[(slice(None), *region)] = labels   # two tiles of (N, 150, 200)
    """
    for start in itertools.product(*(tile_starts(s, t) for s, t in zip(size, tile))):
        spans = tuple((s, s + t + r - 1) for s, t, r in zip(start, tile, receptive_field))
        scores = run_padded(window_of(spans))  # (N, K, th, tw)
        region = tuple(slice(s, s + t) for s, t in zip(start, tile))
        yield region, class_labels(scores, no_data=no_data) if labels else scores
        del scores


def run_tiled(
    run_padded: Callable[[torch.Tensor], torch.Tensor],
    window_of: Callable[[tuple[tuple[int, int], ...]], torch.Tensor],
    size: Size,
    tile: Size,
    receptive_field: Size,
    *,
    labels: bool,
    no_data: bool = False,
) -> torch.Tensor:
    """(N, K, *S) scores of an input of spatial ``size`` S, or (N, *S) int64 labels if ``labels``, computed tile by
    tile with ``run_padded`` ((N, C, th+Rh-1, tw+Rw-1) -> (N, K, th, tw)). ``window_of(spans)`` gives a tile's
    padded input: the window ``[start, stop)`` per axis of the padded input (N, C, *(S+R-1)), which is never made
    whole (:func:`densecnn.padding.padded_window`). The tiles come from :func:`tiles`.
    """
    count = tile_count(size, tile)
    progress = tqdm(
        tiles(run_padded, window_of, size, tile, receptive_field, labels=labels, no_data=no_data),
        total=count,
        desc="densecnn tiles",
        unit="tile",
        disable=None if count >= PROGRESS_FROM else True,
    )
    out = None
    for region, result in progress:
        if out is None:  # (N, *S) labels or (N, K, *S) scores
            out = result.new_empty((*result.shape[: result.dim() - len(size)], *size))
        out[(..., *region)] = result
        del result
    return out
