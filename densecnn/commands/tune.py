"""``densecnn tune MODEL_DIR --size H W``: time every layer's candidate solvers ahead of time, cache the times (later
runs use them instead of the cost model's predictions) and show the chosen plan."""

from __future__ import annotations


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "tune", help="time the candidate solvers of every layer for an image size and cache the fastest"
    )
    parser.add_argument("model", help="model directory (model.json + weights.safetensors)")
    parser.add_argument(
        "--size", nargs=2, type=int, required=True, metavar=("H", "W"), help="image height and width"
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
    from ..ops.find import cache_dir
    from ..tiling import choose_tile

    height, width = args.size
    if height < 1 or width < 1 or args.batch < 1:
        raise ValueError(
            f"--size and --batch must be positive, got size {height}x{width}, batch {args.batch}"
        )
    loaded = load(args.model)
    dense = loaded.dense()
    dense.tune = True
    shape = (args.batch, loaded.in_channels, height, width)
    if args.max_memory is not None:
        estimate = dense.memory_estimate(shape, 4, labels=True, train=False)
        height, width = choose_tile(shape, args.max_memory, estimate, labels=True)
        print(f"tile for max_memory={args.max_memory:,}: {height}x{width}")
    rh, rw = dense.receptive_field
    padded = torch.zeros(args.batch, loaded.in_channels, height + rh - 1, width + rw - 1)
    for train in (False, True) if args.train else (False,):
        with torch.set_grad_enabled(train):
            plan = dense.plan(padded)
        print(
            f"{'training' if train else 'inference'} plan for {args.batch}x{height}x{width}, "
            f"memory format {plan.memory_format}:"
        )
        for row in plan.describe():
            times = ", ".join(f"{name} {ms:.2f}" for name, ms in row["times_ms"].items() if ms is not None)
            source = f" ({row['source']}: {times} ms)" if row["source"] else ""
            print(f"  {' + '.join(row['layers']):<32} {row['solver']:<10}{source}")
    print(f"solver timings cached in {cache_dir() / 'solvers'}")
    return 0
