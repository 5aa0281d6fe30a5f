"""densecnn.ops.precision: no TF32 inside densecnn's GPU convolutions, the caller's settings back after."""

from __future__ import annotations

import torch

from densecnn.ops.precision import full_float32


def test_full_float32_turns_tf32_off_on_a_gpu_and_restores_the_callers_settings():
    before = torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")  # a caller who chose TF32 matrix products
    try:
        with full_float32(torch.device("cuda")):
            assert not torch.backends.cudnn.allow_tf32
            assert torch.get_float32_matmul_precision() == "highest"
        assert torch.backends.cudnn.allow_tf32 and torch.get_float32_matmul_precision() == "high"
        with full_float32(torch.zeros(1)):  # a CPU tensor: no TF32 exists there, nothing changes
            assert torch.backends.cudnn.allow_tf32 and torch.get_float32_matmul_precision() == "high"
    finally:
        torch.backends.cudnn.allow_tf32 = before[0]
        torch.set_float32_matmul_precision(before[1])


def test_blocks_in_several_threads_share_one_change():
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        first, second = full_float32("cuda"), full_float32("cuda")
        first.__enter__()
        second.__enter__()  # as another thread would, while the first block is open
        first.__exit__(None, None, None)
        assert not torch.backends.cudnn.allow_tf32  # the second block still runs without TF32
        second.__exit__(None, None, None)
        assert torch.backends.cudnn.allow_tf32  # the caller's setting back once the last block has left
    finally:
        torch.backends.cudnn.allow_tf32 = before
