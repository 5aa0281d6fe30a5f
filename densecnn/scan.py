"""The baselines a DenseCNN is measured against, both exact: patch-by-patch scanning and fast scanning."""

from __future__ import annotations

import math

import torch
from torch import nn

from .convert import as_patch_size, convert
from .layers import WindowLayer
from .padding import check_padding_mode, pad_for_patches


@torch.no_grad()
def scan_patches(
    model: nn.Module, x: torch.Tensor, patch_size, *, padding_mode: str = "zeros", batch_size: int = 1024
) -> torch.Tensor:
    """Label every pixel by running ``model`` on the patch centred there, ``batch_size`` patches at a time.

    The reference every dense result is checked against: (N, C, H, W) -> (N, K, H, W), patches cut from the image
    padded by ``padding_mode`` (top/left ⌊(P-1)/2⌋, bottom/right ⌊P/2⌋).

    >>> model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    >>> densecnn.scan_patches(model.eval(), torch.rand(1, 1, 8, 9), patch).shape
    torch.Size([1, 3, 8, 9])
    """
    ph, pw = as_patch_size(patch_size)
    check_padding_mode(padding_mode)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n, _, height, width = x.shape
    windows = (
        pad_for_patches(x, (ph, pw), padding_mode).unfold(2, ph, 1).unfold(3, pw, 1)
    )  # (N, C, H, W, Ph, Pw)
    pixels = torch.arange(n * height * width, device=x.device)
    scores = []
    for chunk in pixels.split(batch_size):
        image, row, col = chunk // (height * width), chunk // width % height, chunk % width
        patches = windows[image, :, row, col]  # (B, C, Ph, Pw)
        scores.append(model(patches).reshape(len(chunk), -1))  # (B, K)
    return torch.cat(scores).view(n, height, width, -1).permute(0, 3, 1, 2)  # (N, K, H, W)


@torch.no_grad()
def fast_scan(model: nn.Module, x: torch.Tensor, patch_size, *, padding_mode: str = "zeros") -> torch.Tensor:
    """Fast scanning with fragments (Giusti et al. 2013): every strided op runs at each of its s×s offsets, the
    fragments stacked in the batch, and the final fragments are re-interleaved into the full map.

    (N, C, H, W) -> (N, K, H, W), equal to :func:`scan_patches`.
    """
    patch = as_patch_size(patch_size)
    dense = convert(model, patch, padding_mode=padding_mode, backend="native")
    n, _, height, width = x.shape
    layers = list(dense.features)
    total_stride = [1, 1]
    for layer in dense.window_layers():
        total_stride[0] *= layer.stride[0]
        total_stride[1] *= layer.stride[1]
    # Pad so that every fragment has the same size and the interleaved map covers all H×W pixels.
    padded = dense.pad(x)
    extra = (
        (-padded.shape[2]) % total_stride[0] + total_stride[0],
        (-padded.shape[3]) % total_stride[1] + total_stride[1],
    )
    padded = nn.functional.pad(padded, (0, extra[1], 0, extra[0]))
    fragments, strides = padded, []
    for layer in layers:
        if isinstance(layer, WindowLayer):
            sh, sw = layer.stride
            if (sh, sw) != (1, 1):
                fragments = _all_offsets(layer, fragments, sh, sw)
                strides.append((sh, sw))
            else:
                fragments = layer.strided(fragments)
        else:
            fragments = layer(fragments)
    return _interleave(fragments, strides, n)[:, :, :height, :width]


def _all_offsets(layer: WindowLayer, x: torch.Tensor, sh: int, sw: int) -> torch.Tensor:
    """(B, C, H, W) -> (sh·sw·B, C', H', W'): the strided op at every offset, offset-major in the batch."""
    outputs = [layer.strided(x[:, :, a:, b:]) for a in range(sh) for b in range(sw)]
    rows = min(o.shape[2] for o in outputs)
    cols = min(o.shape[3] for o in outputs)
    return torch.cat([o[:, :, :rows, :cols] for o in outputs])


def _interleave(fragments: torch.Tensor, strides: list[tuple[int, int]], n: int) -> torch.Tensor:
    """Undo the fragment stacking: row = a1 + s1·(a2 + s2·(… + s_L·r)), the first layer's offset least significant."""
    _, k, h, w = fragments.shape
    depth = len(strides)
    offsets = [dim for sh, sw in reversed(strides) for dim in (sh, sw)]  # batch = (aL, bL, …, a1, b1, n)
    x = fragments.view(*offsets, n, k, h, w)
    row_axes = [2 * i for i in range(depth)]  # aL … a1
    col_axes = [2 * i + 1 for i in range(depth)]  # bL … b1
    base = 2 * depth
    x = x.permute(base, base + 1, base + 2, *row_axes, base + 3, *col_axes)  # (N, K, h, aL…a1, w, bL…b1)
    rows = h * math.prod(s[0] for s in strides)
    cols = w * math.prod(s[1] for s in strides)
    return x.reshape(n, k, rows, cols)
