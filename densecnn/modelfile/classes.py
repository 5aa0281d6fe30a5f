"""What a model labels, read from its ``model.json`` alone: class names, palette and label dtype, without building
the layers or reading a weight (for writing label images: a job's PNG, an OME-Zarr label image's colours).

>>> classes = read_classes("models/nuclei")
>>> classes.num_classes, classes.label_dtype
(2, dtype('uint8'))
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..io.labels import label_dtype
from .format import CONFIG_FILE, file_error, parse_config


@dataclass(frozen=True)
class ModelClasses:
    """A model's classes: ``class_names`` and ``palette`` (one RGB colour, 0-255, per class) as saved."""

    class_names: tuple[str, ...]
    palette: tuple[tuple[int, int, int], ...]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def label_dtype(self) -> np.dtype:
        """The dtype of the model's label maps: uint8 up to 255 classes, uint16 past that (the type's maximum is the no-data value)."""
        return label_dtype(self.num_classes)


def read_classes(path: str | Path) -> ModelClasses:
    """The classes of the model directory ``path``, from its ``model.json`` (validated as :func:`load` does).

    Raises:
        ModelFileError: the directory or its ``model.json`` is not a model's.
    """
    config_path = Path(path) / CONFIG_FILE
    try:
        text = config_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise file_error(
            config_path, None, f"cannot be read ({exc})", "give a model directory written by densecnn.save"
        ) from None
    config = parse_config(text, where=config_path)
    return ModelClasses(tuple(config.class_names), tuple(tuple(colour) for colour in config.palette))
