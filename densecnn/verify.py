"""The verification pass: after conversion, the dense net and the patch model must agree on a few patches of a small
random input, or the conversion raises naming the first layer whose outputs differ.

The rules make each layer exact, and the chain reader refuses what it cannot read; this pass catches what nobody
thought of (an idiom that changes what a model computes without showing in its layers). It costs one dense pass
over a map a few pixels larger than the receptive field and one patch-model pass over a few patches, in the model's
dtype and on its device, with the model and the dense net in eval mode (their modes are restored after).

On a mismatch it compares layer by layer, as one debugs a converted engine against its source: first the layers as
densecnn read them against the model's own calls (an operation the chain reader did not see), then each dense layer,
run with torch's own ops, against its patch layer at the positions it stands for (a rule that is not exact), then the
planned kernels against torch's ops.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from torch import nn

from .errors import ConversionError, DenseCNNError, ModelOverflowError
from .ops.precision import full_float32
from .rules import LayerRecord

# max |dense - patch model| <= TOLERANCE · max(max |patch model|, 1): the rounding bound of the equivalence guarantee
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 5e-2}
OUTPUTS_PER_AXIS = {
    1: 4,
    2: 2,
    3: 2,
}  # outputs per axis near the map's start (two per axis: a transposed map shows)
_SEED = 0  # a private generator: the pass never draws from the caller's random stream


@dataclass(frozen=True)
class ConvertedLayer:
    """One layer of the patch model's chain, what it became, and the patch net's map after it.

    Attributes:
        path, module: the layer as the chain reader found it.
        record: the layer record whose rule converted it.
        dense: the dense layer it became (None: dropped, as a Flatten or Identity).
        size: the patch net's map size after the layer, one entry per spatial axis (ones once it is a point).
        dilation: the spacing, in input pixels, of that map's positions in the dense net.
        flat_map: (C, *size) once the patch tensor is flattened, else None.
    """

    path: str
    module: nn.Module
    record: LayerRecord
    dense: nn.Module | None
    size: tuple[int, ...]
    dilation: tuple[int, ...]
    flat_map: tuple[int | None, ...] | None


def verify_conversion(model: nn.Module, dense: nn.Module, layers: list[ConvertedLayer]) -> None:
    """Raise :class:`ConversionError` unless ``dense`` reproduces ``model`` on a few random patches; ``layers`` are
    the chain's layers as :func:`densecnn.convert` converted them (it calls this unless ``verify=False``).

    >>> densecnn.register_rule(SpatialCentring)  # as pointwise, wrongly: it subtracts each channel's spatial mean
    >>> densecnn.convert(nn.Sequential(nn.Conv2d(1, 2, 3), SpatialCentring(), nn.Conv2d(2, 2, 3)), 5)
    Traceback (most recent call last):
    ConversionError: verification failed: ... The first layer whose output differs is '1' (SpatialCentring, ...
    """
    weight = next((t for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()), None)
    dtype = weight.dtype if weight is not None else torch.get_default_dtype()
    device = weight.device if weight is not None else torch.device("cpu")
    if device.type == "meta" or dtype not in TOLERANCE:
        return  # shapes only (a model file being checked), or a dtype with no stated bound
    with torch.no_grad(), _eval_mode(model, dense), full_float32(device):  # no TF32 in either net
        check = _Check(model, dense, layers, dtype, device)
        try:
            scores = check.dense_scores()
        except DenseCNNError:
            raise
        except Exception as exc:  # a solver or a user's dense layer failing on the check's input
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConversionError(
                f"verification could not run the dense net on a small {dtype} input ({type(exc).__name__}: "
                f"{reason}). Convert with backend='native' (torch's own ops); if that fails too, a layer's rule "
                "returns a dense layer that cannot run: correct the rule you registered, or report it as a densecnn "
                "bug"
            ) from None
        error = check.error(scores, check.expected)
        if error is not None:
            raise (ModelOverflowError if check.overflowed else ConversionError)(check.diagnose(error))


@contextlib.contextmanager
def _eval_mode(*nets: nn.Module):
    """Every module of ``nets`` in eval mode inside the block, each back in its own mode after."""
    modes = {module: module.training for net in nets for module in net.modules()}
    try:
        for module in modes:
            module.training = False
        yield
    finally:
        for module, training in modes.items():
            module.training = training


class _Check:
    """The random input, its patches and the model's scores for them; the comparisons made on a mismatch.

    The map holds :data:`OUTPUTS_PER_AXIS` outputs per axis, and along the last axis a patch size more: the dense net
    runs on a map about two patches wide there (a layer whose result depends on the map's size shows), and the model
    on the patches of the first output, of its neighbour along each axis (a transposed map shows; the first four
    for signals) and of the last output of the wide axis: 4 patches for images, 5 for signals and volumes.
    """

    def __init__(self, model, dense, layers, dtype: torch.dtype, device: torch.device):
        self.model, self.dense, self.layers, self.dtype = model, dense, layers, dtype
        first = OUTPUTS_PER_AXIS[dense.dims]
        wide = first + dense.patch_size[-1]  # outputs along the last axis: the image is ~2 patches wide
        self.outputs = (first,) * (dense.dims - 1) + (wide,)
        if dense.dims == 1:
            near = torch.arange(first).view(-1, 1)  # (4, 1)
        else:  # the first output and its neighbour along each axis: a transposed map shows
            near = torch.cat(
                [torch.zeros(1, dense.dims, dtype=torch.long), torch.eye(dense.dims, dtype=torch.long)]
            )
        far = torch.zeros(1, dense.dims, dtype=torch.long)
        far[0, -1] = wide - 1  # the last output of the wide axis, far from the map's start
        self.positions = torch.cat([near, far])  # (B, dims): the output pixels compared, in row-major order
        channels = dense.in_channels or 1
        generator = torch.Generator().manual_seed(_SEED)
        # (1, C, *(s + P - 1)): every patch whole; the dense net reads the first s + R - 1 samples per axis
        size = tuple(s + p - 1 for s, p in zip(self.outputs, dense.patch_size))
        self.image = torch.randn((1, channels, *size), generator=generator, dtype=torch.float64)
        self.image = self.image.to(dtype=dtype, device=device)
        self.padded = self.image[
            (..., *(slice(0, s + r - 1) for s, r in zip(self.outputs, dense.receptive_field)))
        ]
        self.patches = torch.stack(
            [
                self.image[(0, slice(None), *(slice(i, i + p) for i, p in zip(position, dense.patch_size)))]
                for position in self.positions.tolist()
            ]
        )  # (B, C, *P)
        try:
            scores = model(self.patches)
        except (RuntimeError, TypeError, ValueError) as exc:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConversionError(
                f"verification could not run the model on a batch of {len(self.patches)} patches of size "
                f"{'x'.join(map(str, dense.patch_size))} ({reason}). Pass verify=False only if the model cannot "
                "take a batch of patches"
            ) from None
        if not isinstance(scores, torch.Tensor) or scores.shape[0] != len(self.patches):
            raise ConversionError(
                f"the model maps a batch of {len(self.patches)} patches to "
                f"{tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__}, not one score "
                "vector per patch; its forward must return a (B, K) tensor"
            )
        self.expected = scores.reshape(len(self.patches), -1)  # (B, K)

    def dense_scores(self) -> torch.Tensor:
        """The dense net's scores at the patches' pixels, (B, K), by the solvers a call would choose (predicted, never
        timed, and the plan not kept: the pass leaves no trace in the net or the tuning cache)."""
        scores = self.dense.plan(self.padded, keep=False)(self.padded)  # (1, K, *s)
        return scores[(0, slice(None), *self.positions.T)].T  # (B, K)

    def error(self, actual: torch.Tensor, expected: torch.Tensor) -> float | None:
        """The relative error if it exceeds the rounding bound (or the shapes differ), else None."""
        if actual.shape != expected.shape:
            return math.inf
        if actual.numel() == 0:
            return None
        # equal values (infinities of one sign included: their difference would be NaN) and NaN in both agree
        same = (actual == expected) | (actual.isnan() & expected.isnan())
        difference = torch.where(same, 0, (actual - expected).abs()).max().item()
        finite = expected[expected.isfinite()]
        scale = max(finite.abs().max().item() if finite.numel() else 0.0, 1.0)
        error = difference / scale
        return None if error <= TOLERANCE[self.dtype] else (math.inf if math.isnan(error) else error)

    @property
    def overflowed(self) -> bool:
        """Whether the model itself scores some patch NaN or ±Inf (its weights or activations overflow)."""
        return not bool(self.expected.isfinite().all())

    def diagnose(self, total: float) -> str:
        summary = (
            f"verification failed: the dense net and the model disagree on random patches (relative error "
            f"{total:.3g}, bound {TOLERANCE[self.dtype]:g})"
        )
        if self.overflowed:
            overflowed = (~self.expected.isfinite()).any(
                1
            )  # (B,) patches the model itself scores NaN or ±Inf
            return (
                f"{summary}. The model's own scores are NaN or ±Inf on {int(overflowed.sum())} of "
                f"{len(overflowed)} random patches: its weights or activations overflow the {str(self.dtype).removeprefix('torch.')} range, so "
                "they label nothing and no dense net can be checked against them. Check the weights (a diverged "
                "training run leaves them huge) and retrain or rescale them"
            )
        chain_outputs = self._run_chain()
        mismatch = self.error(chain_outputs[-1].reshape(len(self.patches), -1), self.expected)
        if mismatch is not None:
            return f"{summary}. {self._locate_in_model(chain_outputs)}"
        return f"{summary}. {self._locate_in_dense(chain_outputs)}"

    def _run_chain(self) -> list[torch.Tensor]:
        """The patches through the layers as densecnn read them, one output per layer."""
        outputs, x = [], self.patches
        for layer in self.layers:
            x = layer.module(x)
            outputs.append(x)
        return outputs

    def _locate_in_model(self, chain_outputs: list[torch.Tensor]) -> str:
        """Where the model's own calls of its layers first differ from the chain read."""
        calls: dict[nn.Module, list[torch.Tensor]] = {}

        def record(module, inputs, output):
            calls.setdefault(module, []).append(output)

        modules = {layer.module for layer in self.layers}
        handles = [module.register_forward_hook(record) for module in modules]
        try:
            self.model(self.patches)
        finally:
            for handle in handles:
                handle.remove()
        uses: dict[nn.Module, int] = {}
        submodules = set(self.model.modules())
        for layer, output in zip(self.layers, chain_outputs):
            if layer.module not in submodules:
                continue  # a functional op's stand-in: the model never calls it as a module
            use = uses.get(layer.module, 0)
            uses[layer.module] = use + 1
            called = calls.get(layer.module, [])
            if use >= len(called):
                return (
                    f"The model's forward calls layer {layer.path!r} ({type(layer.module).__name__}) fewer times "
                    "than densecnn read it. Write the model as an nn.Sequential of the layers it runs"
                )
            if self.error(called[use], output) is not None:
                return (
                    f"The first layer whose output differs is {layer.path!r} ({type(layer.module).__name__}): the "
                    "model's forward computes something there that densecnn does not see (an operation between "
                    "layers, a module called other than as read). Write the model as an nn.Sequential of layers "
                    "densecnn converts, or register a rule for the layer that does it"
                )
        return (
            "The layers as densecnn read them agree with the model's calls of them, but the model's output differs: "
            "its forward changes the last layer's output. Write the model as an nn.Sequential of layers densecnn "
            "converts"
        )

    def _locate_in_dense(self, chain_outputs: list[torch.Tensor]) -> str:
        """The first dense layer, run with torch's ops, whose map differs from its patch layer's."""
        x = self.padded
        for layer, expected in zip(self.layers, chain_outputs):
            if layer.dense is None:
                continue
            x = layer.dense(x)
            channels, extra = divmod(expected.numel(), len(self.patches) * math.prod(layer.size))
            if channels == 0 or extra:
                return (
                    f"The first layer whose output differs is {layer.path!r} ({type(layer.module).__name__}): the "
                    f"patch model's map there has shape {tuple(expected.shape[1:])}, not the size "
                    f"{'x'.join(map(str, layer.size))} its conversion rule ({layer.record.name}) gave it, so the rule "
                    "is not exact for this layer. If you registered that rule, "
                    "correct it or remove it; otherwise report this as a densecnn bug"
                )
            expected = expected.reshape(len(self.patches), channels, *layer.size)  # (B, C, *size)
            actual, expected = self._at_patch_positions(x, expected, layer.dilation)
            error = self.error(actual, expected)
            if error is not None:
                return (
                    f"The first layer whose output differs is {layer.path!r} ({type(layer.module).__name__}, "
                    f"relative error {error:.3g}): its conversion rule ({layer.record.name}) is not exact for this "
                    "layer. If you registered that rule, correct it or remove it; otherwise report this as a "
                    "densecnn bug"
                )
        return (
            "Every dense layer agrees with its patch layer when run with torch's own ops, but the planned kernels do "
            "not: please report this as a densecnn bug; backend='native' avoids densecnn's kernels meanwhile"
        )

    def _at_patch_positions(
        self, dense_map: torch.Tensor, patch_maps: torch.Tensor, dilation: tuple[int, ...]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(1, C, *M) dense map and (B, C, *size) patch maps -> the same positions of both, (B, C, *n) each.

        Position j of the map of the patch whose pixel is p lies at p + j·dilation in the dense map; positions that
        the net never reads past (a pool floors them away) lie beyond the dense map and are left out.
        """
        last = self.positions.max(0).values.tolist()  # the farthest position per axis
        counts = [
            min(n, (m - 1 - p) // d + 1 if m > p else 0)
            for n, m, p, d in zip(patch_maps.shape[2:], dense_map.shape[2:], last, dilation)
        ]
        dense_at = [
            dense_map[
                (
                    0,
                    slice(None),
                    *(slice(p, p + (n - 1) * d + 1, d) for p, n, d in zip(pixel, counts, dilation)),
                )
            ]
            for pixel in self.positions.tolist()
        ]
        patch_at = patch_maps[(slice(None), slice(None), *(slice(0, n) for n in counts))]
        return torch.stack(dense_at), patch_at
