"""Whether a solver may cache a transform of a conv's weight (the FFT's kernel spectrum, Winograd's transformed
kernel) for the next call: at inference, yes (keyed by the weight's version); in training, whose weights change every
step, no — each cached entry would outlive its step and hold megabytes.

Training is recognised by autograd wanting the weight's gradient, or, for a forward run inside a custom autograd
function (where autograd is off, :mod:`densecnn.ops.gradients`), by :func:`training_forward`.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch

_training_forward = contextvars.ContextVar("densecnn_training_forward", default=False)


def cacheable(weight: torch.Tensor) -> bool:
    """Whether a transform of ``weight`` computed now may be cached."""
    return not (_training_forward.get() or (torch.is_grad_enabled() and weight.requires_grad))


@contextlib.contextmanager
def training_forward():
    """The forward of a training step runs inside: no weight transform is cached."""
    token = _training_forward.set(True)
    try:
        yield
    finally:
        _training_forward.reset(token)
