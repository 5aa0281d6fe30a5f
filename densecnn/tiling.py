"""Exact tiling under a memory cap: the output is cut into tiles, each computed from its input with a halo of R−1.

The whole image is padded once (the padding convention of :meth:`DenseCNN.pad`); output tile rows r … r+th−1 read
padded rows r … r+th+Rh−2, exactly what the untiled pass reads for them, so the stitched result equals the untiled
one. All tiles have the same size (the last row/column of tiles is shifted back to end at the border, overlapping its
neighbour), so one solver plan serves them all.

Memory is estimated from the layer shapes: the padded image and the result are held throughout; per tile, the peak
is the largest pair of consecutive activations (input and output of a layer) times :data:`WORKSPACE` for solver
buffers (space-to-batch copies, format conversions). Under autograd all activations of a tile are kept.
"""

from __future__ import annotations

import itertools
import math
import threading

import torch
from tqdm.auto import tqdm

from .ops.plan import layer_output_shape

WORKSPACE = 3.0  # solver buffers: space-to-batch holds two extra copies of a layer's input and output
PROGRESS_FROM = 8  # show a progress bar from this many tiles on (on a terminal)


def activation_sizes(dense, n: int, channels: int, tile: tuple[int, int]) -> list[int]:
    """Element counts of the input and of every layer output, for an output tile of ``tile`` = (th, tw)."""
    rh, rw = dense.receptive_field
    shape = (n, channels, tile[0] + rh - 1, tile[1] + rw - 1)
    sizes = [math.prod(shape)]
    for layer in dense.features:
        shape = layer_output_shape(layer, shape)
        sizes.append(math.prod(shape))
    return sizes


def tile_bytes(dense, n: int, channels: int, tile: tuple[int, int], itemsize: int, *, train: bool) -> int:
    """Estimated peak bytes of computing one output tile (held results excluded)."""
    sizes = activation_sizes(dense, n, channels, tile)
    peak = max(a + b for a, b in itertools.pairwise(sizes))
    return int(itemsize * ((sum(sizes) if train else 0) + WORKSPACE * peak))


def held_bytes(dense, shape, itemsize: int, *, labels: bool) -> int:
    """Bytes held for the whole call: the padded image and the stitched result (labels or scores)."""
    n, c, h, w = shape
    rh, rw = dense.receptive_field
    result = n * h * w * (8 if labels else dense.num_classes * itemsize)
    return n * c * (h + rh - 1) * (w + rw - 1) * itemsize + result


def choose_tile(
    dense, shape, itemsize: int, max_memory: int, *, labels: bool, train: bool
) -> tuple[int, int]:
    """The output tile (th, tw) with the fewest tiles whose estimate fits ``max_memory`` bytes.

    Raises:
        ValueError: not even a 1×1 tile fits; the message says how much memory is needed.
    """
    n, c, h, w = shape
    budget = max_memory - held_bytes(dense, shape, itemsize, labels=labels)

    def fits(side: int) -> bool:
        return tile_bytes(dense, n, c, (min(side, h), min(side, w)), itemsize, train=train) <= budget

    if fits(max(h, w)):
        return h, w
    low, high = 0, max(h, w)  # largest square side that fits, by bisection
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    if low == 0:
        held = held_bytes(dense, shape, itemsize, labels=labels)
        needed = held + tile_bytes(dense, n, c, (1, 1), itemsize, train=train)
        what = "labels" if labels else "scores (predict() keeps only labels)"
        raise ValueError(
            f"max_memory={max_memory:,} bytes is too small for a {n}x{c}x{h}x{w} input: it needs at least "
            f"{needed:,} bytes ({held:,} for the padded image and the {what}, the rest for the smallest tile); "
            "raise max_memory or pass a smaller image or batch"
        )
    th, tw = min(low, h), min(low, w)
    return math.ceil(h / math.ceil(h / th)), math.ceil(w / math.ceil(w / tw))  # equal tiles, same count


def tile_starts(length: int, tile: int) -> list[int]:
    """Start of each tile along an axis; the last one ends at the border (overlapping its neighbour if needed)."""
    return [min(i * tile, length - tile) for i in range(math.ceil(length / tile))]


def run_tiled(
    dense, x: torch.Tensor, max_memory: int, *, labels: bool, cancel: threading.Event | None = None
) -> torch.Tensor:
    """(N, C, H, W) -> (N, K, H, W) scores, or (N, H, W) int64 labels if ``labels``, tile by tile.

    Equal to the untiled ``dense(x)`` (same ops on the same padded pixels). Raises :class:`Cancelled` at the next
    tile or layer once ``cancel`` is set.
    """
    if isinstance(max_memory, bool) or not isinstance(max_memory, int) or max_memory <= 0:
        raise ValueError(f"max_memory must be a positive number of bytes (int), got {max_memory!r}")
    n, _, h, w = x.shape
    train = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in dense.parameters()))
    th, tw = choose_tile(dense, x.shape, x.element_size(), max_memory, labels=labels, train=train)
    rh, rw = dense.receptive_field
    padded = dense.pad(x)  # (N, C, H+Rh-1, W+Rw-1)
    if labels:
        out = torch.empty((n, h, w), dtype=torch.int64, device=x.device)
    else:
        out = torch.empty((n, dense.num_classes, h, w), dtype=x.dtype, device=x.device)
    tiles = list(itertools.product(tile_starts(h, th), tile_starts(w, tw)))
    progress = tqdm(
        tiles, desc="densecnn tiles", unit="tile", disable=None if len(tiles) >= PROGRESS_FROM else True
    )
    for row, col in progress:
        scores = dense.run_padded(
            padded[:, :, row : row + th + rh - 1, col : col + tw + rw - 1], cancel=cancel
        )  # (N, K, th, tw)
        if labels:
            out[:, row : row + th, col : col + tw] = scores.argmax(1)
        else:
            out[:, :, row : row + th, col : col + tw] = scores
        del scores
    return out
