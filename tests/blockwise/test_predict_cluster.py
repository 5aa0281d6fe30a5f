"""``densecnn predict`` on a Dask cluster of 2 worker processes on 127.0.0.1 (1 GiB each), as on a real cluster.

The shipped nuclei model over a tiled nuclei image of 2000x1500 in small chunks equals one in-memory pass; a
directory of images (one corrupt); a run killed mid-way resumes computing only the missing chunks; a 20000x20000
image keeps every worker under its memory limit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tifffile
import torch
from PIL import Image
from torch import nn

from densecnn.blockwise import BlockwiseOptions, predict_to_disk
from densecnn.ops.config import use_config
from tests.predict_support import (
    NUCLEI_MODEL,
    ROOT,
    nuclei_pixels,
    save_model,
    tiled_nuclei,
    whole_image_scores,
)
from tests.tolerances import assert_labels_equal_except_ties

pytestmark = pytest.mark.xdist_group("dask")
distributed = pytest.importorskip("distributed")
zarr = pytest.importorskip("zarr")

WORKER_MEMORY = 2**30
# the native solver in NCHW everywhere: no timing of solver candidates in each worker (the workers inherit the
# environment, this process the config)
FIXED_SOLVER = {"DENSECNN_SOLVER": "native", "DENSECNN_MEMORY_FORMAT": "nchw"}


@pytest.fixture(scope="module")
def cluster():
    saved = {key: os.environ.get(key) for key in FIXED_SOLVER}
    os.environ.update(FIXED_SOLVER)
    try:
        with use_config(solver="native", memory_format="nchw"), distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None,
            memory_limit=WORKER_MEMORY,
        ) as local, distributed.Client(local) as client:  # fmt: skip
            yield local.scheduler_address, client
    finally:
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)


def _labels(path) -> torch.Tensor:
    return torch.from_numpy(zarr.open_array(str(path))[:].astype(np.int64))


def _label_nuclei(tmp_path, height: int, width: int, chunks, options: BlockwiseOptions):
    """The shipped model on the nuclei image tiled to height x width in a zarr array of ``chunks``: the summary,
    after checking the labels against one in-memory pass."""
    pixels = tiled_nuclei(height, width)
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=pixels, chunks=chunks)
    summary = predict_to_disk(NUCLEI_MODEL, tmp_path / "in.zarr", tmp_path / "labels.zarr", options)
    assert zarr.open_array(str(tmp_path / "labels.zarr")).chunks == chunks
    labels = _labels(tmp_path / "labels.zarr")
    assert_labels_equal_except_ties(labels[None], whole_image_scores(NUCLEI_MODEL, pixels)[None])
    return summary


def test_shipped_model_on_two_workers_equals_one_in_memory_pass(tmp_path, cluster):
    address, _ = cluster
    options = BlockwiseOptions(scheduler=address, block=500, progress=False)
    summary = _label_nuclei(tmp_path, 2000, 1500, (250, 200), options)
    assert (summary.workers, summary.computed, summary.total, summary.retries) == (2, 64, 64, 0)
    assert summary.pixels == 2000 * 1500


def test_directory_of_images_streams_label_maps_and_reports_a_corrupt_file(tmp_path, cluster):
    address, _ = cluster
    images = tmp_path / "fields"
    images.mkdir()
    crops = {"a.png": nuclei_pixels()[:200, :180], "b.tif": nuclei_pixels()[100:260, 50:300]}
    Image.fromarray(crops["a.png"]).save(images / "a.png")
    tifffile.imwrite(images / "b.tif", crops["b.tif"])
    (images / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    summary = predict_to_disk(
        NUCLEI_MODEL, images, tmp_path / "labels", BlockwiseOptions(scheduler=address, progress=False)
    )
    assert (summary.total, summary.computed) == (3, 2)
    assert [name for name, _ in summary.failures] == [str(images / "broken.png")]
    assert "not a readable image" in str(summary.failures[0][1])
    for name, pixels in crops.items():
        out = tmp_path / "labels" / name
        labels = np.asarray(Image.open(out)) if name.endswith(".png") else tifffile.imread(out)
        reference = whole_image_scores(NUCLEI_MODEL, pixels)
        assert_labels_equal_except_ties(torch.from_numpy(labels.astype(np.int64))[None], reference[None])
    again = predict_to_disk(
        NUCLEI_MODEL, images, tmp_path / "labels", BlockwiseOptions(scheduler=address, progress=False)
    )
    assert (again.computed, again.skipped, len(again.failures)) == (0, 2, 1)


def _chunk_files(store) -> int:
    root = store / "c"
    return sum(1 for p in root.rglob("*") if p.is_file() and ".partial" not in p.name) if root.exists() else 0


def test_a_killed_run_resumes_computing_only_the_missing_chunks(tmp_path, cluster):
    address, _ = cluster
    pixels = tiled_nuclei(1024, 512)
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=pixels, chunks=(64, 64))
    out = tmp_path / "out.zarr"
    command = [sys.executable, "-m", "densecnn.cli", "predict", str(NUCLEI_MODEL), str(tmp_path / "in.zarr"),
               str(out), "--block", "64", "--no-progress"]  # fmt: skip
    env = {**os.environ, **FIXED_SOLVER, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while _chunk_files(out) < 12 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    written = _chunk_files(out)
    assert 12 <= written < 128, f"the run was not killed mid-way ({written} of 128 chunks written)"
    summary = predict_to_disk(
        NUCLEI_MODEL, tmp_path / "in.zarr", out, BlockwiseOptions(scheduler=address, block=64, progress=False)
    )
    assert (summary.computed, summary.skipped) == (128 - written, written)
    assert_labels_equal_except_ties(_labels(out)[None], whole_image_scores(NUCLEI_MODEL, pixels)[None])


def test_a_task_rerun_after_a_lost_worker_is_reported(tmp_path, cluster, monkeypatch):
    from densecnn.blockwise import chunked as blockwise_chunked
    from tests.predict_support import dies_the_first_time

    address, client = cluster
    pixels = tiled_nuclei(128, 64)
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=pixels, chunks=(64, 64))
    monkeypatch.setattr(blockwise_chunked, "label_block", dies_the_first_time)
    options = BlockwiseOptions(scheduler=address, block=64, progress=False)
    try:
        summary = predict_to_disk(NUCLEI_MODEL, tmp_path / "in.zarr", tmp_path / "out.zarr", options)
    finally:  # the nanny restarts the dead worker: the next test gets both workers back
        client.wait_for_workers(2, timeout=120)
    assert (summary.computed, summary.retries, summary.reruns) == (2, 0, 1), summary
    assert "1 re-run after a lost worker" in str(summary)
    assert_labels_equal_except_ties(
        _labels(tmp_path / "out.zarr")[None], whole_image_scores(NUCLEI_MODEL, pixels)[None]
    )


def _peak_rss() -> int:
    """This process's peak resident memory since it started (VmHWM: unlike ru_maxrss, not carried over from the
    process that forked it)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak memory from /proc")
def test_a_20000_square_image_keeps_each_worker_under_its_memory_limit(tmp_path, cluster):
    address, client = cluster
    client.restart()  # fresh worker processes: their peak memory is this test's
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten())  # receptive field 3: cheap, with a halo
    model_dir = save_model(model, tmp_path / "model", 3, "reflect", 1)
    image = zarr.create_array(
        store=str(tmp_path / "big.zarr"),
        shape=(20000, 20000),
        chunks=(2000, 2000),
        dtype="uint8",
        fill_value=30,
    )  # fmt: skip  (unwritten chunks read as the fill value)
    content = tiled_nuclei(2000, 2000)
    for row, column in [(0, 0), (4, 7), (9, 9)]:
        image[2000 * row : 2000 * (row + 1), 2000 * column : 2000 * (column + 1)] = content
    summary = predict_to_disk(
        model_dir,
        tmp_path / "big.zarr",
        tmp_path / "labels.zarr",
        BlockwiseOptions(scheduler=address, progress=False),
    )
    assert (summary.computed, summary.retries) == (100, 0)
    peaks = client.run(_peak_rss)
    print(
        "peak RSS per worker (MiB):", [round(p / 2**20) for p in peaks.values()], f"{summary.seconds:.0f} s"
    )
    assert len(peaks) == 2 and max(peaks.values()) < WORKER_MEMORY, {
        w: f"{p / 2**20:.0f} MiB" for w, p in peaks.items()
    }
    labels = zarr.open_array(str(tmp_path / "labels.zarr"))
    for row, column in [
        (4, 7),
        (5, 5),
    ]:  # a chunk of content and one of background, against one in-memory pass
        window = image[2000 * row - 50 : 2000 * (row + 1) + 50, 2000 * column - 50 : 2000 * (column + 1) + 50]
        reference = whole_image_scores(model_dir, window)[:, 50:-50, 50:-50]
        got = torch.from_numpy(
            labels[2000 * row : 2000 * (row + 1), 2000 * column : 2000 * (column + 1)].astype(np.int64)
        )
        assert_labels_equal_except_ties(got[None], reference[None])


def test_a_client_of_ones_own_is_used_and_left_open(tmp_path, cluster):
    _, client = cluster
    summary = _label_nuclei(tmp_path, 300, 260, (150, 130), BlockwiseOptions(client=client, progress=False))
    assert (summary.workers, summary.computed) == (2, 4)  # the fixture's two workers did it
    assert client.status == "running"
