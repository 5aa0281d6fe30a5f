"""What the readers never guess: planes of a TIFF stack as channels, channels an array does not have, an alpha
sample as a colour or as part of the intensity range, 8 bits of a 16-bit colour PNG; and the front ends'
errors for empty arrays, devices torch lacks and ranges too narrow for float32."""

from __future__ import annotations

import io

import imagecodecs
import numpy as np
import pytest
import tifffile
import torch
from PIL import Image

import densecnn
from densecnn.blockwise.options import parse_device
from densecnn.blockwise.worker import model_on
from densecnn.errors import ImageReadError, IntensityError, InvalidInputError, cli_option
from densecnn.io import decode_array, open_lazy_array, read_header, read_nd
from densecnn.io.intensity import Intensity
from tests.tolerances import assert_close_relative


@pytest.fixture(scope="module")
def nuclei():
    return densecnn.load("models/nuclei")  # one channel, 2-D


def test_a_tiff_stack_is_not_read_as_channels(tmp_path):
    tifffile.imwrite(tmp_path / "stack.tif", np.zeros((3, 20, 20), np.uint8), photometric="minisblack")
    with pytest.raises(ImageReadError, match=r"a stack of 3 planes .* not channels") as refused:
        open_lazy_array(tmp_path / "stack.tif", spatial_dims=2)
    assert refused.value.render(cli_option).endswith("channels of one image, name it: --channel-axis 0")
    named = open_lazy_array(tmp_path / "stack.tif", spatial_dims=2, channel_axis=0)  # the user says they are
    assert named.channels == 3


@pytest.mark.parametrize("dtype, bits", [(np.uint8, 8), (np.uint16, 12), (np.bool_, 1)])
def test_white_is_zero_tiffs_are_read_inverted_on_every_path(tmp_path, dtype, bits):
    rng = np.random.default_rng(0)
    shown = rng.integers(0, 2**bits, (3, 20, 24)).astype(dtype)  # as a viewer shows it: (D, H, W)
    white = ~shown if dtype == np.bool_ else (2**bits - 1 - shown).astype(dtype)
    tifffile.imwrite(tmp_path / "plane.tif", white[0], photometric="miniswhite", bitspersample=bits)
    tifffile.imwrite(tmp_path / "stack.tif", white, photometric="miniswhite", bitspersample=bits)
    assert np.array_equal(decode_array(tmp_path / "plane.tif"), shown[0])
    assert np.array_equal(open_lazy_array(tmp_path / "plane.tif", spatial_dims=2).read()[0], shown[0])
    assert np.array_equal(read_nd(tmp_path / "stack.tif", 3)[0], shown)
    assert np.array_equal(open_lazy_array(tmp_path / "stack.tif", spatial_dims=3).read()[0], shown)


def test_a_palette_tiff_is_read_as_its_colours_and_others_are_refused(tmp_path, nuclei):
    rng = np.random.default_rng(0)
    indices = rng.integers(0, 256, (20, 24), dtype=np.uint8)
    colours = rng.integers(0, 256, (3, 256), dtype=np.uint16)
    tifffile.imwrite(tmp_path / "palette.tif", indices, photometric="palette", colormap=colours * 257)
    rgb = np.moveaxis(colours[:, indices], 0, -1).astype(np.uint8)  # (H, W, 3): what a viewer shows
    decoded = decode_array(tmp_path / "palette.tif")
    assert decoded.dtype == np.uint16 and np.array_equal(decoded, rgb.astype(np.uint16) * 257)
    assert read_header((tmp_path / "palette.tif").read_bytes()).decoded_bytes == 20 * 24 * 6
    assert_close_relative(nuclei.input(decoded), nuclei.input(rgb), 1e-6)
    with pytest.raises(ImageReadError, match="palette .* a window at a time"):
        open_lazy_array(tmp_path / "palette.tif", spatial_dims=2)
    tifffile.imwrite(tmp_path / "cmyk.tif", np.zeros((20, 24, 4), np.uint8), photometric="separated")
    tifffile.imwrite(tmp_path / "complex.tif", np.zeros((20, 24), np.complex64))
    with pytest.raises(
        ImageReadError, match=r"separated \(CMYK\).* save it as gray \(black is zero\) or RGB"
    ):
        decode_array(tmp_path / "cmyk.tif")
    with pytest.raises(ImageReadError, match="separated"):
        open_lazy_array(tmp_path / "cmyk.tif", spatial_dims=2)
    with pytest.raises(ImageReadError, match="holds complex64 values"):
        decode_array(tmp_path / "complex.tif")


@pytest.mark.parametrize("spatial_dims", [2, 3])
def test_class_maps_are_read_as_stored_whatever_their_photometric_tag(tmp_path, spatial_dims):
    """tifffile writes bool arrays white-is-zero: a mask or label map so written keeps its ids, and a palette PNG
    (as densecnn writes label maps) gives its indices."""
    from densecnn.train.dataset import read_dataset

    rng = np.random.default_rng(0)
    shape = (20, 24) if spatial_dims == 2 else (3, 20, 24)
    for folder in ("images", "labels", "masks"):
        (tmp_path / folder).mkdir()
    ids = rng.integers(0, 2, shape).astype(np.uint8)
    mask = rng.random(shape) > 0.3
    tifffile.imwrite(tmp_path / "images" / "a.tif", rng.integers(0, 255, shape, dtype=np.uint8))
    tifffile.imwrite(tmp_path / "masks" / "a.tif", mask)  # bool: written MINISWHITE
    if spatial_dims == 2:
        palette = Image.fromarray(ids, mode="P")
        palette.putpalette([0, 0, 0, 255, 0, 0])
        palette.save(tmp_path / "labels" / "a.png")
        assert np.array_equal(decode_array(tmp_path / "labels" / "a.png", as_stored=True), ids)
    else:
        tifffile.imwrite(tmp_path / "labels" / "a.tif", ids.astype(bool))
    if spatial_dims == 2:
        assert np.array_equal(decode_array(tmp_path / "masks" / "a.tif", as_stored=True), mask)
        assert np.array_equal(decode_array(tmp_path / "masks" / "a.tif"), ~mask)  # as displayed
    (sample,) = read_dataset(tmp_path, channels=1, num_classes=2, spatial_dims=spatial_dims)
    expected = np.where(mask, ids, 255)
    assert np.array_equal(np.asarray(sample.labels), expected)


def test_black_and_white_are_0_and_1_as_bits_bools_and_bytes(nuclei):
    rng = np.random.default_rng(0)
    bits = rng.random((30, 30)) > 0.5
    png = io.BytesIO()
    Image.fromarray(bits).save(png, format="PNG")  # a 1-bit PNG, which Pillow decodes to 0 and 255
    tiff = io.BytesIO()
    tifffile.imwrite(tiff, bits, photometric="minisblack")
    x = nuclei.input(decode_array(png.getvalue()))
    assert torch.equal(nuclei.input(decode_array(tiff.getvalue())), x)
    assert torch.equal(nuclei.input(bits), x)


@pytest.mark.parametrize("samples", [3, 4, 2])
def test_a_16_bit_colour_png_keeps_its_16_bits(samples):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 4096, (5, 6, samples)).astype(np.uint16)  # 12-bit data, as a camera stores it
    png = imagecodecs.png_encode(pixels)
    assert png[24] == 16
    decoded = decode_array(png)
    assert decoded.dtype == np.uint16 and np.array_equal(decoded, pixels)
    assert read_header(png).bytes_per_sample == 2


def test_an_opaque_alpha_changes_neither_the_scaling_nor_the_labels(nuclei):
    rng = np.random.default_rng(0)
    gray = rng.integers(1, 200, (48, 48), dtype=np.uint8)
    with_alpha = np.stack([gray, np.full_like(gray, 255)], axis=-1)  # (H, W, 2): gray + alpha
    percentiles = Intensity("percentiles", 1, 99)
    assert nuclei.scaling(with_alpha, intensity=percentiles) == nuclei.scaling(gray, intensity=percentiles)
    x_gray = nuclei.input(gray, intensity=percentiles)
    assert torch.equal(nuclei.input(with_alpha, intensity=percentiles), x_gray)


@pytest.mark.parametrize(
    "array, model",
    [
        (
            np.zeros((2, 20, 20), np.float32),
            "models/nuclei",
        ),  # two channels for a 1-channel model: none is alpha
        (np.zeros((4, 20, 20), np.float32), "models/nuclei"),
        (np.zeros((2, 6, 20, 20), np.float32), "models/nuclei3d"),
    ],
)
def test_an_array_s_channels_are_never_dropped_or_guessed(array, model):
    loaded = densecnn.load(model)
    with pytest.raises(ImageReadError, match=rf"has {array.shape[0]} channels and the model takes 1"):
        loaded.input(array, channel_axis=0)


def test_an_array_of_other_channels_says_it_is_read_channel_first_and_names_the_axis_option_apart(nuclei):
    with pytest.raises(ImageReadError) as refused:
        nuclei.input(np.zeros((20, 24, 3), np.uint8), channel_axis=0)  # channels last, read first
    problem = refused.value.problem
    assert "the array has 20 channels" in problem and "read channel first, (C, H, W)" in problem
    assert refused.value.render(cli_option).endswith("on another axis, name it: --channel-axis N")
    assert "channel_axis" not in problem and "--channel-axis" not in problem  # each front end names its own


def test_gray_and_rgb_are_still_converted_to_each_other(nuclei):
    rgb = np.repeat(np.arange(400, dtype=np.uint8).reshape(20, 20)[..., None], 3, axis=-1)
    assert nuclei.input(rgb).shape == (1, 1, 20, 20)


@pytest.mark.parametrize("shape", [(0, 4), (3, 0, 5)])
def test_an_empty_array_is_refused_naming_it(tmp_path, shape):
    np.save(tmp_path / "empty.npy", np.zeros(shape, np.float32))
    with pytest.raises(ImageReadError, match=r"empty.npy: holds no pixels"):
        open_lazy_array(tmp_path / "empty.npy", spatial_dims=2)


def test_a_device_is_checked_for_its_form_and_where_the_model_loads(nuclei):
    assert parse_device("cuda:1") == "cuda:1"
    with pytest.raises(InvalidInputError, match="expected a torch device .* got 'bogus'"):
        parse_device("bogus")
    if not torch.cuda.is_available():
        with pytest.raises(
            InvalidInputError, match=r"cannot run on device 'cuda' here .* --model-device cpu"
        ):
            model_on(nuclei, "cuda")


def test_a_range_too_narrow_for_float32_is_refused():
    with pytest.raises(IntensityError, match="too narrow to scale in float32"):
        Intensity.parse("range:0,1e-40")
    assert Intensity.parse("range:0,4095").high == 4095


def test_values_overflowing_a_narrow_range_blame_the_range_not_the_image(nuclei):
    """A range float32 can scale by, but whose scaling takes the image's finite values past float32's range."""
    image = np.full((20, 20), 1e6, np.float32)
    scaling = Intensity.parse("range:0,1e-34").scaling(image.ravel())
    for to_input in (lambda: densecnn.io.model_input(image, nuclei, scaling),
                     lambda: densecnn.io.array_input(image[None], nuclei, scaling)):  # fmt: skip
        with pytest.raises(
            IntensityError, match=r"scaled by 0\.\.1e-34 -> 0\.\.1 .* 400 pixels go beyond float32"
        ):
            to_input()
    image[3, 4] = np.nan  # an image that is not finite is still named as such
    with pytest.raises(densecnn.errors.NonFiniteInputError, match=r"1 pixel .* position \(3, 4\)"):
        densecnn.io.model_input(image, nuclei, scaling)


@pytest.mark.parametrize(
    "data, why", [(b"", "it is empty"), (b"garbage", "its bytes are no image format densecnn reads")]
)
def test_an_unreadable_image_says_why_and_what_to_give(data, why):
    with pytest.raises(ImageReadError, match=rf"upload: not a readable image \({why}\); give a PNG"):
        decode_array(data)


def test_predict_options_and_inputs_a_model_cannot_take_are_refused(tmp_path):
    from densecnn.blockwise.inputs import chunked_source
    from densecnn.blockwise.options import parse_sizes
    from densecnn.errors import PredictInputError

    with pytest.raises(InvalidInputError, match="at least 1 pixel, got '0'"):
        parse_sizes("0")
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / "plane.png")
    with pytest.raises(
        PredictInputError, match=r"plane.png: a .png image is 2-D and the model labels volumes"
    ):
        chunked_source(tmp_path / "plane.png", None, spatial_dims=3)
