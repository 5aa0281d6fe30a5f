"""``densecnn calibrate``: time each solver family on a few problems and fit the cost model's factors to this CPU
(what the first plan on a new machine does by itself), cache them and show them; ``--show`` only shows the cached
ones."""

from __future__ import annotations


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="fit the cost model's per-solver factors to this CPU (redo the first use's calibration)",
    )
    parser.add_argument("--show", action="store_true", help="show the cached calibration, time nothing")
    parser.set_defaults(run=run)


def run(args) -> int:
    from ..atomic import unwritable_cache
    from ..errors import DenseCNNError
    from ..ops import calibration, get_config

    switched_on = calibration.enabled()  # an invalid DENSECNN_CALIBRATE is refused before anything is timed
    key = calibration.machine_key()
    path = calibration.cache_file(key, get_config().cache_dir)
    if not args.show:  # a cache that cannot be written is refused before anything is timed, too
        problem = unwritable_cache(path.parent)
        if problem is not None:
            raise DenseCNNError(_uncached(path, problem))
    found = calibration.load(key, path) if args.show else calibration.recalibrate()
    if not args.show and calibration.load(key, path) != found:  # the disk filled meanwhile
        raise DenseCNNError(_uncached(path, "the file was not written"))
    print(f"machine: {key['cpu']}, kernels {key['isa']}, torch {key['torch']} ({key['torch_isa']})")
    if found is None:
        if path.exists():
            print(f"not calibrated yet ({path} is unreadable or not a calibration); run `densecnn calibrate`")
        else:
            print(f"not calibrated yet (no {path}); run `densecnn calibrate`")
        return 0
    print(f"calibration: {found.seconds:.2f} s, {found.rounds} rounds; cached in {path}")
    print("predicted times are multiplied by (1: as measured where the cost model was fitted):")
    for family, factor in found.factors.items():
        print(f"  {family:<28} {factor:.2f}")
    if not switched_on:
        print(
            f"{calibration.ENVIRONMENT}=0: plans use the shipped predictions as they are, not these factors"
        )
    return 0


def _uncached(path, reason: str) -> str:
    return (
        f"the calibration could not be cached in {path.parent} ({reason}); make that folder writable or free space "
        "there, or set DENSECNN_CACHE_DIR to a folder you can write to"
    )
