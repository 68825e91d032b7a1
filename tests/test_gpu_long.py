"""Long rows on the GPU: rows_stream over a cooperative grid (hip/dispatch.cuh, plan_grid), against
float64 references with poisoned outputs.

On an H200 (227 KiB of stage a block, clusters of up to 8) a float32 forward row holds 7 steps of
8192 columns a block, so a cluster holds rows up to 458752 columns and rows past that go to a
group of the grid's blocks; the grid holds rows whole up to 132 x 7 steps (7.5M columns), and
past that each block streams the rest of its chunk twice. Backward steps (y and dy) are twice the
bytes: a cluster holds 196608 columns, the grid 3.2M. 16-bit steps are 16384 columns. The shapes
below sit on both sides of those lengths. Unaligned rows and masked rows are never staged, so they
take the two-launch split instead; they are checked here at the same lengths.
"""

import numpy
import pytest

from _util import assert_close, assert_grad_close, poisoned, ref_softmax, rng, rounded, to_device, to_host64

pytestmark = pytest.mark.gpu

try:
    import cupy
    import pysoftmax
    from pysoftmax import _ops
except ImportError:  # pragma: no cover
    pass


def grid_capable():
    """Whether plan_grid can run here: staged rows (NVIDIA sm_80+) and cooperative launches."""
    if cupy.cuda.runtime.is_hip:
        return False
    dev = cupy.cuda.Device()
    return int(dev.compute_capability) >= 80 and dev.attributes["CooperativeLaunch"] == 1


def clusters():
    return not cupy.cuda.runtime.is_hip and int(cupy.cuda.Device().compute_capability) >= 90


# (rows, cols, dtype, direction): past a cluster by one pack, a cluster's most, held whole by the
# grid, past the grid's capacity (streamed in part), 1/2/3/7/100+ rows.
CASES = [
    (3, 458752, "float32", "forward"),        # a cluster of 8 holds it (the grid takes it: 3 rows)
    (3, 458756, "float32", "forward"),        # one pack more: the grid
    (1, 1048576, "float32", "forward"),
    (2, 1048580, "float32", "forward"),
    (7, 2097152 + 12, "float32", "forward"),
    (130, 131072 * 4 + 4, "float32", "forward"),
    (1, 8388608 + 4, "float32", "forward"),   # past the grid's capacity: streamed in part
    (2, 8000004, "float32", "forward"),
    (3, 196608, "float32", "backward"),       # a cluster of 8
    (3, 196612, "float32", "backward"),       # the grid
    (1, 4194308, "float32", "backward"),      # streamed in part
    (101, 300004, "float32", "backward"),
    (3, 917504, "float16", "forward"),        # a cluster of 8
    (3, 917512, "float16", "forward"),        # the grid
    (1, 16777216, "bfloat16", "forward"),     # streamed in part
    (2, 1048584, "bfloat16", "backward"),
    (7, 2000008, "float16", "backward"),
    (2, 600000, "float64", "forward"),
    (2, 600000, "float64", "backward"),
]


@pytest.mark.parametrize("rows,cols,dtype,direction", CASES)
def test_long_rows(rows, cols, dtype, direction):
    g = rng()
    plan = _ops.plan((rows, cols), dtype, direction=direction)
    wide = dtype == "float32"  # columns a step and steps a block's stage holds, on an H200
    step, fit = {("forward", True): (8192, 7), ("forward", False): (16384, 7), ("backward", True): (8192, 3),
                 ("backward", False): (8192, 7)}[direction, wide]
    cluster_cols = 8 * fit * step
    if dtype != "float64" and grid_capable() and clusters() and cols > cluster_cols:
        assert plan["grid"] == 1, plan  # (shorter rows take it too where they are few: split for want of rows)
    if plan["grid"]:
        assert plan["resident"] == 1 and plan["blocks"] % plan["chunks"] == 0 and plan["workspace"] > 0, plan
    what = f"{direction} {rows}x{cols} {dtype} {plan} seed={g.seed}"
    if direction == "forward":
        x64 = rounded(g.standard_normal((rows, cols)) * 3, dtype)
        y = pysoftmax.fused(to_device(x64, dtype), out=poisoned((rows, cols), dtype))
        assert_close(to_host64(y), ref_softmax(x64), dtype, what)
    else:
        y64 = rounded(ref_softmax(g.standard_normal((rows, cols)) * 3), dtype)
        dy64 = rounded(g.standard_normal((rows, cols)), dtype)
        dx = _ops.backward_impl(to_device(y64, dtype), to_device(dy64, dtype), scale=0.7,
                                out=poisoned((rows, cols), dtype))
        assert_grad_close(to_host64(dx), y64, dy64, 0.7, dtype, what)


@pytest.mark.parametrize("cols,dtype", [(458753, "float16"), (1048577, "bfloat16"), (16777217, "float32")])
def test_long_unaligned_rows(cols, dtype):
    """Odd lengths (every other row starts unaligned): element-wise, the two-launch split. (A
    float16 row of 16M holds values near 6e-8, float16's smallest subnormal: float32 there.)"""
    g = rng()
    rows = 2 if cols < 10**7 else 1
    x64 = rounded(g.standard_normal((rows, cols)) * 3, dtype)
    y = pysoftmax.fused(to_device(x64, dtype), out=poisoned((rows, cols), dtype))
    assert_close(to_host64(y), ref_softmax(x64), dtype, f"{rows}x{cols} seed={g.seed}")


def test_long_rows_masked_and_causal():
    """A boolean padding mask, a float mask and a causal limit on rows of 600000 (never staged)."""
    g = rng()
    q, k = 3, 600000
    x64 = rounded(g.standard_normal((q, k)) * 3, "float32")
    keep = g.random((1, k)) > 0.2
    bias = rounded(g.standard_normal((1, k)), "float32")
    y = pysoftmax.fused(to_device(x64, "float32"), scale=0.5, mask=cupy.asarray(keep), causal=True,
                        out=poisoned((q, k), "float32"))
    assert_close(to_host64(y), ref_softmax(x64, 0.5, keep, causal=True), "float32", f"pad + causal seed={g.seed}")
    y = pysoftmax.fused(to_device(x64, "float32"), mask=to_device(bias, "float32"), out=poisoned((q, k), "float32"))
    assert_close(to_host64(y), ref_softmax(x64, 1.0, bias), "float32", f"float mask seed={g.seed}")


@pytest.mark.parametrize("blocks", [0, 1])
def test_grid_capped_and_repeatable(blocks):
    """A requested grid cap keeps whole groups (one group here, which then walks every row), and
    repeated calls give the same bits: the groups merge their partials in one order."""
    g = rng()
    rows, cols = 9, 1048576
    plan = _ops.plan((rows, cols), "float32", blocks=blocks)
    if plan["grid"] and blocks:
        assert plan["blocks"] == plan["chunks"], plan
    x64 = rounded(g.standard_normal((rows, cols)) * 3, "float32")
    x = to_device(x64, "float32")
    y1 = _ops.forward(x, blocks=blocks, out=poisoned((rows, cols), "float32"))
    y2 = _ops.forward(x, blocks=blocks, out=poisoned((rows, cols), "float32"))
    assert_close(to_host64(y1), ref_softmax(x64), "float32", f"{plan} seed={g.seed}")
    assert bool((y1.view(cupy.uint32) == y2.view(cupy.uint32)).all()), "repeated calls differ"
    dy64 = rounded(g.standard_normal((rows, cols)), "float32")
    y64 = to_host64(y1)
    dx1 = _ops.backward_impl(y1, to_device(dy64, "float32"), blocks=blocks)
    dx2 = _ops.backward_impl(y1, to_device(dy64, "float32"), blocks=blocks)
    assert_grad_close(to_host64(dx1), y64, dy64, 1.0, "float32", f"backward seed={g.seed}")
    assert bool((dx1.view(cupy.uint32) == dx2.view(cupy.uint32)).all()), "repeated backward calls differ"


def test_grid_on_two_streams_at_once():
    """Cooperative launches on two streams at once, forward on one and backward on the other, many
    times over: neither waits forever on the other's blocks, and both stay right."""
    g = rng()
    rows, cols = 3, 2097152
    x64 = rounded(g.standard_normal((rows, cols)) * 3, "float32")
    y64 = rounded(ref_softmax(g.standard_normal((rows, cols)) * 3), "float32")
    dy64 = rounded(g.standard_normal((rows, cols)), "float32")
    x, y, dy = (to_device(a, "float32") for a in (x64, y64, dy64))
    outs = [poisoned((rows, cols), "float32") for _ in range(2)]
    a, b = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.Device().synchronize()
    for _ in range(20):
        pysoftmax.fused(x, out=outs[0], stream=a)
        _ops.backward_impl(y, dy, out=outs[1], stream=b)
    a.synchronize()
    b.synchronize()
    assert_close(to_host64(outs[0]), ref_softmax(x64), "float32", f"forward seed={g.seed}")
    assert_grad_close(to_host64(outs[1]), y64, dy64, 1.0, "float32", f"backward seed={g.seed}")


def test_grid_past_2_to_the_31_elements():
    """2049 rows of 2^20 float32 columns (2^31 + 2^20 elements, 8 GiB): row offsets past 2^31
    elements. Rows at the start, the middle and the end against float64, forward and backward.
    (float32: softmax values of rows of 2^20 are float16 subnormals.)"""
    rows, cols = 2049, 1 << 20
    x = cupy.random.standard_normal((rows, cols), dtype=cupy.float32) * 3
    y = pysoftmax.fused(x, out=cupy.full((rows, cols), numpy.nan, cupy.float32))
    pick = [0, 1, rows // 2, rows - 2, rows - 1]
    x64 = cupy.asnumpy(x[pick]).astype(numpy.float64)
    assert_close(cupy.asnumpy(y[pick]).astype(numpy.float64), ref_softmax(x64), "float32", "forward")
    del x
    dy = cupy.random.standard_normal((rows, cols), dtype=cupy.float32)
    dx = _ops.backward_impl(y, dy, out=cupy.full((rows, cols), numpy.nan, cupy.float32))
    assert_grad_close(cupy.asnumpy(dx[pick]).astype(numpy.float64), cupy.asnumpy(y[pick]).astype(numpy.float64),
                      cupy.asnumpy(dy[pick]).astype(numpy.float64), 1.0, "float32", "backward")
