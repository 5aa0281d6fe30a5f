"""``densecnn train``'s checks of what it trains on and what it says: classes without labelled pixels, classes.json,
label values as the file stores them, mixed image folders, held-out strokes, fine-tuning by class names, Ctrl-C while
the model is written, runs that took no step, and the help and card text."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest
import tifffile
from PIL import Image
from train_support import geojson, make_dataset, square

import densecnn
from densecnn import DatasetError
from densecnn.cli import main
from densecnn.commands.train import EPILOG
from densecnn.errors import Fix, ImageReadError, IntensityError, cli_option
from densecnn.io.pixels import CHANNEL_AXIS_FIX
from densecnn.losses import IGNORE_INDEX
from densecnn.train import strokes as strokes_module
from densecnn.train.dataset import image_files, infer_channels, read_class_info, read_dataset, training_fix
from densecnn.train.holdout import split_strokes

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def dataset(root, labels: np.ndarray, classes: dict | None = None, image: np.ndarray | None = None):
    """One 32x32 gray image with ``labels`` (uint8 PNG) and an optional classes.json."""
    for folder in ("images", "labels"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    pixels = image if image is not None else rng.integers(0, 255, labels.shape, dtype=np.uint8)
    Image.fromarray(pixels).save(root / "images" / "im0.png")
    Image.fromarray(labels.astype(np.uint8)).save(root / "labels" / "im0.png")
    if classes is not None:
        (root / "classes.json").write_text(json.dumps(classes))
    return root


def halves(low: int, high: int, unlabelled: int = 255) -> np.ndarray:
    """32x32 labels: ``low`` on the top rows, ``high`` on the bottom rows, ``unlabelled`` between."""
    labels = np.full((32, 32), unlabelled, np.uint8)
    labels[:4], labels[-4:] = low, high
    return labels


def annotated(data, features: list[tuple[str, list]]):
    """A dataset of one blank 32x32 image, im0.png, with GeoJSON ``features`` as its labels."""
    (data / "images").mkdir(parents=True)
    Image.fromarray(np.zeros((32, 32), np.uint8)).save(data / "images" / "im0.png")
    geojson(data / "annotations" / "im0.geojson", features)
    return data


def train_error(data, tmp_path, capsys, *extra) -> str:
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "run"), *extra]) == 2
    return capsys.readouterr().err


# 1. Ctrl-C while the model is written


@pytest.mark.parametrize(
    "signum, status, said",
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "stopped by SIGTERM")],
    ids=["SIGINT", "SIGTERM"],
)
def test_ctrl_c_while_the_model_is_written_still_writes_it_and_counts_the_steps(
    tmp_path, tiny_recipe, monkeypatch, capsys, sigterm_counter, signum, status, said
):
    data = dataset(tmp_path / "data", halves(1, 2, unlabelled=0), {"names": ["bg", "cell"], "unlabelled": 0})
    original = strokes_module.StrokeTrainer.save

    def interrupted_save(self, *args, **kwargs):
        os.kill(os.getpid(), signum)  # Ctrl-C (or SIGTERM) just as the run ends, while the model is written
        return original(self, *args, **kwargs)

    monkeypatch.setattr(strokes_module.StrokeTrainer, "save", interrupted_save)
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--out", str(out)]) == status
    assert densecnn.load(out / "model").class_names == ["bg", "cell"]
    assert (out / "model" / "README.md").is_file()
    message = capsys.readouterr().err
    assert f"{said} after 8 step(s)" in message and str(out / "model") in message
    assert "no step was taken" not in message


# 8. a run that took no step


def test_a_run_that_took_no_step_warns_that_its_model_is_untrained(tmp_path, tiny_recipe, capsys):
    data = dataset(tmp_path / "data", halves(1, 2, unlabelled=0), {"names": ["bg", "cell"], "unlabelled": 0})
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--out", str(out), "--max-seconds", "1e-9"]) == 0
    densecnn.load(out / "model")  # the promise: a model that loads
    captured = capsys.readouterr()
    assert "no training step ran" in captured.err and "UNTRAINED" in captured.err
    assert "untrained model written" in captured.out


# 2. classes without labelled pixels


def test_a_0_255_mask_is_refused_saying_255_means_unlabelled(tmp_path, capsys):
    data = dataset(tmp_path / "data", halves(0, 255))
    error = train_error(data, tmp_path, capsys)
    assert "labels hold only 0 and 255, and 255 always means unlabelled" in error
    assert "0/1" in error and not (tmp_path / "run" / "model").exists()


def test_a_boolean_unlabelled_value_is_refused(tmp_path, capsys):
    data = dataset(
        tmp_path / "data", halves(0, 1, unlabelled=2), {"names": ["bg", "cell"], "unlabelled": True}
    )
    assert "unlabelled must be an integer label value" in train_error(data, tmp_path, capsys)


def test_a_named_class_without_labelled_pixels_is_refused_naming_it(tmp_path, capsys):
    data = dataset(tmp_path / "data", halves(0, 1), {"names": ["bg", "cell", "debris"]})
    error = train_error(data, tmp_path, capsys)
    assert "2 'debris' have no labelled pixels" in error and "classes.json" in error


def test_ids_with_gaps_without_classes_json_are_refused_naming_the_empty_ids(tmp_path, capsys):
    labels = halves(0, 1)
    labels[10:12] = 5
    error = train_error(dataset(tmp_path / "data", labels), tmp_path, capsys)
    assert "ids [0, 1, 5] and none of [2, 3, 4]" in error


def test_annotations_of_a_single_class_are_refused(tmp_path, capsys):
    data = annotated(tmp_path / "data", [("Tumor", square(2, 2, 12, 12))])
    error = train_error(data, tmp_path, capsys)
    assert "labelled pixels of 1 class(es) (0 'Tumor')" in error and "annotate another class" in error


# 3. held-out strokes


def test_a_high_holdout_keeps_a_stroke_of_each_class_for_training():
    labels = np.full((20, 20), IGNORE_INDEX, np.int64)
    labels[0, :3], labels[10, :3] = 0, 0  # two strokes of class 0
    for row in (2, 5, 14, 18):  # four of class 1
        labels[row, 10:13] = 1
    for seed in range(5):
        (train,), (val,) = split_strokes([labels], share=0.75, seed=seed)
        assert set(np.unique(train[train != IGNORE_INDEX]).tolist()) == {0, 1}
        assert (val == 0).any() and (val == 1).sum() == 9  # 1 of 2 strokes and 3 of 4 held out


# 4. fine-tuning matches classes by name


def test_fine_tuning_matches_annotation_classes_to_the_models_names(tmp_path):
    # "cell" appears first: by appearance it would be class 0, and the model's class 0 is "background"
    data = annotated(
        tmp_path / "data", [("cell", square(2, 2, 6, 6)), ("background", square(20, 20, 30, 30))]
    )
    (sample,) = read_dataset(data, channels=1, num_classes=2, class_names=["background", "cell"])
    assert sample.labels[3, 3] == 1 and sample.labels[25, 25] == 0
    with pytest.raises(DatasetError, match=r"im0\.geojson: annotation class\(es\) 'cell', 'background'"):
        read_dataset(data, channels=1, num_classes=2, class_names=["bg", "nucleus"])


def test_fine_tuning_renumbers_label_files_whose_classes_json_orders_the_names_otherwise(tmp_path):
    data = dataset(tmp_path / "data", halves(0, 1), {"names": ["cell", "background"]})
    (sample,) = read_dataset(data, channels=1, num_classes=2, class_names=["background", "cell"])
    assert sample.labels[0, 0] == 1 and sample.labels[-1, 0] == 0  # file id 0 "cell" is the model's 1
    (data / "classes.json").write_text(json.dumps({"names": ["cell", "stroma"]}))
    with pytest.raises(DatasetError, match=r"classes\.json: names 'stroma' are not classes of the model"):
        read_dataset(data, channels=1, num_classes=2, class_names=["background", "cell"])


def test_fine_tuning_on_the_command_line_matches_annotations_by_name(tmp_path, capsys):
    model = tmp_path / "model"
    densecnn.train.strokes.StrokeTrainer(
        [np.zeros((1, 16, 16), np.float32)],
        [np.tile(np.array([0, 1]), (16, 8))],
        model="tiny",
        class_names=["background", "cell"],
    ).save(model)
    data = annotated(tmp_path / "data", [("cell", square(2, 2, 6, 6)), ("Tumor", square(20, 20, 30, 30))])
    argv = [
        "train",
        "--model",
        str(model),
        "--data",
        str(data),
        "--out",
        str(tmp_path / "run"),
        "--epochs",
        "1",
    ]
    assert main(argv) == 2
    assert "im0.geojson: annotation class(es) 'Tumor'" in capsys.readouterr().err


# 5. label values as stored


def test_unlabelled_zero_leaves_255_unlabelled_and_errors_name_the_files_values(tmp_path):
    labels = halves(1, 2, unlabelled=0)
    labels[10:12] = 255
    (sample,) = read_dataset(dataset(tmp_path / "a", labels), channels=1, num_classes=2, unlabelled=0)
    assert sorted(np.unique(sample.labels).tolist()) == [0, 1, IGNORE_INDEX]  # 255 is not the class 254
    labels[10:12] = 3
    with pytest.raises(DatasetError, match=r"label ids \[3\] in the file"):
        read_dataset(dataset(tmp_path / "b", labels), channels=1, num_classes=2, unlabelled=0)


def test_the_hint_for_ids_beyond_classes_json_names_points_at_classes_json(tmp_path, capsys):
    labels = halves(0, 2)
    error = train_error(
        dataset(tmp_path / "data", labels, {"names": ["bg", "cell"]}), tmp_path, capsys, "--classes", "3"
    )
    assert (
        f"add names for class 2 to {tmp_path / 'data' / 'classes.json'}" in error
        and "use --classes" not in error
    )


def test_a_negative_unlabelled_value_in_npy_labels_is_read_as_unlabelled(tmp_path):
    volume = np.random.default_rng(0).integers(0, 255, (4, 8, 8)).astype(np.uint8)
    labels = np.full((4, 8, 8), -1, np.int16)
    labels[:, 0], labels[:, -1] = 0, 1
    for folder, array in (("images", volume), ("labels", labels)):
        (tmp_path / folder).mkdir()
        np.save(tmp_path / folder / "v.npy", array)
    (sample,) = read_dataset(tmp_path, channels=1, num_classes=2, spatial_dims=3, unlabelled=-1)
    assert (sample.labels[:, 1:-1] == IGNORE_INDEX).all() and (sample.labels[:, 0] == 0).all()


# 6. classes.json checked when it is read


@pytest.mark.parametrize(
    "content, message",
    [
        ({"names": "bg,cell"}, "names must be a list of class names"),
        ({"names": ["bg", "bg"]}, "names repeats 'bg'"),
        ({"names": []}, "names lists 0 class(es)"),
        ({"names": ["bg", ""]}, "names must be a list of class names"),
        ({"names": ["bg", "cell"], "palette": [[0, 0, 0]]}, "palette has 1 colours for 2 names"),
        ({"names": ["bg", "cell"], "palette": [[0, 0, 0], "red"]}, "palette[1] must be [r, g, b]"),
        ({"names": ["bg", "cell"], "palette": [[0, 0, 0], [300, -5, 0]]}, "palette[1] must be [r, g, b]"),
    ],
)
def test_classes_json_is_checked_when_it_is_read(tmp_path, content, message):
    (tmp_path / "classes.json").write_text(json.dumps(content))
    with pytest.raises(DatasetError) as error:
        read_class_info(tmp_path)
    assert message in str(error.value) and "classes.json" in str(error.value)


# 7. mixed image folders


def test_2d_images_beside_stacks_are_refused_not_skipped(tmp_path, capsys):
    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    Image.fromarray(np.zeros((16, 16), np.uint8)).save(data / "images" / "a.png")
    tifffile.imwrite(data / "images" / "b.tif", np.zeros((4, 16, 16), np.uint8))
    with pytest.raises(DatasetError, match=r"a\.png are 2-D images, and the run trains on volumes"):
        image_files(data, 3)


def test_a_gray_image_sorting_first_does_not_make_colour_images_gray(tmp_path):
    make_dataset(tmp_path, images=1)
    Image.fromarray(np.zeros((40, 36, 3), np.uint8)).save(tmp_path / "images" / "z_colour.png")
    assert infer_channels(tmp_path) == 3


# 9. help and card text


def test_the_help_says_the_default_recipe_holds_nothing_out():
    assert "holds out a share of\nthe strokes for early stopping" not in EPILOG
    assert "keeps the newest" in EPILOG and "--holdout S" in EPILOG


def test_a_holdout_runs_card_does_not_say_no_validation_was_done(tmp_path, tiny_recipe):
    data = make_dataset(tmp_path / "data", images=1, size=(48, 48))
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--out", str(out), "--holdout", "0.5", "--classes", "3"]) == 0
    card = (out / "model" / "README.md").read_text()
    assert "No validation set was given (`--val`): there are no held-out metrics" not in card
    assert "strokes were held out" in card


def test_a_label_file_beside_annotations_of_the_same_image_is_refused(tmp_path):
    data = dataset(tmp_path / "data", halves(0, 1), {"names": ["background", "cell"]})
    geojson(data / "annotations" / "im0.geojson", [("cell", square(2, 2, 6, 6))])
    with pytest.raises(DatasetError, match=r"im0\.png has both a label file .* and annotations"):
        read_dataset(data, channels=1, num_classes=2)


def test_qupath_class_colours_become_the_palette_without_classes_json(tmp_path):
    annotations = tmp_path / "annotations" / "im0.geojson"
    annotations.parent.mkdir(parents=True)
    features = [
        ("Tumor", {"colorRGB": -3670016}, square(2, 2, 6, 6)),  # Java's packed ARGB: (200, 0, 0)
        ("Stroma", {"color": [0, 150, 200]}, square(20, 20, 30, 30)),
    ]
    annotations.write_text(json.dumps({"type": "FeatureCollection", "features": [
        {"type": "Feature", "geometry": {"type": "Polygon", "coordinates": [ring]},
         "properties": {"classification": {"name": name, **colour}}} for name, colour, ring in features
    ]}))  # fmt: skip
    info = read_class_info(tmp_path)
    assert info.names == ["Tumor", "Stroma"] and info.palette == [[200, 0, 0], [0, 150, 200]]
    geojson(annotations, [("Tumor", square(2, 2, 6, 6)), ("Stroma", square(20, 20, 30, 30))])  # no colours
    assert read_class_info(tmp_path).palette is None  # the default colours


def test_a_training_error_offers_only_the_options_train_takes():
    """A reader's advice to name a channel axis (predict's and the service's option) is left out of a training
    error; an intensity that fixes it (train's --intensity too) stays."""
    assert training_fix(ImageReadError("a.npy: 5 channels, the model takes 2", fix=CHANNEL_AXIS_FIX)) is None
    kept = training_fix(
        IntensityError("a.tif: values past 1", fix=Fix("give a range", (("intensity", "range:0,4095"),)))
    )
    assert kept.render(cli_option) == "give a range: --intensity range:0,4095"
