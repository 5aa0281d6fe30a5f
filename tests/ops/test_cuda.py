"""densecnn on CUDA tensors: every solver, the custom ops' torch.library checks and gradients, and whole dense nets.

Each case runs on the GPU and is compared with an independent CPU computation in float64 (torch's own dilated ops,
patch-by-patch scanning). They skip without a GPU and an extension built with its CUDA kernels; ``make gpu-check``
builds that extension and fails if any of them skipped. What can be checked without a GPU is checked here too: that
the cases exercise every solver.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import densecnn
from densecnn.ops import ext, solvers
from densecnn.ops.solvers import ConvOp, PoolOp
from tests.ops.test_ext_ops import op_samples

CUDA_KERNELS = (
    torch.cuda.is_available()
    and ext.available()
    and torch._C._dispatch_has_kernel_for_dispatch_key("densecnn::max_pool", "CUDA")
)
needs_cuda = pytest.mark.skipif(not CUDA_KERNELS, reason="no GPU, or the extension was built without CUDA")


def _weights(out_channels, in_channels, kernel, seed):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_channels, in_channels, *kernel, dtype=torch.float64, generator=generator)
    return weight, torch.randn(out_channels, dtype=torch.float64, generator=generator)


# (name, op builder, input shape): convs and pools of 1, 2 and 3 axes, each solver's home ground among them
CASES = [
    ("conv2d_3x3_d2", lambda: ConvOp(*_weights(6, 5, (3, 3), 0), (2, 2), 1), (2, 5, 23, 21)),
    ("conv2d_3x3_d1", lambda: ConvOp(*_weights(6, 8, (3, 3), 1), (1, 1), 1), (1, 8, 19, 20)),
    ("conv2d_few_channels", lambda: ConvOp(*_weights(8, 2, (4, 5), 2), (2, 3), 1), (2, 2, 25, 24)),
    ("conv2d_large_kernel", lambda: ConvOp(*_weights(4, 6, (11, 11), 3), (2, 2), 1), (1, 6, 40, 41)),
    ("conv2d_groups", lambda: ConvOp(*_weights(6, 2, (3, 2), 4), (3, 1), 3), (1, 6, 17, 15)),
    ("conv2d_1x1", lambda: ConvOp(*_weights(5, 7, (1, 1), 5), (4, 4), 1), (1, 7, 9, 10)),
    ("conv1d", lambda: ConvOp(*_weights(4, 3, (5,), 6), (3,), 1), (2, 3, 40)),
    ("conv3d_3x3x3", lambda: ConvOp(*_weights(4, 5, (3, 3, 3), 7), (2, 2, 2), 1), (1, 5, 11, 12, 10)),
    ("max_pool2d", lambda: PoolOp("max_pool2d", (2, 3), (3, 2)), (2, 4, 17, 18)),
    ("max_pool2d_tanh", lambda: PoolOp("max_pool2d", (2, 2), (4, 4), activation="tanh"), (1, 5, 20, 21)),
    ("avg_pool2d_relu", lambda: PoolOp("avg_pool2d", (3, 2), (2, 2), activation="relu"), (1, 3, 16, 15)),
    ("max_pool1d", lambda: PoolOp("max_pool1d", (3,), (5,)), (2, 3, 40)),
    ("avg_pool3d", lambda: PoolOp("avg_pool3d", (2, 2, 2), (2, 1, 3)), (1, 2, 9, 8, 10)),
]
SOLVER_CASES = [
    pytest.param(case, shape, name, id=f"{label}-{name}")
    for label, case, shape in CASES
    for name in solvers.candidates(case(), ext_available=True, dtype=torch.float64)
]


def _on(op, device):
    if isinstance(op, ConvOp):
        return ConvOp(op.weight.to(device), op.bias.to(device), op.dilation, op.groups)
    return op


def _input(shape, seed=8):
    return torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def test_the_cases_exercise_every_solver():
    assert {p.values[2] for p in SOLVER_CASES} == set(solvers.SOLVERS)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("case", "shape", "name"), SOLVER_CASES)
def test_every_solver_on_cuda_equals_the_cpu_reference(case, shape, name, dtype):
    op, x = case(), _input(shape)
    if not solvers.SOLVERS[name].supports(dtype):
        pytest.skip(f"{name} does not run {dtype}")  # not a CUDA skip: the solver has no such kernel anywhere
    expected = solvers.run("native", op, x)  # torch's CPU op in float64
    y = solvers.run(name, _on(op, "cuda"), x.to("cuda", dtype))
    tolerance = {torch.float64: 1e-10, torch.float32: 1e-4}[dtype]
    scale = max(expected.abs().max().item(), 1.0)
    assert (y.double().cpu() - expected).abs().max().item() <= tolerance * scale


@needs_cuda
@pytest.mark.parametrize(("case", "shape", "name"), SOLVER_CASES)
def test_every_solver_on_cuda_has_exact_gradients(case, shape, name):
    op = _on(case(), "cuda")
    reach = [(k - 1) * d + 3 for k, d in zip(op.kernel, op.dilation, strict=True)]  # 3 outputs per axis
    small = (1, shape[1], *(min(n, r) for n, r in zip(shape[2:], reach, strict=True)))
    x = _input(small).cuda().requires_grad_()
    if isinstance(op, ConvOp):
        weight, bias = op.weight.clone().requires_grad_(), op.bias.clone().requires_grad_()

        def conv(x, weight, bias):
            return solvers.run(name, ConvOp(weight, bias, op.dilation, op.groups), x)

        # a conv op's own backward is torch's convolution backward, and cuDNN's may sum in any order: equal to
        # float64 rounding, not bitwise, from one call to the next
        assert torch.autograd.gradcheck(
            conv, (x, weight, bias), eps=1e-6, atol=1e-6, fast_mode=True, nondet_tol=1e-12
        )
    else:
        run = lambda x: solvers.run(name, op, x)  # noqa: E731
        assert torch.autograd.gradcheck(run, (x,), eps=1e-6, atol=1e-6, fast_mode=True)


def _to_cuda(value):
    """A sample's argument on the GPU: a tensor, or each tensor of a list (a pool backward's taps)."""
    if isinstance(value, list | tuple):
        return type(value)(_to_cuda(v) for v in value)
    if isinstance(value, torch.Tensor):
        return value.detach().to("cuda").requires_grad_(value.requires_grad)
    return value


@needs_cuda
@pytest.mark.parametrize("index", range(len(op_samples())))
def test_opcheck_on_cuda(index):
    op, args = op_samples()[index]
    torch.library.opcheck(op, tuple(_to_cuda(a) for a in args))


@needs_cuda
def test_a_pool_backward_with_taps_on_another_device_says_so():
    x = torch.randn(1, 2, 8, 8, device="cuda")
    y, taps = torch.ops.densecnn.max_pool(x, [2, 2], [1, 1], "none", True)
    with pytest.raises(RuntimeError, match="on cpu does not belong to grad_output"):
        torch.ops.densecnn.max_pool_backward(
            torch.ones_like(y), None, [t.cpu() for t in taps], [2, 2], [1, 1], "none"
        )


@needs_cuda
def test_float32_convolutions_stay_exact_with_cudnn_tf32_allowed():
    """cuDNN's default TF32 would round float32 convs to 10 bits: densecnn's convs and verification turn it off."""
    assert torch.backends.cudnn.allow_tf32  # torch's default, which this test must run under
    torch.manual_seed(0)
    model, patch = densecnn.zoo.create("stages_46", in_channels=3, num_classes=4)
    model = model.cuda().eval()
    x = torch.rand(1, 3, 40, 40, device="cuda")
    scores = densecnn.convert(model, patch, backend="native")(x)  # verification passes: 1e-5 in float32
    expected = densecnn.scan_patches(model.double().cpu(), x.double().cpu(), patch)
    assert (scores.double().cpu() - expected).abs().max().item() <= 1e-4 * max(
        expected.abs().max().item(), 1.0
    )
    assert torch.backends.cudnn.allow_tf32  # the caller's setting is back


@needs_cuda
@pytest.mark.parametrize("name", ["tiny", "stages_46"])
def test_a_dense_net_on_cuda_equals_patch_scanning_and_trains_like_it(name):
    torch.manual_seed(0)
    model, patch = densecnn.zoo.create(name, in_channels=2, num_classes=3)
    model = model.double().eval()
    x = torch.rand(1, 2, 21, 19, dtype=torch.float64)
    expected = densecnn.scan_patches(model, x, patch)  # (1, K, H, W), on the CPU
    labels = torch.randint(3, (1, 21, 19), generator=torch.Generator().manual_seed(1))
    mask = torch.rand(1, 21, 19, generator=torch.Generator().manual_seed(2)) < 0.2
    # the patch minibatch of the masked pixels, cut by hand: zeros padding, (P-1)//2 before and P//2 after
    padded = F.pad(x, ((patch - 1) // 2, patch // 2) * 2)
    rows, columns = mask[0].nonzero(as_tuple=True)
    patches = torch.stack([padded[0, :, r : r + patch, c : c + patch] for r, c in zip(rows, columns)])
    F.cross_entropy(model(patches).reshape(len(rows), -1), labels[0, rows, columns]).backward()
    expected_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)

    model.cuda()
    scores = densecnn.convert(model, patch)(x.cuda())
    scale = max(expected.abs().max().item(), 1.0)
    assert (scores.cpu() - expected).abs().max().item() <= 1e-10 * scale
    densecnn.masked_cross_entropy(scores, labels.cuda(), mask.cuda()).backward()
    for p, grad in zip(model.parameters(), expected_grads, strict=True):
        torch.testing.assert_close(p.grad.cpu(), grad, rtol=1e-8, atol=1e-10)
