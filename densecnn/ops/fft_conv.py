"""The ``fft`` solver: a stride-1 dilated convolution computed in the frequency domain, with every stage a GEMM.

A d-dilated conv only ever reads one of the d×d interleaved sub-grids of its input (space-to-batch), where it is an
undilated conv. Each sub-grid is cut into overlapping tiles of Th×Tw pixels (overlap-save: neighbouring tiles share
k-1 rows or columns). On a tile, the cross-correlation with a kh×kw kernel is the inverse 2-D DFT of ``X · conj(W)``
(X, W the tile's and the zero-padded kernel's DFTs); its first S = T - k + 1 rows and columns are exact, the rest
wrap around and are never read. The cost of the products no longer depends on the kernel size (Mathieu, Henaff &
LeCun, "Fast Training of Convolutional Networks through FFTs"; Zlateski, Lee & Seung, "ZNNi").

Every stage is a large matrix product, because that is what a CPU does fast:

1. gather the tiles into ``(Th, Tw, tiles·C)``: channels innermost for a channels_last input, tiles innermost for
   NCHW, so the gather reads the input along its contiguous axis;
2. real DFT along w: one ``(2F, Tw)`` matrix per tile row (F = Tw//2 + 1 frequencies, real and imaginary parts);
3. complex DFT along h: one real ``(2Th, 2Th)`` matrix acting on (row, real/imaginary) pairs;
4. per frequency, the channel mixing ``(tiles, C) @ (C, K)`` in complex arithmetic: four real batched GEMMs with the
   Th·F frequencies as the batch;
5. inverse DFT along h, only the Sh valid rows; 6. inverse real DFT along w, only the Sw valid columns;
7. scatter the valid part of every tile back into the (N, K, H', W') output.

The transforms are matrices rather than ``torch.fft`` calls: batched small FFTs ran at a few GFLOP/s here, while a
length-T DFT as a T×T matrix product costs O(T) per point but runs at GEMM speed, and needs no size with small prime
factors, so T is free to fit the sub-grids (:func:`tile_sizes` picks it from a count of multiply-adds and memory
traffic). The kernel's spectrum is computed once per weight version and reused while the weight does not change
(inference); in training it is recomputed, differentiably, on every call. Every stage is a differentiable torch op,
so the backward pass is autograd's: the adjoint transforms, again as GEMMs.

Exact to rounding: the DFT matrices are built in float64; the result differs from direct convolution by summation
order only (about 1e-7 relative in float32). bfloat16 and float16 inputs are computed in float32 and rounded back.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict

import torch
import torch.nn.functional as F

from ..geometry import output_size

Pair = tuple[int, int]
MAX_TILE = 64  # largest tile side considered; past it the O(T) transforms cost more than the products save
MEMORY_WEIGHT = 8.0  # multiply-adds one float written and read back costs, in the tile-size cost model
SHORT_CONTRACTION = (
    128  # a GEMM whose contraction is this long runs at half the speed of a long one (measured)
)
CACHE_SIZE = 32  # kernel spectra kept (inference), least recently used dropped first
COMPUTE_DTYPES = (torch.float32, torch.float64)


def applies(spec) -> bool:
    """The solver runs ungrouped 2-D convs with a kernel larger than 1×1 (a 1×1 conv has nothing to transform)."""
    return spec.op == "conv2d" and len(spec.kernel) == 2 and spec.groups == 1 and spec.kernel != (1, 1)


def conv2d(spec, x: torch.Tensor) -> torch.Tensor:
    """Stride-1 dilated ``spec`` (a :class:`~densecnn.ops.solvers.ConvSpec`) on x (N, C, H, W) -> (N, K, H', W').

    The output has x's memory format and dtype.

    >>> spec = ConvSpec(torch.randn(8, 3, 7, 7), None, (4, 4), 1)
    >>> y = conv2d(spec, torch.randn(1, 3, 64, 64))  # == F.conv2d(x, spec.weight, dilation=4) to rounding
    >>> y.shape
    torch.Size([1, 8, 40, 40])
    """
    if x.dtype not in COMPUTE_DTYPES:
        return conv2d(spec, x.float()).to(x.dtype)
    weight = spec.weight.to(x.dtype)  # (K, C, kh, kw)
    bias = None if spec.bias is None else spec.bias.to(x.dtype)
    n, c, h, w = x.shape
    k = weight.shape[0]
    kernel, dilation = spec.kernel, spec.dilation
    out = output_size((h, w), kernel, dilation)
    if min(out) < 1:
        raise ValueError(
            f"a {h}x{w} input is smaller than the {kernel[0]}x{kernel[1]} kernel at dilation {dilation} reaches; "
            "pad it (DenseCNN does) or use a smaller kernel"
        )
    sub_out = tuple(-(-o // d) for o, d in zip(out, dilation))  # output rows/cols per sub-grid
    tile = tile_sizes(sub_out, kernel, c, k, n * dilation[0] * dilation[1])
    valid = tuple(t - kk + 1 for t, kk in zip(tile, kernel))
    counts = tuple(-(-so // s) for so, s in zip(sub_out, valid))  # tiles per sub-grid, per axis
    channels_inner = _is_channels_last(x)

    tiles = _gather(x, tile, valid, counts, dilation, kernel, channels_inner)  # (Th, Tw, tiles·C)
    re, im = _forward_dft(tiles, tile, c, channels_inner)  # each (Th·F, tiles, C) or (Th·F, C, tiles)
    w_re, w_im = kernel_spectrum(weight, tile, channels_inner, x.dtype)  # each (Th·F, C, K) or (Th·F, K, C)
    if channels_inner:
        y_re = torch.bmm(re, w_re).baddbmm_(im, w_im, alpha=-1)  # (Th·F, tiles, K)
        y_im = torch.bmm(re, w_im).baddbmm_(im, w_re)
    else:
        y_re = torch.bmm(w_re, re).baddbmm_(w_im, im, alpha=-1)  # (Th·F, K, tiles)
        y_im = torch.bmm(w_im, re).baddbmm_(w_re, im)
    if bias is not None:  # a constant is the zero frequency alone: bias · Th·Tw there, once per tile
        dc = bias * (tile[0] * tile[1])
        y_re[0] += dc if channels_inner else dc[:, None]
    y = _inverse_dft(y_re, y_im, tile, valid)  # (Sh, Sw, tiles·K) or (Sh, Sw, K·tiles)
    return _scatter(y, n, k, valid, counts, dilation, out, channels_inner)


@functools.lru_cache(maxsize=1024)
def tile_sizes(sub_out: Pair, kernel: Pair, c: int, k: int, grids: int) -> Pair:
    """(Th, Tw): the tile sides with the fewest multiply-adds plus weighted memory traffic.

    ``sub_out`` is the output size of one sub-grid, ``grids`` the number of sub-grids (N·dh·dw), ``c``/``k`` the
    input/output channels.
    """
    options = [range(kk + 1, max(kk + 1, min(MAX_TILE, so + kk - 1)) + 1) for so, kk in zip(sub_out, kernel)]
    return min(
        ((th, tw) for th in options[0] for tw in options[1]),
        key=lambda t: _cost(t, sub_out, kernel, c, k, grids),
    )


def _cost(tile: Pair, sub_out: Pair, kernel: Pair, c: int, k: int, grids: int) -> float:
    (th, tw), (sh, sw) = tile, (tile[0] - kernel[0] + 1, tile[1] - kernel[1] + 1)
    tiles = grids * -(-sub_out[0] // sh) * -(-sub_out[1] // sw)
    f = tw // 2 + 1
    multiply_adds = (  # each GEMM's multiply-adds over its efficiency, which falls with a short contraction
        c * th * 2 * f * tw / _efficiency(tw)  # forward DFT along w
        + c * 4 * th * th * f / _efficiency(2 * th)  # forward DFT along h
        + 4 * th * f * c * k / _efficiency(c)  # complex channel mixing
        + k * 4 * sh * th * f / _efficiency(th)  # inverse DFT along h
        + k * 2 * f * sh * sw / _efficiency(2 * f)  # inverse DFT along w
    )
    floats = c * (th * tw + 4 * th * f) + k * (4 * th * f + 2 * sh * f + 2 * sh * sw)
    return tiles * (multiply_adds + MEMORY_WEIGHT * floats)


def _efficiency(contraction: int) -> float:
    return contraction / (contraction + SHORT_CONTRACTION)


# --- stages --------------------------------------------------------------------------------------------------------


def _is_channels_last(x: torch.Tensor) -> bool:
    return not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


def _gather(x, tile: Pair, valid: Pair, counts: Pair, dilation: Pair, kernel: Pair, channels_inner: bool):
    """(N, C, H, W) -> (Th, Tw, tiles·C) [channels inner] or (Th, Tw, C·tiles); tiles ordered (N, dh, th, tw, dw).

    Tile (th, tw) of sub-grid (r, s) starts at sub-grid pixel (th·Sh, tw·Sw); the image is zero-padded at the
    bottom/right to a whole number of tiles (padded pixels only feed outputs that are cropped).
    """
    n, c, h, w = x.shape
    rows, cols = (
        (m * s + kk - 1) for m, s, kk in zip(counts, valid, kernel)
    )  # sub-grid pixels the tiles cover
    dh, dw = dilation
    if (rows * dh, cols * dw) != (h, w):
        x = F.pad(x, (0, cols * dw - w, 0, rows * dh - h))
    grids = x.reshape(n, c, rows, dh, cols, dw)  # (N, C, Q, dh, P, dw)
    windows = grids.unfold(2, tile[0], valid[0]).unfold(
        4, tile[1], valid[1]
    )  # (N, C, th, dh, tw, dw, Th, Tw)
    order = (6, 7, 0, 3, 2, 4, 5, 1) if channels_inner else (6, 7, 1, 0, 3, 2, 4, 5)
    return windows.permute(order).reshape(tile[0], tile[1], -1)


def _forward_dft(tiles: torch.Tensor, tile: Pair, channels: int, channels_inner: bool):
    """(Th, Tw, M) real -> real and imaginary parts of the 2-D DFT, each (Th·F, tiles, C) or (Th·F, C, tiles)."""
    th, tw = tile
    f = tw // 2 + 1
    rfft_w = _rfft_matrix(tw, tiles.dtype, tiles.device)
    fft_h = _fft_matrix(th, tiles.dtype, tiles.device)
    along_w = torch.matmul(rfft_w, tiles)  # (Th, 2F, M): rows (re/im, frequency)
    spectrum = fft_h @ along_w.reshape(2 * th, -1)  # (2Th, F·M): rows (re/im, frequency along h)
    split = (2, th * f, -1, channels) if channels_inner else (2, th * f, channels, -1)
    spectrum = spectrum.reshape(split)
    return spectrum[0], spectrum[1]


def _inverse_dft(y_re, y_im, tile: Pair, valid: Pair) -> torch.Tensor:
    """Real and imaginary (Th·F, ...) spectra -> (Sh, Sw, M) real: the valid rows and columns of every tile."""
    th, tw = tile
    sh, sw = valid
    f = tw // 2 + 1
    ifft_re, ifft_im = _ifft_matrices(th, sh, y_re.dtype, y_re.device)
    along_h = torch.mm(ifft_re, y_re.reshape(th, -1)).addmm_(ifft_im, y_im.reshape(th, -1))  # (2Sh, F·M)
    irfft_w = _irfft_matrix(tw, sw, y_re.dtype, y_re.device)
    return torch.matmul(irfft_w, along_h.reshape(sh, 2 * f, -1))  # (Sh, Sw, M)


def _scatter(y, n: int, k: int, valid: Pair, counts: Pair, dilation: Pair, out: Pair, channels_inner: bool):
    """(Sh, Sw, tiles·K) or (Sh, Sw, K·tiles) -> (N, K, H', W') in the input's memory format."""
    (sh, sw), (th, tw), (dh, dw) = valid, counts, dilation
    rows, cols = th * sh * dh, tw * sw * dw
    if channels_inner:
        y = y.reshape(sh, sw, n, dh, th, tw, dw, k).permute(2, 4, 0, 3, 5, 1, 6, 7).reshape(n, rows, cols, k)
        return y[:, : out[0], : out[1]].permute(0, 3, 1, 2)
    y = y.reshape(sh, sw, k, n, dh, th, tw, dw).permute(3, 2, 5, 0, 4, 6, 1, 7).reshape(n, k, rows, cols)
    return y[:, :, : out[0], : out[1]]


# --- the kernel's spectrum -----------------------------------------------------------------------------------------

_spectra: OrderedDict[tuple, tuple] = OrderedDict()
_spectra_lock = threading.Lock()


def kernel_spectrum(weight: torch.Tensor, tile: Pair, channels_inner: bool, dtype):
    """conj(DFT) of the kernel zero-padded to the tile: real and imaginary parts, each (Th·F, C, K) or (Th·F, K, C).

    Cached per weight version when no gradient is wanted (the cached entry holds the weight, so its memory cannot be
    reused by another tensor while the entry lives); computed afresh, differentiably, in training.
    """
    if torch.is_grad_enabled() and weight.requires_grad:
        return _spectrum(weight, tile, channels_inner, dtype)
    try:
        version = weight._version
    except RuntimeError:  # inference tensors have no version counter
        return _spectrum(weight, tile, channels_inner, dtype)
    key = (
        weight.data_ptr(),
        version,
        tuple(weight.shape),
        weight.stride(),
        weight.device,
        tile,
        channels_inner,
        dtype,
    )
    with _spectra_lock:  # served models run in several threads
        if key in _spectra:
            _spectra.move_to_end(key)
            return _spectra[key][1]
    spectrum = _spectrum(weight, tile, channels_inner, dtype)
    with _spectra_lock:
        _spectra[key] = (weight, spectrum)
        if len(_spectra) > CACHE_SIZE:
            _spectra.popitem(last=False)
    return spectrum


def _spectrum(weight: torch.Tensor, tile: Pair, channels_inner: bool, dtype):
    spectrum = torch.fft.rfft2(weight.double(), s=tile).conj()  # (K, C, Th, F)
    spectrum = spectrum.permute(2, 3, 1, 0) if channels_inner else spectrum.permute(2, 3, 0, 1)
    spectrum = spectrum.reshape(tile[0] * spectrum.shape[1], *spectrum.shape[2:])
    return spectrum.real.to(dtype).contiguous(), spectrum.imag.to(dtype).contiguous()


# --- DFT matrices (built in float64, cached per size, dtype and device) -------------------------------------------


@functools.lru_cache(maxsize=256)
def _rfft_matrix(size: int, dtype, device) -> torch.Tensor:
    """(2F, T): ``m @ x`` stacks the real and imaginary parts of ``torch.fft.rfft(x)``."""
    spectrum = torch.fft.rfft(torch.eye(size, dtype=torch.float64), dim=0)  # (F, T): column j = rfft(e_j)
    return torch.cat([spectrum.real, spectrum.imag]).to(dtype=dtype, device=device)


@functools.lru_cache(maxsize=256)
def _fft_matrix(size: int, dtype, device) -> torch.Tensor:
    """(2T, 2T) real matrix of the complex DFT: columns (row, re/im) in, rows (re/im, frequency) out."""
    dft = torch.fft.fft(torch.eye(size, dtype=torch.float64), dim=0)  # (T, T): dft @ z = fft(z)
    m = torch.empty(2 * size, 2 * size, dtype=torch.float64)
    m[:size, 0::2], m[:size, 1::2] = dft.real, -dft.imag
    m[size:, 0::2], m[size:, 1::2] = dft.imag, dft.real
    return m.to(dtype=dtype, device=device)


@functools.lru_cache(maxsize=256)
def _ifft_matrices(size: int, rows: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``rows`` outputs of the inverse complex DFT, as the (2·rows, T) matrices applied to the real and
    to the imaginary part; output rows (row, re/im)."""
    inverse = torch.fft.ifft(torch.eye(size, dtype=torch.float64), dim=0)[:rows]  # (rows, T)
    on_re = torch.stack([inverse.real, inverse.imag], 1).reshape(2 * rows, size)
    on_im = torch.stack([-inverse.imag, inverse.real], 1).reshape(2 * rows, size)
    return on_re.to(dtype=dtype, device=device), on_im.to(dtype=dtype, device=device)


@functools.lru_cache(maxsize=256)
def _irfft_matrix(size: int, columns: int, dtype, device) -> torch.Tensor:
    """(columns, 2F): the first ``columns`` outputs of ``torch.fft.irfft(re + i·im, n=T)`` from stacked (re, im)."""
    f = size // 2 + 1
    basis = torch.eye(f, dtype=torch.complex128)
    on_re = torch.fft.irfft(basis, n=size, dim=0)[:columns]  # (columns, F)
    on_im = torch.fft.irfft(1j * basis, n=size, dim=0)[:columns]
    return torch.cat([on_re, on_im], 1).to(dtype=dtype, device=device)
