"""Memory formats by name: ``"nchw"`` (NC*, contiguous) and ``"nhwc"`` (channels-last: ``torch.channels_last`` for
images, ``torch.channels_last_3d`` for volumes; signals have no channels-last format in torch and run NC*).

>>> memory_format("nhwc", 5)
torch.channels_last_3d
>>> layout_of(torch.empty(1, 8, 4, 4, 4).contiguous(memory_format=torch.channels_last_3d))
torch.channels_last_3d
"""

from __future__ import annotations

import torch

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


# pixels per block of a channels-last tensor's conversion to NC* (measured: 1.6× faster than one strided copy)
_BLOCK_PIXELS = 2048
# channels up to which torch's own copy is faster (3 classes of a 96³ volume: 0.8 against 4.3 ms blocked; 16 of a
# 512²: 3.2 against 5.5; 24 of a 512²: 8.8 against 5.0)
_FEW_CHANNELS = 16


def contiguous(x: torch.Tensor) -> torch.Tensor:
    """x in NC* memory: a channels-last x, one (pixels, C) matrix in memory, is transposed block by block of
    pixels (a 32-channel 512² score map in 17 ms where torch's strided copy of the whole takes 29: each block's
    reads and writes stay in cache). Under autograd, off the CPU, when x is small or has at most
    :data:`_FEW_CHANNELS` channels (whose rows torch's copy reads fast), torch's own copy.

    >>> x = torch.randn(1, 8, 64, 64).contiguous(memory_format=torch.channels_last)
    >>> torch.equal(contiguous(x), x.contiguous())
    True
    """
    pixels = x.shape[2:].numel()
    small = pixels <= 2 * _BLOCK_PIXELS or x.device.type != "cpu" or x.shape[1] <= _FEW_CHANNELS
    if small or not is_channels_last(x) or (torch.is_grad_enabled() and x.requires_grad):
        return x.contiguous()
    n, c = x.shape[:2]
    matrix = x.movedim(1, -1).reshape(n, pixels, c)  # (N, pixels, C), a view
    out = torch.empty(n, c, pixels, dtype=x.dtype, device=x.device)
    for start in range(0, pixels, _BLOCK_PIXELS):
        block = slice(start, start + _BLOCK_PIXELS)
        out[:, :, block].copy_(matrix[:, block].transpose(1, 2))
    return out.view(x.shape)
