"""Which solvers a dense net may use (its ``backend``), and whether densecnn's compiled kernels are there.

- ``Backend.AUTO``: every applicable solver (densecnn's kernels when they are built; without them, one warning and
  the torch-only solvers);
- ``Backend.NATIVE``: torch's dilated ops only (the ``native`` solver), NCHW, nothing to choose;
- ``Backend.EXT``: densecnn's kernels only (an error when they are not built).

>>> check_backend("native")
<Backend.NATIVE: 'native'>
"""

from __future__ import annotations

import enum
import warnings

from ..errors import ExtensionUnavailableError, ExtensionUnavailableWarning, InvalidInputError
from . import ext
from .solvers import SOLVERS


def no_ext_kernel(layer: str, allowed: set[str], dtype, *, images: bool = False) -> str:
    """The refusal of a ``layer`` (named as the caller names it) that none of densecnn's own kernels runs under
    ``backend="ext"`` (in ``dtype`` where that is why: the images' when ``images``), with the fix."""
    in_dtype = f" in {str(dtype).removeprefix('torch.')}" if dtype is not None else ""
    images = ", or give the images in float32 or float64 (x.float())" if images else ""
    return (
        f"{layer}: none of densecnn's own kernels (backend='ext': {', '.join(sorted(allowed))}) runs it{in_dtype}. "
        f"Convert with backend='auto' (densecnn's kernels where they apply, torch's elsewhere) or backend='native'"
        f"{images}"
    )


class Backend(str, enum.Enum):
    """The ``backend`` argument of :func:`densecnn.convert` (and the service's setting of the same name)."""

    AUTO = "auto"
    NATIVE = "native"
    EXT = "ext"

    def __str__(self) -> str:
        return self.value


# the names, for settings and command lines: ("auto", "native", "ext")
BACKENDS = tuple(b.value for b in Backend)

_warned = False


def check_backend(backend: str) -> Backend:
    """``backend`` as a :class:`Backend`; a clear ValueError for anything else."""
    try:
        return Backend(backend)
    except ValueError:
        names = ", ".join(b.value for b in Backend)
        raise InvalidInputError(f"backend={backend!r} is not supported; use one of {names}") from None


def ext_available() -> bool:
    """Whether densecnn's compiled kernels are built and loaded."""
    return ext.available()


def ext_build() -> str | None:
    """An identifier of the built kernels (library size and modification time), so rebuilt kernels are re-timed."""
    if not ext_available():
        return None
    try:
        library = ext.library_file()
        stat = library.stat()
    except (OSError, TypeError):
        return "unknown"
    return f"{library.name}:{stat.st_size}:{int(stat.st_mtime)}"


def require_ext() -> None:
    """Raise a clear error when densecnn's kernels are asked for but not built."""
    if not ext_available():
        raise ExtensionUnavailableError(
            f"backend='ext' needs densecnn's compiled kernels, which are not available "
            f"({ext.load_error() or 'unknown reason'}). Build them with `pip install --no-build-isolation -e .` "
            "in the project, or use backend='auto' or 'native'"
        )


def _warn_once_without_ext() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            f"densecnn's compiled kernels are not available ({ext.load_error() or 'unknown reason'}); "
            "backend='auto' falls back to torch-only solvers, which are slower. Build them with "
            "`pip install --no-build-isolation -e .`, or pass backend='native' to choose native ops explicitly",
            ExtensionUnavailableWarning,
            stacklevel=4,
        )


def allowed_solvers(backend: Backend, forced: str | None) -> set[str]:
    """The solvers a plan may use under ``backend`` (and a solver forced by name, which also admits ``native``)."""
    if forced is not None:
        if SOLVERS[forced].needs_ext:
            require_ext()
        return {forced, "native"}
    if backend is Backend.NATIVE:
        return {"native"}
    if backend is Backend.EXT:
        require_ext()
        return {name for name, s in SOLVERS.items() if s.needs_ext}
    if not ext_available():
        _warn_once_without_ext()
        return {name for name, s in SOLVERS.items() if not s.needs_ext}
    return set(SOLVERS)
