"""Whether a solver may cache a transform of a conv's weight (the FFT's kernel spectrum, Winograd's transformed
kernel, a copy without subnormals) for the next call, and the caches (:class:`TransformCache`): at inference, yes;
in training, whose weights change every step, no — each cached entry would outlive its step and hold megabytes.

Training is recognised by autograd wanting the weight's gradient, or, for a forward run inside a custom autograd
function (where autograd is off, :mod:`densecnn.ops.gradients`), by :func:`training_forward`.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections import OrderedDict
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

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


def eager(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a plain tensor used eagerly, with memory of its own (traced calls — torch.compile, fake
    tensors, dispatch modes — have none to key a spectrum by or to write into)."""
    return (
        type(tensor) in (torch.Tensor, torch.nn.Parameter)
        and not torch.compiler.is_compiling()
        and not is_in_torch_dispatch_mode()
    )


class TransformCache:
    """Transforms of weights kept for the next call, the least recently used dropped past ``size``.

    An entry keeps a copy of the weight's values it was computed from and serves only a weight that still equals
    them, so the dense net follows a change of the weight by any route: an optimizer's step, which bumps the
    weight's version, but also ``p.data.mul_(...)`` or ``p.data = t``, which no version counter sees (and after which
    a new weight may take a freed one's address). The check reads the weight once per call: a fraction of the conv.

    >>> spectra = TransformCache(32)
    >>> spectrum = spectra.get(weight, (tile, dtype), lambda: compute_spectrum(weight))
    """

    def __init__(self, size: int):
        self.size = size
        self._entries: OrderedDict[tuple, tuple[torch.Tensor, object]] = OrderedDict()
        self._lock = threading.Lock()  # served models run in several threads

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, weight: torch.Tensor, extra: tuple, compute: Callable[[], object]):
        """The transform ``compute()`` of ``weight`` (``extra``: what else it depends on), from the cache while the
        weight's values are those it was computed from (a traced call's weight, without values: computed)."""
        if not eager(weight):
            return compute()
        key = (weight.data_ptr(), tuple(weight.shape), weight.stride(), weight.dtype, weight.device, *extra)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
        if entry is not None and torch.equal(entry[0], weight):
            return entry[1]
        values = weight.detach().clone()
        transform = compute()
        with self._lock:
            self._entries[key] = (values, transform)
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return transform
