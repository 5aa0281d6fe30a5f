"""The ``fft`` solver: a stride-1 dilated convolution computed in the frequency domain, on overlap-save tiles.

A d-dilated conv only ever reads one of the d×d interleaved sub-grids of its input (space-to-batch), where it is an
undilated conv. Each sub-grid is cut into overlapping tiles of Th×Tw pixels (overlap-save: neighbouring tiles share
k-1 rows or columns). On a tile, the cross-correlation with a kh×kw kernel is the inverse 2-D DFT of ``X · conj(W)``
(X, W the tile's and the zero-padded kernel's DFTs); its first S = T - k + 1 rows and columns are exact, the rest
wrap around and are never read. The cost of the products no longer depends on the kernel size (Mathieu, Henaff &
LeCun, "Fast Training of Convolutional Networks through FFTs"; Zlateski, Lee & Seung, "ZNNi").

The work runs in densecnn's kernels (``torch.ops.densecnn.fft_conv2d``, ``cuda_ext/fft_*.{h,cpp,cu}``), one group of
tiles at a time while the group's data is in cache:

1. the forward transform reads each tile straight from the input (any memory format; no gather copy), applies the
   real DFT along w and the complex DFT along h (one level of Cooley-Tukey) as small matrices to vectors of 16
   channels (AVX-512 lanes), and writes each tile's spectrum as one block of ``(tiles, Th·F, C)``, F = Tw//2 + 1;
2. the channel mixing is one batched complex GEMM ``(tiles, C) @ (C, K)`` per frequency (MKL's on CPU);
3. the inverse transform computes only the S valid rows and columns of each tile and writes them, plus the bias,
   straight into the (N, K, H', W') output.

The kernel's spectrum is computed once per weight version (DFT matrices built in float64) and reused while the weight
does not change. Backward, in the frequency domain too: the input gradient is the adjoint of overlap-save on the
forward's tiles, with the forward's kernel spectrum (:func:`input_gradient`); the weight gradient is Σ over the tiles of X · conj(G) (G the spectrum
of the output gradient's part of each tile), one batched GEMM per group of tiles with the tiles as its contraction,
whose inverse DFT is read at the kernel's taps only (:func:`weight_gradient`). A double backward (a gradient of the
weight gradient) takes torch's differentiable formula instead.

Exact to rounding: the DFT matrices are built in float64; the result differs from direct convolution by summation
order only (about 1e-7 relative in float32). bfloat16 and float16 inputs are computed in float32 and rounded back.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math

import numpy as np
import torch

from ..geometry import output_size
from . import ext, weight_cache
from .weight_cache import eager

Pair = tuple[int, int]
MAX_TILE = 64  # largest tile side considered
LANES = 16  # channels the transforms process at once (one AVX-512 vector of float32)
CACHE_SIZE = 32  # kernel spectra kept (inference), least recently used dropped first
COMPUTE_DTYPES = (torch.float32, torch.float64)
# Relative cost of one multiply-add in each stage and of one value moved through memory, in the tile-size model
# (set from timings of the reference nets' layers over tile sizes: the complex GEMM's short contractions run below
# the transforms' rate).
TRANSFORM_WEIGHT = 0.3
PRODUCT_WEIGHT = 1.0
MEMORY_WEIGHT = 16.0
# The most bytes of input tile spectra a training step's forward keeps for the weight gradient (transformed again
# beyond it): 18 MB on stages_46's 5×5 d4 layer for 8 crops of 64².
KEPT_SPECTRA_BYTES = 256 << 20


def built() -> bool:
    """Whether densecnn's kernels are loaded with the ``fft_conv2d`` op (a build older than the op has none)."""
    return ext.available() and hasattr(torch.ops.densecnn, "fft_conv2d")


def backward_built() -> bool:
    """Whether the kernels have the op computing both gradients at once (``fft_conv2d_backward``; older builds do
    not)."""
    return built() and hasattr(torch.ops.densecnn, "fft_conv2d_backward")


def applies(op) -> bool:
    """The solver runs ungrouped 2-D convs with a kernel larger than 1×1 (a 1×1 conv has nothing to transform)."""
    return op.name == "conv2d" and len(op.kernel) == 2 and op.groups == 1 and op.kernel != (1, 1) and built()


def conv2d(op, x: torch.Tensor) -> torch.Tensor:
    """Stride-1 dilated ``op`` (a :class:`~densecnn.ops.solvers.ConvOp`) on x (N, C, H, W) -> (N, K, H', W').

    The output has x's memory format and dtype.

    >>> op = ConvOp(torch.randn(8, 3, 7, 7), None, (4, 4), 1)
    >>> y = conv2d(op, torch.randn(1, 3, 64, 64))  # == F.conv2d(x, op.weight, dilation=4) to rounding
    >>> y.shape
    torch.Size([1, 8, 40, 40])
    """
    if x.dtype not in COMPUTE_DTYPES:
        return conv2d(op, x.float()).to(x.dtype)
    weight = op.weight.to(x.dtype)  # (K, C, kh, kw)
    bias = None if op.bias is None else op.bias.to(x.dtype)
    h, w = x.shape[2:]
    kernel, dilation = op.kernel, tuple(op.dilation)
    if min(output_size((h, w), kernel, dilation)) < 1:
        raise ValueError(
            f"a {h}x{w} input is smaller than the {kernel[0]}x{kernel[1]} kernel at dilation {dilation} reaches; "
            "pad it (DenseCNN does) or use a smaller kernel"
        )
    return _run(x, weight, bias, dilation, cached=weight_cache.cacheable(op.weight))


def input_gradient(
    grad_y: torch.Tensor, weight: torch.Tensor, dilation: Pair, padding: Pair = (0, 0)
) -> torch.Tensor:
    """The input's gradient (N, C, H, W) from the output's (N, K, H', W') of a conv of the input zero-padded by
    ``padding``: the adjoint of overlap-save on the forward's tiles, with the forward's kernel spectrum (computed once
    per step and shared, :func:`shared_spectra`). Each tile of the output gradient is transformed, multiplied
    by the conjugate kernel spectrum, inverse-transformed whole and added into the input gradient where the tile
    came from; the output gradient's padded reach is never transformed.

    >>> w, grad_y = torch.randn(8, 3, 7, 7), torch.randn(1, 8, 16, 16)
    >>> input_gradient(grad_y, w, (4, 4)).shape  # == torch's conv input gradient to rounding
    torch.Size([1, 3, 40, 40])
    """
    if grad_y.dtype not in COMPUTE_DTYPES:
        return input_gradient(grad_y.float(), weight, dilation, padding).to(grad_y.dtype)
    kernel = tuple(int(s) for s in weight.shape[2:])
    dilation, padding = tuple(int(d) for d in dilation), tuple(int(p) for p in padding)
    n, k, *out = (int(s) for s in grad_y.shape)
    c = int(weight.shape[1])
    size = tuple(o + (kk - 1) * d - 2 * p for o, kk, d, p in zip(out, kernel, dilation, padding))  # (H, W)
    padded_shape = (n, c, size[0] + 2 * padding[0], size[1] + 2 * padding[1])
    tile = _tile(padded_shape, kernel, dilation, c, k)  # the forward's
    valid = tuple(t - kk + 1 for t, kk in zip(tile, kernel))
    spectrum = step_spectrum(weight.to(grad_y.dtype), tile, grad_y.dtype)
    return torch.ops.densecnn.fft_conv2d_input_grad(
        grad_y, spectrum, list(size), list(tile), list(valid), list(dilation), list(padding)
    )


def weight_gradient(grad_y: torch.Tensor, x: torch.Tensor, kernel: Pair, dilation: Pair) -> torch.Tensor:
    """The weight's gradient (K, C, kh, kw) from the output's (N, K, H', W') and the input x (N, C, H, W):
    Σ over the tiles of X · conj(G) (G the spectrum of the output gradient's part of each tile), one batched GEMM
    per group of tiles in the kernels, and the kh×kw taps of its inverse DFT read here (:func:`_taps`).

    >>> x, grad_y = torch.randn(1, 3, 40, 40), torch.randn(1, 8, 16, 16)
    >>> weight_gradient(grad_y, x, (7, 7), (4, 4)).shape  # == torch's conv weight gradient to rounding
    torch.Size([8, 3, 7, 7])
    """
    if x.dtype not in COMPUTE_DTYPES:
        return weight_gradient(grad_y.float(), x.float(), kernel, dilation).to(x.dtype)
    c, k = int(x.shape[1]), int(grad_y.shape[1])
    kernel, dilation = tuple(int(s) for s in kernel), tuple(int(d) for d in dilation)
    tile = _tile(x.shape, kernel, dilation, c, k)
    valid = tuple(t - kk + 1 for t, kk in zip(tile, kernel))
    grad_y = grad_y.to(x.dtype)
    spectrum = torch.ops.densecnn.fft_conv2d_weight_spectrum(
        x, grad_y, list(tile), list(valid), list(dilation)
    )
    return _taps(spectrum, tile, kernel)  # (K, C, kh, kw)


def conv2d_keeping_spectra(op, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`conv2d` of a training step, and the input's tile spectra for :func:`gradients` to take (None where they
    would pass :data:`KEPT_SPECTRA_BYTES`, or for dtypes computed in float32): the backward then does not transform
    the input again.

    >>> op, x = ConvOp(torch.randn(8, 3, 7, 7), None, (4, 4), 1), torch.randn(1, 3, 64, 64)
    >>> y, spectra = conv2d_keeping_spectra(op, x)
    >>> grad_x, grad_w, grad_b = gradients(torch.ones_like(y), x, op.weight, (4, 4), input_spectra=spectra)
    """
    kernel, dilation = tuple(int(s) for s in op.weight.shape[2:]), tuple(int(d) for d in op.dilation)
    c, k = int(x.shape[1]), int(op.weight.shape[0])
    tile = _tile(x.shape, kernel, dilation, c, k)
    valid = tuple(t - kk + 1 for t, kk in zip(tile, kernel))
    points = tile[0] * (tile[1] // 2 + 1)
    spectra_bytes = _tiles(x.shape, tile, valid, kernel, dilation) * points * c * 2 * x.element_size()
    fits = min(output_size(tuple(x.shape[2:]), kernel, dilation)) >= 1  # else conv2d says why it cannot run
    if x.dtype not in COMPUTE_DTYPES or spectra_bytes > KEPT_SPECTRA_BYTES or not fits:
        return conv2d(op, x), None
    weight = op.weight.to(x.dtype)
    bias = None if op.bias is None else op.bias.to(x.dtype)
    spectrum = step_spectrum(weight, tile, x.dtype)
    return torch.ops.densecnn.fft_conv2d_with_input_spectra(
        x, weight, spectrum, bias, list(tile), list(valid), list(dilation)
    )


def _tiles(shape, tile: Pair, valid: Pair, kernel: Pair, dilation: Pair) -> int:
    """The number of overlap-save tiles of an (N, C, H, W) input (``cuda_ext/fft_driver.h``'s ``fft_geometry``)."""
    out = output_size(tuple(int(s) for s in shape[2:]), kernel, dilation)
    sub_out = [-(-o // d) for o, d in zip(out, dilation)]  # outputs per sub-grid, per axis
    per_axis = [-(-s // v) for s, v in zip(sub_out, valid)]  # tiles per sub-grid, per axis
    return int(shape[0]) * dilation[0] * dilation[1] * per_axis[0] * per_axis[1]


def gradients(
    grad_y: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    dilation: Pair,
    *,
    input_spectra: torch.Tensor | None = None,
):
    """(∂L/∂x (N, C, H, W), ∂L/∂w (K, C, kh, kw), ∂L/∂b (K,)) of the unpadded conv from the output's gradient
    (N, K, H', W'), in one pass over the forward's tiles: equal to :func:`input_gradient`, :func:`weight_gradient`
    and the output gradient's sum over all but its channels, with each tile of the output gradient transformed once
    for all three (the bias's gradient is the sum of the tiles' DC terms) instead of read once each;
    ``input_spectra`` (from :func:`conv2d_keeping_spectra` on this x and weight) spares transforming the input again.

    >>> w, x, grad_y = torch.randn(8, 3, 7, 7), torch.randn(1, 3, 40, 40), torch.randn(1, 8, 16, 16)
    >>> grad_x, grad_w, grad_b = gradients(grad_y, x, w, (4, 4))  # == torch's conv gradients to rounding
    >>> grad_x.shape, grad_w.shape, grad_b.shape
    (torch.Size([1, 3, 40, 40]), torch.Size([8, 3, 7, 7]), torch.Size([8]))
    """
    if x.dtype not in COMPUTE_DTYPES:  # computed in float32, as the forward (which kept no spectra)
        return tuple(g.to(x.dtype) for g in gradients(grad_y.float(), x.float(), weight, dilation))
    kernel, dilation = tuple(int(s) for s in weight.shape[2:]), tuple(int(d) for d in dilation)
    c, k = int(x.shape[1]), int(grad_y.shape[1])
    tile = _tile(x.shape, kernel, dilation, c, k)  # the forward's
    valid = tuple(t - kk + 1 for t, kk in zip(tile, kernel))
    spectrum = step_spectrum(weight.to(x.dtype), tile, x.dtype)
    grad_x, weight_spectrum, grad_b = torch.ops.densecnn.fft_conv2d_backward(
        x, grad_y.to(x.dtype), spectrum, list(tile), list(valid), list(dilation), input_spectra
    )
    return grad_x, _taps(weight_spectrum, tile, kernel), grad_b  # (N, C, H, W), (K, C, kh, kw), (K,)


def _tile(shape, kernel: Pair, dilation: Pair, c: int, k: int) -> Pair:
    """The cost model's tile for a conv of ``kernel`` and ``dilation`` on an (N, C, H, W) input of ``shape``."""
    n, _, h, w = (int(s) for s in shape)
    out = output_size((h, w), kernel, dilation)
    sub_out = tuple(-(-o // d) for o, d in zip(out, dilation))  # output rows/cols per sub-grid
    return tile_sizes(sub_out, kernel, c, k, n * dilation[0] * dilation[1])


def _run(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation: Pair, cached: bool):
    """The op on x (N, C, H, W) and weight (K, C, kh, kw), with the tile the cost model picks; ``cached``: take the
    kernel's spectrum from the cache (a model's weight at inference), else the step's (training, whose weights
    change every step: computed once and shared with the input gradient, :func:`shared_spectra`)."""
    # Plain ints (a symbolic shape under torch.compile is specialised): the tile is chosen per concrete shape.
    kernel = tuple(int(s) for s in weight.shape[2:])
    dilation = tuple(int(d) for d in dilation)
    tile = _tile(x.shape, kernel, dilation, int(x.shape[1]), int(weight.shape[0]))
    valid = tuple(t - kk + 1 for t, kk in zip(tile, kernel))
    spectrum = kernel_spectrum(weight, tile, x.dtype) if cached else step_spectrum(weight, tile, x.dtype)
    return torch.ops.densecnn.fft_conv2d(x, weight, spectrum, bias, list(tile), list(valid), list(dilation))


def tile_sizes(sub_out: Pair, kernel: Pair, c: int, k: int, grids: int) -> Pair:
    """(Th, Tw): the tile sides with the least modelled cost (transforms, products and memory traffic), over every
    pair of sides at once (a first call waits on this search).

    ``sub_out`` is the output size of one sub-grid, ``grids`` the number of sub-grids (N·dh·dw), ``c``/``k`` the
    input/output channels.
    """
    sides = [
        np.arange(kk + 1, max(kk + 1, min(MAX_TILE, so + kk - 1)) + 1) for so, kk in zip(sub_out, kernel)
    ]
    # numpy, not torch: a plain computation on ints, never traced (the backward runs this under torch.compile too)
    th, tw = np.meshgrid(*sides, indexing="ij")  # (Th options, Tw options)
    th, tw = th.astype(np.float64), tw.astype(np.float64)
    dft_h = np.array([_complex_fft_cost(int(n)) for n in sides[0]], dtype=np.float64)[:, None]
    sh, sw = th - kernel[0] + 1, tw - kernel[1] + 1
    tiles = grids * np.ceil(sub_out[0] / sh) * np.ceil(sub_out[1] / sw)
    f = np.floor(tw / 2) + 1
    dft_w = np.array([_real_fft_cost(int(n)) for n in sides[1]], dtype=np.float64)[None, :]
    # an odd Tw's inverse along w is a matrix of its written columns
    inverse_w = np.where(tw % 2 == 1, sw * 2 * f, dft_w)
    # channels padded to whole vectors of lanes
    lanes_in, lanes_out = (LANES * -(-channels // LANES) for channels in (c, k))
    forward = lanes_in * (th * dft_w + f * dft_h)
    inverse = lanes_out * (f * dft_h + sh * inverse_w)
    products = 4 * th * f * c * k
    floats = 2 * th * f * (c + k) + th * tw * c + sh * sw * k  # the spectra, the tile read, its outputs
    cost = tiles * (
        TRANSFORM_WEIGHT * (forward + inverse) + PRODUCT_WEIGHT * products + MEMORY_WEIGHT * floats
    )
    best = int(cost.argmin())  # the first of equal costs, in (Th, Tw) order
    return int(th.flatten()[best]), int(tw.flatten()[best])


@functools.lru_cache(maxsize=256)
def _complex_fft_cost(n: int) -> int:
    """Vector operations of the kernels' length-n complex FFT (Stockham, radix 4, 2 and odd primes): the copies in
    and out, and per stage n/r butterflies with their twiddles (radix 4: 16 additions and 3 complex products; 2: 4
    and 1; an odd r: (r-1)/2 cosine and sine sums of (r-1)/2 terms per output pair)."""
    cost, rest = 4 * n, n
    for radix, butterfly in ((4, 34), (2, 10)):
        while rest % radix == 0:
            cost, rest = cost + n // radix * butterfly, rest // radix
    factor = 3
    while rest > 1:
        while rest % factor == 0:
            half = factor // 2
            cost, rest = cost + n // factor * (10 * half + 4 * half * half + 6 * (factor - 1)), rest // factor
        factor += 2
    return cost


@functools.lru_cache(maxsize=256)
def _real_fft_cost(n: int) -> int:
    """Vector operations of the kernels' length-n real DFT (either direction): an even n as the complex FFT of its
    n/2 packed sample pairs and a butterfly per frequency; an odd n as its (2F × n) matrix."""
    freqs = n // 2 + 1
    return _complex_fft_cost(n // 2) + 12 * freqs + n if n % 2 == 0 else 2 * freqs * n


# --- the kernel's spectrum -----------------------------------------------------------------------------------------

_spectra = weight_cache.TransformCache(CACHE_SIZE)


def kernel_spectrum(weight: torch.Tensor, tile: Pair, dtype) -> torch.Tensor:
    """conj(DFT) of the kernel zero-padded to the tile, complex (Th·F, C, K), F = Tw//2 + 1.

    Cached while the weight's values are unchanged when no gradient is wanted
    (:class:`~densecnn.ops.weight_cache.TransformCache`); in training it is computed on every call.
    """
    return _spectra.get(weight, (tile, dtype), lambda: _spectrum(weight, tile, dtype))


_step_spectra: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "densecnn_step_spectra", default=None
)


@contextlib.contextmanager
def shared_spectra(spectra: dict):
    """Within the block, :func:`step_spectrum` keeps the spectra it computes in ``spectra`` and takes them from
    there: a conv's forward and its backward run in blocks over the same dict (held by the step's autograd context),
    so the backward reuses the forward's spectrum, and none outlives the step.

    >>> weight, spectra = torch.randn(8, 3, 7, 7), {}
    >>> with shared_spectra(spectra):
    ...     first = step_spectrum(weight, (16, 16), torch.float32)
    ...     assert step_spectrum(weight, (16, 16), torch.float32) is first
    >>> len(spectra)
    1
    """
    token = _step_spectra.set(spectra)
    try:
        yield spectra
    finally:
        _step_spectra.reset(token)


def step_spectrum(weight: torch.Tensor, tile: Pair, dtype) -> torch.Tensor:
    """The kernel spectrum of a training step: from the step's :func:`shared_spectra` if it holds this weight's on
    this tile, else computed (and kept there, if a block is open)."""
    spectra = _step_spectra.get()
    if spectra is None or not eager(weight):
        return _spectrum(weight, tile, dtype)
    key = spectrum_key(weight, tile, dtype)
    if key not in spectra:
        spectra[key] = _spectrum(weight, tile, dtype)
    return spectra[key]


def spectrum_key(weight: torch.Tensor, tile: Pair, dtype) -> tuple:
    """What a step's spectrum is kept under in :func:`shared_spectra`: the weight's memory, the tile and the dtype."""
    return (weight.data_ptr(), tuple(weight.shape), weight.stride(), weight.device, tuple(tile), dtype)


def _spectrum(weight: torch.Tensor, tile: Pair, dtype) -> torch.Tensor:
    """The kernel's spectrum as two small DFT matrices applied to its kh×kw taps (the zero padding to the tile is
    never materialised), on the weight's taps moved first, (kh, kw, C·K), into the (Th·F, C, K) layout, so that no
    complex intermediate is permuted: on the CPU by the extension's ``axes_transform`` into a reused buffer (a
    training step computes spectra of tens of MB on every call), elsewhere as two matrix products.

    The weight is real, so conj(DFT(w)) is the DFT with conjugate matrices: no conjugate view is left for the GEMM
    to resolve (a copy of the whole spectrum on every call).
    """
    k, c, kernel_h, kernel_w = weight.shape
    tile_h, tile_w = tile
    freqs = tile_w // 2 + 1
    complex_dtype = torch.complex64 if dtype == torch.float32 else torch.complex128
    with torch.no_grad():
        dft_h = _dft_matrix(tile_h, tile_h, kernel_h, weight.device).conj().to(complex_dtype)  # (Th, kh)
        dft_w = _dft_matrix(freqs, tile_w, kernel_w, weight.device).conj().to(complex_dtype)  # (F, kw)
        by_tap = weight.permute(2, 3, 1, 0).to(complex_dtype, memory_format=torch.contiguous_format)
        by_tap = by_tap.view(kernel_h, kernel_w, c * k)  # (kh, kw, C·K)
        if not _eager_on_cpu(weight):
            along_w = (dft_w @ by_tap).view(kernel_h, freqs * c * k)  # (kh, F·C·K)
            return (dft_h @ along_w).view(tile_h * freqs, c, k)  # (Th·F, C, K)
        spectrum = ext.empty_buffer((tile_h, freqs, c * k), complex_dtype)
        torch.ops.densecnn.axes_transform(by_tap, dft_h, dft_w, spectrum)  # (Th, F, C·K)
        return spectrum.view(tile_h * freqs, c, k)  # (Th·F, C, K)


def _eager_on_cpu(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a plain CPU tensor used eagerly, so the extension's ``axes_transform`` may transform it
    (into a buffer of the kernels' cache)."""
    return tensor.device.type == "cpu" and eager(tensor)


def _taps(spectrum: torch.Tensor, tile: Pair, kernel: Pair) -> torch.Tensor:
    """The kh×kw taps of the real inverse DFT of a (Th·F, C, K) half spectrum (F = Tw//2 + 1) -> (K, C, kh, kw):
    the adjoint of :func:`_spectrum`, as two small DFT matrices (float64-built) along the (Th, F) axes, so that
    nothing complex is permuted (on the CPU one ``axes_transform``, which reads the spectrum once). The frequencies
    f of the missing half are conjugates of those present: each f other than 0 and Tw/2 counts twice."""
    tile_h, tile_w = tile
    kernel_h, kernel_w = kernel
    freqs = tile_w // 2 + 1
    _, c, k = spectrum.shape
    with torch.no_grad():
        # (kh, Th) and (kw, F): e^{+2πi u·i/Th}, e^{+2πi f·j/Tw}
        inverse_h = _dft_matrix(tile_h, tile_h, kernel_h, spectrum.device).T.conj().to(spectrum.dtype)
        inverse_w = _dft_matrix(freqs, tile_w, kernel_w, spectrum.device).T.conj()
        counts = torch.full((freqs,), 2.0, dtype=torch.float64, device=spectrum.device)
        counts[0] = 1.0
        if tile_w % 2 == 0:
            counts[-1] = 1.0
        inverse_w = (inverse_w * counts / (tile_h * tile_w)).to(spectrum.dtype)
        by_frequency = spectrum.view(tile_h, freqs, c * k)  # (Th, F, C·K)
        if _eager_on_cpu(spectrum):
            taps = torch.empty((kernel_h, kernel_w, c * k), dtype=spectrum.dtype)
            torch.ops.densecnn.axes_transform(by_frequency, inverse_h, inverse_w, taps)  # (kh, kw, C·K)
        else:
            along_h = inverse_h @ by_frequency.view(tile_h, freqs * c * k)  # (kh, F·C·K)
            taps = inverse_w @ along_h.view(kernel_h, freqs, c * k)  # (kh, kw, C·K)
        return taps.real.view(kernel_h, kernel_w, c, k).permute(3, 2, 0, 1)  # (K, C, kh, kw)


def _dft_matrix(frequencies: int, length: int, taps: int, device) -> torch.Tensor:
    """exp(-2πi·u·j/length) for u < frequencies, j < taps, built in float64: (frequencies, taps) complex128."""
    u = torch.arange(frequencies, dtype=torch.float64, device=device)
    j = torch.arange(taps, dtype=torch.float64, device=device)
    return torch.exp(-2j * math.pi * torch.outer(u, j) / length)
