"""What an output was computed from, recorded with it, so that a re-run resumes only work done by the same model
and options from the same input, and refuses the rest (``overwrite`` starts over).

- :func:`weights_digest` and :func:`config_digest`: the model, by content (a model retrained or edited in place is
  another model).
- :func:`~densecnn.io.identity.input_identity`: an input as stored, cheaply (one ``stat`` per file).
- :class:`ImageSetRecord`: a folder of label maps' record, the file :data:`RECORD_FILE` in the folder: the model,
  the options that change labels, and the identity of the image each map was made from.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ..atomic import atomic_write
from ..errors import Fix, PredictInputError
from ..io.identity import input_identity
from ..modelfile.format import CONFIG_FILE, WEIGHTS_FILE
from .options import BlockwiseOptions

RECORD_FILE = ".densecnn-labels.json"  # in a folder of label maps: what they were made from
START_OVER = Fix("remove them, choose another output, or start over", (("overwrite", ""),))
DIGESTS = {"weights": "the model's weights differ", "config": "the model's model.json differs"}


def file_digest(path: Path) -> str:
    """The SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_digest(model_dir: Path) -> str:
    """The SHA-256 of a model directory's weights file: what a resumed output must have been computed with."""
    return file_digest(Path(model_dir) / WEIGHTS_FILE)


def config_digest(model_dir: Path) -> str:
    """The SHA-256 of a model directory's ``model.json`` (its layers, normalisation and intensity scaling)."""
    return file_digest(Path(model_dir) / CONFIG_FILE)


@dataclass(frozen=True)
class ImageSetRecord:
    """What the label maps of a folder were made from: ``made_by`` (the model directory, its weights' and
    ``model.json``'s digests, the intensity scaling asked for: the option that changes labels; the non-finite policy
    does not, as a map is written only where the image has no NaN or where it is propagated) and ``images``, for each
    label map's file name the :func:`input_identity` of the image it was made from."""

    made_by: dict
    images: dict[str, dict]

    @classmethod
    def for_run(cls, model: str, images: list[Path], targets: list[Path], options: BlockwiseOptions):
        """The record of a run labelling ``images`` into ``targets`` with ``model`` and ``options``."""
        made_by = {
            "model": model, "weights": weights_digest(Path(model)), "config": config_digest(Path(model)),
            "intensity": None if options.intensity is None else str(options.intensity),
        }  # fmt: skip
        return cls(made_by, {t.name: input_identity(i) for i, t in zip(images, targets, strict=True)})

    @classmethod
    def read(cls, folder: Path) -> ImageSetRecord | None:
        """The record in ``folder``; None where there is none."""
        path = folder / RECORD_FILE
        if not path.exists():
            return None
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
            return cls(stored["made_by"], stored["images"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PredictInputError(
                f"{path}: the record of what the label maps beside it were made from is unreadable ({exc})",
                fix=START_OVER,
            ) from None

    def write(self, folder: Path) -> None:
        text = json.dumps({"made_by": self.made_by, "images": self.images}, indent=1)
        atomic_write(folder / RECORD_FILE, lambda tmp: tmp.write_text(text, encoding="utf-8"))

    def check_resumes(self, folder: Path, written: list[Path]) -> None:
        """Refuse to keep the label maps ``written`` (already in ``folder``) unless this run would make them as
        they are: recorded, by the same model and options, from images unchanged since.

        Raises:
            PredictInputError: naming the maps and what differs.
        """
        if not written:
            return
        stored = ImageSetRecord.read(folder)
        names = _some(t.name for t in written)
        if stored is None:
            raise PredictInputError(
                f"{folder} holds label maps ({names}) with no record of the model and options that made them",
                fix=START_OVER,
            )
        differences = _differences(stored.made_by, self.made_by)
        if differences:
            raise PredictInputError(
                f"{folder} holds label maps ({names}) made by another model or other options ({differences})",
                fix=START_OVER,
            )
        changed = [t.name for t in written if stored.images.get(t.name) != self.images[t.name]]
        if changed:
            raise PredictInputError(
                f"{folder} holds label maps ({_some(changed)}) not made from the images as they are now (an "
                "image changed since, or its map is not in the folder's record)",
                fix=START_OVER,
            )

    def merged_into(self, folder: Path) -> ImageSetRecord:
        """This record with the images of the one in ``folder`` that this run does not label."""
        stored = ImageSetRecord.read(folder)
        kept = {} if stored is None or stored.made_by != self.made_by else stored.images
        return ImageSetRecord(self.made_by, {**kept, **self.images})


def _differences(stored: dict, wanted: dict) -> str:
    """What differs between two records' ``made_by``, in words (digests are not shown)."""
    return "; ".join(
        DIGESTS.get(k, f"{k} {stored.get(k)!r} vs {v!r}") for k, v in wanted.items() if stored.get(k) != v
    )


def _some(names) -> str:
    """The first three names, and "..." if there are more."""
    names = list(names)
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
