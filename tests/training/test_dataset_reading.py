"""How a training dataset's labels and class names are read: a model's default class names (class_0..class_K-1)
matched by name, label values beyond the classes refused (a 16-bit 256 with unlabelled 0 included), a large image's
label array read by windows exactly as a whole label image, classes.json read as UTF-8 with its names in NFC, the
model card written as UTF-8, and GeoJSON annotations of a volume refused naming what to give instead."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import unicodedata

import numpy as np
import pytest
import tifffile
from PIL import Image
from train_support import geojson, square

from densecnn import DatasetError
from densecnn.losses import IGNORE_INDEX
from densecnn.train.dataset import read_class_info, read_dataset

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

NFC, NFD = unicodedata.normalize("NFC", "Tumör"), unicodedata.normalize("NFD", "Tumör")


def annotated(data, features: list[tuple[str, list]], classes: dict | None = None):
    """One blank 32x32 image, im0.png, with GeoJSON polygons ``features`` (class name, ring) as its labels."""
    (data / "images").mkdir(parents=True)
    (data / "annotations").mkdir()
    Image.fromarray(np.zeros((32, 32), np.uint8)).save(data / "images" / "im0.png")
    geojson(data / "annotations" / "im0.geojson", features)
    if classes is not None:
        (data / "classes.json").write_text(json.dumps(classes), encoding="utf-8")
    return data


def labelled(data, labels: np.ndarray, classes: dict | None = None, suffix: str = ".png"):
    """One 32x32 gray image with ``labels`` (a PNG, or a TIFF of the array's dtype) and an optional classes.json."""
    for folder in ("images", "labels"):
        (data / folder).mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.zeros(labels.shape, np.uint8)).save(data / "images" / "im0.png")
    if suffix == ".png":
        Image.fromarray(labels.astype(np.uint8)).save(data / "labels" / "im0.png")
    else:
        tifffile.imwrite(data / "labels" / f"im0{suffix}", labels)
    if classes is not None:
        (data / "classes.json").write_text(json.dumps(classes), encoding="utf-8")
    return data


def halves(low: int, high: int, unlabelled: int = 255) -> np.ndarray:
    """32x32 labels: ``low`` on the top rows, ``high`` on the bottom rows, ``unlabelled`` between."""
    labels = np.full((32, 32), unlabelled, np.uint8)
    labels[:4], labels[-4:] = low, high
    return labels


UNNAMED = ["class_0", "class_1"]  # a model trained from label images without classes.json


# 1. a model's default names (class_0..class_K-1) are names


def test_annotation_classes_named_as_an_unnamed_models_classes_are_matched_by_name_not_order(tmp_path):
    # "class_1" appears first: by appearance it would be class 0
    data = annotated(
        tmp_path / "data", [("class_1", square(2, 2, 6, 6)), ("class_0", square(20, 20, 30, 30))]
    )
    (sample,) = read_dataset(data, channels=1, num_classes=2, class_names=UNNAMED)
    assert sample.labels[3, 3] == 1 and sample.labels[25, 25] == 0


def test_a_classes_json_listing_an_unnamed_models_names_in_another_order_is_renumbered(tmp_path):
    data = labelled(tmp_path / "data", halves(0, 1), {"names": ["class_1", "class_0"]})
    (sample,) = read_dataset(data, channels=1, num_classes=2, class_names=UNNAMED)
    assert sample.labels[0, 0] == 1 and sample.labels[-1, 0] == 0  # file id 0 "class_1" is the model's 1
    (sample,) = read_dataset(data, channels=1, num_classes=2, class_names=UNNAMED, validation=True)
    assert sample.labels[0, 0] == 1 and sample.labels[-1, 0] == 0  # a validation set the same


def test_other_annotation_classes_are_refused_for_an_unnamed_model_never_numbered_by_appearance(tmp_path):
    data = annotated(tmp_path / "data", [("Tumor", square(2, 2, 6, 6)), ("Stroma", square(20, 20, 30, 30))])
    with pytest.raises(DatasetError) as error:
        read_dataset(data, channels=1, num_classes=2, class_names=UNNAMED)
    message = str(error.value)
    assert "has no class names of its own (class_0, class_1)" in message
    assert (
        "'Tumor', 'Stroma'" in message
        and "classes.json's names in the order of the model's class ids" in message
    )
    assert "\n" not in message
    # the fix the message gives: a classes.json listing them in the model's order
    (data / "classes.json").write_text(json.dumps({"names": ["Stroma", "Tumor"]}))
    (sample,) = read_dataset(data, channels=1, num_classes=2, class_names=UNNAMED)
    assert sample.labels[3, 3] == 1 and sample.labels[25, 25] == 0


def test_a_class_an_unnamed_model_does_not_have_is_refused_beside_its_names(tmp_path):
    data = annotated(tmp_path / "data", [("class_1", square(2, 2, 6, 6)), ("Tumor", square(20, 20, 30, 30))])
    with pytest.raises(DatasetError, match=r"annotation class\(es\) 'Tumor' are not classes"):
        read_dataset(data, channels=1, num_classes=2, class_names=UNNAMED)
    json_data = labelled(tmp_path / "json", halves(0, 1), {"names": ["class_1", "cell"]})
    with pytest.raises(DatasetError, match=r"names 'cell' are not classes of the model being fine-tuned"):
        read_dataset(json_data, channels=1, num_classes=2, class_names=UNNAMED)


def test_label_files_keep_their_ids_for_an_unnamed_model(tmp_path):
    # no names to match: the ids are the model's as they are, with or without a classes.json naming them
    data = labelled(tmp_path / "data", halves(0, 1))
    (sample,) = read_dataset(data, channels=1, num_classes=2, class_names=UNNAMED)
    assert sample.labels[0, 0] == 0 and sample.labels[-1, 0] == 1
    (data / "classes.json").write_text(json.dumps({"names": ["cell", "background"]}))
    (sample,) = read_dataset(data, channels=1, num_classes=2, class_names=UNNAMED)
    assert sample.labels[0, 0] == 0 and sample.labels[-1, 0] == 1


def test_fine_tuning_a_model_saved_without_names_on_annotations_of_its_names(tmp_path):
    from densecnn.train.strokes import StrokeTrainer

    model = tmp_path / "model"
    StrokeTrainer(
        [np.zeros((1, 16, 16), np.float32)], [np.tile(np.array([0, 1]), (16, 8))], model="tiny"
    ).save(model)
    import densecnn

    loaded = densecnn.load(model)
    assert loaded.class_names == UNNAMED
    data = annotated(
        tmp_path / "data", [("class_1", square(2, 2, 6, 6)), ("class_0", square(20, 20, 30, 30))]
    )
    (sample,) = read_dataset(data, channels=1, num_classes=2, class_names=loaded.class_names)
    assert sample.labels[3, 3] == 1 and sample.labels[25, 25] == 0


# 2. label values beyond the classes are refused, whatever they would shift to


def test_a_16_bit_256_with_unlabelled_0_is_refused_not_made_unlabelled(tmp_path):
    labels = halves(1, 2, unlabelled=0).astype(np.uint16)
    labels[10, :5] = 256  # 256 - 1 = 255, the ignore index
    with pytest.raises(DatasetError) as error:
        read_dataset(labelled(tmp_path / "a", labels, suffix=".tif"), channels=1, num_classes=2, unlabelled=0)
    assert "label ids [256] in the file are beyond the model's 2 classes" in str(error.value)
    labels[10, :5] = 255  # 255 itself stays unlabelled
    (sample,) = read_dataset(
        labelled(tmp_path / "b", labels, suffix=".tif"), channels=1, num_classes=2, unlabelled=0
    )
    assert (
        (sample.labels[10] == IGNORE_INDEX).all() and sample.labels[0, 0] == 0 and sample.labels[-1, 0] == 1
    )


def test_a_16_bit_256_is_refused_when_renumbered_too(tmp_path):
    labels = halves(1, 2, unlabelled=0).astype(np.uint16)
    labels[10, :5] = 256
    data = labelled(tmp_path / "a", labels, {"names": ["cell", "background"]}, suffix=".tif")
    with pytest.raises(DatasetError, match=r"label ids \[256\] in the file"):
        read_dataset(data, channels=1, num_classes=2, unlabelled=0, class_names=["background", "cell"])


# 3. a large image's label array is read as a whole label image


def _same_labels_two_ways(tmp_path, labels: np.ndarray, mask: np.ndarray | None):
    """Two datasets of one image with the same label (and mask) TIFFs: a PNG, read whole, and a zarr array of the
    same pixels, read by windows."""
    zarr = pytest.importorskip("zarr")
    pixels = np.random.default_rng(0).integers(0, 256, labels.shape, dtype=np.uint8)
    whole, windowed = tmp_path / "whole", tmp_path / "windowed"
    for data in (whole, windowed):
        for folder in ("images", "labels", "masks"):
            (data / folder).mkdir(parents=True)
        tifffile.imwrite(data / "labels" / "a.tif", labels)
        if mask is not None:
            tifffile.imwrite(data / "masks" / "a.tif", mask)
    Image.fromarray(pixels).save(whole / "images" / "a.png")
    stored = zarr.create_array(
        str(windowed / "images" / "a.zarr"), shape=pixels.shape, chunks=(128, 128), dtype=pixels.dtype
    )
    stored[:] = pixels
    return whole, windowed


def _stray_values(dtype, unlabelled: int | None) -> np.ndarray:
    """(300, 400) labels of 2 classes in ``unlabelled``'s convention: two strokes, a block of 255, the rest
    unlabelled."""
    background = IGNORE_INDEX if unlabelled is None else unlabelled
    first = 1 if unlabelled == 0 else 0
    labels = np.full((300, 400), background, dtype)
    labels[10:20, 10:60], labels[30:40, 10:20] = first, first + 1
    labels[50:52, 10:20] = 255  # always unlabelled
    labels[250:260, 330:390] = first + 1  # a second window
    return labels


@pytest.mark.parametrize(
    "dtype, unlabelled",
    [(np.uint8, None), (np.uint8, 0), (np.uint16, 0), (np.int32, -1), (np.uint16, 7)],
)
@pytest.mark.parametrize("masked", [False, True])
def test_a_label_array_read_by_windows_gives_the_targets_of_the_whole_image(
    tmp_path, dtype, unlabelled, masked
):
    labels = _stray_values(dtype, unlabelled)
    mask = np.ones(labels.shape, np.uint8)
    mask[:15] = 0
    whole, windowed = _same_labels_two_ways(tmp_path, labels, mask if masked else None)
    (expected,) = read_dataset(whole, channels=1, num_classes=2, unlabelled=unlabelled)
    samples = read_dataset(windowed, channels=1, num_classes=2, unlabelled=unlabelled)
    assert len(samples) == 2 and all(s.offset is not None for s in samples)
    covered = np.zeros(labels.shape, bool)
    for sample in samples:
        (r, c), (h, w) = sample.offset, sample.labels.shape
        np.testing.assert_array_equal(sample.labels, expected.labels[r : r + h, c : c + w])
        np.testing.assert_array_equal(sample.image, expected.image[:, r : r + h, c : c + w])
        covered[r : r + h, c : c + w] = True
    assert not (expected.labels[~covered] != IGNORE_INDEX).any()  # no labelled pixel outside the windows
    assert set(np.unique(expected.labels).tolist()) == {0, 1, IGNORE_INDEX}


@pytest.mark.parametrize(
    "dtype, unlabelled, stray, reported",
    [(np.uint8, 0, 3, 3), (np.uint16, 0, 256, 256), (np.uint8, None, 2, 2), (np.int32, -1, -2, -2)],
)
def test_a_label_array_read_by_windows_is_refused_as_the_whole_image_is(
    tmp_path, dtype, unlabelled, stray, reported
):
    labels = _stray_values(dtype, unlabelled)
    labels[12, 12] = stray
    whole, windowed = _same_labels_two_ways(tmp_path, labels, None)
    messages = []
    for data in (whole, windowed):
        with pytest.raises(DatasetError) as error:
            read_dataset(data, channels=1, num_classes=2, unlabelled=unlabelled)
        messages.append(str(error.value).replace(str(data), "DATA"))
    assert messages[0] == messages[1] and f"[{reported}]" in messages[0]


# 4. classes.json read as UTF-8, its names in NFC; the model card written as UTF-8


def test_classes_json_is_read_as_utf8_with_or_without_a_byte_order_mark(tmp_path):
    text = json.dumps({"names": [NFC, "Stroma"]}, ensure_ascii=False)
    (tmp_path / "classes.json").write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    assert read_class_info(tmp_path).names == [NFC, "Stroma"]
    (tmp_path / "classes.json").write_bytes(text.encode("utf-8"))
    assert read_class_info(tmp_path).names == [NFC, "Stroma"]


@pytest.mark.parametrize(
    "encoding, message",
    [
        ("latin-1", "not UTF-8 text (byte 0xf6 on line 1); save it as UTF-8"),
        ("utf-16", "the file is UTF-16 text, not UTF-8; save it as UTF-8"),
    ],
)
def test_a_classes_json_in_another_encoding_is_refused_in_one_line(tmp_path, encoding, message):
    (tmp_path / "classes.json").write_bytes(
        json.dumps({"names": [NFC, "Stroma"]}, ensure_ascii=False).encode(encoding)
    )
    with pytest.raises(DatasetError) as error:
        read_class_info(tmp_path)
    assert message in str(error.value) and "classes.json" in str(error.value) and "\n" not in str(error.value)


def test_classes_json_names_are_read_in_nfc(tmp_path):
    data = annotated(
        tmp_path / "data",
        [(NFC, square(2, 2, 6, 6)), ("Stroma", square(20, 20, 30, 30))],
        classes={"names": ["Stroma", NFD]},  # saved on macOS
    )
    assert read_class_info(data).names == ["Stroma", NFC]
    (sample,) = read_dataset(data, channels=1, num_classes=2)
    assert sample.labels[3, 3] == 1 and sample.labels[25, 25] == 0
    # a model whose names were saved in NFD matches too
    (sample,) = read_dataset(data, channels=1, num_classes=2, class_names=[NFD, "Stroma"])
    assert sample.labels[3, 3] == 0 and sample.labels[25, 25] == 1


def test_two_spellings_of_one_name_in_classes_json_are_one_name_repeated(tmp_path):
    (tmp_path / "classes.json").write_text(json.dumps({"names": [NFC, NFD, "Stroma"]}))
    with pytest.raises(DatasetError, match=f"names repeats '{NFC}'"):
        read_class_info(tmp_path)


_NON_UTF8_LOCALE_SCRIPT = """
import sys, locale
from pathlib import Path
assert locale.getpreferredencoding(False).lower() in ("ascii", "ansi_x3.4-1968"), locale.getpreferredencoding(False)
from densecnn.train.dataset import read_class_info
from densecnn.modelfile.card import write_model_card
folder = Path(sys.argv[1])
names = read_class_info(folder).names
card = write_model_card(folder / "README.md", title="t", config={}, command="densecnn train", model_summary={},
    data_summary={"classes": ", ".join(names)}, training_summary={}, val_scores=None, class_names=names)
print(names == ["Tum\\u00f6r", "Stroma"])
"""


def test_classes_json_and_the_model_card_are_utf8_in_a_non_utf8_locale(tmp_path):
    (tmp_path / "classes.json").write_bytes(
        json.dumps({"names": [NFC, "Stroma"]}, ensure_ascii=False).encode()
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("LC_")}
    env.update(LC_ALL="C", LANG="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0", PYTHONIOENCODING="utf-8")
    result = subprocess.run(
        [sys.executable, "-c", _NON_UTF8_LOCALE_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "True"
    assert f"classes: {NFC}, Stroma" in (tmp_path / "README.md").read_bytes().decode("utf-8")


# 5. GeoJSON annotations of a volume


def test_annotations_of_a_volume_are_refused_naming_the_label_volume_to_give(tmp_path):
    (tmp_path / "images").mkdir()
    tifffile.imwrite(tmp_path / "images" / "stack.tif", np.zeros((4, 32, 32), np.uint8))
    annotated(tmp_path / "elsewhere", [("A", square(2, 2, 6, 6)), ("B", square(20, 20, 30, 30))])
    (tmp_path / "annotations").mkdir()
    shutil.copy(
        tmp_path / "elsewhere" / "annotations" / "im0.geojson", tmp_path / "annotations" / "stack.geojson"
    )
    with pytest.raises(DatasetError) as error:
        read_dataset(tmp_path, channels=1, num_classes=2, spatial_dims=3)
    message = str(error.value)
    assert message.startswith(
        f"{tmp_path / 'annotations' / 'stack.geojson'}: GeoJSON annotations are read for 2-D"
    )
    assert (
        f"give its labels as a label volume of its shape instead, {tmp_path / 'labels' / 'stack.tif'}"
        in message
    )
    assert "no label file" not in message and "\n" not in message
