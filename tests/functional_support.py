"""A module that calls a given function on its input with the tensors it holds: the functional idioms the
converter reads (``F.linear(x, self.w, self.b)``, ``torch.addmm``, ``F.batch_norm``) written once per test."""

from __future__ import annotations

from torch import nn


class Functional(nn.Module):
    """A module holding its tensors and calling ``forward_fn(self, x)``."""

    def __init__(self, forward_fn, **tensors):
        super().__init__()
        self.forward_fn = forward_fn
        self.conv_out = nn.Identity()
        for name, tensor in tensors.items():
            if isinstance(tensor, nn.Parameter):
                self.register_parameter(name, tensor)
            elif isinstance(tensor, nn.Module):
                self.add_module(name, tensor)
            else:
                self.register_buffer(name, tensor)

    def forward(self, x):
        return self.forward_fn(self, x)
