"""Dense (stride-1, dilated) ops behind one interface, dispatched to a backend.

Backends: ``"native"`` (torch ops, always available) and ``"ext"`` (densecnn's own kernels in ``cuda_ext``);
``"auto"`` uses the kernels when they are built and otherwise falls back to native ops with one warning.
A :class:`~densecnn.DenseCNN` with backend ``"auto"`` goes further and picks, per layer, the fastest solver
(:mod:`densecnn.ops.solvers`, :mod:`densecnn.ops.find`).
"""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path

from . import native

BACKENDS = ("auto", "native", "ext")


class ExtensionUnavailableWarning(RuntimeWarning):
    """densecnn's compiled kernels are not built or failed to load; native torch ops are used instead."""


_warned = False


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not supported; use one of {', '.join(BACKENDS)}")
    return backend


def ext_module():
    """The ``densecnn.ops.ext`` wrapper module, or None when it is missing."""
    try:
        return importlib.import_module(f"{__name__}.ext")
    except ImportError:
        return None


def ext_available() -> bool:
    """Whether densecnn's compiled kernels are built and loaded."""
    ext = ext_module()
    return ext is not None and ext.available()


def ext_build() -> str | None:
    """An identifier of the built kernels (library size and modification time), so rebuilt kernels are re-timed."""
    if not ext_available():
        return None
    try:
        library = Path(importlib.import_module("densecnn._C").__file__)
        stat = library.stat()
    except (ImportError, OSError, TypeError):
        return "unknown"
    return f"{library.name}:{stat.st_size}:{int(stat.st_mtime)}"


def ext_load_error() -> str:
    ext = ext_module()
    if ext is None:
        return "densecnn.ops.ext is missing"
    return str(ext.load_error() or "unknown reason")


def require_ext() -> None:
    """Raise a clear error when backend "ext" is asked for but the kernels are not built."""
    if not ext_available():
        raise RuntimeError(
            f"backend='ext' needs densecnn's compiled kernels, which are not available ({ext_load_error()}). "
            "Build them with `pip install --no-build-isolation -e .` in the project, or use backend='auto' or 'native'"
        )


def auto_uses_ext() -> bool:
    """Whether backend "auto" can use the kernels; warns once per process when it cannot."""
    global _warned
    if ext_available():
        return True
    if not _warned:
        _warned = True
        warnings.warn(
            f"densecnn's compiled kernels are not available ({ext_load_error()}); backend='auto' falls back to "
            "native torch ops, which are slower. Build them with `pip install --no-build-isolation -e .`, "
            "or pass backend='native' to choose native ops explicitly",
            ExtensionUnavailableWarning,
            stacklevel=3,
        )
    return False


def _impl(backend: str):
    if backend == "native":
        return native
    if backend == "ext":
        require_ext()
        return ext_module()
    return ext_module() if auto_uses_ext() else native


def conv2d(x, weight, bias, dilation, groups=1, *, backend="auto"):
    """Stride-1 dilated convolution. x (N, C, H, W), weight (K, C/groups, kh, kw) -> (N, K, H', W')."""
    return _impl(backend).conv2d(x, weight, bias, dilation, groups)


def max_pool2d(x, kernel, dilation, *, backend="auto"):
    """Stride-1 dilated max pooling. (N, C, H, W) -> (N, C, H', W')."""
    return _impl(backend).max_pool2d(x, kernel, dilation)


def avg_pool2d(x, kernel, dilation, divisor=None, *, backend="auto"):
    """Stride-1 dilated average pooling (sum of the kh·kw taps / ``divisor``). (N, C, H, W) -> (N, C, H', W')."""
    return _impl(backend).avg_pool2d(x, kernel, dilation, divisor)
