#!/usr/bin/env python
"""The fft input gradient of the reference nets' convs: the adjoint of overlap-save on the forward's tiles (what the
solver runs, with the forward's kernel spectrum) against the same frequency-domain conv of the output gradient
zero-padded by the kernel's reach with the flipped kernel (what it ran before, its own spectrum included) and
against torch's convolution backward, on each conv's real shapes in channels-last. Interleaved rounds, medians.

    PYTHONPATH=. python scripts/bench_fft_input_gradient.py --size 256 --rounds 7 --threads 1
"""

from __future__ import annotations

import argparse
import statistics

import torch

import densecnn
from densecnn.bench import machine
from densecnn.bench.timing import elapsed, interleave
from densecnn.ops import fft_conv, native
from densecnn.ops.plan import next_shape
from densecnn.ops.solvers import ConvOp


def _flipped_conv(grad_y, weight, dilation):
    """The input gradient as the padded frequency-domain conv of the flipped, transposed kernel."""
    flipped = weight.flip(2, 3).transpose(0, 1).contiguous()  # (C, K, kh, kw)
    reach = [(k - 1) * d for k, d in zip(weight.shape[2:], dilation)]
    n, k, h, w = grad_y.shape
    tile = fft_conv._tile(
        (n, k, h + 2 * reach[0], w + 2 * reach[1]), tuple(weight.shape[2:]), dilation, k, flipped.shape[0]
    )
    valid = [t - kk + 1 for t, kk in zip(tile, weight.shape[2:])]
    spectrum = fft_conv._spectrum(flipped, tile, grad_y.dtype)
    return torch.ops.densecnn.fft_conv2d(grad_y, flipped, spectrum, None, tile, valid, list(dilation), reach)


def _race(op: ConvOp, shape, rounds: int) -> str:
    """One conv's table row: its input gradient by the three ways, interleaved."""
    weight = op.weight.detach()
    x = torch.randn(shape).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        grad_y = torch.randn_like(native.conv(x, weight, None, op.dilation, 1))
    samples = interleave(
        {
            "adjoint": lambda: elapsed(lambda: fft_conv.input_gradient(grad_y, weight, op.dilation)),
            "flipped": lambda: elapsed(lambda: _flipped_conv(grad_y, weight, op.dilation)),
            "torch": lambda: elapsed(
                lambda: native.conv_backward(grad_y, x, weight, op.dilation, (True, False, False))
            ),
        },
        rounds,
    )
    ms = {key: statistics.median(values) * 1e3 for key, values in samples.items()}
    ratio = {
        key: statistics.median(s / a for s, a in zip(samples[key], samples["adjoint"], strict=True))
        for key in ("flipped", "torch")
    }
    k, c, kh, kw = weight.shape
    return (
        f"| {kh}×{kw} d{op.dilation[0]} {c}→{k} | {ms['adjoint']:.1f} | {ms['flipped']:.1f} | {ms['torch']:.1f} | "
        f"{ratio['flipped']:.2f}× | {ratio['torch']:.2f}× |"
    )


def layers(name: str, size: int, rounds: int) -> list[str]:
    torch.manual_seed(0)
    model, patch = densecnn.zoo.create(name, in_channels=3, num_classes=32 if name == "plain_133" else 8)
    dense = densecnn.convert(model.eval(), patch)
    shape = tuple(dense.pad(torch.zeros(1, 3, size, size)).shape)
    lines = [
        f"## {name}, {size}² image: fft input gradient, ms (channels-last, {rounds} rounds, medians)",
        "",
    ]
    lines += ["| conv | adjoint | flipped-kernel conv | torch | flipped / adjoint | torch / adjoint |"]
    lines += ["|---|---|---|---|---|---|"]
    for i, step in enumerate(dense.steps()):
        op = step.dense_op() if hasattr(step.layers[0], "dense_op") else None
        if i > 0 and isinstance(op, ConvOp) and fft_conv.applies(op):
            lines.append(_race(op, shape, rounds))
        shape = next_shape(step, shape)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["plain_133", "stages_46"])
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch's intra-op threads (default: torch's)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, densecnn {densecnn.__version__}, {machine.description()}\n")
    for name in args.models:
        print("\n".join(layers(name, args.size, args.rounds)) + "\n")


if __name__ == "__main__":
    main()
