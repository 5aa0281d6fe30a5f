"""The benchmark items; each returns a JSON-able dict of medians and ratios, measured in one interleaved run.

Baselines are honest: native dilated ops, fast scanning and patch-by-patch scanning each run in NCHW and in
channels_last, and densecnn is compared with the faster of the two (named in the results).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import densecnn
from densecnn.ops import allocator, calibration, ext_available, solvers
from densecnn.ops.config import get_config
from densecnn.ops.layout import to_format
from densecnn.ops.plan import next_shape
from densecnn.ops.solvers import ConvOp, PoolOp
from densecnn.ops.tune import tuned_times

from . import machine
from .timing import elapsed, fastest, interleave, median, ratio
from .workloads import LAYOUTS, Workload, native_max_pool, plain_family, pool_input


@dataclass
class Config:
    """Sizes of one benchmark run; :meth:`quick` is the seconds-long smoke version."""

    repeats: int = 5
    models: list[str] = field(default_factory=lambda: ["plain_133", "stages_46"])  # per layer, conv limit
    model: str = "plain_133"  # vs image size, masked training
    size: int = 512  # the goals' image size
    sizes: list[int] = field(default_factory=lambda: [128, 256, 512, 1024])  # 512 reuses the per-layer run
    patch_kernels: list[int] = field(default_factory=lambda: [3, 5, 7, 9])  # plain family: patch 16·m + 21
    patch_image: int = 256
    patch_width: int = 50  # channels of the plain family's hidden layers
    masked_image: int = 256
    masked_counts: list[int] = field(default_factory=lambda: [1, 16, 256, 4096, 65536])
    pool_channels: int = 64
    pool_size: int = 512
    patch_batch: int = 64  # patches per timed batch of the patch-by-patch baseline
    baselines_up_to: int = 512  # in the size sweep, larger images are compared with patch-by-patch only
    memory_image: int = 4096  # tiled predict of one RGB image of this side under memory_cap bytes
    memory_cap: int = 1_500_000_000
    cold_runs: int = 3  # fresh processes per first-call measurement
    monai_crop: int = (
        24  # MONAI's sliding window labels this many pixels squared, timed and scaled to the image
    )

    @classmethod
    def quick(cls) -> Config:
        return cls(
            repeats=5,
            models=["tiny"],
            model="tiny",
            size=24,
            sizes=[16, 24],
            patch_kernels=[1, 2],
            patch_image=12,
            patch_width=4,
            masked_image=16,
            masked_counts=[1, 16, 256],
            pool_channels=4,
            pool_size=24,
            patch_batch=8,
            memory_image=64,
            memory_cap=50_000_000,
            cold_runs=1,
            monai_crop=8,
        )


def per_layer(name: str, config: Config) -> dict:
    """Table 1 analogue: per-layer forward and backward (best native vs densecnn), whole-net times of all four ways.

    Native ops run the same computation with or without autograd, so their forward times come from the training
    runs; densecnn's inference and training plans may differ, so both are run. Per layer, "native" is the faster of
    NCHW and channels_last for that layer; for the whole net, the faster of the two whole runs.
    """
    work = Workload.zoo(name, config.size)
    samples = interleave(
        _per_layer_contenders(work, config), config.repeats, warm_up=("densecnn", "densecnn_train")
    )
    plans = {"infer": work.plan(False), "train": work.plan(True)}
    layers = _layer_rows(work, plans, samples)
    forward, train, best = _whole_net_times(samples)
    return {
        "model": name,
        "image": list(work.x.shape),
        "memory_format": {direction: plan.memory_format for direction, plan in plans.items()},
        "baseline_layouts": {k: v.split("/")[1] for k, v in best.items()},
        "layers": layers,
        "forward_s": {
            "patch": median(samples[best["patch"]]),
            "fast_scan": median(samples[best["fast_scan"]]),
            "native": median(forward[best["native"]]),
            "densecnn": median(forward["densecnn"]),
        },
        "native_forward_s": {fmt: median(forward[f"native/{fmt}"]) for fmt in LAYOUTS},
        "train_s": {
            "patch": median(samples[best["patch_train"]]),
            "native": median(train[best["native_train"]]),
            "densecnn": median(train["densecnn_train"]),
        },
        "speedup": {
            "forward_vs_patch": ratio(samples[best["patch"]], forward["densecnn"]),
            "forward_vs_fast_scan": ratio(samples[best["fast_scan"]], forward["densecnn"]),
            "forward_vs_native": ratio(forward[best["native"]], forward["densecnn"]),
            "train_vs_native": ratio(train[best["native_train"]], train["densecnn_train"]),
            "train_vs_patch": ratio(samples[best["patch_train"]], train["densecnn_train"]),
        },
    }


def _per_layer_contenders(work: Workload, config: Config) -> dict:
    """The runs :func:`per_layer` times: densecnn's inference and training plans step by step, native ops step by
    step (training, which times their forward too) in each layout, fast scanning, and patch-by-patch forward and
    training in each layout."""
    contenders = {"densecnn": work.stepwise("densecnn", train=False)}
    contenders.update({f"native/{fmt}": work.stepwise(f"native/{fmt}", train=True) for fmt in LAYOUTS})
    contenders["densecnn_train"] = work.stepwise("densecnn", train=True)
    contenders.update({f"fast_scan/{fmt}": work.fast_scan(fmt) for fmt in LAYOUTS})
    contenders.update({f"patch/{fmt}": work.patch_forward(config.patch_batch, fmt) for fmt in LAYOUTS})
    contenders.update(
        {f"patch_train/{fmt}": work.patch_train(config.patch_batch, layout=fmt) for fmt in LAYOUTS}
    )
    return contenders


def _layer_rows(work: Workload, plans: dict, samples: dict) -> list[dict]:
    """One row per step: its solvers, and its forward and backward medians for the faster native layout and for
    densecnn."""
    layers = []
    for i, layer in enumerate(work.step_names()):
        row = {"layer": layer, "solver": plans["infer"].steps[i].solver or "module"}
        row["train_solver"] = plans["train"].steps[i].solver or "module"
        row["choice"] = plans["infer"].steps[i].source or "module"
        for part in ("forward", "backward"):
            native = {fmt: median([s[part][i] for s in samples[f"native/{fmt}"]]) for fmt in LAYOUTS}
            row[f"native_{part}_format"] = min(native, key=native.get)
            row[f"native_{part}"] = native[row[f"native_{part}_format"]]
            which = "densecnn" if part == "forward" else "densecnn_train"
            row[f"densecnn_{part}"] = median([s[part][i] for s in samples[which]])
            row[f"{part}_speedup"] = row[f"native_{part}"] / row[f"densecnn_{part}"]
        layers.append(row)
    return layers


def _whole_net_times(samples: dict) -> tuple[dict, dict, dict]:
    """(whole-net forward seconds per stepwise run, whole-net training seconds per stepwise training run, the
    fastest layout's run of each way)."""
    forward = {
        k: [sum(s["forward"]) for s in v] for k, v in samples.items() if k.startswith(("native", "dense"))
    }
    train = {
        k: [sum(s["forward"]) + sum(s["backward"]) for s in samples[k]] for k in forward if k != "densecnn"
    }
    best = {
        "native": fastest(forward, "native/"),
        "native_train": fastest(train, "native/"),
        "fast_scan": fastest(samples, "fast_scan/"),
        "patch": fastest(samples, "patch/"),
        "patch_train": fastest(samples, "patch_train/"),
    }
    return forward, train, best


def _forward_baselines(work: Workload, config: Config) -> dict:
    contenders = {f"patch/{fmt}": work.patch_forward(config.patch_batch, fmt) for fmt in LAYOUTS}
    if work.x.shape[-1] <= config.baselines_up_to:
        contenders.update({f"fast_scan/{fmt}": work.fast_scan(fmt) for fmt in LAYOUTS})
        contenders.update({f"native/{fmt}": work.forward(f"native/{fmt}") for fmt in LAYOUTS})
    contenders["densecnn"] = work.forward("densecnn")
    samples = interleave(contenders, config.repeats, warm_up=("densecnn",))
    best = {k: fastest(samples, f"{k}/") for k in ("patch", "fast_scan", "native") if f"{k}/nchw" in samples}
    best["densecnn"] = "densecnn"
    result = {"forward_s": {k: median(samples[v]) for k, v in best.items()}}
    result["baseline_layouts"] = {k: v.split("/")[1] for k, v in best.items() if k != "densecnn"}
    result["speedup"] = {
        k: ratio(samples[v], samples["densecnn"]) for k, v in best.items() if k != "densecnn"
    }
    return result


def vs_image_size(config: Config, per_layer_results: list[dict]) -> list[dict]:
    """Table 3 analogue: forward at growing image sizes (plain_133 unless quick).

    The goals' size comes from the per-layer run of the same model (same interleaved baselines), not run twice.
    """
    rows = []
    for size in config.sizes:
        same = [r for r in per_layer_results if r["model"] == config.model and r["image"][-1] == size]
        if same:
            speedup = same[0]["speedup"]
            rows.append(
                {
                    "size": size,
                    "forward_s": same[0]["forward_s"],
                    "baseline_layouts": {
                        k: same[0]["baseline_layouts"][k] for k in ("patch", "fast_scan", "native")
                    },
                    "speedup": {k: speedup[f"forward_vs_{k}"] for k in ("patch", "fast_scan", "native")},
                }
            )
        else:
            rows.append({"size": size, **_forward_baselines(Workload.zoo(config.model, size), config)})
    return rows


def vs_patch_size(config: Config) -> list[dict]:
    """Table 4 analogue: the plain family (patch 16·m + 21) at a fixed image size."""
    rows = []
    for kernel in config.patch_kernels:
        torch.manual_seed(0)
        model, patch = plain_family(kernel, width=config.patch_width)
        work = Workload(
            f"plain_{patch}", model.eval(), patch, torch.rand(1, 3, config.patch_image, config.patch_image)
        )
        rows.append({"patch": patch, **_forward_baselines(work, config)})
    return rows


def masked_backward(config: Config) -> dict:
    """Training step time (forward, masked cross-entropy, backward) vs the number of selected pixels.

    densecnn's cost is flat; a patch-minibatch step over the same pixels grows with their number.
    """
    work = Workload.zoo(config.model, config.masked_image)
    n, _, h, w = work.x.shape
    labels = torch.randint(0, work.dense.num_classes, (n, h, w))
    contenders = {}
    for count in [c for c in config.masked_counts if c <= n * h * w]:
        mask = torch.zeros(n * h * w, dtype=torch.bool)
        mask[torch.randperm(n * h * w)[:count]] = True
        contenders[f"densecnn_{count}"] = work.masked_step("densecnn", labels, mask.view(n, h, w))
        for fmt in LAYOUTS:
            contenders[f"patch_{count}/{fmt}"] = work.patch_train(config.patch_batch, count, fmt)
    samples = interleave(contenders, config.repeats)
    counts = sorted({int(k.split("_")[1]) for k in samples if k.startswith("densecnn_")})
    rows = []
    for c in counts:
        patch = fastest(samples, f"patch_{c}/")
        rows.append(
            {
                "selected": c,
                "densecnn_s": median(samples[f"densecnn_{c}"]),
                "patch_s": median(samples[patch]),
                "patch_layout": patch.split("/")[1],
            }
        )
    return {"model": work.name, "image": list(work.x.shape), "rows": rows}


def conv_limit(name: str, config: Config) -> dict:
    """Every candidate solver of every layer, on the real shapes, in both memory formats: which won and by how much,
    densecnn's overhead over the conv-only limit (its forward / Σ over conv layers of the best conv time in the
    format the net runs in), and its forward over the direct-convolution limit (Σ over conv layers of torch's conv in
    the faster format), interleaved with the whole forward. Inference (no autograd).
    """
    work = Workload.zoo(name, config.size)
    shape, contenders = tuple(work.padded.shape), {"densecnn": work.forward("densecnn")}
    plan = work.plan(False)
    ext, steps = ext_available(), work.dense.steps()
    for i, step in enumerate(steps):
        if hasattr(step.layers[0], "dense_op"):
            op = step.dense_op()
            for fmt in LAYOUTS:
                x = to_format(torch.randn(shape), fmt)
                for solver in solvers.candidates(op, ext_available=ext, dtype=x.dtype):
                    contenders[f"{i}:{solver}/{fmt}"] = _no_grad_solver(solver, op, x)
        shape = next_shape(step, shape)
    samples = interleave(contenders, config.repeats)
    races: dict[int, dict[str, float]] = {}
    for key, values in samples.items():
        if key != "densecnn":
            step, candidate = key.split(":")
            races.setdefault(int(step), {})[candidate] = median(values)
    names = work.step_names()
    layers = [
        _race_row(names[i], times, plan.steps[i].solver, plan.memory_format) for i, times in races.items()
    ]
    convs = [row for i, row in zip(races, layers) if isinstance(steps[i].dense_op(), ConvOp)]
    limit = sum(row["best_in_plan_format_s"] for row in convs)
    # torch's direct conv, in either format
    native_convs = sum(row["times_s"][row["best_native"]] for row in convs)
    forward = median(samples["densecnn"])
    return {
        "model": name,
        "image": list(work.x.shape),
        "memory_format": plan.memory_format,
        "layers": layers,
        "convs": [{"layer": r["layer"], "best": r["best_in_plan_format"]} for r in convs],
        "conv_limit_s": limit,
        "native_conv_sum_s": native_convs,
        "densecnn_forward_s": forward,
        "overhead": forward / limit,
        "vs_native_conv_sum": forward / native_convs,
    }


def _race_row(layer: str, times: dict[str, float], chosen: str, fmt: str) -> dict:
    """One layer's race: the winner over both formats, its margin over the runner-up, the best native, the plan's
    choice and how far it is from the best in the plan's format."""
    ranked = sorted(times, key=times.get)
    in_format = {c: t for c, t in times.items() if c.endswith(f"/{fmt}")}
    best_in_format = min(in_format, key=in_format.get)
    native = min((c for c in times if c.startswith("native/")), key=times.get)
    return {
        "layer": layer,
        "times_s": times,
        "winner": ranked[0],
        "winner_s": times[ranked[0]],
        "runner_up": ranked[1] if len(ranked) > 1 else None,
        "margin": times[ranked[1]] / times[ranked[0]] if len(ranked) > 1 else None,
        "best_native": native,
        "vs_best_native": times[native] / times[ranked[0]],
        "plan_choice": f"{chosen}/{fmt}",
        "plan_choice_vs_best_in_format": times[f"{chosen}/{fmt}"] / in_format[best_in_format],
        "best_in_plan_format": best_in_format,
        "best_in_plan_format_s": in_format[best_in_format],
    }


def _no_grad_solver(solver, op, x):
    def run():
        with torch.no_grad():
            solvers.run(solver, op, x)

    return run


def max_pool(kernel: int, dilation: int, config: Config) -> dict:
    """d-sparse max pooling: densecnn's fastest timed solver vs ``F.max_pool2d(dilation=d, stride=1)`` in the faster
    of NCHW and channels_last, forward and backward."""
    x = pool_input(config.pool_channels, config.pool_size)
    op = PoolOp("max_pool2d", (kernel, kernel), (dilation, dilation))
    ext, cache_dir = ext_available(), get_config().cache_dir
    chosen = {}
    for direction, train in (("forward", False), ("backward", True)):
        times = tuned_times(op, tuple(x.shape), x.dtype, x.device, train=train, ext=ext, cache_dir=cache_dir)
        chosen[direction] = min(
            ((fmt, s) for fmt, table in times.items() for s, ms in table.items() if ms is not None),
            key=lambda fs: times[fs[0]][fs[1]],
        )
    xs = {d: to_format(x, chosen[d][0]) for d in chosen}
    contenders = {
        "densecnn_forward": lambda: solvers.run(chosen["forward"][1], op, xs["forward"]),
        "densecnn_backward": _backward(lambda v: solvers.run(chosen["backward"][1], op, v), xs["backward"]),
    }
    for fmt in LAYOUTS:
        layout = to_format(x, fmt)
        contenders[f"native_forward/{fmt}"] = lambda v=layout: native_max_pool(v, kernel, dilation)
        contenders[f"native_backward/{fmt}"] = _backward(
            lambda v: native_max_pool(v, kernel, dilation), layout
        )
    samples = interleave(contenders, config.repeats)
    native = {d: fastest(samples, f"native_{d}/") for d in ("forward", "backward")}
    return {
        "kernel": kernel,
        "dilation": dilation,
        "input": list(x.shape),
        "solver": {d: f"{s}/{fmt}" for d, (fmt, s) in chosen.items()},
        "native_layout": {d: name.split("/")[1] for d, name in native.items()},
        "times_s": {
            "native_forward": median(samples[native["forward"]]),
            "native_backward": median(samples[native["backward"]]),
            "densecnn_forward": median(samples["densecnn_forward"]),
            "densecnn_backward": median(samples["densecnn_backward"]),
        },
        "speedup": {d: ratio(samples[native[d]], samples[f"densecnn_{d}"]) for d in ("forward", "backward")},
    }


def _backward(op, x):
    """A run returning the seconds of the backward pass alone (the forward is not timed)."""

    def run():
        leaf = x.detach().requires_grad_()
        y = op(leaf)
        grad = torch.ones_like(y)
        return elapsed(lambda: y.backward(grad))

    return run


def environment() -> dict:
    return {
        "torch": torch.__version__,
        "densecnn": densecnn.__version__,
        "threads": torch.get_num_threads(),
        "cpu": machine.cpu_model(),
        "isa": machine.kernel_isa(),  # which compiled clone of the kernels' CPU loops ran
        "ext_available": ext_available(),
        "allocator": allocator.name(),  # a caching malloc speeds up torch's ops too
        "cost_model_calibration": calibration.current().factors,  # the immediate plans' factors per solver family
    }


def bfloat16(name: str, config: Config) -> dict:
    """bf16 inference (a bfloat16 image through backend "auto") vs float32: label agreement, score error, speed.

    Random weights and a random image: classes are close together, so this is a pessimistic agreement figure.
    """
    work = Workload.zoo(name, config.patch_image)
    x16 = work.x.bfloat16()
    with torch.no_grad():
        scores, scores16 = work.dense(work.x), work.dense(x16).float()
    samples = interleave(
        {"float32": lambda: work.dense.predict(work.x), "bfloat16": lambda: work.dense.predict(x16)},
        config.repeats,
    )
    return {
        "model": name,
        "image": list(work.x.shape),
        "label_agreement": (scores.argmax(1) == scores16.argmax(1)).double().mean().item(),
        "max_abs_score_error": (scores - scores16).abs().max().item(),
        "max_abs_score": scores.abs().max().item(),
        "times_s": {k: median(v) for k, v in samples.items()},
        "speedup": ratio(samples["float32"], samples["bfloat16"]),
    }
