"""Model directories: ``model.json`` (the layer spec and metadata) and ``weights.safetensors``, read and written
without ever unpickling.

- :mod:`~densecnn.modelfile.directory`: :func:`save`, :func:`load` and :class:`LoadedModel` (the façade every front
  end labels through: ``input``, ``labels``, ``probabilities``, ``label_dtype``);
- :mod:`~densecnn.modelfile.classes`: :func:`read_classes`, a model's classes and palette without its weights;
- :mod:`~densecnn.modelfile.spec`: the JSON layer spec <-> ``nn.Sequential``;
- :mod:`~densecnn.modelfile.format`: the schema of ``model.json`` and the layers it describes, built on the meta device;
- :mod:`~densecnn.modelfile.check`: a directory validated before any tensor is allocated;
- :mod:`~densecnn.modelfile.card`: the README.md model card.

>>> loaded = densecnn.modelfile.load("models/nuclei")
"""

from .classes import ModelClasses, read_classes
from .directory import LoadedModel, default_palette, load, save
from .format import CONFIG_FILE, WEIGHTS_FILE

__all__ = [
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "LoadedModel",
    "ModelClasses",
    "default_palette",
    "load",
    "read_classes",
    "save",
]
