"""The model directories the widget offers before one is browsed for: those under ``models/`` of the source
checkout densecnn runs from (``nuclei``, ``nuclei3d``) and of the working directory (``densecnn serve``'s default).

>>> [path.name for path in shipped_models()]
['nuclei', 'nuclei3d']
"""

from __future__ import annotations

from pathlib import Path

from ..modelfile import CONFIG_FILE

CHECKOUT_MODELS = Path(__file__).resolve().parents[2] / "models"


def shipped_models() -> list[Path]:
    """Every directory holding a ``model.json`` directly under either ``models/``, by name, each once."""
    found = {}
    for root in (CHECKOUT_MODELS, Path.cwd() / "models"):
        for config in sorted(root.glob(f"*/{CONFIG_FILE}")) if root.is_dir() else []:
            found.setdefault(config.parent.resolve(), None)
    return list(found)
