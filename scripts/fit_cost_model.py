"""Measure every solver on a grid of dense ops on this machine and fit the immediate-mode cost model.

Writes ``densecnn/ops/cost_model.json`` (the measurements and the fitted models; see densecnn/ops/costmodel.py and
docs/performance.md). Run it on a quiet machine of the kind the package will run on, after adding or changing a
solver:

    python scripts/fit_cost_model.py                 # time the grid (several minutes) and fit
    python scripts/fit_cost_model.py --refit         # refit the shipped measurements only (after changing features)
    python scripts/fit_cost_model.py --gradients     # time the convs' gradient solvers only (after changing one)
    python scripts/fit_cost_model.py --merge         # time the grid again and keep each candidate's faster time
    python scripts/fit_cost_model.py --quick         # a handful of problems: checks the pipeline, not for shipping
    python scripts/fit_cost_model.py --only volumes  # time the 3-D grid only, keep the shipped images and signals
    python scripts/fit_cost_model.py --calibration   # time the calibration problems only, keep everything else

Every run except ``--refit`` also times the calibration problems (densecnn/ops/calibration.py) the way each
machine's calibration will, on one thread in CPU time: the reference other CPUs compare themselves with.

On a busy machine a run's times carry the other load's spikes (they only ever add time); ``--merge`` with the
shipped file keeps, per problem and candidate, the minimum of both runs. When other processes hold the cores, every
multi-threaded op also waits for its slowest thread at each barrier (tens of ms per op): time with ``--threads 1``
there, which keeps the solvers' ranking.

The grid is random (seeded) over kernel, dilation, channels and map size, plus the layers of the zoo's reference nets
at 256² and 512² images (what the tuning step would time for them); for signals and volumes, a random grid of 1-D and 3-D convs
and pools plus the layers of the zoo's volume nets on small and large volumes (so immediate plans on volumes rank
the 3-D solvers from 3-D measurements); for separable filters (grouped and 1-D-kernel convs, a model family of
their own), a random grid of them plus the filter bank net's on 1, 3 and 5 channels:

    python scripts/fit_cost_model.py --only separable --threads 1  # what the shipped separable family is
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time

import torch

import densecnn
from densecnn.geometry import output_size, reach
from densecnn.ops import calibration, costmodel, gradients, plan, tune
from densecnn.ops.backends import ext_available
from densecnn.ops.solvers import SOLVERS, ConvOp, PoolOp

MAX_MACS = 4e9  # larger convs are left out: too slow to time for what they add to the fit
REFERENCE_NETS = {"plain_133": 32, "stages_46": 8, "nuclei": 3}  # name: classes
REFERENCE_VOLUME_NETS = {"znni_3d": 3, "nuclei3d": 3}  # name: classes
FILTER_BANK_CHANNELS = (1, 3, 5)  # the filter bank's image channels whose grouped layers are timed
VOLUME_SIDES = (32, 96)  # output sides of the volumes the volume nets' layers are timed on


def _macs(row: dict) -> float:
    n, c, *size = row["input"]
    out = output_size(tuple(size), tuple(row["kernel"]), tuple(row["dilation"]))
    pixels = n * math.prod(max(s, 1) for s in out)
    return pixels * math.prod(row["kernel"]) * row["out_channels"] * c / row["groups"]


def random_grid(count: int, seed: int) -> list[dict]:
    """Random conv and pool problems (float32, batch 1) over the ranges dense nets meet."""
    rng = random.Random(seed)
    rows = []
    while len(rows) < count:
        kernel, dilation = rng.choice([1, 2, 3, 5, 7]), rng.choice([1, 2, 4, 8, 16])
        side = rng.choice([48, 96, 160, 256]) + reach((kernel,), (dilation,))[0]
        if rng.random() < 0.55:
            c_in, c_out = rng.choice([1, 3, 8, 16, 32, 50, 64, 128]), rng.choice([3, 8, 16, 32, 50, 64, 128])
            op = ConvOp(torch.empty(c_out, c_in, kernel, kernel), None, (dilation, dilation), 1)
        else:
            op = rng.choice(["max_pool2d", "max_pool2d", "max_pool2d", "avg_pool2d"])
            kernel = rng.choice([2, 2, 3, 4, 8])
            side = rng.choice([48, 96, 160, 256]) + reach((kernel,), (dilation,))[0]
            c_in = rng.choice([4, 8, 16, 32, 50, 64, 128])
            op = PoolOp(
                op, (kernel, kernel), (dilation, dilation), activation=rng.choice([None, "tanh", "relu"])
            )
        row = costmodel.problem(op, (1, c_in, side, side))
        if _macs(row) <= MAX_MACS:
            rows.append(row)
    return rows


def random_grid_nd(count: int, seed: int, dims: int) -> list[dict]:
    """Random conv and pool problems on signals (``dims`` 1) or volumes (3), float32, batch 1."""
    rng = random.Random(seed)
    sides = {1: [1024, 4096, 16384, 65536], 3: [16, 24, 32, 48, 64, 80]}[dims]
    rows = []
    while len(rows) < count:
        dilation = rng.choice([1, 2, 4, 8] if dims == 3 else [1, 2, 4, 8, 16])
        if rng.random() < 0.55:
            kernel = rng.choice([1, 2, 3, 5] if dims == 3 else [1, 3, 5, 7, 9])
            c_in, c_out = rng.choice([1, 3, 8, 16, 32, 64]), rng.choice([3, 8, 16, 32, 64])
            op = ConvOp(torch.empty(c_out, c_in, *(kernel,) * dims), None, (dilation,) * dims, 1)
        else:
            kernel = rng.choice([2, 2, 3] if dims == 3 else [2, 3, 4, 8])
            op = f"{rng.choice(['max', 'max', 'avg'])}_pool{dims}d"
            op = PoolOp(
                op, (kernel,) * dims, (dilation,) * dims, activation=rng.choice([None, "tanh", "relu"])
            )
            c_in = rng.choice([4, 8, 16, 32, 64])
        side = rng.choice(sides) + reach(op.kernel, op.dilation)[0]
        row = costmodel.problem(op, (1, c_in, *(side,) * dims))
        if _macs(row) <= MAX_MACS:
            rows.append(row)
    return rows


def reference_volume_problems(sides=VOLUME_SIDES) -> list[dict]:
    """The windowed steps of the zoo's volume nets on volumes of each output side, at their real shapes (the
    immediate plan predicts at the real shape; a 96³ volume's layers are far larger than the tuning step's)."""
    rows = []
    for name, classes in REFERENCE_VOLUME_NETS.items():
        model, patch = densecnn.zoo.create(name, in_channels=1, num_classes=classes)
        dense = densecnn.convert(model.eval(), patch)
        for side in sides:
            shape = (1, dense.in_channels, *(side + r - 1 for r in dense.receptive_field))
            for step in dense.steps():
                if hasattr(step.layers[0], "dense_op"):
                    rows.append(costmodel.problem(step.dense_op(), shape))
                shape = plan.next_shape(step, shape)
    return rows


def reference_problems(size: int) -> list[dict]:
    """The windowed steps of the zoo's reference nets on a size² image, at the tuning step's timing shapes."""
    rows = []
    for name, classes in REFERENCE_NETS.items():
        rows += net_problems(name, 3 if name != "nuclei" else 1, classes, size)
    return rows


def net_problems(name: str, channels: int, classes: int, size: int) -> list[dict]:
    """The windowed steps of the zoo net ``name`` on a size² image, at the tuning step's timing shapes."""
    model, patch = densecnn.zoo.create(name, in_channels=channels, num_classes=classes)
    dense = densecnn.convert(model.eval(), patch)
    shape = (1, channels, *(size + r - 1 for r in dense.receptive_field))
    rows = []
    for step in dense.steps():
        if hasattr(step.layers[0], "dense_op"):
            op = step.dense_op()
            rows.append(costmodel.problem(op, tune.timing_shape(op, shape)))
        shape = plan.next_shape(step, shape)
    return rows


def reference_separable_problems(size: int = 512) -> list[dict]:
    """The grouped and 1-D-kernel convs of the filter bank net on a size² image of each of
    :data:`FILTER_BANK_CHANNELS` channels, at the tuning step's timing shapes (the same for every size ≥ 256)."""
    rows = []
    for channels in FILTER_BANK_CHANNELS:
        rows += [r for r in net_problems("filter_bank", channels, 4, size) if costmodel.separable(r)]
    return rows


def random_separable_grid(count: int, seed: int) -> list[dict]:
    """Random grouped (depthwise included) 2-D convs with 1-D (k×1, 1×k), square and 1×1 kernels, and ungrouped
    1-D-kernel ones (float32, batch 1): the pieces of separable filters."""
    rng = random.Random(seed)
    rows = []
    while len(rows) < count:
        k = rng.choice([3, 5, 7, 11, 19, 31])
        kernel = rng.choice([(k, 1), (1, k), (k, 1), (1, k), (min(k, 7),) * 2, (1, 1)])
        groups = rng.choice([1, 3, 8, 16, 27, 54, 108, 216]) if kernel != (1, 1) else rng.choice([8, 54, 216])
        if groups == 1 and kernel[0] == kernel[1]:
            continue  # ungrouped square kernels are the image grid's
        per_group, multiplier = rng.choice([1, 1, 3]), rng.choice([1, 2, 3, 6])
        dilation = rng.choice([1, 1, 1, 2, 4])
        side = rng.choice([48, 96, 160, 256])
        weight = torch.empty(groups * multiplier, per_group, *kernel)
        op = ConvOp(weight, None, (dilation, dilation), groups)
        row = costmodel.problem(op, (1, groups * per_group, *(side + r for r in reach(kernel, op.dilation))))
        if _macs(row) <= MAX_MACS:
            rows.append(row)
    return rows


def _gradient_times(op, row: dict) -> dict:
    """{"grad_input" | "grad_weight": {memory_format: {gradient solver: ms}}} of a conv whose gradients a training
    plan chooses apart from its forward; {} for any other op."""
    if len(gradients.candidates(op, set(SOLVERS))) < 2:
        return {}
    table = tune.time_gradients(op, row["input"], torch.float32, "cpu", input_grad=True)
    return {d: {fmt: by_direction[d] for fmt, by_direction in table.items()} for d in gradients.DIRECTIONS}


def _rounded(times: dict) -> dict:
    return {
        direction: {fmt: {s: ms and float(f"{ms:.4g}") for s, ms in t.items()} for fmt, t in table.items()}
        for direction, table in times.items()
    }


def measure(rows: list[dict], log) -> list[dict]:
    ext = ext_available()
    measured = []
    for i, row in enumerate(rows):
        op, start = costmodel.operation(row), time.perf_counter()
        times = {
            direction: tune.time_candidates(
                op, row["input"], torch.float32, "cpu", train=train, ext=ext, input_grad=train, every=True
            )
            for direction, train in (("infer", False), ("train", True))
        }
        times.update(_gradient_times(op, row))
        measured.append({**row, "dtype": "float32", "times_ms": _rounded(times)})
        log(f"[{i + 1}/{len(rows)}] {row['op']} in={row['input']} k={row['kernel']} d={row['dilation']} "
            f"out={row['out_channels']} act={row['activation']}: {time.perf_counter() - start:.1f}s")  # fmt: skip
    return measured


def _merged(problems: list[dict], shipped: list[dict]) -> list[dict]:
    """``problems`` with each time replaced by the minimum of it and the shipped file's time for the same problem."""
    by_key = {json.dumps({k: v for k, v in p.items() if k != "times_ms"}, sort_keys=True): p for p in shipped}
    for p in problems:
        old = by_key.get(json.dumps({k: v for k, v in p.items() if k != "times_ms"}, sort_keys=True))
        for direction, table in p["times_ms"].items():
            for fmt, times in table.items():
                for solver, ms in times.items():
                    previous = old and old["times_ms"].get(direction, {}).get(fmt, {}).get(solver)
                    if previous and (ms is None or previous < ms):
                        times[solver] = previous
    return problems


def calibration_reference(rounds: int = 7) -> list[dict]:
    """The calibration problems timed as each machine's calibration times them (one thread, CPU time), with more
    rounds: the reference of every other machine's factors."""
    rows, _ = calibration.measure(list(calibration.PROBLEMS), rounds=rounds, deadline=math.inf)
    return [r | {"ms": float(f"{r['ms']:.4g}")} for r in rows]


KINDS = {"signals": 1, "images": 2, "volumes": 3, "separable": 2}  # kind of problem: spatial axes


def _grid(kind: str, args) -> list[dict]:
    """The problems of one kind the full run times."""
    if kind == "images":
        rows = reference_problems(256) + random_grid(args.count, seed=0)
        # a strongly dilated layer's timing shape grows with the image (tune.MIN_SUBGRID_SIDE)
        return rows + [row for row in reference_problems(512) if row not in rows]
    if kind == "volumes":
        return reference_volume_problems() + random_grid_nd(args.count_nd, 0, 3)
    if kind == "separable":
        return reference_separable_problems() + random_separable_grid(args.count_separable, seed=0)
    return random_grid_nd(args.count_nd, 0, 1)


def _kind(problem: dict) -> str:
    if costmodel.separable(problem):
        return "separable"
    return next(kind for kind, axes in KINDS.items() if axes == len(problem["input"]) - 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refit", action="store_true", help="refit the shipped measurements, time nothing")
    parser.add_argument("--quick", action="store_true", help="a few problems only (pipeline check)")
    parser.add_argument(
        "--gradients",
        action="store_true",
        help="time the conv gradient solvers on the shipped image problems, keep every other time",
    )
    parser.add_argument("--merge", action="store_true", help="keep the faster of each new and shipped time")
    parser.add_argument(
        "--calibration",
        action="store_true",
        help="time the calibration problems only (the reference for other CPUs), keep every other measurement",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads while timing (default: torch's default)"
    )
    parser.add_argument("--count", type=int, default=60, help="random grid problems (default 60)")
    parser.add_argument(
        "--count-nd", type=int, default=30, help="random 1-D and 3-D problems each (default 30)"
    )
    parser.add_argument(
        "--count-separable", type=int, default=30, help="random grouped and 1-D-kernel convs (default 30)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed runs per candidate after a warm-up (min kept)"
    )
    parser.add_argument(
        "--only",
        choices=sorted(KINDS),
        help="time only this kind of problem and keep the shipped measurements of the others",
    )
    parser.add_argument("--out", default=str(costmodel.MODEL_FILE))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    shipped_document = json.loads(costmodel.MODEL_FILE.read_text())
    reference = shipped_document.get("calibration", [])
    if args.refit or args.gradients or args.calibration:
        problems, machine = shipped_document["problems"], shipped_document["machine"]
    if args.gradients:
        for i, p in enumerate(problems):
            fresh = _gradient_times(costmodel.operation(p), p) if p["op"].startswith("conv") else {}
            p["times_ms"].update(_rounded(fresh))
            if fresh:
                print(f"[{i + 1}/{len(problems)}] gradients of {p['op']} in={p['input']} k={p['kernel']} "
                      f"d={p['dilation']} out={p['out_channels']}")  # fmt: skip
    elif not (args.refit or args.calibration):
        tune.REPEATS, tune.BUDGET_MS = args.repeats, 600.0
        torch.manual_seed(0)
        if (
            args.quick
        ):  # a few of each kind: images, grouped convs, volumes (a small volume net's layers), signals
            rows = reference_problems(256)[:2] + random_grid(2, seed=0) + random_separable_grid(1, seed=0)
            rows += (
                reference_volume_problems(sides=(8,))[:2] + random_grid_nd(1, 0, 3) + random_grid_nd(1, 0, 1)
            )
        else:
            rows = [row for kind in ([args.only] if args.only else KINDS) for row in _grid(kind, args)]
        problems = measure(rows, print)
        shipped = shipped_document["problems"]
        if args.merge:
            problems = _merged(problems, shipped)
        if args.only:
            problems = [p for p in shipped if _kind(p) != args.only] + problems
        machine = {
            **(shipped_document["machine"] if args.only else {}),  # the other kinds' machine
            "cpu": calibration.cpu_model(),
            "isa": calibration.kernel_isa(),
            f"threads_{args.only}" if args.only else "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "ext": ext_available(),
        }
    if not args.refit:
        reference = calibration_reference()
        machine["calibration"] = {"cpu": calibration.cpu_model(), "isa": calibration.kernel_isa()}
    models = costmodel.fit(costmodel.measurement_rows(problems))
    document = {
        "machine": machine,
        "features": list(costmodel.FEATURES),
        "models": models,
    }
    with open(args.out, "w") as f:
        f.write("{\n")
        for key in ("machine", "features", "models"):
            f.write(f"{json.dumps(key)}: {json.dumps(document[key], sort_keys=True)},\n")
        f.write(
            '"calibration": [\n' + ",\n".join(json.dumps(r, sort_keys=True) for r in reference) + "\n],\n"
        )
        f.write('"problems": [\n' + ",\n".join(json.dumps(p, sort_keys=True) for p in problems) + "\n]}\n")
    print(
        f"wrote {args.out}: {len(problems)} problems, {len(models)} fitted models, {len(reference)} calibration times"
    )


if __name__ == "__main__":
    main()
