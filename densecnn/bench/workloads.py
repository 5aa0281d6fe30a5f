"""What the benchmarks run: the four ways to label every pixel, layer by layer where it matters.

- ``patch``: patch-by-patch scanning, batched; a sample batch of patches is timed and scaled to all pixels.
- ``fast_scan``: fragments (:func:`densecnn.fast_scan`), forward only.
- ``native``: the dense net with backend "native" (torch's dilated ops), in NCHW or channels_last (NHWC).
- ``densecnn``: the dense net with backend "auto" (per-layer solver choice, one memory format, the kernels if built).

The baselines run in both memory formats (:data:`LAYOUTS`); the benchmarks compare against the faster of the two.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import densecnn
from densecnn.ops.layout import memory_format, to_format
from densecnn.ops.plan import Step

from .timing import elapsed

LAYOUTS = ("nchw", "nhwc")


def plain_family(
    last_kernel: int, in_channels: int = 3, num_classes: int = 32, width: int = 50
) -> tuple[nn.Sequential, int]:
    """plain_133 with its last conv's kernel m changed: patch 16·m + 21 (m = 7, width 50 is plain_133)."""
    model = nn.Sequential(
        nn.Conv2d(in_channels, width, 6),
        nn.MaxPool2d(8, 8),
        nn.Tanh(),
        nn.Conv2d(width, width, 3),
        nn.MaxPool2d(2, 2),
        nn.Tanh(),
        nn.Conv2d(width, num_classes, last_kernel),
    )
    return model, 16 * last_kernel + 21


@dataclass
class Workload:
    """One patch net, its two dense versions, and an image batch."""

    name: str
    model: nn.Module
    patch: int
    x: torch.Tensor  # (N, C, H, W)

    def __post_init__(self):
        self.natives = {fmt: densecnn.convert(self.model, self.patch, backend="native") for fmt in LAYOUTS}
        for fmt, native in self.natives.items():
            native.memory_format = fmt
        self.dense = densecnn.convert(self.model, self.patch, backend="auto")
        self.padded = self.dense.pad(self.x)

    @classmethod
    def zoo(cls, name: str, size: int, seed: int = 0) -> Workload:
        torch.manual_seed(seed)
        model, patch = densecnn.zoo.create(name, in_channels=3, num_classes=32 if name == "plain_133" else 8)
        return cls(name, model.eval(), patch, torch.rand(1, 3, size, size))

    @property
    def pixels(self) -> int:
        return self.x.shape[0] * self.x.shape[2] * self.x.shape[3]

    def plan(self, train: bool):
        with torch.set_grad_enabled(train):
            return self.dense.plan(self.padded)

    def step_names(self) -> list[str]:
        return [" + ".join(_layer_name(m) for m in step.layers) for step in self.dense.steps()]

    # --- whole-net timings (seconds) -------------------------------------------------------------------------------

    def forward(self, which: str) -> Callable:
        """``which``: "densecnn", or "native/nchw" / "native/nhwc"."""
        net = self.dense if which == "densecnn" else self.natives[which.split("/")[1]]
        return lambda: _no_grad(net, self.x)

    def train_step(self, which: str) -> Callable:
        """Forward and backward of the summed scores (the dense net of ``which``, as in :meth:`forward`)."""
        net = self.dense if which == "densecnn" else self.natives[which.split("/")[1]]

        def step():
            self.model.zero_grad(set_to_none=True)
            net(self.x).sum().backward()

        return step

    def masked_step(self, which: str, labels: torch.Tensor, mask: torch.Tensor) -> Callable:
        """A training step of the mean cross-entropy over the pixels ``mask`` selects ((N, H, W) labels and mask)
        as users run it, ``masked_loss`` by the dense pass, on the dense net of ``which`` (as in :meth:`forward`)."""
        net = self.dense if which == "densecnn" else self.natives[which.split("/")[1]]

        def step():
            self.model.zero_grad(set_to_none=True)
            net.masked_loss(self.x, labels, mask, method="dense").backward()

        return step

    def fast_scan(self, layout: str = "nchw") -> Callable:
        x = to_format(self.x, layout)
        return lambda: densecnn.fast_scan(self.model, x, self.patch)

    def patch_forward(self, batch: int, layout: str = "nchw") -> Callable:
        """Seconds for all pixels, scaled from one batch of ``batch`` patches in ``layout``."""
        patches = torch.rand(batch, self.x.shape[1], self.patch, self.patch)
        patches = to_format(patches, layout)
        return lambda: elapsed(lambda: _no_grad(self.model, patches)) * self.pixels / batch

    def patch_train(self, batch: int, count: int | None = None, layout: str = "nchw") -> Callable:
        """Seconds for a forward+backward over ``count`` patches (default all pixels), scaled from one batch."""
        batch = min(batch, count or batch)
        patches = torch.rand(batch, self.x.shape[1], self.patch, self.patch)
        patches = to_format(patches, layout)

        def step():
            self.model.zero_grad(set_to_none=True)
            self.model(patches).sum().backward()

        return lambda: elapsed(step) * (count or self.pixels) / batch

    # --- layer by layer --------------------------------------------------------------------------------------------

    def stepwise(self, which: str, *, train: bool) -> Callable:
        """A run returning {"forward": [s per step], "backward": [s per step]} (backward empty unless ``train``).

        ``which``: "densecnn", or "native/nchw" / "native/nhwc" (torch's ops layer by layer in that format). The
        rows include the memory-format conversions at entry and exit in the first and last steps. Backward starts
        from a fixed gradient of ones on the scores.
        """
        if which == "densecnn":
            plan = self.plan(train)
            steps, fmt = list(plan.steps), plan.memory_format
        else:
            layer_groups = [step.layers for step in self.dense.steps()]
            steps = [_sequence(layers) for layers in layer_groups]
            fmt = which.split("/")[1]
        params = list(self.model.parameters())

        def run():
            forward, backward, inputs, outputs = [], [], [], []
            x = self.padded
            with torch.set_grad_enabled(train):
                for i, step in enumerate(steps):
                    x = x.detach().requires_grad_(train and i > 0)
                    inputs.append(x)
                    start = time.perf_counter()
                    x = _call(step, x, fmt, first=i == 0, last=i == len(steps) - 1)
                    forward.append(time.perf_counter() - start)
                    outputs.append(x)
            if train:
                grad = torch.ones_like(outputs[-1])
                for i in reversed(range(len(steps))):
                    start = time.perf_counter()
                    outputs[i].backward(grad)
                    backward.insert(0, time.perf_counter() - start)
                    grad = inputs[i].grad
                for p in params:
                    p.grad = None
            return {"forward": forward, "backward": backward}

        return run


def _call(step, x: torch.Tensor, fmt: str, *, first: bool, last: bool) -> torch.Tensor:
    if first:
        x = to_format(x, fmt)
    y = step(x, memory_format(fmt, x.dim())) if isinstance(step, Step) else step(x)
    return y.contiguous() if last else y


def _sequence(layers):
    def run(x):
        for layer in layers:
            x = layer(x)
        return x

    return run


def _no_grad(net, x):
    with torch.no_grad():
        return net(x)


def _layer_name(module: nn.Module) -> str:
    kernel = getattr(module, "kernel", None)
    if kernel is None:
        return type(module).__name__
    name = type(module).__name__.removeprefix("Dense")
    return f"{name} {kernel[0]}x{kernel[1]} d{module.dilation[0]}"


def pool_input(channels: int = 64, size: int = 512) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(1, channels, size, size)


def native_max_pool(x: torch.Tensor, kernel: int, dilation: int) -> torch.Tensor:
    """The pooling baseline: ``F.max_pool2d(dilation=d, stride=1)`` (in ``x``'s memory format)."""
    return F.max_pool2d(x, kernel, 1, 0, dilation)
