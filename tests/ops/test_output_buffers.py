"""Output buffers of densecnn's CPU kernels are reused across calls (cuda_ext/output_buffers.h): a buffer is handed
out again only once nothing refers to it, so outputs a caller keeps are never overwritten."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch

import densecnn
from densecnn.ops import ext
from tests.tolerances import assert_equal_to_rounding

pytestmark = pytest.mark.skipif(not ext.available(), reason="densecnn's kernels are not built")


@pytest.fixture(autouse=True)
def no_free_buffers():
    """Each test starts with no free cached buffers (earlier tests in the process leave some)."""
    ext.release_output_buffers()


def _pool(x):
    return ext.pool_activation(x, (2, 2), (2, 2), "max", "relu", None)


def _reference(x):
    return (
        torch.stack([x[..., a : a + x.shape[2] - 2, b : b + x.shape[3] - 2] for a in (0, 2) for b in (0, 2)])
        .amax(0)
        .relu()
    )


def test_a_dropped_output_buffer_is_reused_and_a_kept_one_is_not():
    x1, x2, x3 = (torch.randn(1, 16, 130, 130) for _ in range(3))  # outputs of 1 MB: large enough to be kept
    y1 = _pool(x1)
    address = y1.data_ptr()
    y2 = _pool(x2)
    assert y2.data_ptr() != address  # y1 is still held
    assert_equal_to_rounding(y1, _reference(x1))
    del y1
    y3 = _pool(x3)
    assert y3.data_ptr() == address  # y1's buffer, free again
    assert_equal_to_rounding(y2, _reference(x2))
    assert_equal_to_rounding(y3, _reference(x3))


def test_a_smaller_output_takes_the_smallest_free_buffer_that_fits():
    """A free buffer serves outputs down to half its size, the smallest fitting one first: a net's slowly shrinking
    maps mostly alternate between two buffers, even within the first call."""
    large, medium = (
        _pool(torch.randn(1, 16, 202, 202)),
        _pool(torch.randn(1, 16, 162, 162)),
    )  # 2.56 MB, 1.64 MB
    addresses = {"large": large.data_ptr(), "medium": medium.data_ptr()}
    del large, medium
    x = torch.randn(1, 16, 150, 150)  # output 1.40 MB: both buffers fit it, the medium one is smaller
    y = _pool(x)
    assert y.data_ptr() == addresses["medium"]
    assert_equal_to_rounding(y, _reference(x))
    x_small = torch.randn(1, 16, 100, 162)  # output 1.00 MB: the large buffer is more than twice that
    y_small = _pool(x_small)
    assert y_small.data_ptr() not in addresses.values()
    assert_equal_to_rounding(y_small, _reference(x_small))
    assert_equal_to_rounding(y, _reference(x))


def test_views_and_autograd_keep_their_buffers():
    x = torch.randn(1, 16, 130, 130, requires_grad=True)
    y = _pool(x)
    crop = y[:, :, 1:, 1:]  # a view holds the buffer
    address = y.data_ptr()
    del y
    assert _pool(torch.randn(1, 16, 130, 130)).data_ptr() != address
    expected = _reference(x.detach())[:, :, 1:, 1:]
    assert_equal_to_rounding(crop.detach(), expected)
    crop.sum().backward()  # what autograd saved for the backward pass was not overwritten either
    x_ref = x.detach().clone().requires_grad_()
    _reference(x_ref)[:, :, 1:, 1:].sum().backward()
    assert torch.equal(x.grad, x_ref.grad)


def test_consecutive_dense_forwards_return_independent_scores():
    model, patch = densecnn.zoo.create("tiny", in_channels=3, num_classes=4)
    dense = densecnn.convert(model.eval(), patch)
    images = [torch.rand(1, 3, 150, 140) for _ in range(3)]
    with torch.no_grad():
        scores = [dense(x) for x in images]  # each held while the next runs
        for x, s in zip(images, scores, strict=True):
            assert_equal_to_rounding(s, dense(x))


def test_threads_get_distinct_buffers():
    inputs = [torch.randn(1, 16, 130, 130) for _ in range(4)]
    results: dict[int, torch.Tensor] = {}

    def work(i):
        for _ in range(5):
            results[i] = _pool(inputs[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, x in enumerate(inputs):
        assert_equal_to_rounding(results[i], _reference(x))


def test_release_frees_the_buffers_nothing_refers_to():
    kept, dropped = _pool(torch.randn(1, 16, 130, 130)), _pool(torch.randn(1, 16, 140, 140))
    before = kept.clone()
    size = dropped.untyped_storage().nbytes()  # a fresh block, exactly its size
    del dropped
    assert ext.release_output_buffers() == size  # the kept one stays cached, in use
    assert ext.release_output_buffers() == 0
    assert torch.equal(kept, before)
    del kept
    assert ext.release_output_buffers() >= 1 << 20


def test_only_free_buffers_count_against_the_cache_limit():
    """Blocks in use (a training step's saved activations) do not push returned blocks out of the cache; the free
    ones beyond DENSECNN_OUTPUT_CACHE_MB are released, least recently used first."""
    code = """
import torch
from densecnn.ops import ext
pool = lambda x: ext.pool_activation(x, (2, 2), (2, 2), "max", "relu", None)
kept = [pool(torch.randn(1, 16, 130, 130)) for _ in range(3)]  # 1 MB each, 3 MB in use: over the 2 MB limit
address = kept[0].data_ptr()
del kept[0]
again = pool(torch.randn(1, 16, 130, 130))
print(again.data_ptr() == address)
del kept, again
print(ext.release_output_buffers())
"""
    env = {**os.environ, "DENSECNN_OUTPUT_CACHE_MB": "2"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    reused, released = result.stdout.split()
    assert reused == "True"
    assert int(released) == 2 << 20  # of the three free blocks, the two most recently used stayed


def test_a_training_steps_kernel_spectrum_lives_on_a_reused_buffer():
    """The FFT solver computes its kernel spectrum anew on every training call, into a buffer of the cache: one held
    is never handed out again, one dropped is, and the values are those of the plain product."""
    from densecnn.ops import fft_conv

    weights = [torch.randn(32, 32, 5, 5) for _ in range(3)]
    spectra = [fft_conv._spectrum(w, (32, 32), torch.float32) for w in weights[:2]]  # 4.4 MB each, both held
    assert spectra[0].data_ptr() != spectra[1].data_ptr()
    address = spectra[0].data_ptr()
    del spectra[0]
    third = fft_conv._spectrum(weights[2], (32, 32), torch.float32)
    assert third.data_ptr() == address
    for weight, spectrum in [(weights[1], spectra[0]), (weights[2], third)]:
        padded = torch.zeros(32, 32, 32, 32)
        padded[:, :, :5, :5] = weight
        expected = torch.fft.rfft2(padded.double()).conj().permute(2, 3, 1, 0).reshape(32 * 17, 32, 32)
        assert_equal_to_rounding(
            torch.view_as_real(spectrum), torch.view_as_real(expected.to(torch.complex64))
        )
