"""``densecnn train``: train or fine-tune a patch model on whole images with masked errors.

The same options work under torchrun: ``torchrun --nproc-per-node N -m densecnn.train ...``.
"""

from __future__ import annotations

import argparse
import os
import sys

EPILOG = """\
dataset layout: DIR/images/NAME.(png|tif|jpg...), DIR/labels/NAME.(png|tif) with class ids 0..K-1 and 255 = ignore,
optional DIR/masks/NAME.(png|tif) (nonzero = labels count), optional classes.json {"names", "palette"} in DIR or
its parent.

examples:
  densecnn train --model tiny --classes 3 --data data/toy/train --val data/toy/val --out runs/toy
  densecnn train --model models/nuclei --data my/train --val my/val --out runs/ft --epochs 5 --lr 3e-4
  torchrun --nproc-per-node 2 -m densecnn.train --model tiny --classes 3 --data DIR --out runs/ddp
  densecnn train --out runs/toy --resume            # continue where it stopped
"""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train or fine-tune a model on whole images with masked errors",
        description=__doc__.split("\n")[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(run=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..train.config import TrainConfig

    d = TrainConfig(model="", data="", out="")  # the defaults, stated once
    io = parser.add_argument_group("model and data")
    io.add_argument(
        "--model", help="model directory to fine-tune, or a zoo name (tiny, stages_46, ...) to start"
    )
    io.add_argument("--data", help="training dataset directory (images/, labels/, optional masks/)")
    io.add_argument("--val", help="validation dataset directory, scored on whole images (default: none)")
    io.add_argument("--out", required=True, help="run directory: checkpoints, metrics.jsonl, plots, model/")
    io.add_argument("--classes", type=int, help="classes of a fresh zoo model (default: from classes.json)")
    io.add_argument("--channels", type=int, help="input channels of a fresh model (default: from the images)")
    io.add_argument("--padding-mode", default=d.padding_mode, choices=("zeros", "reflect", "replicate"),
                    help=f"image padding of a fresh model (default {d.padding_mode})")  # fmt: skip
    io.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its latest checkpoint"
    )

    steps = parser.add_argument_group("schedule")
    steps.add_argument("--epochs", type=int, default=d.epochs, help=f"default {d.epochs}")
    steps.add_argument("--crops-per-image", type=int, default=d.crops_per_image,
                       help=f"random crops drawn from each training image per epoch (default {d.crops_per_image})")  # fmt: skip
    steps.add_argument("--batch", type=int, default=d.batch,
                       help=f"images (crops) per step, all processes together (default {d.batch})")  # fmt: skip
    steps.add_argument(
        "--crop", type=int, default=d.crop, help=f"side of the square random crops (default {d.crop})"
    )
    steps.add_argument("--flip", action=argparse.BooleanOptionalAction, default=d.flip, help="random flips")
    steps.add_argument(
        "--rot90", action=argparse.BooleanOptionalAction, default=d.rot90, help="random quarter turns"
    )
    steps.add_argument("--mask", default=d.mask,
                       help="pixels whose errors count: all | random:K | balanced:K | hard:K[:MIX] "
                       f"(K per image; MIX = random share of hard, default 0.5) (default {d.mask})")  # fmt: skip
    steps.add_argument("--method", default=d.method, choices=("dense", "patches"),
                       help="dense: whole crops through the dense net; patches: the classical patch-minibatch "
                       f"baseline (needs --mask random:K or balanced:K) (default {d.method})")  # fmt: skip
    steps.add_argument("--seed", type=int, default=d.seed, help=f"default {d.seed}")

    optim = parser.add_argument_group("optimiser")
    optim.add_argument(
        "--optimizer", default=d.optimizer, choices=("sgd", "adamw"), help=f"default {d.optimizer}"
    )
    optim.add_argument("--lr", type=float, default=d.lr, help=f"learning rate (default {d.lr:g})")
    optim.add_argument(
        "--momentum", type=float, default=d.momentum, help=f"SGD momentum (default {d.momentum:g})"
    )
    optim.add_argument(
        "--weight-decay", type=float, default=d.weight_decay, help=f"default {d.weight_decay:g}"
    )
    optim.add_argument("--schedule", default=d.schedule, choices=("cosine", "constant"),
                       help=f"learning-rate schedule over the run (default {d.schedule})")  # fmt: skip
    optim.add_argument("--class-weights", type=_floats, help="per-class loss weights, comma-separated")
    optim.add_argument(
        "--bf16", action="store_true", help="bfloat16 forward pass (weights and loss stay float32)"
    )

    run_group = parser.add_argument_group("run")
    run_group.add_argument("--val-every", type=int, default=d.val_every,
                           help="validate every N steps (default 0: every epoch)")  # fmt: skip
    run_group.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every,
                           help="checkpoint every N steps (default 0: every epoch)")  # fmt: skip
    run_group.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints,
                           help=f"newest checkpoints kept (default {d.keep_checkpoints})")  # fmt: skip
    run_group.add_argument("--device", default=d.device, choices=("auto", "cpu", "cuda"), help="default auto")


def _floats(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def config_from_args(args: argparse.Namespace, launcher: str = "densecnn train"):
    from ..train.config import TrainConfig

    if not args.resume:
        missing = [f"--{name}" for name in ("model", "data") if getattr(args, name) is None]
        if missing:
            raise ValueError(f"{' and '.join(missing)} required (or --resume to continue the run in --out)")
    values = {key: value for key, value in vars(args).items() if key not in ("run", "command")}
    values.update(model=args.model or "", data=args.data or "")
    config = TrainConfig.from_dict(values)
    config.command = config.command_line(launcher)
    return config


def run(args: argparse.Namespace, launcher: str = "densecnn train") -> int:
    from ..train import train

    model_dir = train(config_from_args(args, launcher))
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"model written to {model_dir} (model card: {model_dir / 'README.md'})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m densecnn.train``: parse, train, and print user errors in one line."""
    from ..errors import ModelFileError

    parser = argparse.ArgumentParser(
        prog="python -m densecnn.train",
        description=__doc__.split("\n")[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    world = os.environ.get("WORLD_SIZE")
    launcher = f"torchrun --nproc-per-node {world} -m densecnn.train" if world else "python -m densecnn.train"
    try:
        return run(args, launcher)
    except (ModelFileError, ValueError, FileNotFoundError) as exc:
        print(f"densecnn train: error: {exc}", file=sys.stderr)
        return 2
