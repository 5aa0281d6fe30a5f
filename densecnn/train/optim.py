"""The optimisers and learning-rate schedules a run can choose: one registry each, read by the CLI's choices."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

# name -> builder(parameters, lr, momentum, weight_decay); momentum is SGD's only
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": lambda parameters, lr, momentum, weight_decay: torch.optim.SGD(
        parameters, lr=lr, momentum=momentum, weight_decay=weight_decay
    ),
    "adamw": lambda parameters, lr, momentum, weight_decay: torch.optim.AdamW(
        parameters, lr=lr, weight_decay=weight_decay
    ),
}

# name -> builder(optimizer, total_steps): the learning rate over the run
SCHEDULES: dict[str, Callable[[torch.optim.Optimizer, int], torch.optim.lr_scheduler.LRScheduler]] = {
    "cosine": lambda optimizer, total_steps: torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=total_steps
    ),
    "constant": lambda optimizer, total_steps: torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
}


def build_optimizer(
    parameters: Iterable[nn.Parameter], config, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """The optimiser and schedule ``config`` (a :class:`~densecnn.train.TrainConfig`) names, over ``total_steps``.

    >>> optimizer, scheduler = build_optimizer(model.parameters(), TrainConfig(..., optimizer="sgd"), 100)
    """
    optimizer = OPTIMIZERS[config.optimizer](
        list(parameters), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
    )
    return optimizer, SCHEDULES[config.schedule](optimizer, total_steps)
