"""OME-Zarr outputs: labels written into the input image's own ``labels/`` group (NGFF 0.4 and 0.5) or as a
standalone OME-Zarr read back as a coloured multiscale label image with class names by ome-zarr-py's reader; the
levels equal the full level downsampled; level 0 equals one in-memory pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import densecnn
from densecnn.errors import PredictInputError, cli_option, query_option
from tests.predict_support import save_model, tiled_nuclei, whole_image_scores
from tests.tolerances import assert_labels_equal_except_ties

zarr = pytest.importorskip("zarr")
pytest.importorskip("distributed")
ome_zarr = pytest.importorskip("ome_zarr")

from ome_zarr.io import parse_url  # noqa: E402
from ome_zarr.reader import Label, Multiscales, Reader  # noqa: E402

from densecnn.blockwise import BlockwiseOptions, predict_to_disk  # noqa: E402
from densecnn.blockwise.inputs import matching_level  # noqa: E402

PIXEL_SIZE = 0.5


def write_image(path, pixels: np.ndarray, zarr_format: int) -> None:
    """An OME-Zarr image (NGFF 0.4 in zarr v2 or 0.5 in v3) of (H, W) pixels as tczyx, 0.5 um per pixel, 2 levels."""
    from ome_zarr import format as ngff_format
    from ome_zarr.writer import write_multiscales_metadata

    fmt = ngff_format.FormatV04() if zarr_format == 2 else ngff_format.FormatV05()
    group = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
    levels = [pixels, pixels[::2, ::2]]
    encoding = {"chunk_key_encoding": {"name": "v2", "separator": "/"}} if zarr_format == 2 else {}
    for k, level in enumerate(levels):
        group.create_array(str(k), data=level[None, None, None], chunks=(1, 1, 1, 32, 32), **encoding)
    axes = [{"name": "t", "type": "time"}, {"name": "c", "type": "channel"}] + [
        {"name": n, "type": "space", "unit": "micrometer"} for n in "zyx"
    ]
    datasets = [
        {
            "path": str(k),
            "coordinateTransformations": [
                {"type": "scale", "scale": [1, 1, 1, PIXEL_SIZE * 2**k, PIXEL_SIZE * 2**k]}
            ],
        }
        for k in range(len(levels))
    ]
    write_multiscales_metadata(group, datasets, fmt=fmt, axes=axes)


def write_image_scaled_as_a_whole(path, pixels: np.ndarray, zarr_format: int) -> None:
    """:func:`write_image`'s image with its pixel size given once for the whole image: each dataset's scale counts
    level-0 pixels (1, then 2) and the multiscale's own scale, which NGFF applies after them, is 0.5 um per pixel;
    the levels are at 0.5 and 1.0 um per pixel still."""
    write_image(path, pixels, zarr_format)
    group = zarr.open_group(str(path), mode="r+")
    ome = zarr_format == 3  # NGFF 0.5 keeps the multiscales under "ome"
    metadata = dict(group.attrs["ome"] if ome else group.attrs)
    multiscale = metadata["multiscales"][0]
    for k, dataset in enumerate(multiscale["datasets"]):
        dataset["coordinateTransformations"] = [{"type": "scale", "scale": [1, 1, 1, 2**k, 2**k]}]
    multiscale["coordinateTransformations"] = [{"type": "scale", "scale": [1, 1, 1, PIXEL_SIZE, PIXEL_SIZE]}]
    group.attrs.update({"ome": metadata} if ome else metadata)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    root = tmp_path_factory.mktemp("ngff")
    save_model(model, root / "model", patch, "reflect", 1)
    path = root / "model"
    loaded = densecnn.load(path)
    densecnn.save(loaded.model, path, patch_size=loaded.patch_size, class_names=["background", "nucleus", "edge"],
                  palette=[[0, 0, 0], [255, 0, 0], [0, 255, 0]], normalization=loaded.normalization,
                  padding_mode="reflect")  # fmt: skip
    return path


def _read_labels(image_path):
    """The label image nodes of an OME-Zarr image, as ome-zarr-py's reader (napari-ome-zarr's) sees them."""
    nodes = list(Reader(parse_url(str(image_path)))())
    return [node for node in nodes if node.load(Label)]


@pytest.mark.parametrize("zarr_format", [2, 3], ids=["ngff-0.4", "ngff-0.5"])
def test_labels_into_the_images_own_labels_group_read_back_as_a_coloured_label_image(
    model_dir, tmp_path, zarr_format
):
    pixels = tiled_nuclei(150, 130)
    image = tmp_path / "image.ome.zarr"
    write_image(image, pixels, zarr_format)
    options = BlockwiseOptions(labels_into="cells", chunk=32, block=64, progress=False)
    summary = predict_to_disk(model_dir, image, None, options)
    assert summary.computed == summary.total == 5 * 5

    (node,) = _read_labels(image)
    assert "labels/cells" in str(node.zarr) and node.metadata["name"] == "cells"
    assert node.metadata["color"][1] == [1.0, 0.0, 0.0, 1.0]  # the model's palette, as RGBA in [0, 1]
    assert node.metadata["properties"][2]["class"] == "edge"
    assert (
        node.load(Multiscales) is not None and len(node.data) == 4
    )  # 150 -> 75 -> 38 -> 19: each side fits 32

    group = zarr.open_group(str(image / "labels" / "cells"), mode="r")
    assert group.metadata.zarr_format == zarr_format
    attrs = dict(group.attrs) if zarr_format == 2 else group.attrs["ome"]
    assert attrs["image-label"]["source"] == {"image": "../../"}
    multiscale = attrs["multiscales"][0]
    assert [a["name"] for a in multiscale["axes"]] == ["t", "c", "z", "y", "x"]
    assert multiscale["datasets"][2]["coordinateTransformations"][0]["scale"] == [1, 1, 1, 2.0, 2.0]

    levels = [np.asarray(level)[0, 0, 0] for level in node.data]
    labels = torch.from_numpy(levels[0].astype(np.int64))
    assert_labels_equal_except_ties(labels[None], whole_image_scores(model_dir, pixels)[None])
    for k in range(1, len(levels)):
        np.testing.assert_array_equal(levels[k], levels[k - 1][::2, ::2])  # nearest: every other pixel

    again = predict_to_disk(model_dir, image, None, options)  # resumes: nothing left to compute
    assert again.computed == 0 and len(_read_labels(image)) == 1
    for k, index in (
        (0, (0, 0, 0, 2, 3)),
        (1, (0, 0, 0, 1, 0)),
    ):  # a killed run: chunks of two levels missing
        level = zarr.open_array(str(image / "labels" / "cells" / str(k)))
        key = level.metadata.encode_chunk_key(index)
        (image / "labels" / "cells" / str(k) / key).unlink()
    resumed = predict_to_disk(model_dir, image, None, options)
    assert resumed.computed == 1
    np.testing.assert_array_equal(
        [np.asarray(level)[0, 0, 0] for level in _read_labels(image)[0].data][1], levels[1]
    )


def test_a_standalone_ome_zarr_and_multiscale_probabilities(model_dir, tmp_path):
    pixels = tiled_nuclei(100, 70)
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=pixels, chunks=(32, 32))
    options = BlockwiseOptions(chunk=32, probabilities=tmp_path / "p.ome.zarr", progress=False)
    predict_to_disk(model_dir, tmp_path / "in.zarr", tmp_path / "out.ome.zarr", options)
    (node,) = _read_labels(tmp_path / "out.ome.zarr")
    assert node.metadata["properties"][1]["class"] == "nucleus"
    group = zarr.open_group(str(tmp_path / "p.ome.zarr"), mode="r")
    probabilities = [group[str(k)][:] for k in range(len(list(group.array_keys())))]
    assert probabilities[0].dtype == np.float16 and probabilities[0].shape == (3, 100, 70)
    coarse = probabilities[0].astype(np.float32).reshape(3, 50, 2, 35, 2).mean(axis=(2, 4))
    np.testing.assert_allclose(
        probabilities[1].astype(np.float32), coarse, atol=1e-3
    )  # mean of each 2x2 block
    nodes = list(Reader(parse_url(str(tmp_path / "p.ome.zarr")))())
    assert nodes[0].load(Multiscales) is not None


def test_labels_into_needs_an_ome_zarr_image_and_a_plain_name(model_dir, tmp_path):
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=tiled_nuclei(40, 40), chunks=(32, 32))
    with pytest.raises(PredictInputError, match="labels are written into an OME-Zarr image only"):
        predict_to_disk(
            model_dir, tmp_path / "in.zarr", None, BlockwiseOptions(labels_into="cells", progress=False)
        )
    write_image(tmp_path / "image.ome.zarr", tiled_nuclei(40, 40), 3)
    with pytest.raises(PredictInputError, match="no plain name") as refused:
        predict_to_disk(
            model_dir, tmp_path / "image.ome.zarr", None, BlockwiseOptions(labels_into="../x", progress=False)
        )
    assert refused.value.render(cli_option).endswith("give one: --labels-into cells")
    with pytest.raises(PredictInputError, match="no output given") as refused:
        predict_to_disk(model_dir, tmp_path / "image.ome.zarr", None, BlockwiseOptions(progress=False))
    assert refused.value.render(query_option).endswith("?labels_into=NAME")


def test_the_command_writes_labels_into_the_image(model_dir, tmp_path, capsys):
    from densecnn.cli import main

    write_image(tmp_path / "image.ome.zarr", tiled_nuclei(60, 50), 3)
    argv = [
        "predict",
        str(model_dir),
        str(tmp_path / "image.ome.zarr"),
        "--labels-into",
        "nuclei",
        "--no-progress",
    ]
    assert main(argv) == 0
    (node,) = _read_labels(tmp_path / "image.ome.zarr")
    assert node.metadata["name"] == "nuclei"
    assert main([*argv[:3], str(tmp_path / "x.zarr"), *argv[3:]]) == 2
    assert "give no output besides" in capsys.readouterr().err


def test_the_level_is_chosen_by_index_or_by_the_models_pixel_size(model_dir, tmp_path):
    pixels = tiled_nuclei(128, 96)
    write_image(tmp_path / "image.ome.zarr", pixels, 3)  # levels at 0.5 and 1.0 um per pixel
    predict_to_disk(
        model_dir,
        tmp_path / "image.ome.zarr",
        tmp_path / "l1.zarr",
        BlockwiseOptions(level=1, progress=False),
    )
    assert zarr.open_array(str(tmp_path / "l1.zarr")).shape == (64, 48)

    loaded = densecnn.load(model_dir)
    coarse = tmp_path / "coarse-model"
    densecnn.save(loaded.model, coarse, patch_size=loaded.patch_size, normalization=loaded.normalization,
                  padding_mode="reflect", pixel_size=(1.05, 1.05))  # fmt: skip
    assert densecnn.load(coarse).pixel_size == (1.05, 1.05)
    predict_to_disk(
        coarse, tmp_path / "image.ome.zarr", None, BlockwiseOptions(labels_into="coarse", progress=False)
    )
    (node,) = _read_labels(tmp_path / "image.ome.zarr")
    assert np.asarray(node.data[0]).shape == (1, 1, 1, 64, 48)  # level 1: 1.0 um, within 20% of 1.05
    multiscale = zarr.open_group(str(tmp_path / "image.ome.zarr" / "labels" / "coarse")).attrs["ome"][
        "multiscales"
    ]
    assert multiscale[0]["datasets"][0]["coordinateTransformations"][0]["scale"] == [1, 1, 1, 1.0, 1.0]

    fine = tmp_path / "fine-model"
    densecnn.save(loaded.model, fine, patch_size=loaded.patch_size, pixel_size=(0.2, 0.2))
    with pytest.raises(
        PredictInputError, match=r"no level has the model's pixel size \(0\.2x0\.2 um.*0: 0\.5x0\.5"
    ):
        predict_to_disk(
            fine, tmp_path / "image.ome.zarr", tmp_path / "f.zarr", BlockwiseOptions(progress=False)
        )
    with pytest.raises(PredictInputError, match="has levels 0..1, not 2"):
        predict_to_disk(
            fine, tmp_path / "image.ome.zarr", tmp_path / "f.zarr", BlockwiseOptions(level=2, progress=False)
        )


@pytest.mark.parametrize("zarr_format", [2, 3], ids=["ngff-0.4", "ngff-0.5"])
def test_the_level_at_the_models_pixel_size_counts_the_images_own_scale(model_dir, tmp_path, zarr_format):
    image = tmp_path / "image.ome.zarr"
    # levels at 0.5 and 1.0 um per pixel
    write_image_scaled_as_a_whole(image, tiled_nuclei(128, 96), zarr_format)
    loaded = densecnn.load(model_dir)
    models = {}
    for name, pixel_size in (("fine", (0.5, 0.5)), ("coarse", (1.05, 1.05))):
        models[name] = tmp_path / name
        densecnn.save(loaded.model, models[name], patch_size=loaded.patch_size, normalization=loaded.normalization,
                      padding_mode="reflect", pixel_size=pixel_size)  # fmt: skip
    # the datasets' scales alone would put the levels at 1.0 and 2.0 um per pixel: level 0 for the coarse model
    assert matching_level(image, densecnn.load(models["coarse"])) == 1
    assert matching_level(image, densecnn.load(models["fine"])) == 0

    predict_to_disk(models["coarse"], image, None, BlockwiseOptions(labels_into="coarse", progress=False))
    labels = zarr.open_group(str(image / "labels" / "coarse"), mode="r")
    assert labels["0"].shape == (1, 1, 1, 64, 48)  # read at level 1
    metadata = dict(labels.attrs) if zarr_format == 2 else labels.attrs["ome"]
    (multiscale,) = metadata["multiscales"]
    assert multiscale["datasets"][0]["coordinateTransformations"][0]["scale"] == [1, 1, 1, 1.0, 1.0]


def test_ngff_05_outputs_pass_ome_zarr_models_validation(model_dir, tmp_path):
    """The label image written into an NGFF 0.5 image, its labels group, a standalone label image and multiscale
    probabilities, as ome-zarr-models (the NGFF spec's pydantic models) validates them."""
    models = pytest.importorskip("ome_zarr_models.v05")
    from ome_zarr_models.v05.image_label import ImageLabel
    from ome_zarr_models.v05.labels import Labels

    pixels = tiled_nuclei(100, 70)
    image = tmp_path / "image.ome.zarr"
    write_image(image, pixels, 3)
    predict_to_disk(model_dir, image, None, BlockwiseOptions(labels_into="cells", chunk=32, progress=False))
    options = BlockwiseOptions(chunk=32, probabilities=tmp_path / "p.ome.zarr", progress=False)
    predict_to_disk(model_dir, image, tmp_path / "out.ome.zarr", options)
    for model, path in (
        (Labels, image / "labels"),
        (ImageLabel, image / "labels" / "cells"),
        (ImageLabel, tmp_path / "out.ome.zarr"),
        (models.Image, tmp_path / "p.ome.zarr"),
    ):
        model.from_zarr(zarr.open_group(str(path), mode="r"))  # raises a ValidationError naming what is wrong


def test_an_interrupted_run_is_no_label_image_until_it_finishes(model_dir, tmp_path):
    """The multiscales and image-label metadata are written last: readers see a run in progress (or killed) as no
    label image at all, not as one whose missing chunks read as background; the same run then resumes it."""
    import threading

    from densecnn.errors import Cancelled

    pixels = tiled_nuclei(150, 130)
    image = tmp_path / "image.ome.zarr"
    write_image(image, pixels, 3)
    cancel = threading.Event()

    def after_the_first_block(summary) -> None:
        if summary.computed:
            cancel.set()

    options = BlockwiseOptions(labels_into="cells", chunk=32, block=32, progress=False)
    with pytest.raises(Cancelled):
        predict_to_disk(model_dir, image, None, BlockwiseOptions(**{**vars(options), "cancel": cancel,
                                                          "on_progress": after_the_first_block}))  # fmt: skip
    assert (image / "labels" / "cells" / "0").exists()  # chunks were written ...
    assert _read_labels(image) == []  # ... but no reader sees a label image
    resumed = predict_to_disk(model_dir, image, None, options)
    assert 0 < resumed.skipped < resumed.total and resumed.computed == resumed.total - resumed.skipped
    (node,) = _read_labels(image)
    labels = torch.from_numpy(np.asarray(node.data[0])[0, 0, 0].astype(np.int64))
    assert_labels_equal_except_ties(labels[None], whole_image_scores(model_dir, pixels)[None])


@pytest.mark.parametrize("zarr_format", [2, 3], ids=["ngff-0.4", "ngff-0.5"])
def test_starting_over_takes_the_finished_image_away_until_it_is_rewritten(model_dir, tmp_path, zarr_format):
    """``overwrite`` on a finished label image, stopped midway: readers see no label image (not the old metadata
    over replaced levels whose missing chunks read as background); in the image's labels group and standalone."""
    import threading

    from densecnn.errors import Cancelled

    pixels = tiled_nuclei(150, 130)
    image = tmp_path / "image.ome.zarr"
    write_image(image, pixels, zarr_format)
    standalone = tmp_path / "labels.ome.zarr"
    runs = {"labels_into": (image, None), "standalone": (image, standalone)}
    for name, (source, out) in runs.items():
        options = BlockwiseOptions(
            labels_into="cells" if out is None else None, chunk=32, block=32, progress=False
        )
        predict_to_disk(model_dir, source, out, options)
        cancel = threading.Event()
        stop_after_one = {
            "cancel": cancel,
            "on_progress": lambda summary, cancel=cancel: summary.computed and cancel.set(),
        }
        with pytest.raises(Cancelled):
            predict_to_disk(model_dir, source, out, BlockwiseOptions(**{**vars(options), "overwrite": True,
                                                                     **stop_after_one}))  # fmt: skip
        if out is None:
            assert _read_labels(image) == [], name
            labels_group = dict(zarr.open_group(str(image / "labels"), mode="r").attrs)
            assert "cells" not in labels_group.get("labels", labels_group.get("ome", {}).get("labels", []))
        else:
            assert list(Reader(parse_url(str(out)))()) == [], name
            assert not {"multiscales", "ome"} & set(zarr.open_group(str(out), mode="r").attrs), name
        predict_to_disk(model_dir, source, out, options)  # resumes the new run and publishes it
    (node,) = _read_labels(image)
    labels = torch.from_numpy(np.asarray(node.data[0])[0, 0, 0].astype(np.int64))
    assert_labels_equal_except_ties(labels[None], whole_image_scores(model_dir, pixels)[None])
    assert len(list(Reader(parse_url(str(standalone)))())) == 1


@pytest.mark.parametrize("flag", ["output", "probabilities"])
def test_a_1d_models_ome_zarr_output_is_refused_before_any_work(tmp_path, flag, capsys):
    """An NGFF image has 2 or 3 spatial axes; a 1-D model's labels and probabilities have one."""
    from densecnn.cli import main

    signal_net = torch.nn.Sequential(torch.nn.Conv1d(1, 2, 3), torch.nn.Flatten())
    signal_model = save_model(signal_net, tmp_path / "signal", (3,), "zeros", 1)
    signal = tmp_path / "signal.zarr"
    zarr.create_array(store=str(signal), data=np.linspace(0, 1, 64, dtype=np.float32), chunks=(16,))
    output, probabilities = tmp_path / "labels.zarr", None
    if flag == "output":
        output = tmp_path / "labels.ome.zarr"
    else:
        probabilities = tmp_path / "probabilities.ome.zarr"
    with pytest.raises(PredictInputError, match=f"{flag} .*2 or 3 spatial axes.*1-D model.*ending in .zarr"):
        predict_to_disk(
            signal_model, signal, output, BlockwiseOptions(probabilities=probabilities, progress=False)
        )
    argv = ["predict", str(signal_model), str(signal), str(output), "--no-progress"]
    assert main(argv + (["--probabilities", str(probabilities)] if probabilities else [])) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error and "not .ome.zarr" in error, error
    assert not output.exists() and (probabilities is None or not probabilities.exists())
