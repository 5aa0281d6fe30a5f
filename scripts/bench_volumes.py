#!/usr/bin/env python
"""The 3-D benchmark: every voxel of a volume labelled by the zoo's ``znni_3d`` net, four ways, in output voxels per
second.

    python scripts/bench_volumes.py --size 96 --out docs/benchmarks/volumes
    python scripts/bench_volumes.py --quick --out /tmp/volumes      # seconds-long smoke run

- ``densecnn``: the dense net, backend "auto" (per-layer solver choice; the kernels where they apply).
- ``native``: the dense net run with torch's dilated 3-D ops (``F.conv3d`` / ``F.max_pool3d`` with dilation), in
  NCDHW and in channels_last_3d; the faster of the two is the baseline.
- ``fast_scan``: fragments (:func:`densecnn.fast_scan`), every offset of each strided pool stacked in the batch.
- ``cubes``: cube-by-cube scanning: the patch net on a batch of cubes, timed and scaled to all voxels, at several
  batch sizes (small batches lose most to thread barriers on a busy machine) in both layouts; the fastest is the
  baseline.

All run forward only (no autograd) on one 1-channel volume, interleaved round by round; medians and the median of
per-round ratios are reported. The conv-only limit is the sum over conv layers of the fastest conv solver on that
layer's real input, timed interleaved with densecnn's forward: their ratio is the cost of everything else (pools,
padding, layout). Every solver of every pool is raced too. Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import densecnn
from densecnn.bench import machine
from densecnn.bench.timing import elapsed, interleave, median, ratio
from densecnn.ops import ext_available, solvers
from densecnn.ops.layout import NAMES as FORMAT_NAMES
from densecnn.ops.layout import memory_format, to_format
from densecnn.ops.plan import next_shape
from densecnn.ops.solvers import ConvOp

LAYOUTS = {"ncdhw": torch.contiguous_format, "ndhwc": torch.channels_last_3d}


def contenders(model, patch, x: torch.Tensor, cube_batches: list[int]) -> dict:
    """The four ways (baselines in both layouts), each a callable returning seconds or timed as a call; densecnn
    with its immediate plan (solvers chosen by the shipped cost model) and tuned (``tune=True``: timed by the find
    step on the first call)."""
    dense = {
        "densecnn": densecnn.convert(model, patch, backend="auto"),
        "densecnn/tuned": densecnn.convert(model, patch, backend="auto", tune=True),
    }
    native = densecnn.convert(model, patch, backend="native")
    padded = native.pad(x)
    voxels = x[0, 0].numel()
    runs = {name: lambda net=net: _no_grad(net, x) for name, net in dense.items()}
    for name, layout in LAYOUTS.items():
        runs[f"native/{name}"] = _layers(native.features, padded.contiguous(memory_format=layout))
    for name, layout in LAYOUTS.items():
        volume = x.contiguous(memory_format=layout)
        runs[f"fast_scan/{name}"] = lambda v=volume: densecnn.fast_scan(model, v, patch)
    for size in cube_batches:
        cubes = torch.rand(size, x.shape[1], *patch)
        for name, layout in LAYOUTS.items():
            batch = cubes.contiguous(memory_format=layout)
            runs[f"cubes/{name}/{size}"] = lambda b=batch: (
                elapsed(lambda: _no_grad(model, b)) * voxels / len(b)
            )
    return runs, dense


def layer_races(dense, x: torch.Tensor, repeats: int) -> dict:
    """Every candidate solver of every windowed layer on its real input shape in both memory formats, interleaved
    with the whole forward of ``dense``: the conv-only limit (the sum over conv layers of the fastest conv solver,
    either format) and where the rest of the time goes."""
    padded = dense.pad(x)
    with torch.no_grad():
        plan = dense.plan(padded)
    shape, runs, names = tuple(padded.shape), {"densecnn": lambda: _no_grad(dense, x)}, {}
    for i, step in enumerate(dense.steps()):
        if hasattr(step.layers[0], "dense_op"):
            op = step.dense_op()
            names[i] = _layer_name(op, shape)
            for fmt in FORMAT_NAMES:
                inp = to_format(torch.randn(shape), fmt)  # (1, C, D, H, W)
                for solver in solvers.candidates(op, ext_available=ext_available(), dtype=inp.dtype):
                    runs[f"{i}:{solver}/{fmt}"] = _solver(solver, op, inp, memory_format(fmt, 5))
        shape = next_shape(step, shape)
    samples = interleave(runs, repeats)
    layers: dict[int, dict[str, float]] = {}
    for key, values in samples.items():
        if key != "densecnn":
            i, solver = key.split(":")
            layers.setdefault(int(i), {})[solver] = median(values)
    rows = [
        {
            "layer": names[i],
            "conv": names[i].startswith("conv"),
            "times_s": times,
            "best": min(times, key=times.get),
            "best_s": min(times.values()),
            "plan_choice": f"{plan.steps[i].solver}/{plan.memory_format}",
        }
        for i, times in layers.items()
    ]
    limit = sum(row["best_s"] for row in rows if row["conv"])
    forward = median(samples["densecnn"])
    return {
        "memory_format": plan.memory_format,
        "layers": rows,
        "conv_limit_s": limit,
        "densecnn_forward_s": forward,
        "vs_conv_limit": forward / limit,
    }


def _layer_name(op, shape) -> str:
    kind = "conv" if isinstance(op, ConvOp) else op.name
    act = f" + {op.activation}" if getattr(op, "activation", None) else ""
    return f"{kind} {'×'.join(map(str, op.kernel))} d{op.dilation[0]}{act} on {'×'.join(map(str, shape[1:]))}"


def measure(size: int, repeats: int, cube_batches: list[int], threads: int | None) -> dict:
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    model, patch = densecnn.zoo.create("znni_3d", in_channels=1, num_classes=3)
    model.eval()
    x = torch.rand(1, 1, size, size, size)  # (N, C, D, H, W)
    runs, dense = contenders(model, patch, x, cube_batches)
    samples = interleave(runs, repeats, warm_up=tuple(n for n in runs if not n.startswith("fast_scan")))
    voxels = size**3
    times = {name: median(values) for name, values in samples.items()}
    best = {
        way: min((n for n in times if n.startswith(way)), key=times.get)
        for way in ("native", "fast_scan", "cubes")
    }
    races = layer_races(dense["densecnn/tuned"], x, repeats)
    return {
        "model": "znni_3d",
        "patch": list(patch),
        "volume": list(x.shape),
        "output_voxels": voxels,
        "repeats": repeats,
        "cube_batches": cube_batches,
        "kernels_3d": _kernels_apply(dense["densecnn"]),
        "plans": {name: _solvers_of(net, x) for name, net in dense.items()},
        "times_s": times,
        "voxels_per_s": {name: voxels / t for name, t in times.items()},
        "baselines": best,
        "speedup": {
            net: {way: ratio(samples[name], samples[net]) for way, name in best.items()} for net in dense
        },
        "layer_races": races,
        "environment": {
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpu": machine.description(),
            "python": sys.version.split()[0],
        },
    }


def markdown(r: dict) -> str:
    size = "×".join(str(s) for s in r["volume"][2:])
    lines = [
        "# 3-D benchmark: znni_3d on one volume",
        "",
        f"`scripts/bench_volumes.py`: the zoo's `znni_3d` net (patch {'×'.join(map(str, r['patch']))}, three 3³ "
        f"convs of 16 channels, two 2³ max pools) labels every voxel of one 1-channel {size} volume "
        f"({r['output_voxels']:,} output voxels), forward only, {r['repeats']} interleaved rounds, medians. "
        f"Cube-by-cube scanning is timed on batches of {' and '.join(map(str, r['cube_batches']))} cubes and "
        "scaled to all voxels. "
        f"Baselines run in NCDHW and channels_last_3d (NDHWC); the faster is compared. "
        f"densecnn's own pooling kernels {'ran' if r['kernels_3d'] else 'were not available'} for these 3-D pools; "
        f"torch {r['environment']['torch']}, {r['environment']['threads']} threads, shared CPU.",
        "",
        "`densecnn` is the default (immediate) plan, its solvers predicted by the shipped cost model; "
        "`densecnn/tuned` is `convert(..., tune=True)`, its solvers timed by the tuning step on the first call. "
        "Speedups are medians of per-round ratios against the faster layout of each baseline.",
        "",
        "| way | median time | output voxels / s | speedup of densecnn | speedup of densecnn/tuned |",
        "|---|---|---|---|---|",
    ]
    for name, t in sorted(r["times_s"].items(), key=lambda kv: kv[1]):
        way = name.split("/")[0]
        cells = [
            f"{r['speedup'][net][way]:,.1f}×" if r["baselines"].get(way) == name else ""
            for net in ("densecnn", "densecnn/tuned")
        ]
        lines.append(f"| {name} | {t:.3g} s | {r['voxels_per_s'][name]:,.0f} | {' | '.join(cells)} |")
    races = r["layer_races"]
    for net, plan in r["plans"].items():
        steps = ", ".join(str(solver) for solver in plan["solvers"])
        lines += ["", f"`{net}` plan ({plan['format']}; solver per step): {steps}."]
    lines += [
        "",
        "Every solver of every windowed layer on its real input shape (dense, stride 1, dilated), in NCDHW (`nchw`) "
        "and channels_last_3d (`nhwc`), interleaved with "
        f"densecnn/tuned's whole forward ({races['densecnn_forward_s']:.3g} s in these rounds). Conv-only limit (the "
        f"fastest solver per conv layer in either format, summed): {races['conv_limit_s']:.3g} s; densecnn/tuned's forward is "
        f"{races['vs_conv_limit']:.2f}× that.",
        "",
        "| layer (input C×D×H×W) | tuned plan | fastest | times |",
        "|---|---|---|---|",
    ]
    for row in races["layers"]:
        times = ", ".join(f"{k} {v:.3g} s" for k, v in row["times_s"].items())
        lines.append(f"| {row['layer']} | {row['plan_choice']} | {row['best']} | {times} |")
    lines.append("")
    return "\n".join(lines)


def _solvers_of(net, x: torch.Tensor) -> dict:
    """The memory format of ``net``'s plan for ``x`` and the solver of each step (None: a layer run as itself)."""
    with torch.no_grad():
        plan = net.plan(net.pad(x))
    return {"format": plan.memory_format, "solvers": [step.solver for step in plan.steps]}


def _kernels_apply(dense) -> bool:
    """Whether a densecnn kernel (solver "ext*") is a candidate for any layer of ``dense`` here."""
    steps = [s for s in dense.steps() if hasattr(s.layers[0], "dense_op")]
    return any(
        name.startswith("ext")
        for s in steps
        for name in solvers.candidates(s.dense_op(), ext_available=ext_available())
    )


def _layers(features, x: torch.Tensor):
    def run():
        with torch.no_grad():
            y = x
            for layer in features:
                y = layer(y)
        return y

    return run


def _solver(name: str, op, x: torch.Tensor, memory_format: torch.memory_format):
    def run():
        with torch.no_grad():
            solvers.run(name, op, x, memory_format)

    return run


def _no_grad(net, x):
    with torch.no_grad():
        return net(x)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=96, help="side of the cubic volume (default 96)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--cube-batches",
        type=int,
        nargs="+",
        default=[64, 1024],
        help="cubes per timed batch of cube scanning",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    parser.add_argument("--quick", action="store_true", help="a 24³ volume, 2 rounds: checks the script runs")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/volumes"))
    args = parser.parse_args(argv)
    if args.quick:
        args.size, args.repeats, args.cube_batches = 24, 2, [2, 4]
    result = measure(args.size, args.repeats, args.cube_batches, args.threads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
