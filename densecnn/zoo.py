"""Reference patch classifiers. Each builder returns ``(model, patch_size)``.

>>> model, patch = densecnn.zoo.create("plain_133", in_channels=3, num_classes=32)
>>> densecnn.zoo.list_models()
['plain_133', 'stages_46', 'tiny']
"""

from __future__ import annotations

import fnmatch

from torch import nn


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


_MODELS = {"nuclei": nuclei, "plain_133": plain_133, "stages_46": stages_46, "tiny": tiny}


def list_models(pattern: str = "*") -> list[str]:
    """Names of the zoo's models matching a glob ``pattern``."""
    return sorted(name for name in _MODELS if fnmatch.fnmatch(name, pattern))


def create(name: str, *, in_channels: int, num_classes: int) -> tuple[nn.Sequential, int]:
    """Build zoo model ``name``; returns ``(model, patch_size)``."""
    if name not in _MODELS:
        raise ValueError(f"Unknown model {name!r}; the zoo has {', '.join(list_models())}")
    return _MODELS[name](in_channels=in_channels, num_classes=num_classes)
