"""DenseCNN: the converted net, labelling every pixel of a whole image in one pass."""

from __future__ import annotations

import os
import threading
import warnings

import torch
from torch import nn

from . import ops, tiling
from .errors import DenseEquivalenceWarning
from .layers import WindowLayer
from .ops.plan import Plan, make_plan, run_steps
from .padding import pad_image

_STOCHASTIC = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd)


class DenseCNN(nn.Module):
    """A patch classifier converted to stride-1 dilated ops; build it with :func:`densecnn.convert`.

    ``forward(x)`` maps (N, C, H, W) images to (N, K, H, W) scores with ``out[n, :, i, j] == model(patch centred at
    (i, j))``, the image padded as ``padding_mode`` says (top/left ⌊(P-1)/2⌋, bottom/right ⌊P/2⌋).

    With backend "auto" (or "ext"), the first call for an input shape picks the fastest solver per layer and one
    memory format for the whole net (:mod:`densecnn.ops.plan`, timings cached on disk by :mod:`densecnn.ops.find`);
    backend "native" runs torch's dilated ops layer by layer in NCHW. ``max_memory`` (bytes) splits the work into
    exact tiles (:mod:`densecnn.tiling`).

    Attributes:
        patch_size: (Ph, Pw) the patch model was trained on.
        receptive_field: (Rh, Rw), the pixels each output actually depends on (≤ patch_size).
        in_channels, num_classes: input channels C and output classes K.
        padding_mode: "zeros", "reflect" or "replicate".
        solver, memory_format: None (chosen by timing) or a solver name / "nchw" / "nhwc" to force for every layer
            (also settable by the environment variables DENSECNN_SOLVER and DENSECNN_MEMORY_FORMAT).
    """

    def __init__(
        self,
        layers: list[nn.Module],
        *,
        patch_size: tuple[int, int],
        in_channels: int | None,
        num_classes: int,
        padding_mode: str,
        backend: str,
    ):
        super().__init__()
        self.features = nn.Sequential(*layers)
        self.patch_size = patch_size
        self.in_channels = in_channels
        self.num_classes = num_classes
        self.padding_mode = padding_mode
        self.receptive_field = tuple(
            1 + sum((layer.kernel[axis] - 1) * layer.dilation[axis] for layer in self.window_layers())
            for axis in (0, 1)
        )
        self.backend = backend
        self.solver: str | None = None
        self.memory_format: str | None = None
        self._plans: dict[tuple, Plan] = {}

    def window_layers(self) -> list[WindowLayer]:
        return [layer for layer in self.features if isinstance(layer, WindowLayer)]

    @property
    def backend(self) -> str:
        return self._backend

    @backend.setter
    def backend(self, backend: str) -> None:
        self._backend = backend
        for layer in self.window_layers():
            layer.backend = backend

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> (N, C, H+Rh-1, W+Rw-1): the padding the dense ops consume, so the output is H×W."""
        top, left = ((p - 1) // 2 for p in self.patch_size)
        bottom, right = self.receptive_field[0] - 1 - top, self.receptive_field[1] - 1 - left
        return pad_image(x, (top, left), (bottom, right), self.padding_mode)

    def forward(
        self, x: torch.Tensor, max_memory: int | None = None, *, cancel: threading.Event | None = None
    ) -> torch.Tensor:
        """(N, C, H, W) float images -> (N, K, H, W) scores, one patch-model output per pixel.

        ``max_memory`` (bytes): compute the output in tiles whose estimated memory, with the held padded image and
        scores, stays under it; the result equals the untiled one. ``cancel``: once this event is set (by another
        thread), the computation stops at the next layer or tile with :class:`densecnn.errors.Cancelled`.

        >>> dense(torch.rand(1, 1, 300, 200), max_memory=50_000_000).shape
        torch.Size([1, 3, 300, 200])
        """
        self._check_input(x)
        self._warn_if_stochastic()
        if max_memory is not None:
            return tiling.run_tiled(self, x, max_memory, labels=False, cancel=cancel)
        return self.run_padded(self.pad(x), cancel=cancel)

    @torch.no_grad()
    def predict(
        self, x: torch.Tensor, max_memory: int | None = None, *, cancel: threading.Event | None = None
    ) -> torch.Tensor:
        """(N, C, H, W) float images -> (N, H, W) int64 labels (argmax of the scores).

        With ``max_memory`` (bytes) only each tile's labels are kept, so large images fit: a 4096x4096 RGB image
        through plain_133 with ``max_memory=1_500_000_000`` never holds the 2 GB of 32-class scores.
        With backend "auto" the images' dtype is the compute dtype: ``predict(x.bfloat16())`` is bf16 inference.
        ``cancel`` stops it as in :meth:`forward`.
        """
        if max_memory is None:
            return self.forward(x, cancel=cancel).argmax(1)
        self._check_input(x)
        self._warn_if_stochastic()
        return tiling.run_tiled(self, x, max_memory, labels=True, cancel=cancel)

    def run_padded(self, padded: torch.Tensor, *, cancel: threading.Event | None = None) -> torch.Tensor:
        """Run the dense layers on an already padded (N, C, H+Rh-1, W+Rw-1) input -> (N, K, H, W)."""
        if self.backend == "native":
            return run_steps(self.features, padded, cancel)
        return self.plan(padded)(padded, cancel=cancel)

    def plan(self, padded: torch.Tensor) -> Plan:
        """The solver plan for this input (found and cached per shape, dtype, device and direction)."""
        train = torch.is_grad_enabled() and (
            padded.requires_grad or any(p.requires_grad for p in self.parameters())
        )
        key = (
            tuple(padded.shape), padded.dtype, padded.device, train, padded.requires_grad, self.backend, self.solver,
            self.memory_format,
            os.environ.get("DENSECNN_SOLVER"), os.environ.get("DENSECNN_MEMORY_FORMAT"), ops.ext_available(),
        )  # fmt: skip
        if key not in self._plans:
            self._plans[key] = make_plan(
                self.features,
                tuple(padded.shape),
                padded.dtype,
                padded.device,
                backend=self.backend,
                train=train,
                solver=self.solver,
                memory_format=self.memory_format,
                input_grad=padded.requires_grad,
            )
        return self._plans[key]

    def _check_input(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(
                f"expected images as an (N, C, H, W) tensor, got {shape}; add a batch axis with x[None]"
            )
        if not x.is_floating_point():
            raise TypeError(f"expected a floating-point tensor, got {x.dtype}; convert with x.float()")
        weight = next(self.parameters(), None)
        if self.backend == "native" and weight is not None and x.dtype != weight.dtype:
            raise TypeError(
                f"backend='native' computes in the model's dtype ({weight.dtype}), the images are {x.dtype}; "
                f"convert them with x.to({weight.dtype}) or use backend='auto', which computes in the images' dtype"
            )
        if self.in_channels is not None and x.shape[1] != self.in_channels:
            raise ValueError(
                f"the model takes {self.in_channels} input channels, the images have {x.shape[1]}"
            )
        if x.shape[2] < 1 or x.shape[3] < 1:
            raise ValueError(f"images must be at least 1x1, got {x.shape[2]}x{x.shape[3]}")

    def _warn_if_stochastic(self) -> None:
        if any(m.training for m in self.modules() if isinstance(m, _STOCHASTIC)):
            warnings.warn(
                "BatchNorm/Dropout layers are in training mode: the dense net does not match patch-by-patch "
                "scanning (batch statistics and dropout masks differ). Call .eval() for exact equivalence.",
                DenseEquivalenceWarning,
                stacklevel=3,
            )

    def extra_repr(self) -> str:
        return (
            f"patch_size={self.patch_size}, receptive_field={self.receptive_field}, "
            f"padding_mode={self.padding_mode!r}, backend={self.backend!r}"
        )
