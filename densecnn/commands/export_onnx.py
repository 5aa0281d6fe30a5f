"""``densecnn export-onnx MODEL_DIR OUT.onnx``: the model's dense net as ONNX, every spatial axis dynamic."""

from __future__ import annotations


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "export-onnx",
        help="export a model's dense net to ONNX (image -> per-pixel scores, any H and W)",
        description="Write the dense net of MODEL as ONNX: input 'image' (N, C, H, W) float32, already "
        "normalised with the model's mean/std; output 'scores' (N, K, H, W). Padding is in the graph. Volume models "
        "map (N, C, D, H, W) to (N, K, D, H, W), signal models (N, C, L) to (N, K, L).",
    )
    parser.add_argument("model", help="model directory (model.json + weights.safetensors)")
    parser.add_argument("out", help="the .onnx file to write")
    parser.set_defaults(run=run)


def run(args) -> int:
    from ..atomic import unwritable_file
    from ..errors import InvalidInputError
    from ..modelfile import load
    from ..onnx_export import export_onnx

    problem = unwritable_file(args.out)
    if problem is not None:
        raise InvalidInputError(
            f"cannot write OUT: {problem}; give a .onnx file in a folder you can write to"
        )
    loaded = load(args.model)
    dense = loaded.dense(backend="native")
    try:
        path = export_onnx(dense, args.out)
    except OSError as exc:
        # e.g. a full disk: the file that was there is left as it was
        raise InvalidInputError(
            f"could not write {args.out}: {exc.strerror or exc}; free space there or give another OUT"
        ) from exc
    axes = ", ".join({1: "L", 2: "HW", 3: "DHW"}[dense.dims])
    channels, classes = dense.in_channels, dense.num_classes
    print(f"wrote {path}: input 'image' (N, {channels}, {axes}) -> output 'scores' (N, {classes}, {axes})")
    if loaded.normalization:
        print(f"normalise inputs first: (x - {loaded.normalization['mean']}) / {loaded.normalization['std']}")
    return 0
