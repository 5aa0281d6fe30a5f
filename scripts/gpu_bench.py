"""The CUDA benchmark of ``make gpu-check``: dense forward and training step on the GPU against the same net converted
to native (cuDNN) dilated ops, and against patch-by-patch scanning. densecnn runs twice: in immediate mode (on a GPU
an untuned plan runs torch's own ops) and tuned (every layer's candidates timed on this GPU, densecnn's CUDA kernels
among them).

Every time is a median of CUDA-event timings after warm-up runs; the dense net and its native conversion share the
patch model's parameters, run on the same input and are checked to agree before they are timed. Patch scanning is
timed on a crop (it is thousands of times slower) and reported per pixel, next to the dense net's per-pixel time on
the whole image. Writes the results as JSON to ``--out`` and prints one line per model.

    python scripts/gpu_bench.py --out gpu-check/bench.json
    python scripts/gpu_bench.py --out /tmp/bench.json --device cpu --size 40 --crop 4 --repeats 1   # the script itself
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import densecnn  # noqa: E402
from densecnn.ops.config import use_config  # noqa: E402

MODELS = {"plain_133": (3, 32), "stages_46": (3, 8)}  # zoo name -> (in_channels, num_classes)
MASKED_PIXELS = 256  # pixels per image whose loss a training step takes


def seconds(fn, device: str, repeats: int, warm_up: int = 2) -> float:
    """Median seconds of ``fn()``: by CUDA events on the current stream, by the clock on the CPU."""
    for _ in range(warm_up):
        fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1000)
        else:
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def training_step(net, model, x, labels, mask, config):
    def step():
        model.zero_grad(set_to_none=True)
        with config():
            densecnn.masked_cross_entropy(net(x), labels, mask).backward()

    return step


def bench_model(name: str, size: int, crop: int, repeats: int, device: str = "cuda") -> dict:
    in_channels, num_classes = MODELS[name]
    torch.manual_seed(0)
    model, patch = densecnn.zoo.create(name, in_channels=in_channels, num_classes=num_classes)
    model = model.to(device).eval()
    dense = densecnn.convert(model, patch)
    native = densecnn.convert(model, patch, backend="native")
    x = torch.rand(1, in_channels, size, size, device=device)  # (1, C, H, W)
    with torch.no_grad():
        ours, theirs = dense(x), native(x)
    scale = max(theirs.abs().max().item(), 1.0)
    agreement = (ours - theirs).abs().max().item() / scale
    if agreement > 1e-4:
        raise SystemExit(
            f"gpu-bench: {name}: the dense net and its native conversion differ by {agreement:.2e}"
        )
    labels = torch.randint(num_classes, (1, size, size), device=device)
    mask = torch.zeros(1, size * size, dtype=torch.bool, device=device)
    mask[0, torch.randperm(size * size, device=device)[:MASKED_PIXELS]] = True
    mask = mask.view(1, size, size)
    nets = {"densecnn": dense, "densecnn_tuned": densecnn.convert(model, patch), "native": native}
    with tempfile.TemporaryDirectory() as tuning:  # the tuned timings of this run only
        configs = {
            "densecnn": contextlib.nullcontext,
            "densecnn_tuned": lambda: use_config(tune=True, cache_dir=Path(tuning)),
            "native": contextlib.nullcontext,
        }

        def forward_pass(name):
            def run():
                with torch.no_grad(), configs[name]():
                    nets[name](x)

            return run

        forward = {name: seconds(forward_pass(name), device, repeats) for name in nets}
        step = {
            name: seconds(training_step(net, model, x, labels, mask, configs[name]), device, repeats)
            for name, net in nets.items()
        }
    small = x[:, :, :crop, :crop].contiguous()
    with torch.no_grad():
        scan = seconds(lambda: densecnn.scan_patches(model, small, patch), device, max(1, repeats // 4), 1)
    dense_per_pixel = forward["densecnn"] / size**2
    return {
        "model": name,
        "image": [size, size],
        "patch": patch,
        "max_relative_difference_vs_native": agreement,
        "forward_s": forward,
        "training_step_s": step,
        "forward_speedup_vs_native": forward["native"] / forward["densecnn"],
        "training_step_speedup_vs_native": step["native"] / step["densecnn"],
        "tuned_forward_speedup_vs_native": forward["native"] / forward["densecnn_tuned"],
        "tuned_training_step_speedup_vs_native": step["native"] / step["densecnn_tuned"],
        "patch_scan": {"crop": [crop, crop], "seconds": scan, "seconds_per_pixel": scan / crop**2},
        "forward_speedup_vs_patch_scan_per_pixel": (scan / crop**2) / dense_per_pixel,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the results")
    parser.add_argument("--size", type=int, default=512, help="image side (default 512)")
    parser.add_argument(
        "--crop", type=int, default=48, help="side of the crop patch scanning runs on (default 48)"
    )
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per measurement (default 20)")
    parser.add_argument("--device", default="cuda", help="cuda (the check), or cpu to try the script itself")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu-bench: no GPU visible to torch; run it on a machine with one", file=sys.stderr)
        return 1
    started = time.perf_counter()
    results = {
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "models": [bench_model(name, args.size, args.crop, args.repeats, args.device) for name in MODELS],
    }
    results["seconds"] = time.perf_counter() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    native = "native cuDNN" if args.device == "cuda" else "native"
    for row in results["models"]:
        print(
            f"gpu-bench: {row['model']} {args.size}²: forward {row['forward_s']['densecnn'] * 1e3:.2f} ms "
            f"({row['forward_speedup_vs_native']:.2f}x {native}, "
            f"{row['forward_speedup_vs_patch_scan_per_pixel']:.0f}x patch scanning per pixel); training step "
            f"{row['training_step_s']['densecnn'] * 1e3:.2f} ms ({row['training_step_speedup_vs_native']:.2f}x {native}); "
            f"tuned: forward {row['tuned_forward_speedup_vs_native']:.2f}x, training step "
            f"{row['tuned_training_step_speedup_vs_native']:.2f}x {native}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
