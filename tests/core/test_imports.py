"""The core stays light: converting a net, and the training and CLI modules, import none of the extras' stacks."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

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
    "bioimageio",
    "tiffslide",
    "openslide",
    "napari",
    "qtpy",
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


# What densecnn.ops may import of densecnn: itself, the compiled kernels (`import densecnn._C`), and the leaf modules
# below everything (each imports nothing of densecnn, checked below). `from densecnn import X` (or `from .. import X`)
# reads X from the package root, above ops, and is refused.
OPS_MAY_IMPORT = ("densecnn.ops", "densecnn._C", "densecnn._version", "densecnn.atomic", "densecnn.errors",
                  "densecnn.geometry")  # fmt: skip
PACKAGE = Path(__file__).resolve().parents[2] / "densecnn"


def _imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """(line, module) for every import statement of ``source``, a module of ``package``; relative ones resolved."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(parts + ([node.module] if node.module else []))
            found.append((node.lineno, module))
    return found


def _outside(source: str, package: str, allowed: tuple[str, ...]) -> list[tuple[int, str]]:
    """The imports of ``source`` that are neither the standard library, torch, numpy nor under ``allowed``."""
    return [
        (line, module)
        for line, module in _imported_modules(source, package)
        if module.split(".")[0] not in sys.stdlib_module_names | {"torch", "numpy", "__future__"}
        and not any(module == a or module.startswith(a + ".") for a in allowed)
    ]


def test_ops_is_the_bottom_layer():
    """densecnn.ops imports nothing of densecnn above it: the plan gets the layers and activation names from its
    caller, the version comes from its leaf module, the kernels load as densecnn._C itself."""
    sources = sorted((PACKAGE / "ops").glob("*.py"))
    upward = {
        f"ops/{path.name}:{line} imports {module}"
        for path in sources
        for line, module in _outside(path.read_text(), "densecnn.ops", OPS_MAY_IMPORT)
    }
    assert len(sources) > 10 and upward == set()
    leaves = OPS_MAY_IMPORT[2:]
    for (
        leaf
    ) in leaves:  # the leaves import nothing of densecnn but each other (geometry raises errors' types)
        path = PACKAGE / f"{leaf.removeprefix('densecnn.')}.py"
        assert _outside(path.read_text(), "densecnn", leaves) == [], f"{leaf} is no longer a leaf"


def test_the_layering_check_catches_imports_that_run_back_up():
    source = """
from __future__ import annotations
import os, torch
from .. import __version__
from densecnn import _C
from ..layers import output_shape
from ..rules.registry import fused_activation
from ..geometry import reach
from . import ext
from .tune import tuned_times
import densecnn._C
"""
    assert _outside(source, "densecnn.ops", OPS_MAY_IMPORT) == [
        (4, "densecnn"), (5, "densecnn"), (6, "densecnn.layers"), (7, "densecnn.rules.registry"),
    ]  # fmt: skip
