"""Memory formats by name: ``"nchw"`` (NC*, contiguous) and ``"nhwc"`` (channels-last: ``torch.channels_last`` for
images, ``torch.channels_last_3d`` for volumes; signals have no channels-last format in torch and run NC*).

>>> memory_format("nhwc", 5)
torch.channels_last_3d
>>> layout_of(torch.empty(1, 8, 4, 4, 4).contiguous(memory_format=torch.channels_last_3d))
torch.channels_last_3d
"""

from __future__ import annotations

import torch

from . import ext

NAMES = ("nchw", "nhwc")
_CHANNELS_LAST = {
    4: torch.channels_last,
    5: torch.channels_last_3d,
}  # tensor rank: torch's channels-last format


def names_for(dims: int) -> list[str]:
    """The memory formats a (N, C, *S) tensor of ``dims`` dimensions can take: both for images and volumes."""
    return list(NAMES) if dims in _CHANNELS_LAST else ["nchw"]


def memory_format(name: str, dims: int) -> torch.memory_format:
    """torch's memory format for ``name`` on a tensor of ``dims`` dimensions ("nhwc" on a signal is NC*)."""
    return _CHANNELS_LAST.get(dims, torch.contiguous_format) if name == "nhwc" else torch.contiguous_format


def to_format(x: torch.Tensor, name: str) -> torch.Tensor:
    """x laid out in the memory format ``name``. A one-channel tensor is laid out alike in both; in "nhwc" it is
    re-strided as channels-last (channel stride 1), which is how densecnn's kernels tell that their outputs should
    be channels-last too."""
    fmt = memory_format(name, x.dim())
    if fmt is torch.contiguous_format or x.shape[1] != 1:
        return x.contiguous(memory_format=fmt)
    return x.to(memory_format=fmt)


def is_channels_last(x: torch.Tensor) -> bool:
    """Whether ``x`` is channels-last (and not also NC*, as tensors with one channel or one pixel are)."""
    layout = _CHANNELS_LAST.get(x.dim())
    return layout is not None and not x.is_contiguous() and x.is_contiguous(memory_format=layout)


def layout_of(x: torch.Tensor) -> torch.memory_format:
    """x's memory format: channels-last or contiguous (NC*)."""
    return _CHANNELS_LAST[x.dim()] if is_channels_last(x) else torch.contiguous_format


# pixels per image up to which torch's own copy serves (8 crops of 64² with 50 channels: 0.3–1.0 ms either way)
_SMALL_PIXELS = 4096


def contiguous(x: torch.Tensor) -> torch.Tensor:
    """x in NC* memory: a channels-last x, one (pixels, C) matrix per image in memory, is transposed by densecnn's
    kernel (``torch.ops.densecnn.channels_first``: block by block of pixels, into a reused output buffer; a
    32-channel 632² map in 8.6 ms where torch's strided copy into fresh memory takes 60). Under autograd its
    gradient goes back channels-last, as x was, so that the net's backward runs in x's layout. Off the CPU, without
    the compiled kernels or for small images, torch's own copy.

    >>> x = torch.randn(1, 8, 64, 64).contiguous(memory_format=torch.channels_last)
    >>> torch.equal(contiguous(x), x.contiguous())
    True
    """
    small = x.shape[2:].numel() <= _SMALL_PIXELS or x.device.type != "cpu" or not ext.available()
    if small or not is_channels_last(x):
        return x.contiguous()
    return torch.ops.densecnn.channels_first(x)


def channels_last(x: torch.Tensor) -> torch.Tensor:
    """x (N, C, *S) with its channels last in memory (one (pixels, C) matrix per image), whatever its rank: the
    inverse of :func:`contiguous`, by the same kernel's blocks the other way (``torch.ops.densecnn.channels_last``; a
    32-class score map's NC* gradient handed back to a channels-last net: 1.1 ms at 256² where torch's strided copy
    takes 3.1, and as fast or faster down to 8 crops of 32²). Off the CPU or without the compiled kernels, torch's
    own copy.

    >>> x = torch.randn(1, 8, 64, 64)
    >>> torch.equal(channels_last(x), x) and channels_last(x).is_contiguous(memory_format=torch.channels_last)
    True
    """
    if x.movedim(1, -1).is_contiguous():
        return x
    if x.device.type != "cpu" or not ext.available():
        return x.movedim(1, -1).contiguous().movedim(-1, 1)
    return torch.ops.densecnn.channels_last(x)
