"""The ops settings: one :class:`OpsConfig`, read once from the environment when densecnn is imported, overridable
in code, and passed down to the plans, the tuning step and densecnn's kernels.

Every setting, its environment variable, default and effect is in the table of docs/performance.md ("Settings").
A net's own ``solver``, ``memory_format`` and ``tune`` attributes take precedence over the process's config for that
net (its ``backend`` is a setting of the net only).

>>> get_config().output_cache_mb  # 1024 unless DENSECNN_OUTPUT_CACHE_MB says otherwise
1024
>>> with use_config(solver="native", memory_format="nchw"):  # every plan made inside runs torch's ops in NCHW
...     get_config().solver
'native'
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InvalidInputError, InvalidTypeError
from . import ext
from .gradients import SOLVERS as GRADIENT_SOLVERS
from .layout import NAMES
from .solvers import SOLVERS

# field: the environment variable it is read from
ENVIRONMENT = {
    "solver": "DENSECNN_SOLVER",
    "gradient_solver": "DENSECNN_GRADIENT_SOLVER",
    "memory_format": "DENSECNN_MEMORY_FORMAT",
    "tune": "DENSECNN_TUNE",
    "cache_dir": "DENSECNN_CACHE_DIR",
    "output_cache_mb": "DENSECNN_OUTPUT_CACHE_MB",
    "huge_pages": "DENSECNN_HUGE_PAGES",
    "plan_cache_size": "DENSECNN_PLAN_CACHE_SIZE",
}
# variable: its old name, still read (with one warning) where the variable is unset
DEPRECATED_NAMES = {"DENSECNN_TUNE": "DENSECNN_FIND"}
_FLAGS = {"0": False, "1": True}
_warned_deprecated: set[str] = set()
_NOUNS = {
    "output_cache_mb": "output cache size",
    "cache_dir": "cache directory",
    "huge_pages": "huge pages",
    "plan_cache_size": "plan cache size",
}


def _default_cache_dir(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "densecnn"


@dataclass(frozen=True)
class OpsConfig:
    """How dense nets choose and run their solvers (the table in docs/performance.md says each setting's effect).

    Attributes:
        solver: None (each layer's fastest) or a solver name forced on every layer that it can run.
        gradient_solver: None (each conv's fastest) or "native" / "fft" / "winograd" forced for the input and
            weight gradients of every conv a training plan chooses them for (:mod:`densecnn.ops.gradients`) that it
            can run.
        memory_format: None (the faster for the whole net) or "nchw" / "nhwc" forced.
        tune: time the candidate solvers of every new problem (the tuning step) instead of predicting their times.
        cache_dir: where the tuning step's timings are cached (in ``cache_dir / "solvers"``); from the environment
            ``$DENSECNN_CACHE_DIR``, else ``$XDG_CACHE_HOME/densecnn``, else ``~/.cache/densecnn``.
        output_cache_mb: megabytes of free output buffers densecnn's CPU kernels keep for reuse (0: no reuse).
        huge_pages: advise fresh output buffers to be backed by 2 MiB pages.
        plan_cache_size: solver plans a dense net keeps, one per input shape (and dtype, direction, config): past it,
            the least recently used is dropped, so a process that sees many sizes holds bounded memory.

    >>> OpsConfig(solver="fastest")
    Traceback (most recent call last):
    ...
    ValueError: solver 'fastest' is unknown; use one of native, s2b, ext, ext_fused, fft, direct, winograd, or None (OpsConfig.solver)
    """

    solver: str | None = None
    gradient_solver: str | None = None
    memory_format: str | None = None
    tune: bool = False
    cache_dir: Path = field(default_factory=lambda: _default_cache_dir({}))
    output_cache_mb: int = 1024
    huge_pages: bool = False
    plan_cache_size: int = 64

    def __post_init__(self):
        if isinstance(self.cache_dir, str) and self.cache_dir:
            object.__setattr__(self, "cache_dir", Path(self.cache_dir))
        for name in ENVIRONMENT:
            _check(name, getattr(self, name), f"OpsConfig.{name}")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> OpsConfig:
        """The config the ``DENSECNN_*`` variables of ``environ`` give (unset or empty ones: the defaults); a
        ValueError naming the variable and what it may be for an invalid one.

        >>> OpsConfig.from_environ({"DENSECNN_SOLVER": "s2b", "DENSECNN_TUNE": "1"}).tune
        True
        """
        values = {"cache_dir": _default_cache_dir(environ)}
        for name, variable in ENVIRONMENT.items():
            variable, raw = _read(environ, variable)
            if raw:
                value = _parse(name, raw)
                _check(name, value, variable, written=raw)
                values[name] = value
        return cls(**values)

    def replace(self, **changes) -> OpsConfig:
        """A copy with ``changes`` (checked like the constructor's arguments)."""
        return dataclasses.replace(self, **changes)


def _read(environ: Mapping[str, str], variable: str) -> tuple[str, str]:
    """(the variable read, its value) for the setting whose variable is ``variable``: its deprecated old name's value
    where only that is set (warning once per process that the old name is deprecated)."""
    raw = environ.get(variable, "")
    old = DEPRECATED_NAMES.get(variable)
    if raw or old is None or not environ.get(old):
        return variable, raw
    if old not in _warned_deprecated:
        _warned_deprecated.add(old)
        warnings.warn(f"{old} is deprecated; set {variable} instead", FutureWarning, stacklevel=4)
    return old, environ[old]


def _parse(name: str, raw: str):
    """The setting ``name`` from an environment string (unchecked; a string that is not a number or a flag is kept
    as it is, so that :func:`_check` names it)."""
    if name in ("tune", "huge_pages"):
        return _FLAGS.get(raw, raw)
    if name in ("output_cache_mb", "plan_cache_size"):
        return int(raw) if raw.strip().lstrip("-").isdigit() else raw
    if name == "cache_dir":
        return Path(raw)
    return raw


def _check(name: str, value, source: str, written: str | None = None) -> None:
    """A ValueError naming ``source`` (the field or the environment variable), the value as ``written`` there and
    the allowed values, unless ``value`` is one of them."""
    environment = source in ENVIRONMENT.values() or source in DEPRECATED_NAMES.values()
    unset = "or leave it unset" if environment else "or None"
    if name == "solver" and not (value is None or value in SOLVERS):
        what, allowed = "is unknown", f"one of {', '.join(SOLVERS)}, {unset}"
    elif name == "gradient_solver" and not (value is None or value in GRADIENT_SOLVERS):
        what, allowed = "is unknown", f"one of {', '.join(GRADIENT_SOLVERS)}, {unset}"
    elif name == "memory_format" and not (value is None or value in NAMES):
        what, allowed = "is unknown", f"one of {', '.join(NAMES)}, {unset}"
    elif name in ("tune", "huge_pages") and not isinstance(value, bool):
        what, allowed = "is not a flag", "1 or 0" if environment else "True or False"
    elif name == "cache_dir" and not isinstance(value, Path):
        what, allowed = "is invalid", "a pathlib.Path or a non-empty string"
    elif name == "output_cache_mb" and not (
        isinstance(value, int) and not isinstance(value, bool) and value >= 0
    ):
        what, allowed = "is invalid", "a whole number of megabytes, 0 or more (0 turns reuse off)"
    elif name == "plan_cache_size" and not (
        isinstance(value, int) and not isinstance(value, bool) and value >= 1
    ):
        what, allowed = "is invalid", "a whole number of plans, 1 or more"
    else:
        return
    shown = repr(value if written is None else written)
    raise InvalidInputError(
        f"{_NOUNS.get(name, name.replace('_', ' '))} {shown} {what}; use {allowed} ({source})"
    )


def get_config() -> OpsConfig:
    """The config in effect: the environment's, as read when densecnn was imported, unless code has set another.

    >>> get_config().solver is None  # unless DENSECNN_SOLVER is set
    True
    """
    if _current is None:
        raise _environment_error.with_traceback(None)
    return _current


def set_config(config: OpsConfig) -> OpsConfig:
    """Make ``config`` the one in effect for every plan made from now on and for densecnn's kernels; returns the
    previous one. Plans a net has already made for a shape are kept unless the change affects them (a net's plans
    are keyed by the config they were made with).

    >>> previous = set_config(get_config().replace(output_cache_mb=0))  # no output reuse from here on
    >>> _ = set_config(previous)
    """
    global _current
    if not isinstance(config, OpsConfig):
        raise InvalidTypeError(
            f"expected an OpsConfig, got {type(config).__name__}; build one with get_config().replace(...)"
        )
    previous, _current = _current, config
    _apply(config)
    return previous


@contextlib.contextmanager
def use_config(**changes) -> Iterator[OpsConfig]:
    """The config in effect with ``changes`` inside the ``with`` block, the previous one after it.

    >>> with use_config(tune=True) as config:
    ...     config.tune
    True
    """
    previous = set_config(get_config().replace(**changes))
    try:
        yield get_config()
    finally:
        set_config(previous)


def _apply(config: OpsConfig) -> None:
    """Hand the kernels' settings to the compiled library (which reads no environment of its own)."""
    if ext.available():
        ext.set_output_buffers(max_free_bytes=config.output_cache_mb << 20, huge_pages=config.huge_pages)


try:
    _current: OpsConfig | None = OpsConfig.from_environ()
    _environment_error: InvalidInputError | None = None
    _apply(_current)
except InvalidInputError as exc:
    # an invalid DENSECNN_* setting is raised where the config is first asked for, not by the import: so that the
    # ``densecnn`` command, which checks it first, says what is wrong in one line (exit status 2), even for --help
    _current, _environment_error = None, exc
