"""The images' dtype is the compute dtype: a float32 model runs float64, bfloat16 and float16 images, its layers
without a dense op (norms, PReLU) included, or refuses by type a layer torch has no kernel of for that dtype."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import densecnn
from densecnn.errors import InvalidTypeError
from tests.tolerances import assert_equal_to_rounding


def _batch_norm_with_statistics(model: nn.Module) -> nn.Module:
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2.0)
    return model.eval()


MODELS = {
    "batch norm": lambda: nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 3, 3)),
    "prelu": lambda: nn.Sequential(nn.Conv2d(2, 4, 3), nn.PReLU(4), nn.Conv2d(4, 3, 3)),
    "batch norm head": lambda: nn.Sequential(
        nn.Conv2d(2, 4, 5), nn.Flatten(), nn.BatchNorm1d(4), nn.Linear(4, 3)
    ),
    "layer norm head": lambda: nn.Sequential(
        nn.Conv2d(2, 4, 5), nn.Flatten(), nn.LayerNorm(4), nn.Linear(4, 3)
    ),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_float32_model_computes_in_float64_on_float64_images(name):
    torch.manual_seed(0)
    model = _batch_norm_with_statistics(MODELS[name]())
    dense = densecnn.convert(model, 5)
    x = torch.rand(1, 2, 9, 11, dtype=torch.float64)
    with torch.no_grad():
        scores = dense(x)
        assert scores.dtype == torch.float64 and next(model.parameters()).dtype == torch.float32
        assert_equal_to_rounding(scores, densecnn.scan_patches(model.double(), x, 5))


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_images_run_every_layer(name, dtype):
    torch.manual_seed(0)
    model = _batch_norm_with_statistics(MODELS[name]())
    dense = densecnn.convert(model, 5)
    x = torch.rand(1, 2, 9, 11)
    with torch.no_grad():
        scores = dense(x.to(dtype))
        reference = dense(x)
    assert scores.dtype == dtype
    assert (scores.float() - reference).abs().max() <= 5e-2 * max(reference.abs().max().item(), 1.0)


def test_a_layer_without_a_kernel_for_the_dtype_is_refused_naming_it():
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.LocalResponseNorm(2), nn.Conv2d(4, 3, 3)).eval()
    dense = densecnn.convert(model, 5)
    with pytest.raises(
        InvalidTypeError, match=r"LocalResponseNorm cannot compute in torch.bfloat16 .*\(x\.float\(\)\)"
    ):
        dense(torch.rand(1, 2, 9, 9).bfloat16())
