"""Unaligned rows on the GPU: rows that start off a 16-byte boundary.

Such rows come from widths that are not a multiple of the 16-byte pack (every row but one in
each pack's worth starts off a boundary) and from views that start inside a row. Where every
array starts each row at the same offset inside its pack, rows_warp and rows_block read the rows
from the boundary below them (straddling, hip/dispatch.cuh, plan_straddling); otherwise, and
with a mask or causal limit, unaligned rows take the element-wise kernels (vector_rows).
Most tests here write into a view of a larger buffer full of poison and check that the
elements around the view keep it; their inputs and outputs start at different offsets in the
pack, the straddling tests' at one. The rows cross every family's thresholds.
"""

import numpy
import pytest

from _util import (DTYPES, assert_close, assert_grad_close, np_dtype, poisoned, ref_softmax, rng, rounded, to_device,
                   to_host64)

pytestmark = pytest.mark.gpu

try:
    import cupy
    import pysoftmax
    from pysoftmax import _ops
except ImportError:  # pragma: no cover
    pass


def pack(dtype):
    return 16 // np_dtype(dtype).itemsize


def view_of(buf, offset, cols):
    """Columns [offset, offset + cols) of each row of `buf`: rows that start `offset` elements past
    the buffer's rows."""
    return buf[:, offset:offset + cols]


def offset_input(g, rows, cols, dtype, offset, scale=3.0):
    """(x64, x): random logits, x a view `offset` elements into a wider device buffer."""
    width = cols + 2 * pack(dtype)
    full64 = rounded(g.standard_normal((rows, width)) * scale, dtype)
    x = view_of(to_device(full64, dtype), offset, cols)
    return full64[:, offset:offset + cols], x


def offset_output(rows, cols, dtype, offset):
    """(buffer, view): a poisoned buffer and the view `offset` elements into it that is written."""
    buf = poisoned((rows, cols + 2 * pack(dtype)), dtype)
    return buf, view_of(buf, offset, cols)


def assert_untouched(buf, offset, cols, what):
    """The poison around the written view is still there."""
    host = to_host64(buf)
    outside = numpy.concatenate([host[:, :offset], host[:, offset + cols:]], axis=1)
    assert numpy.isnan(outside).all(), f"{what}: {int((~numpy.isnan(outside)).sum())} elements outside the view written"


# Row lengths on both sides of the families' thresholds (in 16-byte packs: rows_warp's tiny table,
# its medium table, rows_block, rows_stream; for float32 and 16-bit alike), odd and even.
COLS = [1, 3, 9, 33, 64, 100, 257, 1000, 1001, 4099, 20000, 40001]
# (x offset, out offset) in elements into the pack: both off by different amounts, the input
# only ("last": the pack's last element), the output only.
OFFSETS = [(1, 2), ("last", 0), (0, 1)]


def offsets(dtype):
    p = pack(dtype)
    return [((p - 1 if a == "last" else a % p), b % p) for a, b in OFFSETS]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", COLS)
def test_unaligned_forward(dtype, cols):
    """fused on unaligned rows of every family, against the float64 reference; 67 rows, so that
    rows_warp's last warp holds dead rows."""
    g = rng()
    rows = 67
    for xs, os in offsets(dtype):
        x64, x = offset_input(g, rows, cols, dtype, xs)
        buf, out = offset_output(rows, cols, dtype, os)
        assert (x.data.ptr | out.data.ptr | x.strides[0] | out.strides[0]) % 16, "meant to be unaligned"
        plan = _ops.plan((rows, cols), dtype, aligned="mixed")
        assert plan["pack"] == 1 and plan["stage"] == 0, plan
        y = pysoftmax.fused(x, out=out)
        what = f"{rows}x{cols} x+{xs} out+{os} {plan['family']} seed={g.seed}"
        assert_close(to_host64(y), ref_softmax(x64), dtype, what)
        assert_untouched(buf, os, cols, what)


@pytest.mark.parametrize("family", ["warp", "block", "stream"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("cols", [5, 77, 250])
def test_unaligned_every_family(family, dtype, cols):
    """Each family forced on the same unaligned rows: odd widths in a contiguous array (every row
    its own offset) written into a view one element in."""
    g = rng()
    rows = 45
    x64 = rounded(g.standard_normal((rows, cols)) * 4, dtype)
    buf, out = offset_output(rows, cols, dtype, 1)
    fam = {"warp": 1, "block": 2, "stream": 3}[family]
    y = _ops.forward(to_device(x64, dtype), out=out, family=fam)
    assert_close(to_host64(y), ref_softmax(x64), dtype, f"{family} {cols} seed={g.seed}")
    assert_untouched(buf, 1, cols, family)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [3, 33, 257, 1001, 4099, 40001])
def test_unaligned_backward(dtype, cols):
    """backward with y, dy and dx at three different offsets, and naive_backward."""
    g = rng()
    rows = 67
    p = pack(dtype)
    y64 = ref_softmax(g.standard_normal((rows, cols)) * 2)
    y64 = rounded(y64, dtype)
    dy64 = rounded(g.standard_normal((rows, cols)), dtype)
    ybuf = to_device(numpy.pad(y64, ((0, 0), (1, 2 * p - 1))), dtype)
    dybuf = to_device(numpy.pad(dy64, ((0, 0), (p - 1, p + 1))), dtype)
    y, dy = view_of(ybuf, 1, cols), view_of(dybuf, p - 1, cols)
    for name, fn in (("backward", pysoftmax.backward), ("naive_backward", pysoftmax.naive_backward)):
        buf, out = offset_output(rows, cols, dtype, 2 % p)
        dx = fn(y, dy, scale=0.7, out=out)
        assert_grad_close(to_host64(dx), y64, dy64, 0.7, dtype, f"{name} {cols} seed={g.seed}")
        assert_untouched(buf, 2 % p, cols, name)


@pytest.mark.parametrize("algo", ["online", "naive"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("cols", [7, 100, 1001, 20001])
def test_unaligned_reference_algorithms(algo, dtype, cols):
    """online and naive (rows_passes in groups and a block a row, and the stream) on unaligned rows."""
    g = rng()
    rows = 67
    x64, x = offset_input(g, rows, cols, dtype, 1)
    buf, out = offset_output(rows, cols, dtype, 0 if cols % 2 else 3)
    os = 0 if cols % 2 else 3
    y = getattr(pysoftmax, algo)(x, out=out)
    assert_close(to_host64(y), ref_softmax(x64), dtype, f"{algo} {cols} seed={g.seed}")
    assert_untouched(buf, os, cols, algo)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("s", [63, 129, 257, 1031])
def test_unaligned_masked_and_causal(dtype, s):
    """Attention blocks [B, H, S, S] of odd S (each row its own offset): a boolean padding mask,
    causal, both, and an additive mask, with the scale; each on the automatic grid and on a grid
    of 4 blocks, whose warps walk many steps (16-bit rows of S < 512 then take rows_warp's walk)."""
    g = rng()
    b, h = (2, 8) if s < 512 else (1, 2)
    x64 = rounded(g.standard_normal((b, h, s, s)) * 3, dtype)
    keep = g.random((b, 1, 1, s)) > 0.2
    bias = rounded(g.standard_normal((1, 1, s, s)), dtype)
    x = to_device(x64, dtype)
    cases = [("pad", dict(mask=cupy.asarray(keep)), dict(mask=keep)),
             ("causal", dict(causal=True), dict(causal=True)),
             ("pad+causal", dict(mask=cupy.asarray(keep), causal=True), dict(mask=keep, causal=True)),
             ("additive", dict(mask=to_device(bias, dtype)), dict(mask=bias))]
    for name, kw, ref_kw in cases:
        ref = ref_softmax(x64, 0.3, **ref_kw)
        for blocks in (0, 4):
            y = _ops.forward(x, scale=0.3, out=poisoned(x64.shape, dtype), blocks=blocks, **kw)
            assert_close(to_host64(y), ref, dtype, f"{name} S={s} blocks={blocks} seed={g.seed}")


def test_unaligned_long_rows_split():
    """Long unaligned rows: never staged, so rows_stream reads them twice, split over blocks (one
    row, two launches) or not (many rows)."""
    g = rng()
    for rows, cols, dtype in ((1, 3_000_001, "float32"), (3, 700_001, "bfloat16"), (300, 70_001, "float16")):
        x64, x = offset_input(g, rows, cols, dtype, 1, scale=2.0)
        buf, out = offset_output(rows, cols, dtype, 2)
        y = pysoftmax.fused(x, out=out)
        assert_close(to_host64(y), ref_softmax(x64), dtype, f"{rows}x{cols} seed={g.seed}")
        assert_untouched(buf, 2, cols, f"{rows}x{cols}")


def test_unaligned_repeatable():
    """The same unaligned input twice gives the same bits (every path is deterministic)."""
    g = rng()
    x64, x = offset_input(g, 129, 3001, "bfloat16", 3)
    a = pysoftmax.fused(x)
    b = pysoftmax.fused(x)
    assert bool((a.view(cupy.uint16) == b.view(cupy.uint16)).all())


# Widths for straddling rows: rows_warp's tiny and medium tables, rows_block, and past it, where
# they are read element-wise again (32761 and 32769 sit on both sides of the last rows_block width
# of 16-bit rows, 32768 columns planned as cols + 7); float32 rows straddle where element-wise
# ones would stream (backward 10001, forward 20001).
STRADDLE_COLS = [3, 9, 33, 100, 257, 1001, 2047, 4099, 10001, 20001, 32761, 32769]


def straddle_width(cols, dtype):
    """A row width of whole packs past `cols` + 1: views one element into its rows start every row
    one element past a boundary."""
    p = pack(dtype)
    return cols + 1 + (-(cols + 1)) % p + p


def placed(a64, dtype, layout):
    """a64 on the device, each row at the same offset inside the pack in every array so placed: a
    contiguous array (row r at r * cols: an odd width gives rows at every offset), or views one
    element into the rows of a wider buffer."""
    if layout == "contiguous":
        return to_device(a64, dtype)
    rows, cols = a64.shape
    pad = straddle_width(cols, dtype) - cols - 1
    return view_of(to_device(numpy.pad(a64, ((0, 0), (1, pad)), constant_values=numpy.nan), dtype), 1, cols)


def straddled_output(rows, cols, dtype, layout):
    """(buf, out, offset): a poisoned output placed as placed() places inputs (buf None if contiguous)."""
    if layout == "contiguous":
        return None, poisoned((rows, cols), dtype), 0
    buf = poisoned((rows, straddle_width(cols, dtype)), dtype)
    return buf, view_of(buf, 1, cols), 1


def assert_straddle_plan(shape, dtype, direction):
    """The plan for rows one element past a boundary in every array, against plan_straddling's
    rule: 16-bit rows straddle wherever rows_warp or rows_block holds cols + pack - 1 columns
    (certainly up to 1017 columns), wider ones only where element-wise packs would stream the row."""
    plan = _ops.plan(shape, dtype, direction=direction, aligned=False)
    scalar = _ops.plan(shape, dtype, direction=direction, aligned="mixed")
    if plan["straddle"]:
        assert plan["family"] in ("warp", "block") and plan["pack"] == pack(dtype), plan
        assert pack(dtype) == 8 or scalar["family"] == "stream", (plan, scalar)
    else:
        assert plan == dict(scalar, straddle=0), (plan, scalar)
        assert pack(dtype) < 8 or shape[-1] > 1017, plan
    return plan


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", STRADDLE_COLS)
@pytest.mark.parametrize("layout", ["contiguous", "views at one offset"])
def test_straddling_forward(dtype, cols, layout):
    """fused where x and out start each row at the same offset inside the pack: each row is read
    from the boundary below it (hip/dispatch.cuh, plan_straddling), its neighbour's columns padded
    and never written. The poison around the views stays; in the contiguous layout each row's
    neighbours hold their own results; in place (out=x) too."""
    g = rng()
    rows = 67
    x64 = rounded(g.standard_normal((rows, cols)) * 3, dtype)
    x = placed(x64, dtype, layout)
    buf, out, off = straddled_output(rows, cols, dtype, layout)
    plan = assert_straddle_plan(x64.shape, dtype, "forward")
    what = f"{layout} {x64.shape} {plan['family']} straddle={plan['straddle']} seed={g.seed}"
    ref = ref_softmax(x64, 0.6)
    y = pysoftmax.fused(x, scale=0.6, out=out)
    assert y is out
    assert_close(to_host64(y), ref, dtype, what)
    if buf is not None:
        assert_untouched(buf, off, cols, what)
    y = pysoftmax.fused(x, scale=0.6, out=x)
    assert_close(to_host64(y), ref, dtype, "in place " + what)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", STRADDLE_COLS)
@pytest.mark.parametrize("layout", ["contiguous", "views at one offset"])
def test_straddling_backward(dtype, cols, layout):
    """backward where y, dy and dx share each row's offset inside the pack, as the forward."""
    g = rng()
    rows = 67
    y64 = rounded(ref_softmax(g.standard_normal((rows, cols)) * 2), dtype)
    dy64 = rounded(g.standard_normal((rows, cols)), dtype)
    y, dy = placed(y64, dtype, layout), placed(dy64, dtype, layout)
    buf, out, off = straddled_output(rows, cols, dtype, layout)
    plan = assert_straddle_plan((rows, cols), dtype, "backward")
    what = f"{layout} {rows}x{cols} {plan['family']} straddle={plan['straddle']} seed={g.seed}"
    dx = pysoftmax.backward(y, dy, scale=0.7, out=out)
    assert dx is out
    assert_grad_close(to_host64(dx), y64, dy64, 0.7, dtype, what)
    if buf is not None:
        assert_untouched(buf, off, cols, what)


def test_fast_path_plans_each_offset():
    """The fast path caches a plan, and its workspace, for each set of offsets inside the pack:
    views one row into odd-width arrays (every row one element past a boundary here) with a fresh
    output (on a boundary: element-wise, the split stream, which needs a workspace), an output at
    the inputs' offset (straddling) and one at another, each called twice."""
    g = rng()
    for dtype, cols in (("float32", 20001), ("bfloat16", 40001)):
        a64 = rounded(g.standard_normal((65, cols)) * 3, dtype)
        x64, x = a64[1:], to_device(a64, dtype)[1:]
        ref = ref_softmax(x64)
        same = poisoned((65, cols), dtype)[1:]
        other = poisoned((64 * cols + 8,), dtype)[2:2 + 64 * cols].reshape(64, cols)
        assert len({x.data.ptr % 16, same.data.ptr % 16, other.data.ptr % 16} - {0}) == 2, "meant to differ"
        for out in (None, same, other, None, same, other):
            y = pysoftmax.fused(x, out=out)
            assert_close(to_host64(y), ref, dtype, f"forward {dtype} {cols} out={'fresh' if out is None else out.data.ptr % 16}")
    cols = 10001  # float32 backward: rows_block where straddled, the split stream where element-wise
    y64 = rounded(ref_softmax(g.standard_normal((65, cols)) * 2), "float32")
    dy64 = rounded(g.standard_normal((65, cols)), "float32")
    y, dy = to_device(y64, "float32")[1:], to_device(dy64, "float32")[1:]
    for out in (None, poisoned((65, cols), "float32")[1:], None):
        dx = pysoftmax.backward(y, dy, scale=0.5, out=out)
        assert_grad_close(to_host64(dx), y64[1:], dy64[1:], 0.5, "float32", f"backward out={'fresh' if out is None else 'same'}")
