"""Unaligned rows on the GPU: rows that start off a 16-byte boundary.

Such rows come from widths that are not a multiple of the 16-byte pack (every row but one in
each pack's worth starts off a boundary) and from views that start inside a row; an input, mask
or output that is unaligned takes the element-wise kernels (hip/dispatch.cuh, vector_rows).
Every test here writes into a view of a larger buffer full of poison and checks that the
elements around the view keep it. Inputs and outputs start at different offsets in the pack, and
the rows cross every family's thresholds.
"""

import os

import numpy
import pytest

from _util import (DTYPES, assert_close, assert_grad_close, pack, poisoned, pytest_in_process, ref_softmax, rng,
                   rounded, to_device, to_host64)

pytestmark = pytest.mark.gpu

try:
    import cupy
    import pysoftmax
    from pysoftmax import _lib, _ops
except ImportError:  # pragma: no cover
    pass


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
        plan = _ops.plan((rows, cols), dtype, aligned="mixed")  # x and out at different offsets
        assert plan["pack"] == 1 and plan["stage"] == 0 and plan["straddle"] == 0, plan
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


# PYSOFTMAX_STRADDLE_MASKED=0 (read once a device) keeps masked 16-bit rows on their element-wise
# plans; test_masked_rows_switched_off runs the masked tests in a process with it.
MASKED_STRADDLE = os.environ.get("PYSOFTMAX_STRADDLE_MASKED") != "0"
MASKED_COLS = [129, 257, 1001, 1031, 2049, 4097, 10001, 32001]


def test_masked_rows_keep_their_plans_switched_off():
    """With PYSOFTMAX_STRADDLE_MASKED=0, masked rows of an odd width keep their element-wise plans."""
    if MASKED_STRADDLE:
        pytest.skip("run by test_masked_rows_switched_off (PYSOFTMAX_STRADDLE_MASKED=0)")
    for dtype in ("float16", "bfloat16"):
        for queries, mask in ((1006, True), (1006, False), (0, True)):
            plan = _ops.plan((2012, 1001), dtype, causal_queries=queries, mask=mask)
            assert plan["straddle"] == 0 and plan["pack"] == 1, (queries, mask, plan)


def test_masked_rows_switched_off():
    """test_masked_rows_keep_their_plans_switched_off and test_unaligned_masked_and_causal in a
    process with PYSOFTMAX_STRADDLE_MASKED=0."""
    if not MASKED_STRADDLE:
        pytest.skip("this process runs with PYSOFTMAX_STRADDLE_MASKED=0")
    env = dict(os.environ, PYSOFTMAX_STRADDLE_MASKED="0")
    want = 1 + 3 * 4  # test_unaligned_masked_and_causal: 3 dtypes, 4 widths
    pytest_in_process(__file__, "test_masked_rows_keep_their_plans_switched_off or test_unaligned_masked_and_causal",
                      env, want)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("cols", MASKED_COLS)
def test_masked_rows_straddle(dtype, cols):
    """16-bit rows of an odd width with a boolean mask, a causal limit or both, where their
    element-wise plan is rows_block or the stream (and, without a causal limit, rows_warp's
    groups), take their bodies' vector plan (ForwardOp::kStraddles), the mask and the limit
    shifted with each row's body. Queries run past the row's end where the
    row is short enough (limits inside the columns after the body, in rows_block and in the
    stream forced, whole and split in two), and the masks are a padding row broadcast over the
    queries, a whole mask of their own and a mask broadcast along the columns (column stride 0);
    `online` under the same masks streams. The output is a fresh poisoned array of the same
    layout, so that its rows straddle with the input's."""
    if not MASKED_STRADDLE:
        pytest.skip("this process runs with PYSOFTMAX_STRADDLE_MASKED=0")
    g = rng()
    queries = cols + 5 if cols <= 4097 else 40
    batch = 2 if cols <= 1031 else 1
    x64 = rounded(g.standard_normal((batch, queries, cols)) * 3, dtype)
    pad = g.random((batch, 1, cols)) > 0.2
    whole = g.random((batch, queries, cols)) > 0.3
    by_query = g.random((batch, queries, 1)) > 0.3
    x = to_device(x64, dtype)
    cases = [("pad", dict(mask=cupy.asarray(pad)), dict(mask=pad)),
             ("causal", dict(causal=True), dict(causal=True)),
             ("pad+causal", dict(mask=cupy.asarray(pad), causal=True), dict(mask=pad, causal=True)),
             ("whole+causal", dict(mask=cupy.asarray(whole), causal=True), dict(mask=whole, causal=True)),
             ("by query+causal", dict(mask=cupy.asarray(by_query), causal=True), dict(mask=by_query, causal=True))]
    rows = batch * queries
    for name, kw, ref_kw in cases:
        causal = kw.get("causal", False)
        plan = _ops.plan((rows, cols), dtype, causal_queries=queries if causal else 0, mask="mask" in kw)
        # The bodies' plans: rows_block and the stream from 1001 columns, rows_warp's groups for
        # the shorter rows without a causal limit (no straddling rows_warp for the causal kind).
        assert plan["straddle"] == (1 if cols >= 1001 or not causal else 0), (name, plan)
        ref = ref_softmax(x64, 0.3, **ref_kw)
        y = pysoftmax.fused(x, scale=0.3, out=poisoned(x64.shape, dtype), **kw)
        assert_close(to_host64(y), ref, dtype, f"{name} {cols} seed={g.seed}")
        forced = [("stream", dict(family=_lib.FAMILY_STREAM)), ("split", dict(family=_lib.FAMILY_STREAM, chunks=2)),
                  ("online", dict(algo=_lib.ALGO_ONLINE))]
        for how, extra in forced if cols >= 1001 else forced[2:]:
            y = _ops.forward(x, scale=0.3, out=poisoned(x64.shape, dtype), **kw, **extra)
            assert_close(to_host64(y), ref, dtype, f"{name} {how} {cols} seed={g.seed}")


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
