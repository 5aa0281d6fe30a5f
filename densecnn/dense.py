"""DenseCNN: the converted net, labelling every pixel of a whole image in one pass."""

from __future__ import annotations

import collections
import functools
import math
import threading
import warnings

import numpy as np
import torch
from torch import nn

from . import tiling
from .errors import DenseEquivalenceWarning, InvalidInputError, InvalidTypeError
from .functional_weights import SharedTensor
from .geometry import Size, reach
from .hooks import check_modules
from .layers import WindowLayer, output_shape
from .losses import IGNORE_INDEX, check_targets
from .masked import masked_terms
from .nonfinite import (
    check_finite,
    check_policy,
    no_data_input,
    no_data_pixels,
    run_with_no_data,
    zero_filled,
)
from .ops.backends import Backend, check_backend, ext_available
from .ops.config import OpsConfig, get_config
from .ops.plan import Plan, Step, group_steps, make_plan
from .ops.solvers import ConvOp
from .padding import dense_padding, pad_image, padded_window
from .rules.registry import fused_activation
from .structure import Structure

_INPUTS = {1: ("signals", "(N, C, L)"), 2: ("images", "(N, C, H, W)"), 3: ("volumes", "(N, C, D, H, W)")}
_STOCHASTIC = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd)


def _native_scratch_bytes(layer: nn.Module, in_shape, out_shape, itemsize: int) -> int:
    """Buffers torch's own ops allocate beyond their input and output, where they are large: a conv that runs as
    im2col + GEMM unrolls its input (one image at a time: C/groups · taps columns per output pixel) — torch's dilated
    3-D conv always does, and so do 2-D convs on CPUs without AVX2, where oneDNN has no direct kernels — and 3-D max
    pooling computes int64 argmax indices even without autograd."""
    if not isinstance(layer, WindowLayer):
        return 0
    op = layer.dense_op()
    pixels = math.prod(out_shape[2:])
    if isinstance(op, ConvOp):
        dilated = any(d > 1 for d, k in zip(op.dilation, op.kernel) if k > 1)
        unrolled = (layer.dims == 3 and dilated) or (
            math.prod(op.kernel) > 1 and torch.backends.cpu.get_cpu_capability() == "DEFAULT"
        )
        return op.weight.shape[1] * math.prod(op.kernel) * pixels * itemsize if unrolled else 0
    return 8 * math.prod(out_shape) if layer.dims == 3 and op.mode == "max" else 0


class DenseCNN(nn.Module):
    """A patch classifier converted to stride-1 dilated ops; build it with :func:`densecnn.convert`.

    ``forward(x)`` maps (N, C, H, W) images to (N, K, H, W) scores with ``out[n, :, i, j] == model(patch centred at
    (i, j))``, the image padded as ``padding_mode`` says (top/left ⌊(P-1)/2⌋, bottom/right ⌊P/2⌋). A net converted
    from a signal model (``Conv1d``...) maps (N, C, L) signals to (N, K, L), one from a volume model (``Conv3d``...)
    (N, C, D, H, W) volumes to (N, K, D, H, W), padded by the same rule along every axis.

    The first call for an input shape picks a solver per layer and one memory format for the whole net
    (:mod:`densecnn.ops.plan`) at once, from the shipped cost model; with ``tune`` (or the config's, e.g.
    ``DENSECNN_TUNE=1``) it times the candidates instead and caches the times on disk (:mod:`densecnn.ops.tune`),
    which later plans reuse.
    ``backend`` restricts the candidates: "native" runs torch's dilated ops in NCHW, "ext" densecnn's kernels only.
    ``max_memory`` (bytes) splits the work into exact tiles (:mod:`densecnn.tiling`). A call raises
    :class:`~densecnn.ConversionError` if a hook was added to the patch model since conversion (:mod:`densecnn.hooks`),
    :class:`~densecnn.errors.ModelChangedError` if its structure changed (:mod:`densecnn.structure`), and
    :class:`~densecnn.errors.NonFiniteInputError` on NaN/±Inf input unless ``nonfinite="propagate"``
    (:mod:`densecnn.nonfinite`).

    Attributes:
        structure: the patch model's :class:`~densecnn.structure.Structure` at conversion, checked on every call.
        patch_size: (Ph, Pw) the patch model was trained on; (Pd, Ph, Pw) for volumes, (Pl,) for signals.
        receptive_field: (Rh, Rw), the pixels each output actually depends on (≤ patch_size), per axis like
            ``patch_size``.
        dims: the number of spatial axes (1, 2 or 3).
        in_channels, num_classes: input channels C and output classes K.
        padding_mode: "zeros", "reflect" or "replicate".
        backend: the :class:`~densecnn.ops.Backend` whose solvers the plans may use.
        tune: time the candidate solvers of every new problem instead of predicting their times (also when the
            process's :class:`~densecnn.ops.OpsConfig` says so).
        solver, memory_format: None (the process's config decides: :func:`densecnn.ops.get_config`, e.g.
            DENSECNN_SOLVER) or a solver name / "nchw" / "nhwc" to force for every layer of this net.
    """

    def __init__(
        self,
        layers: list[nn.Module],
        *,
        patch_size: tuple[int, ...],
        in_channels: int | None,
        num_classes: int,
        padding_mode: str,
        backend: str = "auto",
        tune: bool = False,
        patch_modules: tuple[tuple[str, nn.Module], ...] = (),
        shared_tensors: tuple[SharedTensor, ...] = (),
    ):
        super().__init__()
        self.features = nn.Sequential(*layers)
        # the patch model's modules by path, checked for hooks and structural changes on every call: a hook added
        # or a layer replaced after conversion would change the patch model but not this net (a plain tuple: not
        # submodules of the dense net)
        self._patch_modules = patch_modules
        self.structure = Structure(patch_modules, shared_tensors)
        self.patch_size = patch_size
        self.in_channels = in_channels
        self.num_classes = num_classes
        self.padding_mode = padding_mode
        self.receptive_field = tuple(
            1 + sum(reach(layer.kernel, layer.dilation)[axis] for layer in self.window_layers())
            for axis in range(len(patch_size))
        )
        self.backend = backend
        self.tune = tune
        self.solver: str | None = None
        self.memory_format: str | None = None
        self._plans: collections.OrderedDict[tuple, Plan] = (
            collections.OrderedDict()
        )  # least recently used first

    @property
    def dims(self) -> int:
        """The number of spatial axes: 1 (signals), 2 (images) or 3 (volumes)."""
        return len(self.patch_size)

    def window_layers(self) -> list[WindowLayer]:
        return [layer for layer in self.features if isinstance(layer, WindowLayer)]

    @property
    def backend(self) -> Backend:
        return self._backend

    @backend.setter
    def backend(self, backend: str) -> None:
        self._backend = check_backend(backend)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, *S) -> (N, C, *(S+R-1)): the padding the dense ops consume, so the output has the input's size.

        Use it (or :func:`densecnn.padding.pad_image` with :func:`~densecnn.padding.dense_padding`) to pad crops of any
        number of spatial axes the way the dense net does."""
        before, after = dense_padding(self.patch_size, self.receptive_field)
        return pad_image(x, before, after, self.padding_mode)

    def forward(
        self,
        x: torch.Tensor,
        max_memory: int | None = None,
        *,
        cancel: threading.Event | None = None,
        nonfinite: str = "refuse",
    ) -> torch.Tensor:
        """(N, C, H, W) float images -> (N, K, H, W) scores, one patch-model output per pixel ((N, C, *S) ->
        (N, K, *S) for signals and volumes).

        ``max_memory`` (bytes): compute the output in tiles whose estimated memory, with the held padded image and
        scores, stays under it; the result equals the untiled one. ``cancel``: once this event is set (by another
        thread), the computation stops at the next layer or tile with :class:`densecnn.errors.Cancelled`.
        ``nonfinite``: "refuse" (default) raises :class:`~densecnn.errors.NonFiniteInputError` on NaN/±Inf input;
        "propagate" reads them as no-data: NaN scores exactly where a pixel's patch reads one, every other pixel
        exact (:mod:`densecnn.nonfinite`).

        >>> dense(torch.rand(1, 1, 300, 200), max_memory=50_000_000).shape
        torch.Size([1, 3, 300, 200])
        """
        self._check_call(x, nonfinite, cancel)
        self._warn_if_stochastic()
        if max_memory is not None:
            return self._run_tiled(x, max_memory, labels=False, cancel=cancel, nonfinite=nonfinite)
        return self._run(self.pad(x), cancel=cancel, nonfinite=nonfinite)

    @torch.no_grad()
    def predict(
        self,
        x: torch.Tensor,
        max_memory: int | None = None,
        *,
        cancel: threading.Event | None = None,
        nonfinite: str = "refuse",
    ) -> torch.Tensor:
        """(N, C, H, W) float images -> (N, H, W) int64 labels (argmax of the scores); (N, C, *S) -> (N, *S).

        With ``max_memory`` (bytes) only each tile's labels are kept, so large images fit: a 4096x4096 RGB image
        through plain_133 with ``max_memory=1_500_000_000`` never holds the 2 GB of 32-class scores.
        With backend "auto" the images' dtype is the compute dtype: ``predict(x.bfloat16())`` is bf16 inference.
        ``cancel`` stops it as in :meth:`forward`. With ``nonfinite="propagate"`` a pixel whose patch reads a
        NaN/±Inf input pixel is labelled :data:`densecnn.nonfinite.NO_DATA_LABEL` (-1), as is any pixel whose scores
        are NaN; with "refuse", NaN scores (the net overflowing on a finite input) raise
        :class:`~densecnn.errors.ScoresNotFiniteError`.
        """
        if max_memory is None:
            scores = self.forward(x, cancel=cancel, nonfinite=nonfinite)
            return tiling.class_labels(scores, no_data=nonfinite == "propagate")
        self._check_call(x, nonfinite, cancel)
        self._warn_if_stochastic()
        return self._run_tiled(x, max_memory, labels=True, cancel=cancel, nonfinite=nonfinite)

    def masked_loss(
        self,
        x: torch.Tensor,
        labels: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        class_weights: torch.Tensor | None = None,
        ignore_index: int = IGNORE_INDEX,
        method: str = "auto",
        focal_gamma: float = 0.0,
        nonfinite: str = "refuse",
    ) -> torch.Tensor:
        """The mean cross-entropy over the pixels ``mask`` selects (labels not ``ignore_index``): its gradient is the
        patch minibatch's of those pixels, computed the cheapest way (:mod:`densecnn.masked`): the whole dense pass,
        the dense pass over the selected pixels' region, or their patch minibatch. ``method`` forces one.
        ``class_weights`` and ``focal_gamma`` weigh the pixels as :func:`~densecnn.masked_cross_entropy` does.
        ``nonfinite="propagate"`` leaves out of the mask every pixel whose patch reads a NaN/±Inf input pixel (the
        gradient is then the patch minibatch's of the remaining selected pixels); "refuse" (default) raises on them.

        (N, C, *S) images, (N, *S) labels and bool mask (None: every pixel) -> a scalar (float32, or float64 for
        float64 images); 0 with a zero gradient when no pixel counts.

        >>> dense.masked_loss(images, labels, densecnn.masks.random(64)(labels, generator=g)).backward()
        """
        self._check_call(x, nonfinite)
        self._warn_if_stochastic()
        padded = self.pad(x)
        no_data = no_data_input(padded) if nonfinite == "propagate" else None
        if no_data is not None:
            counted = ~no_data_pixels(self.features, no_data)  # (N, *S)
            check_targets(labels, mask, tuple(counted.shape), self.num_classes, ignore_index)
            mask = counted if mask is None else mask & counted
            padded = zero_filled(padded, no_data)
        terms = masked_terms(
            self,
            padded,
            labels,
            mask,
            class_weights=class_weights,
            ignore_index=ignore_index,
            method=method,
            focal_gamma=focal_gamma,
        )
        return terms.loss_sum / terms.weight_sum.clamp(min=torch.finfo(terms.weight_sum.dtype).tiny)

    def warm(
        self, shape, *, dtype: torch.dtype = torch.float32, max_memory: int | None = None, train: bool = False
    ) -> None:
        """Prepare what a call on (N, C, H, W) images of ``shape`` needs, so that the first real call is as fast as
        the next: the plans (tuned if ``tune`` is set) and torch's own first-call work for those shapes, by one call
        on zeros: ``predict(x, max_memory)`` (with ``max_memory``, the plan of its tile shape), or with ``train`` a
        training step (forward and backward; the parameters' gradients are left as they were).

        >>> dense.warm((1, 3, 512, 512))  # e.g. at a service's start-up, once per expected size
        """
        x = torch.zeros(shape, dtype=dtype, device=next(self.parameters()).device)
        if not train:
            self.predict(x, max_memory=max_memory)
            return
        params = list(self.parameters())
        grads = [p.grad for p in params]
        with torch.enable_grad():
            scores = self.forward(x, max_memory=max_memory)
            if scores.requires_grad:
                scores.sum().backward()
        for p, grad in zip(params, grads):
            p.grad = grad

    def check_model(self) -> None:
        """Raise if the patch model changed since conversion in a way this net cannot follow: a hook added
        (:mod:`densecnn.hooks`) or its structure changed (:mod:`densecnn.structure`; a few µs per module). Every call
        checks it; parameter values are shared and followed.

        Raises:
            ConversionError: a hook was added to one of its modules.
            ModelChangedError: a layer, hyper-parameter or attribute changed; convert the model again.
        """
        check_modules(self._patch_modules)
        self.structure.check()

    def _check_call(self, x: torch.Tensor, nonfinite: str, cancel: threading.Event | None = None) -> None:
        """What every scoring call checks first: the input, the non-finite policy, the cancel event, the patch
        model."""
        self._check_input(x)
        if cancel is not None and not callable(getattr(cancel, "is_set", None)):
            raise InvalidInputError(
                f"cancel must be a threading.Event (or None), got {type(cancel).__name__}; set the event from another "
                "thread to stop the call"
            )
        if check_policy(nonfinite) == "refuse":
            check_finite(x)
        self.check_model()

    def _run(self, padded: torch.Tensor, *, cancel: threading.Event | None, nonfinite: str) -> torch.Tensor:
        """:meth:`run_padded` under the non-finite policy (the input already checked under "refuse")."""
        if nonfinite == "propagate":
            return run_with_no_data(functools.partial(self.run_padded, cancel=cancel), self.features, padded)
        return self.run_padded(padded, cancel=cancel)

    def _run_tiled(
        self,
        x: torch.Tensor,
        max_memory: int,
        *,
        labels: bool,
        cancel: threading.Event | None,
        nonfinite: str,
    ) -> torch.Tensor:
        max_memory = tiling.check_max_memory(max_memory)
        estimate = self.memory_estimate(x.shape, x.element_size(), labels=labels, train=self._trains(x))
        tile = tiling.choose_tile(x.shape, max_memory, estimate, labels=labels)
        # checks ``cancel`` before each layer of each tile; a tile's no-data pixels are found in its own window
        run = functools.partial(self._run, cancel=cancel, nonfinite=nonfinite)
        before, _ = dense_padding(self.patch_size, self.receptive_field)
        window_of = functools.partial(padded_window, x, before, padding_mode=self.padding_mode)
        return tiling.run_tiled(
            run, window_of, tuple(x.shape[2:]), tile, self.receptive_field, labels=labels,
            no_data=nonfinite == "propagate",
        )  # fmt: skip

    def memory_estimate(self, shape, itemsize: int, *, labels: bool, train: bool) -> tiling.MemoryEstimate:
        """Bytes a tiled call on (N, C, H, W) images of ``shape`` holds, and needs per output tile (from the layer
        shapes; see :mod:`densecnn.tiling`). ``labels``: only labels are kept; ``train``: under autograd."""
        n, c, *size = shape
        result = n * math.prod(size) * (8 if labels else self.num_classes * itemsize)

        def tile(tile_size: Size) -> int:
            layer_shape = (n, c, *(t + r - 1 for t, r in zip(tile_size, self.receptive_field)))
            sizes, scratch = [math.prod(layer_shape)], 0
            for layer in self.features:
                out_shape = output_shape(layer, layer_shape)
                scratch = max(scratch, _native_scratch_bytes(layer, layer_shape, out_shape, itemsize))
                layer_shape = out_shape
                sizes.append(math.prod(layer_shape))
            return tiling.tile_peak_bytes(sizes, itemsize, train=train) + scratch

        halo = tuple(r - 1 for r in self.receptive_field)
        return tiling.MemoryEstimate(held=result, tile=tile, halo=halo)

    def run_padded(
        self, padded: torch.Tensor, *, cancel: threading.Event | None = None, keep_layout: bool = False
    ) -> torch.Tensor:
        """Run the dense layers on an already padded (N, C, *(S+R-1)) input -> (N, K, *S); ``cancel`` as in
        :meth:`forward`. The scores are NC* in memory, or with ``keep_layout`` in the layout the plan computes in
        (channels-last for most plans on the CPU): what a loss reads without a transposing copy."""
        return self.plan(padded)(padded, cancel=cancel, keep_layout=keep_layout)

    def _trains(self, x: torch.Tensor) -> bool:
        return torch.is_grad_enabled() and (
            x.requires_grad or any(p.requires_grad for p in self.parameters())
        )

    def ops_config(self) -> OpsConfig:
        """The config this net's plans use: the process's (:func:`densecnn.ops.get_config`) with the net's
        ``solver``, ``memory_format`` and ``tune`` on top.

        >>> dense.solver = "native"
        >>> dense.ops_config().solver
        'native'
        """
        config = get_config()
        if not (self.solver or self.memory_format or self.tune):
            return config
        return config.replace(
            solver=self.solver or config.solver,
            memory_format=self.memory_format or config.memory_format,
            tune=self.tune or config.tune,
        )

    def steps(self) -> list[Step]:
        """The net's layers grouped as a plan runs them (:func:`densecnn.ops.plan.group_steps`), no solver chosen:
        each windowed layer, with the tanh/ReLU that follows a pool."""
        return group_steps(self.features, [fused_activation(layer) for layer in self.features])

    def plan(self, padded: torch.Tensor, *, keep: bool = True) -> Plan:
        """The solver plan for this input (made once per shape, dtype, device, direction and config, and kept);
        ``keep=False``: a plan made for this call only, predicted, never timed (the net and the tuning cache are left
        as they were)."""
        train = self._trains(padded)
        config = self.ops_config() if keep else self.ops_config().replace(tune=False)
        key = (
            tuple(padded.shape), padded.dtype, padded.device, train, padded.requires_grad, self.backend, config,
            ext_available(),
        )  # fmt: skip
        if keep and key in self._plans:
            self._plans.move_to_end(key)  # least recently used first: the first to go
            return self._plans[key]
        plan = make_plan(
            self.steps(),
            tuple(padded.shape),
            padded.dtype,
            padded.device,
            backend=self.backend,
            train=train,
            config=config,
            input_grad=padded.requires_grad,
        )
        if keep:
            self._plans[key] = plan
            while len(self._plans) > config.plan_cache_size:
                self._plans.popitem(last=False)
        return plan

    def _check_input(self, x: torch.Tensor) -> None:
        what, layout = _INPUTS[self.dims]
        if not isinstance(x, torch.Tensor):
            fix = "torch.from_numpy(x)" if isinstance(x, np.ndarray) else "torch.as_tensor(x)"
            raise InvalidTypeError(
                f"expected {what} as an {layout} torch tensor, got {type(x).__name__}; convert it with {fix}"
            )
        if x.is_meta:
            raise InvalidInputError(
                "x is on the meta device, which holds no values to score; move it to the CPU or a GPU"
            )
        if x.dim() != self.dims + 2:
            if x.dim() == self.dims + 1:
                fix = f"add the batch axis with x[None] (a single {what[:-1]})"
            else:
                fix = f"this model has {self.dims} spatial axis/axes (patch size {self.patch_size})"
            raise InvalidInputError(f"expected {what} as an {layout} tensor, got {tuple(x.shape)}; {fix}")
        if not x.is_floating_point():
            raise InvalidTypeError(
                f"expected a floating-point tensor, got {x.dtype}; convert it with x.float(), scaled and normalised "
                "as the model's training images were (a LoadedModel takes raw pixels as a numpy array and does both)"
            )
        weight = next(self.parameters(), None)
        if self.backend is Backend.NATIVE and weight is not None and x.dtype != weight.dtype:
            raise InvalidTypeError(
                f"backend='native' computes in the model's dtype ({weight.dtype}), the images are {x.dtype}; "
                f"convert them with x.to({weight.dtype}) or use backend='auto', which computes in the images' dtype"
            )
        if self.in_channels is not None and x.shape[1] != self.in_channels:
            raise InvalidInputError(
                f"the model takes {self.in_channels} input channels, the images have {x.shape[1]}: give images of "
                f"{self.in_channels} channel(s) (axis 1 of the (N, C, ...) input), or a model trained on "
                f"{x.shape[1]}-channel ones"
            )
        if min(x.shape[2:]) < 1:
            raise InvalidInputError(
                f"{what} must have at least 1 pixel per axis, got {'x'.join(map(str, x.shape[2:]))}"
            )

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
            f"padding_mode={self.padding_mode!r}, backend={self.backend.value!r}"
        )
