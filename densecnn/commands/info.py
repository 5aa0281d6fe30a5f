"""``densecnn info MODEL_DIR``: what a model is and the dense net it converts to."""

from __future__ import annotations

_TAKES = {1: "signals (N, C, L)", 2: "images (N, C, H, W)", 3: "volumes (N, C, D, H, W)"}
_AXES = {1: "L", 2: "H x W", 3: "D x H x W"}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("info", help="describe a model directory and its dense net")
    parser.add_argument("model", help="model directory (model.json + weights.safetensors)")
    parser.set_defaults(run=run)


def run(args) -> int:
    from ..modelfile import load

    loaded = load(args.model)
    dense = loaded.dense()
    print(f"model: {loaded.path}")
    print(f"takes: {_TAKES[dense.dims]}")
    print(
        f"patch size: {'x'.join(map(str, loaded.patch_size))} ({_AXES[dense.dims]}), "
        f"input channels: {loaded.in_channels}"
    )
    print(f"classes ({loaded.num_classes}): {', '.join(loaded.class_names)}")
    print(f"padding mode: {loaded.padding_mode}")
    parameters = sum(p.numel() for p in loaded.model.parameters())
    print(f"parameters: {parameters:,} ({str(loaded.dtype).removeprefix('torch.')})")
    print(dense)
    return 0
