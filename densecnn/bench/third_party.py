"""What a MONAI user would run to label every pixel with a patch classifier, beside batched patch scanning.

MONAI's ``SlidingWindowInferer`` (Cardoso et al., "MONAI: An open-source framework for deep learning in
healthcare", 2022) slides a window of the patch's size over the padded image at stride 1 (overlap 1 - 1/P), runs the
classifier on batches of windows, and blends the windows' output maps. The classifier's scores are placed at each
window's centre (the pixel densecnn's patch convention labels: ⌊(P-1)/2⌋ from its top-left corner) and zero
elsewhere; with constant blending every pixel is then the centre of exactly one window, so its blended scores are its
own divided by the number of windows covering it, a positive factor per pixel that leaves the labels unchanged.

MONAI is pure Python (``pip install densecnn[bench]``); without it the item says so and measures nothing.

>>> from densecnn.bench.workloads import Workload
>>> result = monai_baseline(Workload.zoo("tiny", 24), crop=12, window_batch=64, repeats=3)
>>> result["labels_equal"]
True
"""

from __future__ import annotations

import importlib.util

import torch

from .timing import elapsed, interleave, median, ratio
from .workloads import LAYOUTS, Workload

TIE = 1e-4  # top-two score gap, relative to max(|score|, 1), below which a label may flip by rounding


def monai_available() -> bool:
    return importlib.util.find_spec("monai") is not None


def centre_scores(model: torch.nn.Module, patch: int):
    """A MONAI predictor: (B, C, P, P) windows -> (B, K, P, P) maps holding the classifier's scores at the centre."""
    centre = (patch - 1) // 2

    def predict(windows: torch.Tensor) -> torch.Tensor:
        scores = model(windows).reshape(windows.shape[0], -1)  # (B, K)
        maps = scores.new_zeros(*scores.shape, patch, patch)  # (B, K, P, P)
        maps[:, :, centre, centre] = scores
        return maps

    return predict


def monai_labels(work: Workload, crop: int, window_batch: int) -> torch.Tensor:
    """Labels (N, crop, crop) of the image's top-left crop×crop pixels by MONAI's sliding window at stride 1."""
    from monai.inferers import SlidingWindowInferer

    p = work.patch
    region = work.padded[
        :, :, : crop + p - 1, : crop + p - 1
    ]  # (N, C, crop+P-1, crop+P-1): every window of the crop
    inferer = SlidingWindowInferer(
        roi_size=(p, p), sw_batch_size=window_batch, overlap=1 - 1 / p, mode="constant", progress=False
    )
    with torch.no_grad():
        blended = inferer(region, centre_scores(work.model, p))  # (N, K, crop+P-1, crop+P-1)
    before = (p - 1) // 2
    return blended[:, :, before : before + crop, before : before + crop].argmax(1)


def monai_baseline(work: Workload, *, crop: int, window_batch: int, repeats: int) -> dict:
    """MONAI's sliding window and batched patch scanning (the faster of NCHW and channels_last) on a crop×crop
    region, scaled to the whole image's pixels, interleaved with densecnn's forward on the whole image; and whether
    MONAI's labels equal densecnn's on the crop (exact ties of random nets aside, they must)."""
    if not monai_available():
        return {"skipped": "MONAI is not installed: pip install 'densecnn[bench]'"}
    crop = min(crop, work.x.shape[-2], work.x.shape[-1])
    scale = work.pixels / (work.x.shape[0] * crop * crop)
    with torch.no_grad():
        scores = work.dense(work.x)[:, :, :crop, :crop]  # (N, K, crop, crop)
    labels, dense_labels = monai_labels(work, crop, window_batch), scores.argmax(1)
    same = labels == dense_labels  # (N, crop, crop)
    contenders = {
        "monai": lambda: _scaled(lambda: monai_labels(work, crop, window_batch), scale),
        "densecnn": work.forward("densecnn"),
    }
    contenders.update({f"patch/{fmt}": work.patch_forward(window_batch, fmt) for fmt in LAYOUTS})
    samples = interleave(contenders, repeats, warm_up=("densecnn",))
    patch = min((k for k in samples if k.startswith("patch/")), key=lambda k: median(samples[k]))
    return {
        "model": work.name,
        "image": list(work.x.shape),
        "crop": crop,
        "window_batch": window_batch,
        "labels_equal": bool(same[_decided(scores)].all()),  # every pixel but exact ties (to rounding)
        "label_agreement": same.double().mean().item(),
        "patch_layout": patch.split("/")[1],
        "forward_s": {
            "monai": median(samples["monai"]),
            "patch": median(samples[patch]),
            "densecnn": median(samples["densecnn"]),
        },
        "speedup": {
            "densecnn_vs_monai": ratio(samples["monai"], samples["densecnn"]),
            "patch_vs_monai": ratio(samples["monai"], samples[patch]),
        },
    }


def _scaled(run, scale: float) -> float:
    return elapsed(run) * scale


def _decided(scores: torch.Tensor) -> torch.Tensor:
    """(N, K, H, W) -> (N, H, W): the pixels whose top two scores differ by more than summation order can move them."""
    top = scores.topk(2, dim=1).values  # (N, 2, H, W)
    return top[:, 0] - top[:, 1] > TIE * scores.abs().amax(1).clamp(min=1)
