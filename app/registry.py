"""The served models: every subdirectory of the model directory that holds a ``model.json``."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from densecnn import DenseCNN, LoadedModel, ModelFileError, load
from densecnn.modelfile import CONFIG_FILE

logger = logging.getLogger("densecnn.app")


@dataclass(frozen=True)
class ServedModel:
    """A loaded model and its dense net, ready for inference."""

    name: str
    loaded: LoadedModel
    dense: DenseCNN


def model_dirs(root: Path) -> list[Path]:
    """The model directories under ``root``, sorted by name."""
    return sorted(path.parent for path in root.glob(f"*/{CONFIG_FILE}"))


def load_models(root: Path, *, backend: str = "auto") -> dict[str, ServedModel]:
    """Load every model under ``root``; a broken one is logged and skipped; none at all is an error."""
    models, failures = {}, []
    for directory in model_dirs(root):
        try:
            loaded = load(directory)
            models[directory.name] = ServedModel(directory.name, loaded, loaded.dense(backend=backend))
        except (ModelFileError, ValueError) as exc:
            failures.append(f"{directory.name}: {exc}")
            logger.error("cannot load model %s: %s", directory, exc)
    if not models:
        why = "; ".join(failures) or f"no subdirectory of {root} holds a {CONFIG_FILE}"
        raise ModelFileError(f"no model could be loaded from {root} ({why})")
    logger.info("loaded models: %s", ", ".join(models))
    return models
