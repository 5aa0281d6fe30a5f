"""Per-layer and end-to-end timings of the solvers on the reference nets, transform-domain (``fft``, ``winograd``)
included.

For every windowed step of the converted net (a conv, or a pool with the tanh/ReLU after it), each applicable solver
runs on an input of that step's shape in both memory formats; candidates are interleaved and the median is kept.
End to end, the best plan with and without ``fft`` (each step's fastest solver in the format whose steps add up
to the least) runs interleaved with the best native conversion (torch's dilated ops layer by layer, NCHW and
channels_last) and with densecnn's own plan.

    PYTHONPATH=. python scripts/bench_transform.py --size 512 --repeats 7 [--dtype bfloat16] [--json out.json]
    PYTHONPATH=. python scripts/bench_transform.py --winograd --size 512 --volume 96 --repeats 7

``--winograd``: the 3×3 and 3×3×3 convs of plain_133 (at --size²) and znni_3d (at --volume³), winograd against the
best native direct conv (the faster of NC* and channels-last), and both nets end to end with the best plan with and
without winograd (each step's fastest solver in the format whose steps add up to the least).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import statistics
import tempfile
import time

import torch

import densecnn
from densecnn.bench import machine
from densecnn.ops import ext_available, solvers
from densecnn.ops.config import get_config, set_config
from densecnn.ops.layout import NAMES as FORMATS
from densecnn.ops.layout import memory_format, to_format

NETS = {"plain_133": 32, "stages_46": 8}  # classes


def steps_of(dense) -> list[tuple]:
    """(layers, op or None) per step of the net, grouped as the planner groups them (a pool absorbs its tanh/ReLU)."""
    return [
        (step.layers, step.dense_op() if hasattr(step.layers[0], "dense_op") else None)
        for step in dense.steps()
    ]


def interleaved(candidates: dict, repeats: int) -> dict[str, float]:
    """Median milliseconds of each candidate, run round-robin after one warm-up each; a candidate that fails its
    warm-up (e.g. a kernel without bfloat16 support) is left out, as the tuning step does."""
    with torch.no_grad():
        candidates = {name: fn for name, fn in candidates.items() if _runs(fn)}
    times = {name: [] for name in candidates}
    with torch.no_grad():
        for _ in range(repeats):
            for name, fn in candidates.items():
                start = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(ms) for name, ms in times.items()}


def _runs(fn) -> bool:
    try:
        fn()
    except (RuntimeError, TypeError, ValueError, NotImplementedError):
        return False
    return True


def step_table(steps, padded: torch.Tensor, repeats: int) -> list[dict]:
    """Per windowed step: its description and {f"{solver}@{format}": ms}."""
    rows, x = [], padded
    for layers, op in steps:
        with torch.no_grad():  # the next step's input, computed in x's dtype
            out = solvers.run("native", op, x) if op is not None else layers[0](x)
        if op is not None:
            inputs = {fmt: to_format(x, fmt) for fmt in FORMATS}
            candidates = {
                f"{name}@{fmt}": functools.partial(_run, name, op, inputs[fmt], fmt)
                for name in solvers.candidates(op, ext_available=ext_available())
                for fmt in FORMATS
            }
            rows.append({"step": describe(op, x), "op": op, "ms": interleaved(candidates, repeats)})
        x = out
    return rows


def describe(op, x) -> str:
    kind = "conv" if isinstance(op, solvers.ConvOp) else op.name.split("_")[0]
    channels = f" {x.shape[1]}->{op.weight.shape[0]}" if kind == "conv" else ""
    act = f"+{op.activation}" if getattr(op, "activation", None) else ""
    return (
        f"{kind}{act} {op.kernel[0]}x{op.kernel[1]} d{op.dilation[0]}{channels} on {x.shape[2]}x{x.shape[3]}"
    )


def best(ms: dict, fmt: str, allow) -> tuple[str, float]:
    timed = {key: t for key, t in ms.items() if key.endswith("@" + fmt) and allow(key.split("@")[0])}
    key = min(timed, key=timed.get)
    return key.split("@")[0], timed[key]


def plan_from_table(rows, allow) -> tuple[str, list[str], float]:
    """(format, solver per windowed step, summed ms) of the best plan using the solvers ``allow`` accepts."""
    options = []
    for fmt in FORMATS:
        chosen = [best(row["ms"], fmt, allow) for row in rows]
        options.append((fmt, [name for name, _ in chosen], sum(ms for _, ms in chosen)))
    return min(options, key=lambda option: option[2])


def runner(steps, fmt: str, names: list[str]):
    """The padded input in ``fmt``, each step by its solver (any number of axes)."""
    names = iter(names)
    plan = [(layers, op, next(names) if op is not None else None) for layers, op in steps]

    def run(padded):
        x = to_format(padded, fmt)
        for layers, op, name in plan:
            x = _run(name, op, x, fmt) if op is not None else layers[0](x)
        return x.contiguous()

    return run


def _run(name: str, op, x: torch.Tensor, fmt: str) -> torch.Tensor:
    """One step by solver ``name``, its output in ``fmt`` (a one-channel input is both formats)."""
    return solvers.run(name, op, x, memory_format(fmt, x.dim()))


def bench_net(name: str, size: int, dtype: torch.dtype, repeats: int) -> dict:
    torch.manual_seed(0)
    model, patch = densecnn.zoo.create(name, in_channels=3, num_classes=NETS[name])
    model = model.eval()
    dense = densecnn.convert(model, patch)
    x = torch.rand(1, 3, size, size).to(dtype)
    padded = dense.pad(x)
    steps = steps_of(dense)
    rows = step_table(steps, padded, repeats)
    natives = {
        fmt: densecnn.convert(copy.deepcopy(model).to(dtype), patch, backend="native") for fmt in FORMATS
    }
    for fmt, native in natives.items():
        native.memory_format = fmt  # torch's dilated ops, every layer in this layout
    plans = {
        "with_fft": plan_from_table(rows, lambda s: True),
        "without_fft": plan_from_table(rows, lambda s: s != "fft"),
    }
    candidates = {
        **{f"native_{fmt}": functools.partial(native, x) for fmt, native in natives.items()},
        "densecnn": lambda: dense(x),
        **{
            f"plan_{key}": functools.partial(runner(steps, fmt, names), padded)
            for key, (fmt, names, _) in plans.items()
        },
    }
    if dtype != torch.float32:
        candidates["densecnn_float32"] = functools.partial(dense, x.float())
    end_to_end = interleaved(candidates, repeats)
    result = {
        "net": name,
        "size": size,
        "dtype": str(dtype).removeprefix("torch."),
        "layers": [],
        "end_to_end": end_to_end,
    }
    for row in rows:
        ms = row["ms"]
        winner = min(ms, key=ms.get)
        direct = {k: t for k, t in ms.items() if not k.startswith("fft")}
        best_direct = min(direct, key=direct.get)
        layer = {"step": row["step"], "ms": ms, "winner": winner, "best_direct": best_direct}
        if isinstance(row["op"], solvers.ConvOp):
            layer["best_native"] = min(ms[f"native@{f}"] for f in FORMATS)
        if any(k.startswith("fft") for k in ms):
            fft = min(t for k, t in ms.items() if k.startswith("fft"))
            layer["fft_vs_best_direct"] = direct[best_direct] / fft
        result["layers"].append(layer)
    conv_sum = sum(layer.get("best_native", 0.0) for layer in result["layers"])
    best_native = min(end_to_end["native_nchw"], end_to_end["native_nhwc"])
    if dtype != torch.float32:
        result["speedup_vs_float32"] = end_to_end["densecnn_float32"] / end_to_end["densecnn"]
    result["plans"] = {key: {"format": fmt, "solvers": names} for key, (fmt, names, _) in plans.items()}
    result["sum_best_native_conv_ms"] = conv_sum
    result["ratios"] = {
        key: {
            "vs_best_native_conversion": best_native / end_to_end[key],
            "vs_sum_best_native_conv": end_to_end[key] / conv_sum,
        }
        for key in ("densecnn", "plan_with_fft", "plan_without_fft")
    }
    return result


def bf16_agreement(name: str, size: int) -> float:
    """Fraction of pixels whose bfloat16 label equals the float32 label (random weights, random image)."""
    torch.manual_seed(0)
    model, patch = densecnn.zoo.create(name, in_channels=3, num_classes=NETS[name])
    dense = densecnn.convert(model.eval(), patch)
    x = torch.rand(1, 3, size, size)
    return (dense.predict(x) == dense.predict(x.bfloat16())).double().mean().item()


def gemm_throughput(repeats: int) -> dict[str, float]:
    """GFLOP/s of a 2048² matrix product in float32 and bfloat16 (interleaved): the compute ceiling of each dtype."""
    n = 2048
    pairs = {name: (torch.randn(n, n).to(getattr(torch, name)), torch.randn(n, n).to(getattr(torch, name)))
             for name in ("float32", "bfloat16")}  # fmt: skip
    ms = interleaved({name: functools.partial(torch.mm, a, b) for name, (a, b) in pairs.items()}, repeats)
    return {name: 2 * n**3 / (t * 1e-3) / 1e9 for name, t in ms.items()}


def kernel_sweep(size: int, kernels: list[int], repeats: int) -> list[dict]:
    """The last conv of plain_133 (50 -> 32 channels, dilation 16, output size²) with a k×k kernel: the best direct
    solver vs fft, whose cost does not grow with k."""
    rows = []
    for k in kernels:
        op = solvers.ConvOp(torch.randn(32, 50, k, k) / (50 * k * k) ** 0.5, torch.randn(32), (16, 16), 1)
        x = torch.randn(1, 50, size + (k - 1) * 16, size + (k - 1) * 16)
        inputs = {fmt: to_format(x, fmt) for fmt in FORMATS}
        ms = interleaved(
            {
                f"{name}@{fmt}": functools.partial(_run, name, op, inputs[fmt], fmt)
                for name in ("native", "s2b", "fft")
                for fmt in FORMATS
            },  # fmt: skip
            repeats,
        )
        direct = min(t for key, t in ms.items() if not key.startswith("fft"))
        fft = min(t for key, t in ms.items() if key.startswith("fft"))
        rows.append({"kernel": k, "best_direct_ms": direct, "fft_ms": fft, "fft_speedup": direct / fft})
        print(
            f"conv {k}x{k} d16 50->32 to {size}²: best direct {direct:.1f} ms, fft {fft:.1f} ms ({direct / fft:.2f}x)"
        )
    return rows


def winograd_net(name: str, shape: tuple, repeats: int) -> dict:
    """Per 3-tap conv of ``name`` on an input of ``shape`` (N, C, *S): winograd vs the best native direct conv; and
    end to end, the best plan from the step table with and without winograd (interleaved)."""
    torch.manual_seed(0)
    model, patch = densecnn.zoo.create(name, in_channels=shape[1], num_classes=3)
    dense = densecnn.convert(model.eval(), patch)
    padded = dense.pad(torch.rand(shape))
    steps, rows, x = steps_of(dense), [], padded
    for layers, op in steps:
        with torch.no_grad():
            out = solvers.run("native", op, x) if op is not None else layers[0](x)
        if op is not None:
            inputs = {fmt: to_format(x, fmt) for fmt in FORMATS}
            names = [n for n in solvers.candidates(op, ext_available=ext_available()) if n != "fft"]
            candidates = {
                f"{n}@{fmt}": functools.partial(_run, n, op, inputs[fmt], fmt)
                for n in names
                for fmt in FORMATS
            }
            rows.append({"op": op, "shape": list(x.shape), "ms": interleaved(candidates, repeats)})
        x = out
    layers = []
    for row in rows:
        ms, op = row["ms"], row["op"]
        if "winograd@nchw" not in ms:
            continue
        native = min(ms["native@nchw"], ms["native@nhwc"])
        wino = {fmt: ms[f"winograd@{fmt}"] for fmt in FORMATS}
        layers.append({
            "conv": f"{'x'.join(map(str, op.kernel))} d{op.dilation[0]} {op.weight.shape[1]}->"
                    f"{op.weight.shape[0]} on {'x'.join(map(str, row['shape'][2:]))}",
            "best_native_ms": native, "winograd_ms": wino, "speedup": native / min(wino.values()),
        })  # fmt: skip
    plans = {
        "with_winograd": plan_from_table(rows, lambda s: True),
        "without_winograd": plan_from_table(rows, lambda s: s != "winograd"),
    }
    end_to_end = interleaved(
        {key: functools.partial(runner(steps, fmt, names), padded)
         for key, (fmt, names, _) in plans.items()},
        repeats,
    )  # fmt: skip
    return {
        "net": name,
        "shape": list(shape),
        "layers": layers,
        "plans": {key: {"format": fmt, "solvers": names} for key, (fmt, names, _) in plans.items()},
        "end_to_end_ms": end_to_end,
        "speedup": {
            key.replace("with_winograd", "winograd"): end_to_end[key.replace("with_", "without_")]
            / end_to_end[key]
            for key in end_to_end
            if key.startswith("with_")
        },
    }


def report_winograd(result: dict) -> None:
    print(f"\n## winograd: {result['net']} on {result['shape']}")
    for layer in result["layers"]:
        wino = ", ".join(f"{fmt} {ms:.1f}" for fmt, ms in layer["winograd_ms"].items())
        print(f"conv {layer['conv']:32s} best native {layer['best_native_ms']:.1f} ms, winograd {wino} ms: "
              f"{layer['speedup']:.2f}x")  # fmt: skip
    print("plans:", result["plans"])
    print("end to end (ms):", {k: round(v, 1) for k, v in result["end_to_end_ms"].items()})
    print("with / without winograd:", {k: f"{v:.2f}x" for k, v in result["speedup"].items()})


def report(result: dict) -> None:
    print(f"\n## {result['net']} at {result['size']}² ({result['dtype']})")
    for layer in result["layers"]:
        ms = layer["ms"]
        gain = (
            f"  fft {layer['fft_vs_best_direct']:.2f}x best direct" if "fft_vs_best_direct" in layer else ""
        )
        print(f"{layer['step']:40s} winner {layer['winner']:16s} {ms[layer['winner']]:8.1f} ms  "
              f"best direct {layer['best_direct']} {ms[layer['best_direct']]:.1f} ms{gain}")  # fmt: skip
    print("end to end (ms):", {k: round(v, 1) for k, v in result["end_to_end"].items()})
    print("plans:", result["plans"])
    if "speedup_vs_float32" in result:
        print(f"densecnn {result['dtype']} vs float32: {result['speedup_vs_float32']:.2f}x")
    print(f"sum of best native conv per layer: {result['sum_best_native_conv_ms']:.1f} ms")
    for key, ratios in result["ratios"].items():
        print(f"{key:18s} {ratios['vs_best_native_conversion']:.2f}x best native conversion, "
              f"{ratios['vs_sum_best_native_conv']:.2f}x the sum of best native convs")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", nargs="*", default=list(NETS), choices=list(NETS))
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument(
        "--kernels", type=int, nargs="*", default=[], help="also sweep the last conv's kernel size"
    )
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--winograd", action="store_true", help="the winograd section only (see above)")
    parser.add_argument("--volume", type=int, default=96, help="znni_3d volume side for --winograd")
    args = parser.parse_args()
    if "DENSECNN_CACHE_DIR" not in os.environ:  # a private, empty solver cache unless one was chosen
        set_config(get_config().replace(cache_dir=tempfile.mkdtemp(prefix="densecnn-bench-")))
    dtype = getattr(torch, args.dtype)
    results = []
    if args.winograd:
        for name, shape in (
            ("plain_133", (1, 3, args.size, args.size)),
            ("znni_3d", (1, 1, *(args.volume,) * 3)),
        ):
            results.append(winograd_net(name, shape, args.repeats))
            report_winograd(results[-1])
        args.nets = []
    if dtype == torch.bfloat16:
        gemm = gemm_throughput(args.repeats)
        print("matrix product GFLOP/s:", {k: round(v, 1) for k, v in gemm.items()})
        results.append({"gemm_gflops": gemm})
    if args.kernels:
        results.append({"kernel_sweep": kernel_sweep(args.size, args.kernels, args.repeats)})
    for name in args.nets:
        result = bench_net(name, args.size, dtype, args.repeats)
        if dtype == torch.bfloat16:
            result["label_agreement_with_float32"] = bf16_agreement(name, args.size)
        report(result)
        results.append(result)
    print(f"\ntorch {torch.__version__}, {machine.description()}, load average {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
