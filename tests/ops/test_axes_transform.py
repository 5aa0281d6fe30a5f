"""The extension's ``axes_transform`` (cuda_ext/axes_transform_cpu.cpp) against a float64 einsum, and the FFT conv's
kernel spectrum and weight-gradient taps, which it computes on the CPU, against the DFT of the zero-padded kernel
(torch.fft) and a direct correlation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from densecnn.ops import ext, fft_conv

pytestmark = pytest.mark.skipif(not ext.available(), reason="densecnn's kernels are not built")
ops = torch.ops.densecnn


def _complex(shape, dtype, generator):
    real = torch.randn(*shape, 2, dtype=torch.float64, generator=generator)
    return torch.view_as_complex(real).to(dtype)


def _reference(x, first, second):
    """out[a', b', n] = Σ_a Σ_b first[a', a] second[b', b] x[a, b, n], in complex128."""
    return torch.einsum("pa,qb,abn->pqn", first.cdouble(), second.cdouble(), x.cdouble())


@settings(max_examples=40, deadline=None)
@given(
    a_in=st.integers(1, 40),
    b_in=st.integers(1, 24),
    a_out=st.integers(1, 40),
    b_out=st.integers(1, 24),
    n=st.integers(1, 700),
    double=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_axes_transform_equals_the_two_matrix_products(a_in, b_in, a_out, b_out, n, double, seed):
    """Either axis first and either loop order (more outputs than terms or fewer), chunks of n cut anywhere."""
    dtype = torch.complex128 if double else torch.complex64
    generator = torch.Generator().manual_seed(seed)
    x = _complex((a_in, b_in, n), dtype, generator)
    first, second = _complex((a_out, a_in), dtype, generator), _complex((b_out, b_in), dtype, generator)
    out = torch.full((a_out, b_out, n), float("nan"), dtype=dtype)
    ops.axes_transform(x, first, second, out)
    expected = _reference(x, first, second)
    # each output sums a_in·b_in products of unit-variance terms, rounded in two stages
    terms = _reference(x.abs().to(dtype), first.abs().to(dtype), second.abs().to(dtype)).abs()
    eps = torch.finfo(torch.float64 if double else torch.float32).eps
    assert ((out.cdouble() - expected).abs() <= 4 * (a_in + b_in) * eps * terms).all()


def test_axes_transform_reads_a_strided_input():
    generator = torch.Generator().manual_seed(0)
    x = _complex((6, 5, 300), torch.complex64, generator).transpose(0, 1)  # (5, 6, 300), not contiguous
    first, second = _complex((3, 5), torch.complex64, generator), _complex((7, 6), torch.complex64, generator)
    out = torch.empty(3, 7, 300, dtype=torch.complex64)
    ops.axes_transform(x, first, second, out)
    torch.testing.assert_close(out.cdouble(), _reference(x, first, second), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("x", "first", "second", "out", "message"),
    [
        ((2, 3, 4), (5, 2), (6, 3), (5, 6, 5), "do not chain"),
        ((2, 3, 4), (5, 3), (6, 3), (5, 6, 4), "do not chain"),
        ((2, 3), (5, 2), (6, 3), (5, 6), "expected x"),
    ],
)
def test_axes_transform_refuses_shapes_that_do_not_chain(x, first, second, out, message):
    tensors = [torch.zeros(shape, dtype=torch.complex64) for shape in (x, first, second, out)]
    with pytest.raises(RuntimeError, match=message):
        ops.axes_transform(*tensors)


def test_axes_transform_refuses_real_or_mixed_dtypes():
    with pytest.raises(RuntimeError, match="complex64 or complex128"):
        ops.axes_transform(torch.zeros(2, 3, 4), torch.zeros(5, 2), torch.zeros(6, 3), torch.zeros(5, 6, 4))
    with pytest.raises(RuntimeError, match="x's dtype"):
        ops.axes_transform(
            torch.zeros(2, 3, 4, dtype=torch.complex64),
            torch.zeros(5, 2, dtype=torch.complex128),
            torch.zeros(6, 3, dtype=torch.complex64),
            torch.zeros(5, 6, 4, dtype=torch.complex64),
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("kernel", "tile"), [((5, 5), (38, 38)), ((3, 7), (12, 17)), ((1, 1), (4, 5))])
def test_kernel_spectrum_is_the_conjugate_dft_of_the_zero_padded_kernel(dtype, kernel, tile):
    weight = torch.randn(6, 4, *kernel, dtype=dtype, generator=torch.Generator().manual_seed(1))
    spectrum = fft_conv._spectrum(weight, tile, dtype)  # (Th·F, C, K)
    padded = F.pad(weight.double(), (0, tile[1] - kernel[1], 0, tile[0] - kernel[0]))  # (K, C, Th, Tw)
    expected = torch.fft.rfft2(padded).conj().permute(2, 3, 1, 0).reshape(spectrum.shape)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(
        spectrum.cdouble(), expected, rtol=tolerance, atol=tolerance * kernel[0] * kernel[1]
    )


@pytest.mark.parametrize(("kernel", "tile"), [((5, 5), (38, 38)), ((3, 7), (12, 17)), ((2, 3), (9, 8))])
def test_taps_of_a_weight_gradient_spectrum_equal_the_direct_correlation(kernel, tile):
    """The taps _taps reads from Σ X·conj(G) over one tile equal Σ_outputs grad_y · x, the weight's gradient."""
    generator = torch.Generator().manual_seed(2)
    valid = (tile[0] - kernel[0] + 1, tile[1] - kernel[1] + 1)
    x = torch.randn(1, 3, *tile, dtype=torch.float64, generator=generator)
    grad_y = torch.randn(1, 5, *valid, dtype=torch.float64, generator=generator)
    x_spectrum = torch.fft.rfft2(x)[0]  # (C, Th, F)
    g_spectrum = torch.fft.rfft2(F.pad(grad_y, (0, kernel[1] - 1, 0, kernel[0] - 1)))[0]  # (K, Th, F)
    spectrum = torch.einsum("cuf,kuf->ufck", x_spectrum, g_spectrum.conj()).reshape(-1, 3, 5)  # (Th·F, C, K)
    expected = torch.nn.grad.conv2d_weight(x, (5, 3, *kernel), grad_y)  # (K, C, kh, kw)
    for dtype in (torch.complex64, torch.complex128):
        taps = fft_conv._taps(spectrum.to(dtype), tile, kernel)
        tolerance = 1e-4 if dtype == torch.complex64 else 1e-10
        torch.testing.assert_close(taps.double(), expected, rtol=tolerance, atol=tolerance)
