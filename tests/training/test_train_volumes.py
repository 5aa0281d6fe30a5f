"""Training on signals (1-D) and volumes (3-D): crops with context, datasets, and whole steps of the trainer.

The crops are checked against an independent reference (numpy.pad with the patch convention, then a plain
window); the steps with a stride-1 conv net, whose dense net is the net itself run on the padded input.
"""

from __future__ import annotations

import argparse
import itertools
import shlex

import numpy as np
import pytest
import tifffile
import torch
from torch import nn

from densecnn import DatasetError, TrainingError, zoo
from densecnn.cli import main
from densecnn.commands.train import add_arguments, config_from_args
from densecnn.train import TrainConfig
from densecnn.train import loop as training_loop
from densecnn.train.crops import CropSampler, pad_spatial, sample_generator
from densecnn.train.data import crop_size
from densecnn.train.dataset import read_dataset
from densecnn.train.distributed import Distributed
from densecnn.train.metrics import confusion_matrix
from densecnn.train.validation import validate

NUMPY_MODES = {"zeros": "constant", "reflect": "reflect", "replicate": "edge"}


def reference_context(image: np.ndarray, patch, padding_mode: str) -> np.ndarray:
    """(C, *spatial) padded with the patch convention (⌊(P-1)/2⌋ before, ⌊P/2⌋ after, per axis) by numpy.pad."""
    widths = [(0, 0)] + [((p - 1) // 2, p // 2) for p in patch]
    return np.pad(image, widths, mode=NUMPY_MODES[padding_mode])


def augmentations(dims: int):
    """Every flip subset along the spatial axes, with every quarter turn in the (H, W) plane (none for signals)."""
    turns = range(4) if dims >= 2 else range(1)
    flip_sets = itertools.chain.from_iterable(
        itertools.combinations(range(-dims, 0), n) for n in range(dims + 1)
    )
    return list(itertools.product(flip_sets, turns))


def augmented(array: np.ndarray, flips, turns) -> np.ndarray:
    for axis in flips:
        array = np.flip(array, axis)
    return np.rot90(array, turns, axes=(-2, -1)) if turns else array


@pytest.mark.parametrize(
    "shape, patch, crop, padding_mode",
    [
        ((17,), (6,), (5,), "zeros"),
        ((17,), (5,), (9,), "reflect"),
        ((4,), (9,), (3,), "replicate"),  # signal shorter than the patch
        ((6, 7, 8), (3, 4, 4), (2, 3, 3), "zeros"),
        ((5, 9, 8), (2, 5, 4), (3, 4, 4), "reflect"),  # anisotropic, even and odd, Ph != Pw
        ((3, 4, 5), (4, 7, 6), (2, 2, 2), "reflect"),  # volume smaller than the patch on every axis
        ((5, 6, 6), (3, 3, 3), (4, 5, 5), "replicate"),
    ],
)
def test_crops_equal_the_window_a_naive_sampler_cuts_from_the_padded_augmented_input(
    shape, patch, crop, padding_mode
):
    dims = len(shape)
    rng = np.random.default_rng(dims)
    image = rng.standard_normal((2, *shape))  # float64: the comparison below is exact
    labels = np.arange(np.prod(shape)).reshape(shape)  # every pixel its own id, to locate the crop
    sampler = CropSampler([torch.from_numpy(image)], [torch.from_numpy(labels)], patch_size=patch,
                          padding_mode=padding_mode, crop=crop, flip=True, rot90=True)  # fmt: skip
    seen = set()
    for seed in range(16):
        sample = sampler.sample(0, sample_generator(0, 0, seed))
        assert sample.labels.shape == crop
        assert sample.image.shape == (2, *(c + p - 1 for c, p in zip(crop, patch, strict=True)))
        matched = 0
        for flips, turns in augmentations(dims):
            moved_labels = augmented(labels, flips, turns)
            start = np.argwhere(moved_labels == sample.labels.reshape(-1)[0].item())[0]
            window = tuple(slice(s, s + c) for s, c in zip(start, crop, strict=True))
            if moved_labels[window].shape != crop or not np.array_equal(moved_labels[window], sample.labels):
                continue
            padded = reference_context(augmented(image, flips, turns), patch, padding_mode)
            context = tuple(slice(s, s + c + p - 1) for s, c, p in zip(start, crop, patch, strict=True))
            np.testing.assert_array_equal(sample.image.numpy(), padded[(slice(None), *context)])
            matched += 1
            seen.add((flips, turns))
        # several may match (flipping H and W is a half turn): each of them must give the crop's image
        assert matched, "the crop's labels match no augmentation of the input"
    assert len(seen) >= min(4, len(augmentations(dims)))  # several flips (and turns) were exercised


@pytest.mark.parametrize("padding_mode", NUMPY_MODES)
def test_pad_spatial_equals_numpy_pad_on_every_axis(padding_mode):
    volume = np.random.default_rng(0).standard_normal((2, 3, 1, 4))
    before, after = (5, 2, 0), (1, 3, 6)
    got = pad_spatial(torch.from_numpy(volume), before, after, padding_mode).numpy()
    widths = [(0, 0)] + list(zip(before, after, strict=True))
    np.testing.assert_array_equal(got, np.pad(volume, widths, mode=NUMPY_MODES[padding_mode]))


def test_quarter_turns_keep_d_and_need_a_square_plane():
    volume, labels = torch.zeros(1, 4, 6, 6), torch.zeros(4, 6, 6, dtype=torch.long)
    with pytest.raises(ValueError, match="equal H and W"):
        CropSampler([volume], [labels], patch_size=(1, 3, 3), padding_mode="zeros", crop=(2, 3, 4), flip=False,
                    rot90=True)  # fmt: skip
    sampler = CropSampler([volume], [labels], patch_size=(1, 3, 3), padding_mode="zeros", crop=(2, 3, 4),
                          flip=True, rot90=False)  # fmt: skip
    assert sampler.sample(0, sample_generator(0, 0, 0)).labels.shape == (2, 3, 4)


def test_crop_size_per_axis():
    assert crop_size(64, [(40, 36)], rot90=False) == (36, 36)  # images: a square, as before
    assert crop_size(64, [(31, 61, 40), (33, 50, 70)], rot90=True) == (31, 40, 40)
    assert crop_size([8, 64, 64], [(31, 61, 40)], rot90=True) == (8, 40, 40)
    assert crop_size([8, 64, 32], [(31, 61, 40)], rot90=False) == (8, 61, 32)
    assert crop_size(100, [(50,)], rot90=True) == (50,)
    with pytest.raises(TrainingError, match="--crop needs 3 entries"):
        crop_size([8, 64], [(31, 61, 40)], rot90=True)
    with pytest.raises(TrainingError, match="--no-rot90"):
        crop_size([8, 64, 32], [(31, 61, 40)], rot90=True)


@pytest.mark.parametrize("text, value", [("48", 48), ("8,64,64", [8, 64, 64])])
def test_the_crop_option_takes_an_int_or_one_size_per_axis(text, value):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--out", "r", "--model", "tiny", "--data", "d", "--crop", text])
    config = config_from_args(args)
    assert config.crop == value
    words = shlex.split(config.command)
    assert words[words.index("--crop") + 1] == text  # the model card's command gives it back as written
    with pytest.raises(TrainingError, match="--crop must be >= 1"):
        TrainConfig(model="tiny", data="d", out="r", crop=[4, 0, 4]).check()


def test_a_bad_crop_option_is_refused_by_the_parser(capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--out", "r", "--crop", "8,x"])
    assert "expected an integer or comma-separated integers" in capsys.readouterr().err


# --- datasets ------------------------------------------------------------------------------------------------------


def volume_and_labels(shape=(5, 7, 6), seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, shape, dtype=np.uint8), rng.integers(0, 3, shape, dtype=np.uint8)


def write(path, array):
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".npy":
        np.save(path, array)
    elif path.suffix == ".zarr":
        import zarr

        zarr.save_array(str(path), array)
    else:
        tifffile.imwrite(path, array, photometric="minisblack")


def test_volume_datasets_read_tiff_stacks_npy_and_zarr(tmp_path):
    volume, labels = volume_and_labels()
    write(tmp_path / "images" / "a.tif", volume)  # a multi-page TIFF
    write(tmp_path / "labels" / "a.tif", labels)
    write(tmp_path / "images" / "b.npy", volume[None].astype(np.uint16) * 257)  # (C, D, H, W)
    write(tmp_path / "labels" / "b.npy", labels.astype(np.int32))
    write(tmp_path / "images" / "c.zarr", volume)
    write(tmp_path / "labels" / "c.zarr", labels)
    tifffile.imwrite(
        tmp_path / "images" / "e.tif", volume, volumetric=True, tile=(16, 16), photometric="minisblack"
    )
    write(
        tmp_path / "labels" / "e.tif", labels
    )  # above: a 3-D TIFF (one volumetric page), here a multi-page one
    (tmp_path / "images" / "d.tif").parent.mkdir(exist_ok=True)
    for page in volume:  # pages appended one by one, no shape metadata: stacked in page order
        tifffile.imwrite(tmp_path / "images" / "d.tif", page, append=True, metadata=None)
    write(tmp_path / "labels" / "d.npy", labels)
    write(tmp_path / "masks" / "d.npy", (np.arange(labels.size) % 2).reshape(labels.shape))

    samples = read_dataset(tmp_path, channels=1, num_classes=3, spatial_dims=3)
    assert [s.name for s in samples] == ["a", "b", "c", "d", "e"]
    for sample in samples:
        assert sample.image.shape == (1, 5, 7, 6) and sample.image.dtype == np.float32
        np.testing.assert_allclose(sample.image[0], volume / 255, rtol=1e-6)
        assert sample.labels.dtype == np.int64
    for sample in samples[:3] + samples[4:]:
        np.testing.assert_array_equal(sample.labels, labels)
    masked = samples[3].labels.reshape(-1)
    assert (masked[::2] == 255).all() and np.array_equal(masked[1::2], labels.reshape(-1)[1::2])

    rgb = read_dataset(tmp_path, channels=3, num_classes=3, spatial_dims=3)[0]
    assert rgb.image.shape == (3, 5, 7, 6)  # a gray volume replicated to the model's channels


def test_rgb_tiff_pages_have_their_channel_axis_moved_first(tmp_path):
    rgb = np.random.default_rng(1).integers(0, 256, (5, 7, 6, 3), dtype=np.uint8)
    (tmp_path / "images").mkdir()
    tifffile.imwrite(tmp_path / "images" / "a.tif", rgb, photometric="rgb")  # (D, H, W, 3): RGB pages
    write(tmp_path / "labels" / "a.npy", np.zeros((5, 7, 6), np.uint8))
    (sample,) = read_dataset(tmp_path, channels=3, num_classes=2, spatial_dims=3)
    np.testing.assert_allclose(sample.image, np.moveaxis(rgb, -1, 0) / 255, rtol=1e-6)


def test_a_model_of_images_refuses_a_tiff_stack(tmp_path):
    volume, labels = volume_and_labels()
    write(tmp_path / "images" / "a.tif", volume)
    write(tmp_path / "labels" / "a.tif", labels[0])
    with pytest.raises(DatasetError, match="a.tif: a stack of 5 slices, and the model reads 2-D images"):
        read_dataset(tmp_path, channels=1, num_classes=3)
    write(tmp_path / "images" / "a.tif", volume[0])  # one page: an image, read as before
    assert read_dataset(tmp_path, channels=1, num_classes=3)[0].image.shape == (1, 7, 6)


def test_signal_datasets_read_npy(tmp_path):
    signal = np.random.default_rng(2).standard_normal((2, 50)).astype(np.float32)
    write(tmp_path / "images" / "ecg.npy", signal)
    write(tmp_path / "labels" / "ecg.npy", np.arange(50) % 2)
    write(tmp_path / "images" / "mono.npy", signal[0])
    write(tmp_path / "labels" / "mono.npy", np.zeros(50, np.uint8))
    two, one = read_dataset(tmp_path, channels=2, num_classes=2, spatial_dims=1)
    np.testing.assert_array_equal(two.image, signal)
    np.testing.assert_array_equal(one.image, np.stack([signal[0]] * 2))
    assert two.labels.shape == (50,)


@pytest.mark.parametrize(
    "breakage, message",
    [
        (lambda r: write(r / "labels" / "a.tif", np.zeros((5, 7, 5), np.uint8)),
         "a.tif: label size 5x7x5 does not match its image"),
        (lambda r: write(r / "labels" / "a.tif", np.full((5, 7, 6), 3, np.uint8)), "label ids [3]"),
        (lambda r: (r / "images" / "a.tif").write_bytes(b"II*\x00 garbage"), "a.tif: cannot read it as an array"),
        (lambda r: (r / "labels" / "a.tif").unlink(), "a.tif: no label file; expected"),
        (lambda r: (r / "labels" / "a.tif").rename(r / "labels" / "a.png"), "(a.png in labels/ is not one of these)"),
        (lambda r: write(r / "images" / "a.tif", np.zeros((7, 6), np.uint8)), "is not (D, H, W) or (C, D, H, W)"),
        (lambda r: write(r / "labels" / "a.tif", np.zeros((2, 5, 7, 6), np.uint8)), "a.tif: a stack of 2 volumes"),
        (lambda r: write(r / "labels" / "a.tif", np.zeros((5, 7, 6), np.float32)), "must hold integers"),
        (lambda r: write(r / "masks" / "a.npy", np.zeros((5, 7), np.uint8)),
         "a.npy: the masks of a.tif are 2-D (H, W), 5x7, but the volume is 3-D (D, H, W), 5x7x6: give a mask volume"),
    ],
)  # fmt: skip
def test_bad_volume_datasets_name_the_file_and_the_fix(tmp_path, breakage, message):
    volume, labels = volume_and_labels()
    write(tmp_path / "images" / "a.tif", volume)
    write(tmp_path / "labels" / "a.tif", labels)
    breakage(tmp_path)
    with pytest.raises(DatasetError) as error:
        read_dataset(tmp_path, channels=1, num_classes=3, spatial_dims=3)
    assert message in str(error.value), str(error.value)


@pytest.mark.parametrize("suffix", [".tif", ".npy"])
def test_a_2d_label_file_for_a_volume_says_what_is_wrong_with_it(tmp_path, suffix):
    """A label file of one slice for a volume is refused as a label file: no hint to name a channel axis (an option
    for images, not for labels)."""
    volume, labels = volume_and_labels()
    write(tmp_path / "images" / "a.tif", volume)
    write(tmp_path / "labels" / f"a{suffix}", labels[0])
    with pytest.raises(DatasetError) as error:
        read_dataset(tmp_path, channels=1, num_classes=3, spatial_dims=3)
    assert str(error.value) == (
        f"{tmp_path / 'labels' / f'a{suffix}'}: the labels of a.tif are 2-D (H, W), 7x6, but the volume is 3-D "
        "(D, H, W), 5x7x6: give a label volume of the same shape"
    )


# --- whole steps of the trainer in 1-D and 3-D ---------------------------------------------------------------------


class StrideOneDense(nn.Module):
    """The dense net of a stride-1 conv net: the net itself on the input padded with the patch convention.

    Stands in for the N-d converter in these tests; it has the DenseCNN interface the trainer uses."""

    def __init__(self, model, patch_size, *, padding_mode):
        super().__init__()
        self.features, self.patch_size, self.padding_mode = model, tuple(patch_size), padding_mode
        self.receptive_field = self.patch_size
        self.num_classes = model[-1].out_channels

    def pad(self, x):  # (N, C, *spatial) -> (N, C, *(spatial + P - 1))
        before = tuple((p - 1) // 2 for p in self.patch_size)
        after = tuple(p // 2 for p in self.patch_size)
        padded = pad_spatial(x.flatten(0, 1), before, after, self.padding_mode)  # (N·C, *(spatial + P - 1))
        return padded.view(*x.shape[:2], *padded.shape[1:])

    def run_padded(self, padded, keep_layout=False):  # NC* either way
        return self.features(padded)

    def forward(self, x):
        return self.run_padded(self.pad(x))


def conv_net(dims, in_channels, num_classes):
    """Stride-1 convs only (so the net is its own dense net): patch 3 along D/L, 4 (even) in the plane."""
    conv = {1: nn.Conv1d, 3: nn.Conv3d}[dims]
    first, second = ((3,), (2,)) if dims == 1 else ((3, 3, 3), (1, 2, 2))
    patch = tuple(a + b - 1 for a, b in zip(first, second, strict=True))
    return nn.Sequential(conv(in_channels, 4, first), nn.Tanh(), conv(4, num_classes, second)), patch


@pytest.fixture
def stride_one_training(monkeypatch):
    """``densecnn train`` with a zoo name that builds :func:`conv_net` and :class:`StrideOneDense` as its dense net."""

    def create(name, *, in_channels, num_classes):
        dims = int(name.removeprefix("conv"))
        return conv_net(dims, in_channels, num_classes)

    monkeypatch.setattr(zoo, "create", create)
    monkeypatch.setattr(training_loop, "convert", StrideOneDense)


def volume_dataset(root, dims, *, count=2):
    shape = (24,) if dims == 1 else (4, 9, 8)
    rng = np.random.default_rng(dims)
    for i in range(count):
        image = rng.integers(0, 256, shape, dtype=np.uint8)
        write(root / "images" / f"s{i}.npy", image)
        write(root / "labels" / f"s{i}.npy", (image > 128).astype(np.uint8) + (image > 200))
    return root


@pytest.mark.parametrize("dims", [1, 3], ids=["signal", "volume"])
def test_dense_and_patch_steps_are_identical_in_1d_and_3d(tmp_path, stride_one_training, dims):
    """The same crops and selected pixels through the dense net (whole crops) and the patch minibatch (cubes cut
    from the crops' context) give the same loss and the same updated weights."""
    data = volume_dataset(tmp_path / "data", dims)
    weights = {}
    for method in ("dense", "patches"):
        config = TrainConfig(
            model=f"conv{dims}", data=str(data), val=str(data), out=str(tmp_path / method), classes=3, channels=1,
            crop=6 if dims == 1 else [3, 5, 5], batch=2, crops_per_image=2, mask="random:5", method=method,
            optimizer="sgd", lr=0.5, seed=1,
        )  # fmt: skip
        trainer = training_loop.Trainer(config.check(), Distributed())
        assert trainer.data.crop == ((6,) if dims == 1 else (3, 5, 5))
        record = trainer.take_step(0, trainer.data.order(0), 0)
        weights[method] = [p.detach().clone() for p in trainer.model.model.parameters()]
        assert record["selected_pixels"] == 2 * 5
        loss, scores = validate(trainer.model, trainer.dense, trainer.data.val, Distributed())
        assert np.isfinite(loss) and len(scores["iou"]) == 3 and 0 <= scores["pixel_accuracy"] <= 1
    for dense, patches in zip(weights["dense"], weights["patches"], strict=True):
        torch.testing.assert_close(dense, patches, rtol=1e-5, atol=1e-6)


def test_confusion_matrix_counts_every_labelled_voxel():
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 3, (1, 4, 5, 6))
    labels[0, 0] = 255
    predicted = rng.integers(0, 3, (1, 4, 5, 6))
    expected = np.zeros((3, 3), np.int64)
    for truth, guess in zip(labels.ravel(), predicted.ravel(), strict=True):
        if truth != 255:
            expected[truth, guess] += 1
    got = confusion_matrix(torch.from_numpy(predicted), torch.from_numpy(labels), 3)
    np.testing.assert_array_equal(got.numpy(), expected)


def test_training_a_model_of_images_on_volumes_is_a_one_line_error(tmp_path, capsys):
    volume, labels = volume_and_labels()
    write(tmp_path / "data" / "images" / "a.tif", volume)
    write(tmp_path / "data" / "labels" / "a.tif", labels)
    argv = [
        "train",
        "--model",
        "tiny",
        "--classes",
        "3",
        "--data",
        str(tmp_path / "data"),
        "--out",
        str(tmp_path / "r"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("densecnn train: error:") and "a stack of 5 slices" in err and "Traceback" not in err
    )
