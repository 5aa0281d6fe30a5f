"""Block-wise runs as the service's jobs and ``densecnn predict`` drive them: options that generate the command
line, a cancel event that stops a run between blocks (nothing written after it, resumable), the least task memory
known before a run starts, and refusals that name options in each front end's words."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

import densecnn
from densecnn.errors import Cancelled, PredictInputError, cli_option, query_option
from tests.app_support import blobs, save_brightness_model
from tests.tolerances import assert_labels_equal_except_ties

zarr = pytest.importorskip("zarr")
distributed = pytest.importorskip("distributed")

from densecnn.blockwise import BlockwiseOptions, estimate_task_memory, predict_to_disk  # noqa: E402
from densecnn.blockwise.sinks import open_output, written_chunks  # noqa: E402

IMAGE = blobs(96, 96)[:, :, 0]  # (H, W) uint8


@pytest.fixture(scope="module")
def gray_model(tmp_path_factory):
    return save_brightness_model(tmp_path_factory.mktemp("models"), "gray", in_channels=1)


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address="127.0.0.1:0") as cluster, distributed.Client(cluster) as c:  # fmt: skip
        yield c


@pytest.fixture
def image_zarr(tmp_path):
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=IMAGE, chunks=(16, 16))
    return tmp_path / "in.zarr"


def chunks_written(path) -> int:
    return len(written_chunks(open_output(str(path)), 2))


def test_a_cancelled_run_stops_between_blocks_writes_nothing_after_and_resumes(
    gray_model, image_zarr, client
):
    cancel = threading.Event()

    def after_the_first_block(summary) -> None:
        if summary.computed >= 1:
            cancel.set()

    out = image_zarr.parent / "out.zarr"
    options = BlockwiseOptions(chunk=16, block=16, progress=False, client=client, cancel=cancel,
                               on_progress=after_the_first_block)  # fmt: skip
    with pytest.raises(Cancelled):
        predict_to_disk(gray_model, image_zarr, out, options)
    written = chunks_written(out)
    assert 1 <= written < 36  # stopped within the blocks in flight, of 6 x 6
    time.sleep(1.0)  # a task still in flight would write now
    assert chunks_written(out) == written
    summary = predict_to_disk(
        gray_model, image_zarr, out, BlockwiseOptions(chunk=16, block=16, progress=False, client=client)
    )
    assert summary.skipped == written and summary.computed == 36 - written  # resumed
    loaded = densecnn.load(gray_model)
    model, patch = loaded.model, loaded.patch_size
    with torch.no_grad():
        scores = densecnn.scan_patches(model, torch.from_numpy(IMAGE / 255).float()[None, None], patch)
    labels = torch.from_numpy(zarr.open_array(str(out))[:].astype(np.int64))[None]
    assert_labels_equal_except_ties(labels, scores)


def test_the_least_task_memory_is_known_before_a_run_and_a_run_below_it_is_refused(
    gray_model, image_zarr, client
):
    least = estimate_task_memory(gray_model, image_zarr, 16)
    dense = densecnn.load(gray_model).dense()
    reach = dense.receptive_field[0] - 1  # the halo: the window of one 16x16 chunk
    assert least >= (16 + reach) ** 2 * 9  # one channel of uint8: 1 + 8 bytes, and 8 for the labels
    options = BlockwiseOptions(chunk=16, block=16, progress=False, client=client, max_memory=least)
    with pytest.raises(PredictInputError, match="more than the") as refused:
        predict_to_disk(gray_model, image_zarr, image_zarr.parent / "out.zarr", options)
    assert "--chunk N or --max-memory BYTES" in refused.value.render(cli_option)
    assert "?chunk=N" in refused.value.render(query_option) and "--" not in refused.value.render(query_option)
    assert not (image_zarr.parent / "out.zarr").exists()


def test_predicts_options_are_generated_from_blockwise_options(gray_model, image_zarr, capsys):
    from densecnn.cli import build_parser, main
    from densecnn.commands.predict import _cli_fields

    args = build_parser().parse_args(
        ["predict", "m", "in", "out", "--chunk", "16,32", "--max-memory", "2GiB", "--overwrite", "--no-progress",
         "--intensity", "range:0,4095", "--model-device", "cpu"]
    )  # fmt: skip
    assert (args.chunk, args.max_memory, args.overwrite, args.progress) == ((16, 32), 2**31, True, False)
    assert args.intensity == densecnn.io.Intensity("range", 0, 4095)
    assert {spec.name for spec in _cli_fields()} >= {"chunk", "block", "max_memory", "intensity", "overwrite"}
    with pytest.raises(SystemExit):
        main(["predict", "m", "in", "out", "--intensity", "gamma:2"])
    assert "--intensity dtype or --intensity range:LOW,HIGH" in capsys.readouterr().err
    out = image_zarr.parent / "cli.zarr"
    code = main(
        ["predict", str(gray_model), str(image_zarr), str(out), "--chunk", "16", "--max-memory", "4096"]
    )
    assert code == 2 and "choose a smaller chunk or a larger memory cap: --chunk N or --max-memory BYTES" in (
        capsys.readouterr().err
    )
