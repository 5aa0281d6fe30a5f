"""``densecnn tune MODEL_DIR --size H W`` (``--size D H W`` for a volume model, ``--size L`` for a signal model): time every layer's candidate solvers ahead of time, cache the times (later
runs use them instead of the cost model's predictions) and show the chosen plan."""

from __future__ import annotations

from ..errors import DenseCNNError, InvalidInputError


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
    from ..tiling import choose_tile, physical_memory

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
    cache = dense.ops_config().cache_dir / "solvers"
    _check_cache(cache)
    tuned = (args.batch, loaded.in_channels, *size)
    estimate = dense.memory_estimate(tuned, 4, labels=True, train=args.train)
    needed, memory = estimate.held + estimate.tile(size), physical_memory()
    if memory is not None and needed > memory:
        raise InvalidInputError(_too_large(args.batch, size, f"needs about {_gb(needed)}, more than this "
                                           f"machine's {_gb(memory)}"))  # fmt: skip
    from ..ops import tune as solver_cache

    solver_cache.store_error = None
    try:
        padded = torch.zeros(
            args.batch, loaded.in_channels, *(s + r - 1 for s, r in zip(size, dense.receptive_field))
        )
        plans = []
        for train in (False, True) if args.train else (False,):
            with torch.set_grad_enabled(train):
                plans.append((train, dense.plan(padded)))
    except (MemoryError, RuntimeError) as exc:
        if not isinstance(exc, MemoryError) and "allocate" not in str(exc):
            raise
        raise InvalidInputError(_too_large(args.batch, size, "does not fit in memory")) from None
    for train, plan in plans:
        print(
            f"{'training' if train else 'inference'} plan for {args.batch}x{_text(size)}, "
            f"memory format {plan.memory_format}:"
        )
        for row in plan.describe():
            times = ", ".join(f"{name} {ms:.2f}" for name, ms in row["times_ms"].items() if ms is not None)
            source = f" ({row['source']}: {times} ms)" if row["source"] else ""
            print(f"  {' + '.join(row['layers']):<32} {row['solver']:<10}{source}")
    if solver_cache.store_error is not None:
        path, exc = solver_cache.store_error
        raise DenseCNNError(_uncached(cache, f"{path.name}: {exc.strerror or exc}"))
    print(f"solver timings cached in {cache}")
    return 0


def _check_cache(cache) -> None:
    """Refuse, before timing anything, a solver cache folder that cannot be written (DENSECNN_CACHE_DIR a file, a
    read-only or full folder)."""
    from ..atomic import unwritable_cache

    problem = unwritable_cache(cache)
    if problem is not None:
        raise DenseCNNError(_uncached(cache, problem))


def _uncached(cache, reason: str) -> str:
    return (
        f"the solver timings could not be cached in {cache} ({reason}); make that folder writable or free space "
        "there, or set DENSECNN_CACHE_DIR to a folder you can write to"
    )


def _too_large(batch: int, size, why: str) -> str:
    return (
        f"tuning --size {' '.join(map(str, size))} with --batch {batch} {why}; tune a smaller --size or --batch, or "
        "give --max-memory BYTES to tune the tile predict(max_memory=BYTES) would use"
    )


def _gb(size: int) -> str:
    return f"{size / 1e9:,.1f} GB"


def _text(size) -> str:
    return "x".join(map(str, size))
