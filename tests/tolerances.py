"""The rounding bounds the suite asserts between computations that may sum in different orders.

torch's CPU kernels choose their summation order by shape, memory format, thread count and CPU (oneDNN/MKL pick
kernels per ISA), so results of different shapes (a tile vs the whole image), solvers or machines agree to rounding,
not bitwise. Bitwise checks stay only where the same kernel runs on the same data.
"""

from __future__ import annotations

import torch

# Relative to the larger of the largest reference magnitude and 1: rounding follows the magnitudes inside the net.
RELATIVE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}


def assert_close_relative(
    actual: torch.Tensor, expected: torch.Tensor, rel: float, floor: float = 0.0, what: str = ""
) -> None:
    """max |actual - expected| <= rel * max(max |expected|, floor), with matching shapes.

    ``floor=1`` makes ``rel`` an absolute bound for scores below 1: float32 rounding grows with the magnitudes inside
    the net, not with the (possibly tiny) scores that come out of it.
    """
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    scale = max(expected.abs().max().item(), floor) or 1.0
    error = (actual - expected).abs().max().item()
    assert error <= rel * scale, f"{what} max abs error {error:.3g} > {rel:g} x {scale:.3g}"


def bound(expected: torch.Tensor) -> float:
    """The absolute bound ``RELATIVE[dtype] · max(max|expected|, 1)``."""
    scale = max(expected.detach().abs().max().item() if expected.numel() else 0.0, 1.0)
    return RELATIVE[expected.dtype] * scale


def assert_equal_to_rounding(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    """``actual`` equals ``expected`` up to the dtype's rounding bound (shapes and dtypes must match exactly)."""
    assert actual.dtype == expected.dtype, (what, actual.dtype, expected.dtype)
    assert_close_relative(actual.detach(), expected.detach(), RELATIVE[expected.dtype], 1.0, what)


def assert_labels_equal_except_ties(labels: torch.Tensor, scores: torch.Tensor, what: str = "") -> None:
    """(N, H, W) labels are the argmax of (N, K, H, W) reference scores wherever that argmax is not a tie.

    A pixel whose two best scores lie within the rounding bound may go either way; every other pixel must agree.
    """
    top2 = scores.detach().topk(2, dim=1).values  # (N, 2, H, W)
    decided = (top2[:, 0] - top2[:, 1]) > 2 * bound(scores)
    disagree = (labels != scores.argmax(1)) & decided
    assert not disagree.any(), f"{what} {int(disagree.sum())} decided pixels disagree"


def assert_within_rounding_of_terms(
    actual: torch.Tensor, expected: torch.Tensor, terms: torch.Tensor, rel: float, what: str = ""
) -> None:
    """|actual − expected| <= rel · terms element by element, ``terms`` the sum of the absolute values of the
    products each output sums (the same op on |x| and |w|): rounding follows the terms, which an output that cancels
    to a small value (one pixel of few classes) does not show."""
    assert actual.shape == expected.shape == terms.shape, (actual.shape, expected.shape, terms.shape)
    ratio = ((actual - expected).abs() / terms.clamp(min=torch.finfo(terms.dtype).tiny)).max().item()
    assert ratio <= rel, f"{what} max error {ratio:.3g} of its terms' magnitude > {rel:g}"
