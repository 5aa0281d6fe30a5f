"""DenseCNN: the converted net, labelling every pixel of a whole image in one pass."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from .errors import DenseEquivalenceWarning
from .layers import WindowLayer
from .padding import pad_image

_STOCHASTIC = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd)


class DenseCNN(nn.Module):
    """A patch classifier converted to stride-1 dilated ops; build it with :func:`densecnn.convert`.

    ``forward(x)`` maps (N, C, H, W) images to (N, K, H, W) scores with ``out[n, :, i, j] == model(patch centred at
    (i, j))``, the image padded as ``padding_mode`` says (top/left ⌊(P-1)/2⌋, bottom/right ⌊P/2⌋).

    Attributes:
        patch_size: (Ph, Pw) the patch model was trained on.
        receptive_field: (Rh, Rw), the pixels each output actually depends on (≤ patch_size).
        in_channels, num_classes: input channels C and output classes K.
        padding_mode: "zeros", "reflect" or "replicate".
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) float images -> (N, K, H, W) scores, one patch-model output per pixel."""
        self._check_input(x)
        self._warn_if_stochastic()
        return self.features(self.pad(x))

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) float images -> (N, H, W) int64 labels (argmax of the scores)."""
        return self.forward(x).argmax(1)

    def _check_input(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"expected images as an (N, C, H, W) tensor, got {shape}; add a batch axis with x[None]")
        if not x.is_floating_point():
            raise TypeError(f"expected a floating-point tensor, got {x.dtype}; convert with x.float()")
        if self.in_channels is not None and x.shape[1] != self.in_channels:
            raise ValueError(f"the model takes {self.in_channels} input channels, the images have {x.shape[1]}")
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
