"""Valid patch sizes in closed form: checked against brute force and against the converter itself."""

import itertools
import time

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

import densecnn
from densecnn.chain import extract_chain
from densecnn.convert import _convert_chain
from densecnn.patch_sizes import (
    Adaptive,
    Features,
    Window,
    accepts,
    nearest,
    nearest_whole_sizes,
    preimage,
    smallest_equivalent,
)
from tests.core.test_equivalence import patch_nets

SEARCH = 400  # brute force looks this far


@st.composite
def step_chains(draw):
    """Random size steps of a 2-D patch net: windows, maybe an adaptive pool, maybe a Linear head."""
    steps = []
    for _ in range(draw(st.integers(0, 4))):
        window = (draw(st.integers(1, 7)), draw(st.integers(1, 3)))
        other = window if draw(st.booleans()) else (draw(st.integers(1, 7)), draw(st.integers(1, 3)))
        steps.append((Window(*window), Window(*other)))
    if draw(st.booleans()):
        output = draw(st.integers(1, 3))
        steps.append((Adaptive(output), Adaptive(output) if draw(st.booleans()) else Window(1, 1)))
        for _ in range(draw(st.integers(0, 1))):
            extent = draw(st.integers(1, 2))
            steps.append((Window(extent, 1), Window(extent, 1)))
    if draw(st.booleans()):
        steps.append(Features(draw(st.integers(1, 200)), draw(st.sampled_from([None, 1, 2, 3]))))
    return steps


def _brute_force(steps, size, moving):
    def valid(p):
        return accepts(steps, tuple(p if axis in moving else n for axis, n in enumerate(size)))

    start = size[moving[0]]
    below = next((p for p in range(start - 1, 0, -1) if valid(p)), None)
    above = next((p for p in range(start + 1, SEARCH) if valid(p)), None)
    return [p for p in (below, above) if p is not None]


@settings(max_examples=400)
@given(steps=step_chains(), size=st.tuples(st.integers(1, 60), st.integers(1, 60)), square=st.booleans())
def test_nearest_valid_sizes_equal_brute_force(steps, size, square):
    same_axes = all(isinstance(s, Features) or s[0] == s[1] for s in steps)
    moving = (0, 1) if square and same_axes else (0,)
    if moving == (0, 1):
        size = (size[0], size[0])
    assume(not accepts(steps, size))
    found = nearest(steps, size, moving)
    if found and found[-1] >= SEARCH:  # beyond the brute-force range: check it directly
        assert accepts(steps, tuple(found[-1] if a in moving else n for a, n in enumerate(size)))
        found = found[:-1]
    assert found == _brute_force(steps, size, moving)


def _prefix_output(steps, axis, n):
    """The size along ``axis`` reaching the first size-fixing step (an adaptive pool or a Linear)."""
    for step in steps:
        if isinstance(step, Features) or not isinstance(step[axis], Window):
            break
        n = step[axis].apply(n)
    return n


@settings(max_examples=300)
@given(steps=step_chains(), size=st.tuples(st.integers(1, 80), st.integers(1, 80)))
def test_smallest_equivalent_size_is_the_smallest_reduced_alike(steps, size):
    reached = [_prefix_output(steps, axis, n) for axis, n in enumerate(size)]
    assume(min(reached) >= 1)
    expected = tuple(
        min(n for n in range(1, size[axis] + 1) if _prefix_output(steps, axis, n) == reached[axis])
        for axis in (0, 1)
    )
    assert smallest_equivalent(steps, size) == expected
    assert accepts(steps, expected) == accepts(steps, size)


@settings(max_examples=150)
@given(net=patch_nets(), data=st.data())
def test_the_recorded_steps_accept_exactly_the_sizes_the_converter_accepts(net, data):
    model, patch = net
    chain = extract_chain(model)
    try:
        _, ctx = _convert_chain(chain, patch, strict=False)
    except densecnn.ConversionError:
        assume(False)
    size = (data.draw(st.integers(1, 40), label="h"), data.draw(st.integers(1, 40), label="w"))
    try:
        _convert_chain(chain, size)
        converts = True
    except densecnn.PatchSizeError:
        converts = False
    assert accepts(ctx.steps, size) == converts


@pytest.mark.parametrize("patch", [30000, 200000, (133, 200000)])
def test_a_huge_wrong_patch_size_fails_at_once_naming_the_nearest_valid_sizes(patch):
    model, _ = densecnn.zoo.plain_133()
    start = time.perf_counter()
    with pytest.raises(densecnn.PatchSizeError, match=r"148"):
        densecnn.convert(model, patch)
    assert time.perf_counter() - start < 1.0


def test_valid_sizes_of_reference_nets():
    steps = [(Window(e, s), Window(e, s)) for e, s in [(6, 1), (8, 8), (3, 1), (2, 2), (7, 1)]]  # plain_133
    assert preimage([step[0] for step in steps], 1) == (133, 148)
    assert nearest(steps, (149, 149), (0, 1)) == [148]
    assert nearest(steps, (100, 100), (0, 1)) == [133]
    assert smallest_equivalent(steps, (140, 141)) == (133, 133)
    global_pool = [(Window(3, 1), Window(3, 1)), (Window(2, 2), Window(2, 2)), (Adaptive(1), Adaptive(1))]
    assert nearest(global_pool, (2, 2), (0, 1)) == [4]
    assert smallest_equivalent(global_pool, (11, 10)) == (10, 10)


def test_converting_a_valid_model_does_not_warn_or_search(recwarn):
    model, patch = densecnn.zoo.stages_46()
    densecnn.convert(model.eval(), patch)
    assert not [w for w in recwarn if issubclass(w.category, densecnn.PatchSizeWarning)]


@pytest.mark.parametrize(
    "patch, hint, valid",
    [
        ((20, 30), r"Nearest valid patch sizes: 6x6$", (6, 6)),  # both axes off: whole sizes
        ((17, 5), r"Nearest valid heights \(width 5\): 5 to 6 \(one net", (5, 5)),  # one axis off: that axis
        ((5, 30), r"Nearest valid widths \(height 5\): 5 to 6 \(one net", (5, 6)),
    ],
)
def test_a_wrong_size_names_valid_sizes_on_one_or_both_axes(patch, hint, valid):
    model = nn.Sequential(
        nn.Conv2d(1, 3, 2), nn.ReLU(), nn.AvgPool2d(2), nn.Conv2d(3, 2, 2)
    )  # valid: 5-6 per axis
    with pytest.raises(densecnn.PatchSizeError, match=hint) as info:
        densecnn.convert(model.eval(), patch)
    assert "none" not in str(info.value)
    densecnn.convert(model.eval(), valid)


def _takes_along(steps, axis, n):
    """Whether the layers of ``axis`` alone bring ``n`` pixels to one output (windows and adaptive pools only)."""
    for step in steps:
        axis_step = step[axis]
        if isinstance(axis_step, Adaptive):
            if n < 1 or n % axis_step.output:
                return False
            n = axis_step.output
        else:
            n = (n - axis_step.extent) // axis_step.stride + 1
            if n < 1:
                return False
    return n == 1


def _near_along(steps, axis, n):
    """Brute force: ``[n]`` if the axis takes it, else the nearest sizes below and above that it takes."""
    if _takes_along(steps, axis, n):
        return [n]
    below = next((p for p in range(n - 1, 0, -1) if _takes_along(steps, axis, p)), None)
    above = next((p for p in range(n + 1, SEARCH) if _takes_along(steps, axis, p)), None)
    return [p for p in (below, above) if p is not None]


@settings(max_examples=300)
@given(steps=step_chains(), size=st.tuples(st.integers(1, 40), st.integers(1, 40)))
def test_whole_sizes_of_axes_with_different_layers_equal_brute_force(steps, size):
    """Without a Linear head the axes are independent: the valid whole sizes near ``size`` combine, per axis, its own
    size if that axis takes it, else its nearest valid sizes, whatever the other axis is."""
    assume(not any(isinstance(step, Features) for step in steps))
    assume(not accepts(steps, size))
    expected = list(itertools.product(*(_near_along(steps, axis, n) for axis, n in enumerate(size))))
    assert nearest_whole_sizes(steps, size, alike=False) == expected


@pytest.mark.parametrize(
    "model, patch, hint, valid",
    [
        (nn.Sequential(nn.Conv2d(1, 2, (3, 5))), (4, 6), r"Nearest valid patch sizes: 3x5$", (3, 5)),
        (
            nn.Sequential(nn.Conv3d(1, 4, 2), nn.MaxPool3d(2, stride=(2, 1, 1)), nn.Conv3d(4, 3, 1)),
            (3, 2, 2),
            r"Nearest valid patch sizes: 3x3x3$",
            (3, 3, 3),
        ),
    ],
)
def test_several_axes_off_with_different_layers_name_the_nearest_whole_sizes(model, patch, hint, valid):
    with pytest.raises(densecnn.PatchSizeError, match=hint):
        densecnn.convert(model.eval(), patch)
    assert densecnn.convert(model.eval(), valid).patch_size == valid
