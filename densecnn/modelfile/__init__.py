"""Model directories: ``model.json`` (the layer spec and metadata) and ``weights.safetensors``, read and written
without ever unpickling.

- :mod:`~densecnn.modelfile.directory`: :func:`save`, :func:`load` and :class:`LoadedModel`;
- :mod:`~densecnn.modelfile.spec`: the JSON layer spec <-> ``nn.Sequential``;
- :mod:`~densecnn.modelfile.format`: the schema of ``model.json`` and the layers it describes, built on the meta device;
- :mod:`~densecnn.modelfile.check`: a directory validated before any tensor is allocated;
- :mod:`~densecnn.modelfile.card`: the README.md model card.

>>> loaded = densecnn.modelfile.load("models/nuclei")
"""

from .directory import LoadedModel, default_palette, load, save
from .format import CONFIG_FILE, WEIGHTS_FILE

__all__ = ["CONFIG_FILE", "WEIGHTS_FILE", "LoadedModel", "default_palette", "load", "save"]
