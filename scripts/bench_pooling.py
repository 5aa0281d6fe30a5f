"""Time densecnn's d-sparse max pooling kernels against torch's dilated pooling and space-to-batch.

Candidates run interleaved (one call of each per round), and the medians are reported with their ratios.

    PYTHONPATH=. python scripts/bench_pooling.py volume   # (1, 16, 64, 64, 64), k=2, d=1, 2, 4
    PYTHONPATH=. python scripts/bench_pooling.py image    # (1, 50, 512, 512), k=8 d=1 and k=2 d=2
    PYTHONPATH=. python scripts/bench_pooling.py volume --backward   # forward keeping the argmax + backward
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from densecnn.bench import machine
from densecnn.ops import ext


def space_to_batch_max_pool3d(x: torch.Tensor, kernel: int, dilation: int) -> torch.Tensor:
    """Dilated 3-D max pooling as the undilated pool on the d³ interleaved sub-volumes moved into the batch."""
    n, c, *size = x.shape
    d = dilation
    padded = [-(-s // d) * d for s in size]
    x = F.pad(x, [p for s, q in zip(reversed(size), reversed(padded)) for p in (0, q - s)])
    sub = [q // d for q in padded]
    grids = x.reshape(n, c, sub[0], d, sub[1], d, sub[2], d).permute(0, 3, 5, 7, 1, 2, 4, 6)
    y = F.max_pool3d(grids.reshape(n * d**3, c, *sub), kernel, stride=1)  # (N·d³, C, sub - k + 1)
    out = [s - (kernel - 1) * d for s in size]
    y = y.reshape(n, d, d, d, c, *y.shape[2:]).permute(0, 4, 5, 1, 6, 2, 7, 3)
    return y.reshape(n, c, *(q * d for q in y.shape[2::2]))[:, :, : out[0], : out[1], : out[2]]


def with_backward(pool):
    """pool(x) followed by the gradient of a fixed random grad_output w.r.t. x (a training step's share)."""

    def step(x):
        x = x.detach().requires_grad_()
        y = pool(x)
        return torch.autograd.grad(y, x, torch.ones_like(y))[0]

    return step


def interleaved_medians(candidates: dict, rounds: int) -> dict[str, float]:
    """Median seconds per candidate, timing one call of each candidate per round (after one warm-up call)."""
    times = {name: [] for name in candidates}
    for fn in candidates.values():
        fn()
    for _ in range(rounds):
        for name, fn in candidates.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def volume(rounds: int, backward: bool) -> list[dict]:
    x = torch.randn(1, 16, 64, 64, 64, generator=torch.Generator().manual_seed(0))
    x_cl = x.contiguous(memory_format=torch.channels_last_3d)
    rows = []
    for d in (1, 2, 4):
        expected = F.max_pool3d(x, 2, 1, 0, d)
        assert torch.equal(ext.max_pool(x, 2, d), expected)
        assert torch.equal(space_to_batch_max_pool3d(x, 2, d), expected)
        pools = {
            "ext": (x, lambda t, d=d: ext.max_pool(t, 2, d)),
            "ext_channels_last": (x_cl, lambda t, d=d: ext.max_pool(t, 2, d)),
            "native": (x, lambda t, d=d: F.max_pool3d(t, 2, 1, 0, d)),
            "native_channels_last": (x_cl, lambda t, d=d: F.max_pool3d(t, 2, 1, 0, d)),
            "space_to_batch": (x, lambda t, d=d: space_to_batch_max_pool3d(t, 2, d)),
        }
        candidates = _calls(pools, backward)
        rows.append({"kernel": 2, "dilation": d, "median_s": interleaved_medians(candidates, rounds)})
    return rows


def image(rounds: int, backward: bool) -> list[dict]:
    x = torch.randn(1, 50, 512, 512, generator=torch.Generator().manual_seed(0))
    x_cl = x.contiguous(memory_format=torch.channels_last)
    rows = []
    for k, d in ((8, 1), (2, 2)):
        pools = {
            "ext": (x, lambda t, k=k, d=d: ext.max_pool(t, k, d)),
            "ext_channels_last": (x_cl, lambda t, k=k, d=d: ext.max_pool(t, k, d)),
            "native": (x, lambda t, k=k, d=d: F.max_pool2d(t, k, 1, 0, d)),
            "native_channels_last": (x_cl, lambda t, k=k, d=d: F.max_pool2d(t, k, 1, 0, d)),
        }
        candidates = _calls(pools, backward)
        rows.append({"kernel": k, "dilation": d, "median_s": interleaved_medians(candidates, rounds)})
    return rows


def _calls(pools: dict, backward: bool) -> dict:
    """name -> a no-argument call: the pool of its input, or (backward) the pool and its gradient."""
    if backward:
        return {name: (lambda x=x, pool=pool: with_backward(pool)(x)) for name, (x, pool) in pools.items()}
    return {name: (lambda x=x, pool=pool: pool(x)) for name, (x, pool) in pools.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=["volume", "image"])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument(
        "--backward", action="store_true", help="time forward (keeping the argmax) + backward"
    )
    args = parser.parse_args()
    with torch.set_grad_enabled(args.backward):
        rows = (volume if args.case == "volume" else image)(args.rounds, args.backward)
    for row in rows:
        medians = row["median_s"]
        best_native = min(medians["native"], medians["native_channels_last"])
        row["native_over_ext"] = best_native / min(medians["ext"], medians["ext_channels_last"])
    print(
        json.dumps(
            {"case": args.case, "backward": args.backward, "machine": machine.description(), "rows": rows}
        )
    )


if __name__ == "__main__":
    main()
