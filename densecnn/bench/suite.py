"""The benchmark items (DESIGN.md's baselines, the issue's goals); each returns a JSON-able dict of medians and ratios."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import densecnn
from densecnn.losses import masked_cross_entropy
from densecnn.ops import ext_available, solvers
from densecnn.ops.find import MEMORY_FORMATS, find
from densecnn.ops.plan import group_steps, next_shape
from densecnn.ops.solvers import ConvSpec, PoolSpec

from .timing import elapsed, interleave, median, ratio
from .workloads import Workload, native_max_pool, plain_family, pool_input


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
        )


def per_layer(name: str, config: Config) -> dict:
    """Table 1 analogue: per-layer forward and backward (native vs densecnn), whole-net times of all four baselines.

    Native ops run the same computation with or without autograd, so their forward times come from the training
    runs; densecnn's inference and training plans may differ, so both are run.
    """
    work = Workload.zoo(name, config.size)
    samples = interleave(
        {
            "densecnn": work.stepwise("densecnn", train=False),
            "native_train": work.stepwise("native", train=True),
            "densecnn_train": work.stepwise("densecnn", train=True),
            "fast_scan": work.fast_scan(),
            "patch": work.patch_forward(config.patch_batch),
            "patch_train": work.patch_train(config.patch_batch),
        },
        config.repeats,
        warm_up=("densecnn", "densecnn_train"),
    )
    layers = []
    for i, layer in enumerate(work.step_names()):
        row = {"layer": layer, "solver": work.plan(False).steps[i].solver or "module"}
        row["train_solver"] = work.plan(True).steps[i].solver or "module"
        for key, which, part in [
            ("native_forward", "native_train", "forward"),
            ("densecnn_forward", "densecnn", "forward"),
            ("native_backward", "native_train", "backward"),
            ("densecnn_backward", "densecnn_train", "backward"),
        ]:
            row[key] = median([s[part][i] for s in samples[which]])
        row["forward_speedup"] = row["native_forward"] / row["densecnn_forward"]
        row["backward_speedup"] = row["native_backward"] / row["densecnn_backward"]
        layers.append(row)
    forward = {
        k: [sum(s["forward"]) for s in samples[w]]
        for k, w in (("native", "native_train"), ("densecnn", "densecnn"))
    }
    train = {
        k: [sum(s["forward"]) + sum(s["backward"]) for s in samples[f"{k}_train"]]
        for k in ("native", "densecnn")
    }
    return {
        "model": name,
        "image": list(work.x.shape),
        "memory_format": {"infer": work.plan(False).memory_format, "train": work.plan(True).memory_format},
        "layers": layers,
        "forward_s": {
            "patch": median(samples["patch"]),
            "fast_scan": median(samples["fast_scan"]),
            "native": median(forward["native"]),
            "densecnn": median(forward["densecnn"]),
        },
        "train_s": {
            "patch": median(samples["patch_train"]),
            "native": median(train["native"]),
            "densecnn": median(train["densecnn"]),
        },
        "speedup": {
            "forward_vs_patch": ratio(samples["patch"], forward["densecnn"]),
            "forward_vs_fast_scan": ratio(samples["fast_scan"], forward["densecnn"]),
            "forward_vs_native": ratio(forward["native"], forward["densecnn"]),
            "train_vs_native": ratio(train["native"], train["densecnn"]),
            "train_vs_patch": ratio(samples["patch_train"], train["densecnn"]),
        },
    }


def _forward_baselines(work: Workload, config: Config) -> dict:
    contenders = {"patch": work.patch_forward(config.patch_batch)}
    if work.x.shape[-1] <= config.baselines_up_to:
        contenders.update(fast_scan=work.fast_scan(), native=work.forward("native"))
    contenders["densecnn"] = work.forward("densecnn")
    samples = interleave(contenders, config.repeats, warm_up=("densecnn",))
    result = {"forward_s": {k: median(v) for k, v in samples.items()}}
    result["speedup"] = {k: ratio(v, samples["densecnn"]) for k, v in samples.items() if k != "densecnn"}
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
        contenders[f"densecnn_{count}"] = _masked_step(work, labels, mask.view(n, h, w))
        contenders[f"patch_{count}"] = work.patch_train(config.patch_batch, count)
    samples = interleave(contenders, config.repeats)
    counts = sorted({int(k.split("_")[1]) for k in samples})
    return {
        "model": work.name,
        "image": list(work.x.shape),
        "rows": [
            {
                "selected": c,
                "densecnn_s": median(samples[f"densecnn_{c}"]),
                "patch_s": median(samples[f"patch_{c}"]),
            }
            for c in counts
        ],
    }


def _masked_step(work: Workload, labels, mask):
    def step():
        work.model.zero_grad(set_to_none=True)
        masked_cross_entropy(work.dense(work.x), labels, mask).backward()

    return step


def conv_limit(name: str, config: Config) -> dict:
    """Overhead over the conv-only limit: densecnn forward / Σ over conv layers of the best conv solver's time.

    Conv candidates are timed in the memory format the net runs in (what the rest of the net would cost is the
    question), on inputs of the real shapes, interleaved with the whole forward.
    """
    work = Workload.zoo(name, config.size)
    shape, contenders = tuple(work.padded.shape), {"densecnn": work.forward("densecnn")}
    fmt = work.plan(False).memory_format
    ext = ext_available()
    for i, step in enumerate(group_steps(work.dense.features)):
        spec = step.spec() if hasattr(step.layers[0], "spec") else None
        if isinstance(spec, ConvSpec):
            x = torch.randn(shape).contiguous(memory_format=MEMORY_FORMATS[fmt])
            for solver in solvers.candidates(spec, ext_available=ext):
                contenders[f"{i}:{solver}"] = _no_grad_solver(solver, spec, x)
        shape = next_shape(step, shape)
    samples = interleave(contenders, config.repeats)
    per_conv: dict[str, dict] = {}
    for key, values in samples.items():
        if key != "densecnn":
            layer, solver = key.split(":")
            per_conv.setdefault(layer, {})[f"{solver}/{fmt}"] = median(values)
    best = {layer: min(times, key=times.get) for layer, times in per_conv.items()}
    limit = sum(per_conv[layer][best[layer]] for layer in per_conv)
    forward = median(samples["densecnn"])
    return {
        "model": name,
        "image": list(work.x.shape),
        "memory_format": fmt,
        "convs": [{"step": int(k), "best": best[k], "times_s": v} for k, v in per_conv.items()],
        "conv_limit_s": limit,
        "densecnn_forward_s": forward,
        "overhead": forward / limit,
    }


def _no_grad_solver(solver, spec, x):
    def run():
        with torch.no_grad():
            solvers.run(solver, spec, x)

    return run


def max_pool(kernel: int, dilation: int, config: Config) -> dict:
    """d-sparse max pooling: densecnn's chosen solver vs ``F.max_pool2d(dilation=d, stride=1)`` (NCHW), fwd and bwd."""
    x = pool_input(config.pool_channels, config.pool_size)
    spec = PoolSpec("max_pool2d", (kernel, kernel), (dilation, dilation))
    ext = ext_available()
    chosen = {}
    for direction, train in (("forward", False), ("backward", True)):
        times = find(spec, tuple(x.shape), x.dtype, x.device, train=train, ext=ext)
        chosen[direction] = min(
            ((fmt, s) for fmt, table in times.items() for s, ms in table.items() if ms is not None),
            key=lambda fs: times[fs[0]][fs[1]],
        )
    xs = {d: x.contiguous(memory_format=MEMORY_FORMATS[chosen[d][0]]) for d in chosen}
    samples = interleave(
        {
            "native_forward": lambda: native_max_pool(x, kernel, dilation),
            "densecnn_forward": lambda: solvers.run(chosen["forward"][1], spec, xs["forward"]),
            "native_backward": _backward(lambda v: native_max_pool(v, kernel, dilation), x),
            "densecnn_backward": _backward(
                lambda v: solvers.run(chosen["backward"][1], spec, v), xs["backward"]
            ),
        },
        config.repeats,
    )
    return {
        "kernel": kernel,
        "dilation": dilation,
        "input": list(x.shape),
        "solver": {d: f"{s}/{fmt}" for d, (fmt, s) in chosen.items()},
        "times_s": {k: median(v) for k, v in samples.items()},
        "speedup": {
            "forward": ratio(samples["native_forward"], samples["densecnn_forward"]),
            "backward": ratio(samples["native_backward"], samples["densecnn_backward"]),
        },
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
    import platform

    return {
        "torch": torch.__version__,
        "densecnn": densecnn.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "ext_available": ext_available(),
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
