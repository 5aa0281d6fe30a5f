"""The served models: every subdirectory of the model directory that holds a ``model.json``."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from densecnn import DenseCNN, DenseCNNError, LoadedModel, ModelFileError, load
from densecnn.modelfile import CONFIG_FILE

logger = logging.getLogger("densecnn.app")


@dataclass(frozen=True)
class ServedModel:
    """A loaded model and its dense net, ready for inference."""

    name: str
    loaded: LoadedModel
    dense: DenseCNN
    identity: str = ""  # the digest of its directory's files (path, size, mtime) when it was loaded


def model_identity(directory: Path) -> str:
    """The digest of a model directory's files as stored (a file replaced, added or deleted changes it)."""
    from densecnn.io.identity import input_identity

    return input_identity(directory)["digest"]


def load_model(directory: Path, *, backend: str = "auto") -> ServedModel:
    """The model in ``directory``, with the identity its files had before it was read (files changed while it
    loads give another identity at the next check, so it is loaded again)."""
    identity = model_identity(directory)
    loaded = load(directory)
    return ServedModel(directory.name, loaded, loaded.dense(backend=backend), identity)


def model_dirs(root: Path) -> list[Path]:
    """The model directories under ``root``, sorted by name."""
    return sorted(path.parent for path in root.glob(f"*/{CONFIG_FILE}"))


def load_models(
    root: Path, *, backend: str = "auto", warm_sizes: list[list[int]] = (), max_memory: int | None = None
) -> dict[str, ServedModel]:
    """Load every model under ``root``, each warmed (:func:`warm_model`); a broken one is logged and skipped; none
    at all is an error."""
    models, failures = {}, []
    for directory in model_dirs(root):
        try:
            models[directory.name] = load_model(directory, backend=backend)
        except DenseCNNError as exc:
            failures.append(f"{directory.name}: {exc}")
            logger.error("cannot load model %s: %s", directory, exc)
    for served in models.values():
        warm_model(served, warm_sizes, max_memory=max_memory)
    if not models:
        why = "; ".join(failures) or f"no subdirectory of {root} holds a {CONFIG_FILE}"
        raise ModelFileError(f"no model could be loaded from {root} ({why})")
    logger.info("loaded models: %s", ", ".join(models))
    return models


def warm_model(served: ServedModel, warm_sizes: list[list[int]], *, max_memory: int | None) -> None:
    """Run ``served`` once on zeros of every size in ``warm_sizes`` with as many axes as it has (under the
    inference memory cap ``max_memory``, so its tile shape is the one requests will use): its plans and torch's
    first-call work are done before a request needs them. A size that cannot be warmed is logged and skipped."""
    for size in warm_sizes:
        if len(size) != served.dense.dims:
            continue
        try:
            served.dense.warm((1, served.loaded.in_channels, *size), max_memory=max_memory)
            logger.info("warmed model %s for size %s", served.name, "x".join(map(str, size)))
        except DenseCNNError as exc:  # e.g. the size does not fit max_memory: requests of it get 413 anyway
            logger.warning("cannot warm model %s for size %s: %s", served.name, size, exc)
