"""``densecnn tune MODEL_DIR --size H W`` (``--size D H W`` for a volume model, ``--size L`` for a signal model): time every layer's candidate solvers ahead of time, cache the times (later
runs use them instead of the cost model's predictions) and show the chosen plan."""

from __future__ import annotations

from ..errors import InvalidInputError


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "tune", help="time the candidate solvers of every layer for an image size and cache the fastest"
    )
    parser.add_argument("model", help="model directory (model.json + weights.safetensors)")
    parser.add_argument(
        "--size",
        nargs="+",
        type=int,
        required=True,
        metavar="N",
        help="the input's size, one number per spatial axis: H W for images, D H W for volumes, L for signals",
    )
    parser.add_argument("--batch", type=int, default=1, help="images per batch (default 1)")
    parser.add_argument(
        "--train", action="store_true", help="also tune the training direction (forward + backward)"
    )
    parser.add_argument(
        "--max-memory",
        type=int,
        default=None,
        help="bytes: tune the tile shape predict(max_memory=...) would use",
    )
    parser.set_defaults(run=run)


def run(args) -> int:
    import torch

    from ..modelfile import load
    from ..tiling import choose_tile

    size = tuple(args.size)
    if min(size) < 1 or args.batch < 1:
        raise InvalidInputError(
            f"--size and --batch must be positive, got size {_text(size)}, batch {args.batch}"
        )
    loaded = load(args.model)
    dense = loaded.dense()
    if len(size) != dense.dims:
        axes = {1: "L", 2: "H W", 3: "D H W"}[dense.dims]
        raise InvalidInputError(
            f"--size {' '.join(map(str, size))}: this model has {dense.dims} spatial axis/axes (patch size "
            f"{_text(dense.patch_size)}); pass --size {axes}"
        )
    dense.tune = True
    shape = (args.batch, loaded.in_channels, *size)
    if args.max_memory is not None:
        estimate = dense.memory_estimate(shape, 4, labels=True, train=False)
        size = tuple(choose_tile(shape, args.max_memory, estimate, labels=True))
        print(f"tile for max_memory={args.max_memory:,}: {_text(size)}")
    padded = torch.zeros(
        args.batch, loaded.in_channels, *(s + r - 1 for s, r in zip(size, dense.receptive_field))
    )
    for train in (False, True) if args.train else (False,):
        with torch.set_grad_enabled(train):
            plan = dense.plan(padded)
        print(
            f"{'training' if train else 'inference'} plan for {args.batch}x{_text(size)}, "
            f"memory format {plan.memory_format}:"
        )
        for row in plan.describe():
            times = ", ".join(f"{name} {ms:.2f}" for name, ms in row["times_ms"].items() if ms is not None)
            source = f" ({row['source']}: {times} ms)" if row["source"] else ""
            print(f"  {' + '.join(row['layers']):<32} {row['solver']:<10}{source}")
    print(f"solver timings cached in {dense.ops_config().cache_dir / 'solvers'}")
    return 0


def _text(size) -> str:
    return "x".join(map(str, size))
