"""Reference patch classifiers. Each builder returns ``(model, patch_size)``: an int for
the square patches of 2-D nets, a tuple with one entry per axis (D, H, W) for 3-D nets.

>>> model, patch = densecnn.zoo.create("plain_133", in_channels=3, num_classes=32)
>>> densecnn.zoo.list_models()
['filter_bank', 'multichannel_40', 'nuclei', 'nuclei3d', 'plain_133', 'stages_46', 'tiny', 'znni_3d']
>>> densecnn.zoo.create("znni_3d", in_channels=1, num_classes=3)[1]
(18, 18, 18)
"""

from __future__ import annotations

import fnmatch

from torch import nn

from .errors import InvalidInputError
from .filter_bank import derivative_layers, smoothing_layers

# the share of the filter bank's features the strokes trainer drops in each step when few pixels are labelled
# (less as labels cover more of the images: densecnn.train.strokes.StrokeTrainer)
FEATURE_DROPOUT = 0.3


def plain_133(in_channels: int = 3, num_classes: int = 32) -> tuple[nn.Sequential, int]:
    """The Plain CNN of Li, Zhao & Wang (2014), patch 133: 133 -> 128 -> 16 -> 14 -> 7 -> 1."""
    model = nn.Sequential(
        nn.Conv2d(in_channels, 50, 6),
        nn.MaxPool2d(8, 8),
        nn.Tanh(),
        nn.Conv2d(50, 50, 3),
        nn.MaxPool2d(2, 2),
        nn.Tanh(),
        nn.Conv2d(50, num_classes, 7),
    )
    return model, 133


def stages_46(in_channels: int = 3, num_classes: int = 8) -> tuple[nn.Sequential, int]:
    """Three conv+pool stages, patch 46: 46 -> 40 -> 20 -> 16 -> 8 -> 4 -> 2 -> 1; most work in late, dilated layers."""
    model = nn.Sequential(
        nn.Conv2d(in_channels, 16, 7),
        nn.MaxPool2d(2, 2),
        nn.Tanh(),
        nn.Conv2d(16, 64, 5),
        nn.MaxPool2d(2, 2),
        nn.Tanh(),
        nn.Conv2d(64, 128, 5),
        nn.MaxPool2d(2, 2),
        nn.Tanh(),
        nn.Conv2d(128, num_classes, 2),
    )
    return model, 46


def tiny(in_channels: int = 1, num_classes: int = 3) -> tuple[nn.Sequential, int]:
    """A small net with max and average pooling and a two-layer FC head, patch 12, for tests."""
    model = nn.Sequential(
        nn.Conv2d(in_channels, 4, 3),
        nn.MaxPool2d(2, 2),
        nn.ReLU(),
        nn.Conv2d(4, 6, 2),
        nn.AvgPool2d(2, 2),
        nn.Tanh(),
        nn.Flatten(),
        nn.Linear(6 * 2 * 2, 8),
        nn.ReLU(),
        nn.Linear(8, num_classes),
    )
    return model, 12


def nuclei(in_channels: int = 1, num_classes: int = 3) -> tuple[nn.Sequential, int]:
    """The shipped nuclei segmenter (models/nuclei), patch 40: two full-resolution 3×3 convs, then three
    conv+pool stages; 12.9k parameters, small enough to label a 512×512 image in a fraction of a second."""
    model = nn.Sequential(
        nn.Conv2d(in_channels, 8, 3),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3),
        nn.MaxPool2d(2, 2),
        nn.ReLU(),
        nn.Conv2d(8, 24, 3),
        nn.MaxPool2d(2, 2),
        nn.ReLU(),
        nn.Conv2d(24, 24, 3),
        nn.MaxPool2d(2, 2),
        nn.ReLU(),
        nn.Conv2d(24, 24, 3),
        nn.ReLU(),
        nn.Conv2d(24, num_classes, 1),
    )
    return model, 40


def multichannel_40(in_channels: int = 3, num_classes: int = 4) -> tuple[nn.Sequential, int]:
    """A wider nuclei net for RGB and multichannel images, patch 40: the nuclei net's layout (two full-resolution
    3×3 convs, three conv+pool stages, a 1×1 head) with twice its channels; about 37k parameters (the geometry of
    :func:`nuclei`). Training from strokes starts from :func:`nuclei` instead: on an RGB image it learned more in
    the same steps, at three quarters of the cost a step (docs/training.md, "Training from strokes").
    """
    model = nn.Sequential(
        nn.Conv2d(in_channels, 16, 3),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3),
        nn.MaxPool2d(2, 2),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3),
        nn.MaxPool2d(2, 2),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3),
        nn.MaxPool2d(2, 2),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3),
        nn.ReLU(),
        nn.Conv2d(32, num_classes, 1),
    )
    return model, 40


# the filter bank's scales per number of spatial axes
BANK_SIGMAS = {2: (1.0, 2.5, 5.0), 3: (1.0, 1.6, 2.5, 5.0)}


def filter_bank(in_channels: int = 1, num_classes: int = 3) -> tuple[nn.Sequential, int]:
    """A fixed multi-scale filter bank and a learned per-pixel head, patch 49: the default net for training images
    from strokes (docs/training.md, "Training from strokes").

    Layers 0–5 are fixed (:mod:`densecnn.filter_bank`, separable filters as pairs of 1-D convs): per channel,
    Gaussian derivatives up to second order at σ 1, 2.5 and 5 with both signs, rectified, each kept as it is and
    smoothed at σ 3 (72 maps per channel); training leaves them as they are. A batch norm without learned
    parameters standardises them: :class:`~densecnn.train.strokes.StrokeTrainer` sets its statistics from the
    labelled pixels' features when it starts a fresh net (:func:`densecnn.train.features.standardize`). The head
    is a dropout of a third of the features (while training from strokes only; less as labels cover more of the
    images) and three 1×1 convs (32, 32, ``num_classes``): a small MLP on the features of each pixel, as ilastik's
    random forest is a classifier on its filter features, each of its trees on a random subset of them.
    Patch 49 = 31 + 19 − 1.
    """
    return _filter_bank(in_channels, num_classes, dims=2)


def filter_bank3d(in_channels: int = 1, num_classes: int = 3) -> tuple[nn.Sequential, tuple[int, int, int]]:
    """:func:`filter_bank` for volumes, patch 49³: the default net for training volumes from strokes.

    Layers 0–7 are the fixed filter bank in 3-D (three 1-D convs per filter, 160 maps per channel: the Gaussian,
    3 first and 6 second derivatives at σ 1, 1.6, 2.5 and 5 with both signs, each kept and smoothed at σ 3), then the
    same standardisation, dropout and head. The σ 1.6 the images' bank lacks finds the one-voxel boundary shells of
    small nuclei, which are thinner along D than in the plane (docs/training.md, "Training from strokes").
    """
    return _filter_bank(in_channels, num_classes, dims=3)


def _filter_bank(in_channels: int, num_classes: int, *, dims: int):
    """(model, patch): the filter bank net in ``dims`` spatial axes, its patch the reach of the fixed layers (an int
    for images, a tuple per axis for volumes)."""
    derivatives = derivative_layers(in_channels, sigmas=BANK_SIGMAS[dims], dims=dims)
    smoothing = smoothing_layers(derivatives[-1].out_channels, sigmas=(3.0,), dims=dims)
    features = smoothing[-1].out_channels
    conv = {2: nn.Conv2d, 3: nn.Conv3d}[dims]
    norm = {2: nn.BatchNorm2d, 3: nn.BatchNorm3d}[dims]
    model = nn.Sequential(
        *derivatives,
        nn.ReLU(),
        *smoothing,
        norm(features, affine=False),
        nn.Dropout(FEATURE_DROPOUT),
        conv(features, 32, 1),
        nn.ReLU(),
        conv(32, 32, 1),
        nn.ReLU(),
        conv(32, num_classes, 1),
    )
    patch = derivatives[0].kernel_size[0] + smoothing[0].kernel_size[0] - 1
    return model, patch if dims == 2 else (patch,) * dims


def nuclei3d(in_channels: int = 1, num_classes: int = 3) -> tuple[nn.Sequential, tuple[int, int, int]]:
    """The shipped 3-D nuclei segmenter (models/nuclei3d), patch (9, 20, 20) (D, H, W): one full-resolution 3³ conv,
    two conv+pool stages pooling in the plane only (the stacks are coarser along D), a 3³ conv and a 1³ head.

    Patch: 1 <- 3 <- (5, 6, 6) <- (5, 8, 8) <- (7, 16, 16) <- (7, 18, 18) <- (9, 20, 20); 17.6k parameters.
    """
    model = nn.Sequential(
        nn.Conv3d(in_channels, 8, 3),
        nn.ReLU(),
        nn.Conv3d(8, 16, 3),
        nn.MaxPool3d((1, 2, 2), (1, 2, 2)),
        nn.ReLU(),
        nn.Conv3d(16, 16, 3),
        nn.MaxPool3d((1, 2, 2), (1, 2, 2)),
        nn.ReLU(),
        nn.Conv3d(16, 16, 3),
        nn.ReLU(),
        nn.Conv3d(16, num_classes, 1),
    )
    return model, (9, 20, 20)


def znni_3d(in_channels: int = 1, num_classes: int = 3) -> tuple[nn.Sequential, tuple[int, int, int]]:
    """A 3-D reference net in the style of the n337 net of Zlateski, Lee & Seung ("ZNNi: maximizing the inference
    throughput of 3D convolutional networks on CPUs and GPUs"), scaled to a small CPU: three 3³ convs of 16
    channels with two 2³ max pools, and a 1³ head. Patch 18³: 1 <- 3 <- 6 <- 8 <- 16 <- 18.
    """
    model = nn.Sequential(
        nn.Conv3d(in_channels, 16, 3),
        nn.MaxPool3d(2, 2),
        nn.ReLU(),
        nn.Conv3d(16, 16, 3),
        nn.MaxPool3d(2, 2),
        nn.ReLU(),
        nn.Conv3d(16, 16, 3),
        nn.ReLU(),
        nn.Conv3d(16, num_classes, 1),
    )
    return model, (18, 18, 18)


_MODELS = {
    "filter_bank": filter_bank,
    "filter_bank3d": filter_bank3d,
    "nuclei": nuclei,
    "nuclei3d": nuclei3d,
    "multichannel_40": multichannel_40,
    "plain_133": plain_133,
    "stages_46": stages_46,
    "tiny": tiny,
    "znni_3d": znni_3d,
}
_VOLUME_MODELS = {"filter_bank3d", "nuclei3d", "znni_3d"}


def list_models(pattern: str = "*") -> list[str]:
    """Names of the zoo's models matching a glob ``pattern``."""
    return sorted(name for name in _MODELS if fnmatch.fnmatch(name, pattern))


def spatial_dims(name: str) -> int:
    """The spatial axes of zoo model ``name``'s input: 2 for images, 3 for volumes.

    >>> densecnn.zoo.spatial_dims("nuclei3d")
    3
    """
    _check_name(name)
    return 3 if name in _VOLUME_MODELS else 2


def create(name: str, *, in_channels: int, num_classes: int) -> tuple[nn.Sequential, int | tuple[int, ...]]:
    """Build zoo model ``name``; returns ``(model, patch_size)`` (a tuple per axis for 3-D nets)."""
    _check_name(name)
    return _MODELS[name](in_channels=in_channels, num_classes=num_classes)


def _check_name(name: str) -> None:
    if name not in _MODELS:
        raise InvalidInputError(f"Unknown model {name!r}; the zoo has {', '.join(list_models())}")
