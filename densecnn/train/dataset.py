"""Reading a training dataset: ``images/``, ``labels/`` and optional ``masks/``, checked file by file.

Layout::

    DIR/images/NAME.png|.tif|.tiff|.jpg|...   the images (any size; gray or RGB, converted to the model's channels),
                .svs|.ndpi|...|.zarr          or whole slides and zarr / OME-Zarr arrays, read by windows (below)
    DIR/labels/NAME.png|.tif|.tiff            class-id maps, same height and width: 0..K-1, 255 = ignore
    DIR/masks/NAME.png|.tif|.tiff             optional: nonzero where labels count (others are ignored)
    DIR/annotations/NAME.geojson              instead of a label file: GeoJSON annotations (QuPath, napari),
                                              rasterised to sparse labels (:mod:`densecnn.io.annotations`); for
                                              2-D images only (a volume's or signal's labels are a label file)
    DIR/classes.json (or DIR/../classes.json) optional, UTF-8: {"names": [...], "palette": [[r, g, b], ...],
                                              "unlabelled": V}; names are read in Unicode NFC

Sparse labels (strokes, points, outlined regions): the label files' value V (``"unlabelled"`` in classes.json, or
``densecnn train --unlabelled V``) marks unlabelled pixels; with V = 0 (napari's "not painted") the ids 1..K mean
classes 0..K-1. 255 always means unlabelled, and a value beyond the classes is refused (a 16-bit 256 is never
shifted onto 255). Annotation classes are matched to classes.json's names (without one,
the classes are the annotations' names in order of appearance).

For a model of volumes the files are TIFF stacks, .npy or .zarr arrays ((D, H, W), or (C, D, H, W) for images;
read by :func:`densecnn.io.open_lazy_array`), for a model of signals .npy arrays ((L,) or (C, L)); labels and masks have
the image's spatial shape.

A large 2-D image (a whole slide, a zarr array, a TIFF above 64 Mpixel) is never read whole: each cluster of its
annotations or labelled pixels becomes one sample, a window around it (:mod:`densecnn.train.windows`); its label
and mask files may be TIFF, zarr or .npy arrays, read by windows too, their values read as a whole label file's
(:func:`~densecnn.train.windows.class_targets`).

Every problem raises :class:`DatasetError` naming the file and the fix.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from ..errors import DatasetError, DenseCNNError, Fix, ImageReadError, IntensityError, NonFiniteInputError
from ..io import (
    Intensity,
    LazyArray,
    array_scaling,
    decode_array,
    image_scaling,
    open_lazy_array,
    read_header,
    unit_planes,
)
from ..io.annotations import IGNORED_CLASS_PREFIX, class_names_of, rasterize, read_geojson
from ..io.formats import ARRAY_SUFFIXES, IMAGE_SUFFIXES, LABEL_IMAGE_SUFFIXES, TIFF_SUFFIXES
from ..io.slides import SLIDE_SUFFIXES
from ..io.utf8 import utf8_text
from ..losses import IGNORE_INDEX
from .config import TrainConfig
from .windows import (
    BEYOND_CLASSES_HINT,
    LARGE_LABEL_SUFFIXES,
    WindowPlan,
    check_window_budget,
    class_targets,
    is_large,
    open_windowed,
    plan_windows,
    stored_class_map,
    window_margin,
)

ANNOTATIONS = "annotations"  # the folder of GeoJSON annotation files beside images/
# a map's spatial axes, for messages
_AXES = {1: "(L)", 2: "(H, W)", 3: "(D, H, W)"}
# what a model of 1 or 3 spatial axes takes, for messages
_KINDS = {1: ("signals", ".npy arrays (L,) or (C, L)"), 3: ("volumes", "TIFF stacks, .npy or .zarr arrays")}
DEFAULT_WINDOW_MARGIN = window_margin((49, 49))  # windows' margin for the default net's patch (filter_bank's)


@dataclass
class Sample:
    """One training image: ``image`` (C, H, W) float32 in [0, 1], ``labels`` (H, W) int64 (255 = ignore); for
    signals and volumes ``image`` (C, *spatial) and ``labels`` (*spatial). A window of a large image has the
    ``offset`` (row, column) of its first pixel in the image; a whole image None."""

    name: str
    image: np.ndarray
    labels: np.ndarray
    offset: tuple[int, int] | None = None


@dataclass
class ClassInfo:
    names: list[str] | None = None
    palette: list[list[int]] | None = None
    unlabelled: int | None = None  # the label files' value of unlabelled pixels
    path: Path | None = None  # the classes.json read (None: the names, if any, are the annotations')


def image_files(directory: str | Path, spatial_dims: int = 2) -> list[Path]:
    """The images of a dataset directory (signals or volumes for ``spatial_dims`` 1 or 3), sorted by name."""
    folder = Path(directory) / "images"
    if not folder.is_dir():
        raise DatasetError(
            f"{directory}: no images/ folder (a dataset has images/ and labels/ with matching names)"
        )
    suffixes = _image_suffixes(spatial_dims)
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in suffixes)
    flat = sorted(
        p.name for p in folder.iterdir() if p.suffix.lower() in _image_suffixes(2) and p not in files
    )
    if flat:  # 2-D images in a dataset of signals or volumes (in one of images, every file is one)
        kind, forms = _KINDS[spatial_dims]
        shown = f"{', '.join(flat[:3])}{' ...' if len(flat) > 3 else ''} are 2-D images"
        if not files:
            raise DatasetError(
                f"{folder}: {shown}, and the model takes {kind} ({forms}); train a 2-D model on them (a zoo name for "
                f"images, or a 2-D model directory), or give a dataset of {kind}"
            )
        raise DatasetError(  # never skipped unsaid
            f"{folder}: {shown}, and the run trains on {kind} ({files[0].name}); a dataset holds one kind: move them "
            "to a dataset of their own"
        )
    if not files:
        raise DatasetError(f"{folder}: no images found (looked for {', '.join(suffixes)})")
    by_name: dict[str, list[str]] = {}
    for path in files:
        by_name.setdefault(path.stem, []).append(path.name)
    shared = [names for names in by_name.values() if len(names) > 1]
    if shared:  # labels/NAME.* would label both: never trained twice unsaid
        raise DatasetError(
            f"{folder}: {' and '.join(shared[0])} share the name {Path(shared[0][0]).stem!r}, and a label file is "
            "matched to its image by name: rename one (and give it its own labels), or move it out"
        )
    return files


def infer_channels(directory: str | Path, spatial_dims: int = 2) -> int:
    """The input channels of a fresh model: 1 when every image is gray, 3 when any is colour (gray images are then
    read as colour, their three channels equal); for signals and volumes the first array's channel axis (1 without
    one). Images of other channel counts (a TIFF's channels that are not alpha) must all have the same count, which
    is the model's."""
    files = image_files(directory, spatial_dims)
    if spatial_dims != 2:
        return _open_nd(files[0], spatial_dims).channels
    found = {path: _image_channels(path) for path in files}
    counts = set(found.values())
    if counts <= {1, 3} or len(counts) == 1:
        return max(counts)
    examples = {c: next(p.name for p, k in found.items() if k == c) for c in sorted(counts)}
    raise DatasetError(
        f"{Path(directory) / 'images'}: images of {' and '.join(map(str, sorted(counts)))} channels "
        f"({', '.join(f'{name}: {c}' for c, name in examples.items())}); give every image the same channels "
        "(or give the model's with --channels)"
    )


def _image_channels(path: Path) -> int:
    """A 2-D image's channels as training reads it: 1 for gray, 3 for colour (alpha dropped), else the count."""
    if is_large(path):
        samples = open_windowed(path).channels
    else:
        try:
            header = read_header(path)  # from the header: nothing decoded
        except ImageReadError as exc:
            raise DatasetError(str(exc)) from None
        samples = header.samples
        if samples in (2, 4) and not header.alpha:  # a TIFF's channels, none of them alpha
            return samples
    return 1 if samples in (1, 2) else 3 if samples in (3, 4) else samples


def read_class_info(directory: str | Path) -> ClassInfo:
    """Class names and palette from ``classes.json`` in the dataset directory or its parent, if there is one."""
    for candidate in (Path(directory) / "classes.json", Path(directory).parent / "classes.json"):
        if candidate.is_file():
            try:
                info = json.loads(_utf8_text(candidate))
                unlabelled = info.get("unlabelled")
                names, palette = info.get("names"), info.get("palette")
            except (json.JSONDecodeError, AttributeError) as exc:
                raise DatasetError(f"{candidate}: not a JSON object with names/palette ({exc})") from None
            if isinstance(names, list):  # one spelling of each name, whatever the editor wrote (macOS: NFD)
                names = [unicodedata.normalize("NFC", n) if isinstance(n, str) else n for n in names]
            if unlabelled is not None and (isinstance(unlabelled, bool) or not isinstance(unlabelled, int)):
                raise DatasetError(
                    f'{candidate}: unlabelled must be an integer label value (e.g. 0 for napari\'s "not painted"), '
                    f"got {json.dumps(unlabelled)}"
                )
            _check_names(candidate, names)
            _check_palette(candidate, palette, names)
            return ClassInfo(names=names, palette=palette, unlabelled=unlabelled, path=candidate)
    names, colours = _annotation_classes(Path(directory))
    palette = [list(colours[n]) for n in names] if names and all(n in colours for n in names) else None
    return ClassInfo(names=names or None, palette=palette)


def _utf8_text(path: Path) -> str:
    """The text of the JSON file ``path``, read as UTF-8 (JSON's encoding, RFC 8259; a byte-order mark skipped)
    whatever the locale; another encoding refused, naming the file and the fix."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read it ({exc.strerror or exc}); make it readable") from None
    return utf8_text(data, str(path))


def _check_names(path: Path, names) -> None:
    """classes.json's names: a list of 2 or more distinct, non-empty strings (or absent)."""
    if names is None:
        return
    if not isinstance(names, list) or not all(isinstance(n, str) and n.strip() for n in names):
        raise DatasetError(
            f"{path}: names must be a list of class names, one non-empty string per class "
            f'(e.g. ["background", "cell"]), got {json.dumps(names)}'
        )
    if len(names) < 2:
        raise DatasetError(
            f"{path}: names lists {len(names)} class(es); a model tells at least 2 classes apart: name every class "
            '(e.g. ["background", "cell"])'
        )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise DatasetError(
            f"{path}: names repeats {', '.join(map(repr, repeated))}; give each class its own name"
        )


def _check_palette(path: Path, palette, names) -> None:
    """classes.json's palette: one [r, g, b] of integers in 0..255 per name (or absent)."""
    if palette is None:
        return
    if not isinstance(palette, list):
        raise DatasetError(f"{path}: palette must be a list of [r, g, b] colours, got {json.dumps(palette)}")
    for k, colour in enumerate(palette):
        if (
            not isinstance(colour, list)
            or len(colour) != 3
            or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255 for v in colour)
        ):
            raise DatasetError(
                f"{path}: palette[{k}] must be [r, g, b] with integers in 0..255, got {json.dumps(colour)}"
            )
    if names is not None and len(palette) != len(names):
        raise DatasetError(
            f"{path}: palette has {len(palette)} colours for {len(names)} names; give one [r, g, b] per class, "
            "or leave the palette out for the default colours"
        )


def _annotation_classes(directory: Path) -> tuple[list[str], dict[str, tuple[int, int, int]]]:
    """The classes the dataset's GeoJSON annotations name, in order of appearance (none without annotations), and
    the colour each is first given (QuPath's classification colours, the model's palette when every class has one)."""
    names: list[str] = []
    colours: dict[str, tuple[int, int, int]] = {}
    folder = directory / ANNOTATIONS
    for path in sorted(folder.glob("*.geojson")) if folder.is_dir() else []:
        annotations = read_geojson(path)
        names += [n for n in class_names_of(annotations) if n not in names]
        for annotation in annotations:
            if annotation.color is not None:
                colours.setdefault(annotation.class_name, annotation.color)
    return names, colours


def read_dataset(
    directory: str | Path,
    *,
    channels: int,
    num_classes: int,
    spatial_dims: int = 2,
    intensity: Intensity | None = None,
    unlabelled: int | None = None,
    nonfinite: str = "refuse",
    margin: int = DEFAULT_WINDOW_MARGIN,
    class_names: list[str] | None = None,
    validation: bool = False,
) -> list[Sample]:
    """Every image of ``directory`` with its labels (masked and unlabelled pixels set to 255), checked against the
    model. ``unlabelled``: the label files' value of unlabelled pixels (None: classes.json's, if it gives one).

    ``spatial_dims`` is the model's: 2 for images, 1 for signals, 3 for volumes (its ``len(patch_size)``); each
    image is scaled to [0, 1] by ``intensity`` (the model's declaration; None: by its dtype's range), as ``densecnn
    predict`` and the service scale it. NaN/±Inf pixels are refused (a :class:`~densecnn.errors.DatasetError` naming the file), unless
    ``nonfinite`` is "propagate": they are kept, for the step to leave out (:mod:`densecnn.train.no_data`).
    A large image gives one sample per window around its labels, each window ``margin`` pixels beyond them
    (:func:`~densecnn.train.windows.window_margin` of the trainer's patch; by default the default net's).

    ``class_names``: the classes of a model being fine-tuned. Annotation classes are matched to them by name, and
    label files whose classes.json names them in another order are renumbered to the model's ids; a class the model
    does not have is refused, naming the file. A model's default names (class_0..class_K-1, a model saved without
    names) are matched like any others; data that names none of them keeps the label files' ids (in classes.json's
    order), and annotation classes without a classes.json are refused (their order of appearance is no match).
    None: the classes are classes.json's names (else the annotations').
    ``validation``: the dataset is a run's validation set, and ``class_names`` the classes of the model it scores
    (a fresh model's are the training set's); the same matching, the messages saying so.

    >>> [s.image.shape for s in read_dataset("data/nuclei3d/train", channels=1, num_classes=3, spatial_dims=3)]
    [(1, 31, 61, 40)]
    """
    directory = Path(directory)
    files = image_files(directory, spatial_dims)  # images of other dimensions refused before their classes
    info = read_class_info(directory)
    unlabelled = info.unlabelled if unlabelled is None else unlabelled
    classes = _Classes(directory, info, class_names, num_classes, validation=validation)
    plans = {
        path: _plan_windows(directory, path, margin, unlabelled)
        for path in files
        if spatial_dims == 2 and is_large(path)
    }
    check_window_budget(plans)  # before a pixel is read
    samples = []
    for image_path in files:
        if image_path in plans:
            annotation_path = directory / ANNOTATIONS / f"{image_path.stem}.geojson"
            if annotation_path.is_file():
                classes.check_annotations(annotation_path)
            samples += _window_samples(
                plans[image_path],
                image_path,
                channels=channels,
                num_classes=num_classes,
                intensity=intensity or Intensity(),
                unlabelled=unlabelled,
                classes=classes,
                finite=nonfinite != "propagate",
            )
            continue
        image = _read_image(
            image_path, channels, spatial_dims, intensity or Intensity(), finite=nonfinite != "propagate"
        )  # (C, *spatial)
        labels = _read_masked_labels(
            directory, image_path, image.shape[1:], num_classes, spatial_dims, unlabelled, classes
        )
        samples.append(Sample(image_path.stem, image, labels))
    return samples


def _unnamed(count: int) -> list[str]:
    """The names of a model saved without class names (:func:`densecnn.save`'s default): class_0..class_{count-1}."""
    return [f"class_{k}" for k in range(count)]


class _Classes:
    """Which class id each name or label value of a dataset is: classes.json's names (or the annotations'), or a
    fine-tuned model's ``class_names``, matched to them by name."""

    def __init__(
        self,
        directory: Path,
        info: ClassInfo,
        class_names: list[str] | None,
        num_classes: int,
        *,
        validation: bool = False,
    ):
        self.validation = validation
        self.model = "the model being trained" if validation else "the model being fine-tuned"
        if class_names is not None:  # matched to the data's names (classes.json's NFC) in one spelling
            class_names = [unicodedata.normalize("NFC", n) for n in class_names]
        data_names = info.names if info.names is not None else _annotation_classes(directory)[0]
        if class_names == _unnamed(len(class_names or ())) and not set(data_names or ()) & set(class_names):
            # a model trained without names (class_0..class_K-1) and data naming none of them: the label files'
            # ids (and classes.json's order) are the model's as they are; annotation classes have no order to keep
            if data_names and (info.path is None or info.names is None):
                raise DatasetError(
                    f"{directory / ANNOTATIONS}: {self.model} has no class names of its own "
                    f"({', '.join(class_names)}), so the annotation classes {', '.join(map(repr, data_names))} "
                    "cannot be matched to its classes by name; name the annotations as its classes, or list their "
                    "classes in a classes.json's names in the order of the model's class ids"
                )
            class_names = None
        self.info, self.model_names, self.num_classes = info, class_names, num_classes
        names = class_names or data_names or []
        self.ids = {n: k for k, n in enumerate(names)}
        self.lookup: np.ndarray | None = (
            None  # classes.json's ids -> the fine-tuned model's, when they differ
        )
        if class_names is not None and info.path is not None and info.names not in (None, list(class_names)):
            unknown = [n for n in info.names if n not in class_names]
            if unknown:
                fix = (
                    "a validation set scores the model's classes: name them as the training set does"
                    if validation
                    else "name its classes in classes.json, or train a fresh model (without --model) for new classes"
                )
                raise DatasetError(
                    f"{info.path}: names {', '.join(map(repr, unknown))} are not classes of {self.model} "
                    f"({', '.join(map(repr, class_names))}); {fix}"
                )
            self.lookup = np.array([list(class_names).index(n) for n in info.names], np.int64)

    def check_annotations(self, path: Path) -> None:
        """Refuse annotation classes that are not classes, naming ``path``."""
        unknown = [
            n
            for n in class_names_of(read_geojson(path))
            if n not in self.ids and not n.startswith(IGNORED_CLASS_PREFIX)
        ]
        if not unknown:
            return
        where = (
            f"{self.model} has"
            if self.model_names is not None
            else f"{self.info.path} names"
            if self.info.path is not None
            else "the classes are"
        )
        fix = (
            "rename the annotations to the training set's classes"
            if self.validation and self.model_names is not None
            else "rename the annotations to its classes"
            if self.model_names is not None
            else "add them to classes.json's names or rename the annotations"
        )
        raise DatasetError(
            f"{path}: annotation class(es) {', '.join(map(repr, unknown))} are not classes ({where} "
            f"{', '.join(map(repr, self.ids))}); {fix} (a class named {IGNORED_CLASS_PREFIX}* unlabels what it covers)"
        )

    def hint(self) -> str:
        """How to fix label values beyond the classes."""
        if self.model_names is not None:
            return f"fix the labels: {self.model} has these classes"
        if self.info.path is not None and self.info.names is not None:
            return f"fix the labels or add the classes to the names in {self.info.path}"
        return BEYOND_CLASSES_HINT


def _read_masked_labels(
    directory, image_path, shape, num_classes, spatial_dims, unlabelled, classes: _Classes
) -> np.ndarray:
    """The labels of a whole image, 255 where its mask (``masks/NAME.*``, if there is one) is 0."""
    labels = _read_labels(directory, image_path, shape, num_classes, spatial_dims, unlabelled, classes)
    mask_path = _companion(directory / "masks", image_path.stem, _label_suffixes(spatial_dims))
    if mask_path is not None:
        mask = _read_class_map(mask_path, image_path, shape, spatial_dims, what="mask")
        labels[mask == 0] = IGNORE_INDEX
    return labels


def _image_suffixes(spatial_dims: int) -> tuple[str, ...]:
    return (*IMAGE_SUFFIXES, *SLIDE_SUFFIXES, ".zarr") if spatial_dims == 2 else ARRAY_SUFFIXES[spatial_dims]


def _plan_windows(directory: Path, image_path: Path, margin: int, unlabelled: int | None) -> WindowPlan:
    """The windows of a large image around its label array's labelled pixels or its annotations."""
    label_path = _companion(directory / "labels", image_path.stem, LARGE_LABEL_SUFFIXES)
    annotation_path = directory / ANNOTATIONS / f"{image_path.stem}.geojson"
    _refuse_both(image_path, label_path, annotation_path)
    if label_path is None and not annotation_path.is_file():
        raise _no_labels(directory, image_path, LARGE_LABEL_SUFFIXES, annotation_path)
    return plan_windows(
        image_path,
        margin=margin,
        annotations=read_geojson(annotation_path) if label_path is None else None,
        label_path=label_path,
        mask_path=_companion(directory / "masks", image_path.stem, LARGE_LABEL_SUFFIXES),
        unlabelled=unlabelled,
    )


def _window_samples(
    plan: WindowPlan,
    image_path: Path,
    *,
    channels: int,
    num_classes: int,
    intensity: Intensity,
    unlabelled: int | None,
    classes: _Classes,
    finite: bool,
) -> list[Sample]:
    """One sample per window of ``plan`` that holds labels; the image scaled as a whole (its intensity sample), the
    label array's values read as a whole label image's are."""
    samples = []
    try:
        scaling = array_scaling(plan.image, intensity)
        for window in plan.windows:
            labels = plan.read_labels(
                window, classes.ids, unlabelled, num_classes, classes.hint(), classes.lookup
            )  # (h, w)
            if (labels != IGNORE_INDEX).any():
                image = plan.read_image(window, channels, scaling, finite=finite)  # (C, h, w)
                samples.append(Sample(image_path.stem, image, labels, (window[0].start, window[1].start)))
    except (ImageReadError, IntensityError, NonFiniteInputError) as exc:
        problem = exc.problem if str(image_path) in exc.problem else f"{image_path}: {exc.problem}"
        raise DatasetError(f"{problem}; fix or remove the file", fix=training_fix(exc)) from None
    return samples


def _label_suffixes(spatial_dims: int) -> tuple[str, ...]:
    return LABEL_IMAGE_SUFFIXES if spatial_dims == 2 else ARRAY_SUFFIXES[spatial_dims]


def _read_image(
    path: Path, channels: int, spatial_dims: int, intensity: Intensity, *, finite: bool
) -> np.ndarray:
    """An image file as float32 (C, *spatial) scaled by ``intensity``, with ``channels`` channels; NaN/±Inf values
    refused if ``finite``."""
    try:
        if spatial_dims == 2:
            planes = read_header(path).planes if path.suffix.lower() in TIFF_SUFFIXES else 1
            if planes > 1:
                raise DatasetError(
                    f"{path}: a stack of {planes} slices, and the model reads 2-D images; "
                    "train a model of volumes on it, or save the slices as separate images"
                )
            pixels = decode_array(path)  # (H, W[, C])
            return unit_planes(pixels, channels, image_scaling(pixels, intensity, finite=finite))  # (C, H, W)
        array = _read_nd(path, spatial_dims)  # (C, *spatial)
        if array.shape[0] != channels:
            if array.shape[0] != 1:  # a signal's or volume's channels are not colours: only gray is converted
                raise DatasetError(
                    f"{path}: {array.shape[0]} channels (the first axis), the model takes {channels}; "
                    "give the arrays the model's channels"
                )
            array = np.repeat(array, channels, axis=0)
        scaling = image_scaling(array, intensity, tuple(range(1, array.ndim)), finite=finite)
        return scaling.apply_(np.array(array, dtype=np.float32, order="C"))
    except (ImageReadError, IntensityError, NonFiniteInputError) as exc:
        problem = exc.problem if str(path) in exc.problem else f"{path}: {exc.problem}"
        raise DatasetError(f"{problem}; fix or remove the file", fix=training_fix(exc)) from None


def training_fix(error: DenseCNNError) -> Fix | None:
    """``error``'s fix kept to the options ``densecnn train`` takes (a reader's advice to name a channel axis, which
    only predict and the service take, is left out)."""
    return None if error.fix is None else error.fix.within({spec.name for spec in fields(TrainConfig)})


def _open_nd(path: Path, spatial_dims: int):
    """The signal or volume file ``path``, opened lazily (:class:`densecnn.io.LazyArray`)."""
    try:
        return open_lazy_array(path, spatial_dims=spatial_dims)
    except ImageReadError as exc:  # its fix kept to the options a run takes (no channel axis to name)
        hint = _flat_array_hint(path, spatial_dims)
        raise DatasetError(f"{exc.problem}{hint}; fix or remove the file", fix=training_fix(exc)) from None


def _flat_array_hint(path: Path, spatial_dims: int) -> str:
    """How to give a 2-D image that was saved as a .npy array among volumes ("" for any other file)."""
    if spatial_dims != 3 or path.suffix.lower() != ".npy":
        return ""
    try:
        flat = np.load(path, mmap_mode="r", allow_pickle=False).ndim == 2
    except (OSError, ValueError):
        return ""
    return (
        "; a dataset's .npy arrays are volumes (or signals, with a 1-D --model): to train on a 2-D image (H, W), "
        "save it as .tif or .png instead"
        if flat
        else ""
    )


def _read_nd(path: Path, spatial_dims: int) -> np.ndarray:
    """The signal or volume file ``path``, channels first: (C, *spatial) in the file's dtype."""
    return _read_whole(_open_nd(path, spatial_dims))


def _read_nd_class_map(path: Path, image_path: Path, image_shape: tuple[int, ...], what: str) -> np.ndarray:
    """The ids of a signal's or volume's class map ``path`` as stored, (C, *spatial). A map with fewer axes than its
    image is refused as such: the array reader's own message is about images (it names a channel axis)."""
    try:
        array = open_lazy_array(path, spatial_dims=len(image_shape), as_stored=True)
    except ImageReadError as exc:
        fewer_axes = _fewer_axes_error(path, image_path, image_shape, what)
        raise fewer_axes or DatasetError(f"{exc}; fix or remove the file") from None
    return _read_whole(array)


def _fewer_axes_error(
    path: Path, image_path: Path, image_shape: tuple[int, ...], what: str
) -> DatasetError | None:
    """The error for a class map that reads as a map of fewer axes than its image (a 2-D label slice of a volume),
    else None."""
    dims = len(image_shape)
    for fewer in range(dims - 1, 0, -1):
        try:
            stored = open_lazy_array(path, spatial_dims=fewer, as_stored=True)
        except ImageReadError:
            continue
        # every axis spatial: no channel axis taken for one
        if stored.layout == "s" * fewer:
            kind = "volume" if dims == 3 else "signal"
            return DatasetError(
                f"{path}: the {what}s of {image_path.name} are {fewer}-D {_AXES[fewer]}, {_size(stored.shape)}, but "
                f"the {kind} is {dims}-D {_AXES[dims]}, {_size(image_shape)}: give a {what} {kind} of the same shape"
            )
    return None


def _read_whole(array: LazyArray) -> np.ndarray:
    """Every value of a lazily opened array, channels first: (C, *spatial) in the file's dtype."""
    try:
        return array.read()
    except Exception as exc:  # a chunk or page that cannot be decoded
        raise DatasetError(
            f"{array.path}: cannot read it as an array ({exc}); fix or remove the file"
        ) from None


def _companion(folder: Path, stem: str, suffixes: tuple[str, ...]) -> Path | None:
    for suffix in suffixes:
        for candidate in (folder / f"{stem}{suffix}", folder / f"{stem}{suffix.upper()}"):
            if candidate.is_file() or (suffix == ".zarr" and candidate.is_dir()):
                return candidate
    return None


def _read_labels(
    directory: Path,
    image_path: Path,
    shape: tuple[int, ...],
    num_classes: int,
    spatial_dims: int,
    unlabelled: int | None,
    classes: _Classes,
) -> np.ndarray:
    label_path = _companion(directory / "labels", image_path.stem, _label_suffixes(spatial_dims))
    annotation_path = directory / ANNOTATIONS / f"{image_path.stem}.geojson"
    _refuse_both(image_path, label_path, annotation_path)
    if label_path is None and annotation_path.is_file():
        if spatial_dims != 2:
            raise _annotations_of_nd(directory, image_path, annotation_path, spatial_dims)
        classes.check_annotations(annotation_path)
        return rasterize(read_geojson(annotation_path), shape, class_ids=classes.ids)
    if label_path is None:
        raise _no_labels(
            directory,
            image_path,
            _label_suffixes(spatial_dims),
            annotation_path if spatial_dims == 2 else None,
        )
    stored = _read_class_map(label_path, image_path, shape, spatial_dims, what="label", unlabelled=unlabelled)
    # 255 and the declared value unlabelled, ids beyond the classes refused: as a large image's windows are read
    return class_targets(
        stored, label_path, num_classes, unlabelled, lookup=classes.lookup, hint=classes.hint()
    )


def _annotations_of_nd(
    directory: Path, image_path: Path, annotation_path: Path, spatial_dims: int
) -> DatasetError:
    """The error for GeoJSON annotations of a volume or signal, which are read for 2-D images only."""
    kind = "volume" if spatial_dims == 3 else "signal"
    return DatasetError(
        f"{annotation_path}: GeoJSON annotations are read for 2-D images only, and {image_path.name} is a {kind} "
        f"{_AXES[spatial_dims]}; give its labels as a label {kind} of its shape instead, "
        f"{directory / 'labels' / image_path.stem}{_label_suffixes(spatial_dims)[0]} (or "
        f"{', '.join(_label_suffixes(spatial_dims)[1:])}: class ids 0..K-1, 255 = unlabelled)"
    )


def _refuse_both(image_path: Path, label_path: Path | None, annotation_path: Path) -> None:
    """An image's labels come from a label file or from annotations, never both (one would be left out)."""
    if label_path is not None and annotation_path.is_file():
        raise DatasetError(
            f"{image_path.name} has both a label file ({label_path}) and annotations ({annotation_path}); one of "
            "them would be left out: keep one (paint the annotations into the label file, or move it away)"
        )


def _no_labels(
    directory: Path, image_path: Path, suffixes: tuple[str, ...], annotation_path: Path | None
) -> DatasetError:
    folder = directory / "labels"
    others = sorted(p.name for p in folder.glob(f"{image_path.stem}.*")) if folder.is_dir() else []
    return DatasetError(
        f"{image_path}: no label file; expected {folder / image_path.stem}{suffixes[0]} "
        f"(or {', '.join(suffixes[1:]) or suffixes[0]}), a class-id map of the same size"
        + (f", or annotations in {annotation_path}" if annotation_path is not None else "")
        + (f" ({', '.join(others)} in labels/ is not one of these)" if others else "")
    )


def _read_class_map(
    path: Path,
    image_path: Path,
    shape: tuple[int, ...],
    spatial_dims: int,
    *,
    what: str,
    unlabelled: int | None = None,
) -> np.ndarray:
    """A single-channel integer map of ``shape``, as int64; negative values refused, but for ``unlabelled``
    (:func:`~densecnn.train.windows.stored_class_map`)."""
    if spatial_dims == 2:
        try:
            array = decode_array(path, as_stored=True)  # ids as stored, whatever a viewer would show
        except ImageReadError as exc:
            raise DatasetError(f"{exc}; fix or remove the file") from None
        if array.ndim == 3 and array.shape[2] == 1:
            array = array[:, :, 0]
        hint = "colour labels are not read; save the ids as an 8-bit grayscale PNG"
    else:
        array = _read_nd_class_map(path, image_path, shape, what)  # (C, *spatial)
        if array.shape[0] == 1:
            array = array[0]
        hint = "save the class ids as one array of the image's spatial shape, without a channel axis"
    if array.ndim != spatial_dims:
        raise DatasetError(
            f"{path}: a {what} file must be a single-channel map of class ids, got shape {array.shape} ({hint})"
        )
    if array.shape != tuple(shape):
        raise DatasetError(
            f"{path}: {what} size {_size(array.shape)} does not match its image {image_path} ({_size(shape)}); "
            f"give the {what}s the image's size"
        )
    # integers, negative values refused but for unlabelled: as a large image's windows are read
    return stored_class_map(array, path, what=what, unlabelled=unlabelled)


def _size(shape) -> str:
    return "x".join(str(s) for s in shape)


def normalization_stats(samples: list[Sample]) -> dict[str, list[float]]:
    """Per-channel mean and std of the images' finite [0, 1] values: the model's input normalisation."""
    channels = samples[0].image.shape[0]
    total = np.zeros(channels)
    squares = np.zeros(channels)
    count = np.zeros(channels)
    for sample in samples:
        pixels = sample.image.reshape(channels, -1).astype(np.float64)  # (C, pixels)
        finite = np.isfinite(pixels)  # (C, pixels): no-data pixels left out
        pixels = np.where(finite, pixels, 0.0)
        total += pixels.sum(1)
        squares += (pixels**2).sum(1)
        count += finite.sum(1)
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean**2, 0.0))
    return {"mean": mean.tolist(), "std": np.maximum(std, 1e-6).tolist()}


def check_labelled_classes(
    directory: str | Path,
    samples: list[Sample],
    names: list[str] | None,
    *,
    unlabelled: int | None = None,
    fine_tuning: bool = False,
) -> list[str]:
    """Refuse a dataset whose labels leave classes without a pixel; returns the names of the classes without one
    (only ever non-empty when ``fine_tuning``: a fine-tuned model keeps classes the new labels do not show).

    At least 2 classes need labelled pixels. For a fresh model every class needs some: ``names`` (classes.json's,
    the annotations' or ``--classes``'s), or without names every id from 0 to the highest labelled. ``unlabelled``:
    the value declared for the label files (None: none was, and 255 alone meant unlabelled).
    """
    directory = Path(directory)
    labelled = [s.labels[s.labels != IGNORE_INDEX].ravel() for s in samples]
    counts = np.bincount(np.concatenate(labelled).astype(np.int64) if labelled else np.zeros(0, np.int64))
    classes = list(names) if names is not None else [f"class_{k}" for k in range(len(counts))]
    counts = np.pad(counts, (0, max(0, len(classes) - len(counts))))
    present = [k for k in range(len(classes)) if counts[k]]
    empty = [k for k in range(len(classes)) if not counts[k]]
    info = read_class_info(directory)
    from_annotations = (directory / ANNOTATIONS).is_dir() and info.path is None and names is not None
    label_names = ", ".join(f"{k} {classes[k]!r}" for k in empty)
    if len(present) < 2:
        shown = ", ".join(f"{k} {classes[k]!r}" for k in present) or "none"
        problem = (
            f"{directory}: labelled pixels of {len(present)} class(es) ({shown}); a model needs at least 2"
        )
        if present == [0] and unlabelled is None and not from_annotations:
            fix = (
                "the labels hold only 0 and 255, and 255 always means unlabelled: save a two-class mask as 0/1 "
                "(0 background, 1 foreground), or paint strokes of both classes"
            )
        elif from_annotations and len(info.names or []) <= 1:
            fix = (
                f"the annotations name {len(info.names or [])} class(es) ({', '.join(info.names or [])}): annotate "
                "another class too (e.g. the background), or list every class in classes.json's names"
            )
        elif from_annotations and present:
            fix = f"the annotations of {label_names} cover no pixel of the images: annotate them inside the images"
        else:
            fix = f"label pixels of {'another class' if present else 'at least 2 classes'} too" + (
                f" (no pixels: {label_names})" if empty else ""
            )
        if unlabelled is not None and 0 < unlabelled < IGNORE_INDEX:
            declared = (
                f"unlabelled = {unlabelled} in {info.path}"
                if info.path is not None and info.unlabelled == unlabelled
                else f"--unlabelled {unlabelled}"
            )
            fix += (
                f"; note that {declared} turned every pixel of label value {unlabelled} into an unlabelled "
                "one: declare the value your label files leave unlabelled, or leave it out"
            )
        raise DatasetError(f"{problem}: {fix}")
    if not empty or fine_tuning:
        return [classes[k] for k in empty]
    if names is None:
        raise DatasetError(
            f"{directory}: the labels hold class ids {present} and none of {empty}; without names every id from 0 "
            "to the highest is a class, so these would be classes without a pixel: number the classes 0..K-1 "
            "without gaps, or name them in classes.json"
        )
    if info.path is not None and info.names == list(names):
        where = f"{info.path} names {len(names)} classes"
        fix = "label some of their pixels, or take them out of the names (and renumber the labels)"
        if (
            info.unlabelled is not None
            and unlabelled == info.unlabelled
            and info.unlabelled in range(len(names))
        ):
            fix += f"; note that unlabelled = {info.unlabelled} there makes every pixel of value {info.unlabelled} unlabelled"
    elif from_annotations:
        where = "the annotations name them"
        fix = (
            "their annotations cover no pixel of the images: annotate them inside the images, or remove them"
        )
    else:
        where = f"--classes {len(names)}"
        fix = "label some of their pixels, or lower --classes"
    raise DatasetError(f"{directory}: class(es) {label_names} have no labelled pixels ({where}); {fix}")
