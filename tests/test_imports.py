"""The core stays light: converting a net, and the training and CLI modules, import none of the extras' stacks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

EXTRAS = (
    "matplotlib",
    "fastapi",
    "uvicorn",
    "starlette",
    "dask",
    "distributed",
    "zarr",
    "onnx",
    "onnxruntime",
)

CONVERT = """
import densecnn, densecnn.convert, torch
model, patch = densecnn.zoo.create("stages_46", in_channels=3, num_classes=4)
dense = densecnn.convert(model.eval(), patch)
with torch.no_grad():
    assert dense(torch.rand(1, 3, 8, 8)).shape == (1, 4, 8, 8)
"""

TRAIN_SETUP = """
import densecnn.train, densecnn.train.loop, densecnn.cli
densecnn.cli.build_parser().parse_args(["train", "--model", "tiny", "--data", "d", "--out", "r"])
"""


def imported_after(code: str) -> set[str]:
    """The top-level packages in sys.modules after running ``code`` in a fresh interpreter."""
    report = "import json, sys; print(json.dumps(sorted({name.split('.')[0] for name in sys.modules})))"
    result = subprocess.run(
        [sys.executable, "-c", code + "\n" + report], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return set(json.loads(result.stdout.splitlines()[-1]))


@pytest.mark.parametrize("code", [CONVERT, TRAIN_SETUP], ids=["convert", "train-and-cli"])
def test_no_extra_is_imported(code):
    loaded = imported_after(code)
    assert "densecnn" in loaded and "torch" in loaded  # the probe sees what the code imported
    assert not loaded & set(EXTRAS), f"imported {sorted(loaded & set(EXTRAS))}"
