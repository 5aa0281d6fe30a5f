"""The dense (stride-1, dilated) ops and how each layer of a dense net runs them.

- :mod:`~densecnn.ops.solvers`: the exact ways to compute each op (``native`` torch ops, space-to-batch,
  densecnn's kernels), one registry;
- :mod:`~densecnn.ops.plan`: per net and input shape, a solver per layer and one memory format — the only way a dense
  net runs its ops;
- :mod:`~densecnn.ops.costmodel`: the plan's immediate choice, predicted from measurements shipped with the package;
- :mod:`~densecnn.ops.tune`: timing the candidates when asked to tune, cached on disk;
- :mod:`~densecnn.ops.backends`: which solvers a net may use (``Backend``) and whether the kernels are built;
- :mod:`~densecnn.ops.config`: the settings (``OpsConfig``), read once from the environment, overridable in code;
- :mod:`~densecnn.ops.native`, :mod:`~densecnn.ops.ext`: the torch and compiled-kernel implementations;
- :mod:`~densecnn.ops.registrations`: the compiled ops' fake kernels and autograd formulas (imported here, so that
  importing any part of this package registers them).

This package is the bottom layer: it imports nothing of densecnn above it (only ``densecnn._C`` and the leaf
modules ``geometry``, ``errors``, ``atomic`` and ``_version``, which import nothing of densecnn); what a plan needs
from the converter (the layers, the activations a pool may absorb) its caller hands it.
"""

from __future__ import annotations

from . import registrations  # noqa: F401  (registers the ops' fake kernels and gradients)
from .backends import BACKENDS, Backend, check_backend, ext_available
from .config import OpsConfig, get_config, set_config, use_config

__all__ = [
    "BACKENDS",
    "Backend",
    "OpsConfig",
    "check_backend",
    "ext_available",
    "get_config",
    "set_config",
    "use_config",
]
