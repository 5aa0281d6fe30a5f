"""Whole-image training with masked errors: ``densecnn train``, ``python -m densecnn.train`` (torchrun), or
:func:`train` from Python.

>>> from densecnn.train import TrainConfig, train
>>> model_dir = train(TrainConfig(model="tiny", classes=3, data="data/toy/train", out="runs/toy", mask="random:64"))
>>> densecnn.load(model_dir)
"""

from ..errors import DatasetError, TrainingError
from .config import TrainConfig
from .loop import train

__all__ = ["DatasetError", "TrainConfig", "TrainingError", "train"]
