"""A run whose loss or weights become NaN/±Inf stops at that step, keeping the last weights whose loss was finite.

A learning rate too high for the data blows the weights up: a step's update makes them huge (still finite), the next
forward pass overflows and its loss is NaN, and every update after it fills the weights with NaN, whose dense net
labels every pixel no-data. Each step therefore checks its loss before its update and the weights after it
(:class:`LastFinite`), and on the first non-finite value puts back the last weights whose loss was finite and raises
:class:`Diverged` naming the step. The loops (:mod:`densecnn.train.loop`, :mod:`densecnn.train.strokes`) then write
those weights as the model, as on any error mid-step, and say so.

>>> kept = LastFinite(model.parameters())
>>> kept.update(loss, float(loss), optimizer)  # backward and step, or Diverged with the weights put back
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from ..errors import TrainingError
from ..ops.precision import full_float32


class Diverged(TrainingError):
    """A step's loss or the weights after its update are NaN/±Inf; the weights are back at the last finite ones.

    Attributes:
        what: what was not finite, in words (``"the loss is nan"``).
        rewound: completed steps whose updates were undone (1: the loss of the weights of the last step was not
            finite, so the weights before that step's update are kept; 0: the weights are those of the last step).
        kept_finite: whether the weights kept gave a finite loss (False: the loss of the weights the run started
            from, or resumed with, is not finite; there are no finite ones to keep).
    """

    def __init__(self, what: str, rewound: int, kept_finite: bool):
        super().__init__(what)
        self.what, self.rewound, self.kept_finite = what, rewound, kept_finite


class LastFinite:
    """The trained parameters' values before the latest update (a copy, allocated once), to put back when the loss
    or the update turns out not finite."""

    def __init__(self, parameters: Iterable[nn.Parameter]):
        self.parameters = [p for p in parameters if p.is_floating_point()]
        self._copies: list[torch.Tensor] | None = None

    @property
    def held(self) -> bool:
        """Whether a copy was kept (none before the first update)."""
        return self._copies is not None

    def update(self, loss: torch.Tensor, loss_value: float, optimizer: torch.optim.Optimizer) -> None:
        """One update from ``loss`` (``loss_value``: the loss whose finiteness decides, e.g. all-reduced), guarded:
        a non-finite ``loss_value`` came from the weights of the previous update, which are put back; weights the
        update makes non-finite are put back to those before it.

        Raises:
            Diverged: either case, the weights already put back.
        """
        if not math.isfinite(loss_value):
            rewound = self.restore()
            raise Diverged(f"its loss is {loss_value}", rewound=rewound, kept_finite=rewound > 0)
        self.keep()
        optimizer.zero_grad(set_to_none=True)
        with full_float32(loss.device):  # torch's conv gradients without TF32 on a GPU
            loss.backward()
        optimizer.step()
        if not self.finite():  # the same on every process under DDP: it averaged the gradients
            self.restore()
            raise Diverged("its update made the weights NaN or infinite", rewound=0, kept_finite=True)

    @torch.no_grad()
    def keep(self) -> None:
        """Copy the parameters' current values (before an update whose loss is finite)."""
        if self._copies is None:
            self._copies = [p.detach().clone() for p in self.parameters]
        else:
            for copy, p in zip(self._copies, self.parameters, strict=True):
                copy.copy_(p)

    @torch.no_grad()
    def restore(self) -> int:
        """Put the kept values back into the parameters; 1 if there were some, 0 if none was kept yet."""
        if self._copies is None:
            return 0
        for copy, p in zip(self._copies, self.parameters, strict=True):
            p.copy_(copy)
        return 1

    @torch.no_grad()
    def finite(self) -> bool:
        """Whether every parameter holds finite values: one sum of the sums (NaN and ±Inf make it non-finite; a sum
        that overflows on finite values is settled tensor by tensor)."""
        if not self.parameters:
            return True
        total = torch.stack([p.detach().sum(dtype=torch.float32) for p in self.parameters]).sum()
        return bool(torch.isfinite(total)) or all(bool(torch.isfinite(p).all()) for p in self.parameters)
