"""What ``densecnn predict`` prints when a run fails or is stopped: one line naming the problem and its fix, never
Dask's log of each failed attempt or a traceback; errors that a retry cannot fix are not retried."""

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("distributed")
zarr = pytest.importorskip("zarr")

import densecnn  # noqa: E402
from densecnn.blockwise.cluster import ctrl_c_held  # noqa: E402
from densecnn.blockwise.scheduling import Unretryable, attempt  # noqa: E402
from densecnn.commands.predict import quiet_dask_logs  # noqa: E402
from densecnn.errors import InvalidInputError  # noqa: E402
from tests.predict_support import save_model  # noqa: E402

pytestmark = pytest.mark.xdist_group("dask")

DENSECNN = Path(sys.executable).with_name("densecnn")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    return save_model(model, tmp_path_factory.mktemp("model") / "tiny", patch, "zeros", 1)


def _predict(*args: str) -> subprocess.CompletedProcess:
    """The command in a fresh process, as a user runs it (its own logging, its own local cluster)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    return subprocess.run(
        [str(DENSECNN), "predict", *args, "--no-progress"],
        capture_output=True, text=True, timeout=120, env=environment,
    )  # fmt: skip


def test_a_damaged_input_chunk_is_one_line_naming_the_input_and_the_block_and_is_not_retried(
    tmp_path, model_dir
):
    # large enough that the intensity sample skips the damaged chunk: a block's task meets it
    pixels = np.random.default_rng(0).random((2100, 2100), dtype=np.float32)
    stored = zarr.create_array(store=str(tmp_path / "in.zarr"), data=pixels, chunks=(4, 512))
    (tmp_path / "in.zarr" / stored.metadata.encode_chunk_key((64, 1))).write_bytes(b"not a zstd frame\n")
    result = _predict(str(model_dir), str(tmp_path / "in.zarr"), str(tmp_path / "out.zarr"))
    assert result.returncode == 1, result.stderr
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1, lines[:20]
    assert "Traceback" not in lines[0] and "Compute Failed" not in lines[0]
    assert lines[0].startswith("densecnn predict: error: the block of chunks"), lines[0]
    assert "(rows 0..1023, columns 0..1023) failed: " in lines[0], lines[0]
    assert f"{tmp_path / 'in.zarr'}: a chunk of it that this block reads cannot be decoded" in lines[0], (
        lines[0]
    )


def test_negative_retries_are_refused_before_any_work(tmp_path, model_dir):
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=np.zeros((20, 20), np.float32), chunks=(10, 10))
    result = _predict(
        str(model_dir), str(tmp_path / "in.zarr"), str(tmp_path / "out.zarr"), "--retries", "-1"
    )
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "densecnn predict: error: retries must be 0 or more, got -1; give how many times a failing task is run "
        "again: --retries 0"
    ]
    assert not (tmp_path / "out.zarr").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch has CUDA")
def test_a_device_the_local_cluster_lacks_is_refused_before_any_task(tmp_path, model_dir):
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=np.zeros((20, 20), np.float32), chunks=(10, 10))
    result = _predict(
        str(model_dir), str(tmp_path / "in.zarr"), str(tmp_path / "out.zarr"), "--model-device", "cuda"
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines[:20]
    assert lines[0].startswith("densecnn predict: error: the model cannot run on device 'cuda' here"), lines[
        0
    ]
    assert "--model-device cpu" in lines[0]


def _refused(job, chunks):
    raise InvalidInputError("refused")


def _undecodable(job, chunks):
    raise RuntimeError("a bug, or a worker out of sorts: worth another try")


def test_densecnn_errors_come_back_as_values_and_other_errors_are_raised_for_a_retry():
    outcome = attempt(_refused, None, ((0, 0),))
    assert isinstance(outcome, Unretryable) and isinstance(outcome.error, InvalidInputError)
    with pytest.raises(RuntimeError, match="worth another try"):
        attempt(_undecodable, None, ((0, 0),))


def test_the_command_turns_off_dask_logs_of_failed_attempts(monkeypatch):
    monkeypatch.delenv("DASK_LOGGING__DISTRIBUTED", raising=False)
    for name in ("distributed", "tornado.application"):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.getLogger(name).level)
    quiet_dask_logs()
    assert (
        os.environ["DASK_LOGGING__DISTRIBUTED"] == "critical"
    )  # the worker processes read it when they start
    assert not logging.getLogger("distributed.worker").isEnabledFor(logging.ERROR)  # "Compute Failed"
    assert not logging.getLogger("tornado.application").isEnabledFor(logging.ERROR)


def test_ctrl_c_while_the_cluster_starts_is_held_until_it_started():
    before = signal.getsignal(signal.SIGINT)
    with ctrl_c_held() as pressed:
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt in the middle of starting
        assert pressed.wait(5)
    assert signal.getsignal(signal.SIGINT) is before
