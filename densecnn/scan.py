"""The baselines a DenseCNN is measured against, both exact: patch-by-patch scanning and fast scanning.

Both take signals (N, C, L), images (N, C, H, W) or volumes (N, C, D, H, W), as the model's layers say.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import nn

from .chain import extract_chain
from .convert import as_patch_size, convert, spatial_dims_of
from .errors import InvalidInputError
from .layers import WindowLayer
from .ops.precision import full_float32
from .padding import check_padding_mode, pad_for_patches


@torch.no_grad()
def scan_patches(
    model: nn.Module, x: torch.Tensor, patch_size, *, padding_mode: str = "zeros", batch_size: int = 1024
) -> torch.Tensor:
    """Label every pixel by running ``model`` on the patch centred there, ``batch_size`` patches at a time.

    The reference every dense result is checked against: (N, C, *S) -> (N, K, *S) for any number of spatial axes,
    patches cut from the input padded by ``padding_mode`` (⌊(P-1)/2⌋ before, ⌊P/2⌋ after, along each axis).

    >>> model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    >>> densecnn.scan_patches(model.eval(), torch.rand(1, 1, 8, 9), patch).shape
    torch.Size([1, 3, 8, 9])
    """
    _check_tensor(x)
    patch = as_patch_size(patch_size, x.dim() - 2)
    check_padding_mode(padding_mode)
    if batch_size < 1:
        raise InvalidInputError(f"batch_size must be >= 1, got {batch_size}")
    n, _, *size = x.shape
    windows = pad_for_patches(x, patch, padding_mode)
    for axis, p in enumerate(patch, start=2):
        windows = windows.unfold(axis, p, 1)  # (N, C, *S, *P)
    pixels = torch.arange(n * math.prod(size), device=x.device)
    scores = []
    with full_float32(x):  # the reference in IEEE float32 on a GPU too (no TF32)
        if not len(pixels):  # no pixel to label: the classes from one patch of zeros
            return x.new_zeros(n, _patch_scores(model, x.new_zeros(1, x.shape[1], *patch)).shape[1], *size)
        for chunk in pixels.split(batch_size):
            index = torch.unravel_index(chunk, (n, *size))  # (image, *position)
            patches = windows[(index[0], slice(None), *index[1:])]  # (B, C, *P)
            scores.append(_patch_scores(model, patches))  # (B, K)
    return torch.cat(scores).view(n, *size, -1).movedim(-1, 1)  # (N, K, *S)


def _check_tensor(x, spatial_dims: int | None = None) -> None:
    """Refuse an ``x`` that is not an (N, C, *S) tensor (of ``spatial_dims`` axes S, where given)."""
    dims = x.dim() if isinstance(x, torch.Tensor) else None
    if dims is not None and dims >= 3 and spatial_dims in (None, dims - 2):
        return
    shape = f" of shape {tuple(x.shape)}" if hasattr(x, "shape") else ""
    axes = {1: "(N, C, L)", 2: "(N, C, H, W)", 3: "(N, C, D, H, W)"}.get(spatial_dims, "(N, C, *S)")
    raise InvalidInputError(
        f"x must be an {axes} torch tensor for this model, got {type(x).__name__}{shape}; e.g. "
        "torch.from_numpy(image)[None, None] for one gray image"
    )


def _patch_scores(model: nn.Module, patches: torch.Tensor) -> torch.Tensor:
    """(B, K) class scores of (B, C, *P) ``patches``: the model's output per patch must be one score vector (or a
    map of one pixel); a larger map means the patch is not the size the model labels one pixel from."""
    try:
        out = model(patches)
    except RuntimeError as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InvalidInputError(
            f"the model cannot run on patches of shape {tuple(patches.shape[1:])} ({reason}); give the patch size, "
            "channels and dtype it takes"
        ) from None
    if out.dim() > 2 and math.prod(out.shape[2:]) > 1:
        raise InvalidInputError(
            f"the model maps a {'x'.join(map(str, patches.shape[2:]))} patch to a {tuple(out.shape[1:])} map, not "
            "one score vector: give the patch size it labels one pixel from (its output one score per class)"
        )
    return out.reshape(len(patches), -1)


@torch.no_grad()
def fast_scan(model: nn.Module, x: torch.Tensor, patch_size, *, padding_mode: str = "zeros") -> torch.Tensor:
    """Fast scanning with fragments (Giusti et al. 2013): every strided op runs at each of its offsets (s×s for
    images, s×s×s for volumes), the fragments stacked in the batch, and the final fragments are re-interleaved into
    the full map.

    (N, C, *S) -> (N, K, *S), equal to :func:`scan_patches`.
    """
    patch = as_patch_size(patch_size, spatial_dims_of(extract_chain(model), patch_size))
    _check_tensor(x, len(patch))
    dense = convert(model, patch, padding_mode=padding_mode, backend="native")
    n, _, *size = x.shape
    total_stride = [math.prod(axis) for axis in zip(*(layer.stride for layer in dense.window_layers()))]
    # Pad so that every fragment has the same size and the interleaved map covers the whole input.
    padded = dense.pad(x)
    extra = [(-s) % t + t for s, t in zip(padded.shape[2:], total_stride)]
    padded = nn.functional.pad(padded, [w for e in reversed(extra) for w in (0, e)])
    fragments, strides = padded, []
    for layer in dense.features:
        if isinstance(layer, WindowLayer):
            if any(s != 1 for s in layer.stride):
                fragments = _all_offsets(layer, fragments)
                strides.append(layer.stride)
            else:
                fragments = layer.strided(fragments)
        else:
            fragments = layer(fragments)
    full = _interleave(fragments, strides, n)
    return full[(slice(None), slice(None), *(slice(0, s) for s in size))]


def _all_offsets(layer: WindowLayer, x: torch.Tensor) -> torch.Tensor:
    """(B, C, *S) -> (prod(s)·B, C', *S'): the strided op at every offset, offset-major in the batch (the first
    axis's offset most significant)."""
    outputs = [
        layer.strided(x[(slice(None), slice(None), *(slice(o, None) for o in offset))])
        for offset in itertools.product(*(range(s) for s in layer.stride))
    ]
    smallest = [min(o.shape[axis] for o in outputs) for axis in range(2, x.dim())]
    return torch.cat([o[(slice(None), slice(None), *(slice(0, m) for m in smallest))] for o in outputs])


def _interleave(fragments: torch.Tensor, strides: list[tuple[int, ...]], n: int) -> torch.Tensor:
    """Undo the fragment stacking: along each axis, position = a1 + s1·(a2 + s2·(… + s_L·r)), the first layer's
    offset least significant."""
    _, k, *out = fragments.shape
    dims, depth = len(out), len(strides)
    offsets = [
        s for stride in reversed(strides) for s in stride
    ]  # batch = (layer L's offsets, …, layer 1's, n)
    x = fragments.view(*offsets, n, k, *out)
    base = dims * depth
    order = [base, base + 1]  # (N, K, then per axis: its map size, then the offsets of layers L … 1)
    for axis in range(dims):
        order += [base + 2 + axis, *(dims * layer + axis for layer in range(depth))]
    sizes = [o * math.prod(stride[axis] for stride in strides) for axis, o in enumerate(out)]
    return x.permute(*order).reshape(n, k, *sizes)
