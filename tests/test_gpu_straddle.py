"""Straddling rows held in registers on the GPU: dense rows of an odd width, a row a block
(rows_block) or a group of lanes (rows_warp).

Each row of an odd width starts at another offset inside the 16-byte pack. Where every array of
the call shares that offset (a contiguous array, in place or into a fresh one; views one element
into rows of one width), the fused algorithm's rows that its element-wise plan holds in registers
take the plan of their body, the whole packs from the row's first pack boundary on that leave at
least pack - 1 columns, as an aligned row: the body in vector packs, and the pack - 1 to
2 pack - 2 columns outside it (the head before it, the rest after it) one element each of the
first 2 pack - 2 threads or lanes, two each of a group of 8 lanes (holds_outside in hip/span.cuh;
plan_straddling in hip/dispatch.cuh). rows_block<kStraddle> takes them where the body takes rows_block (or rows_warp
a warp a row, but the forward's rows that a warp leaves fewer slots idle in): by default 16-bit
rows (kStraddleBlock 1), PYSOFTMAX_STRADDLE_BLOCK=2 every dtype's, =0 none. rows_warp<kStraddle>
takes 16-bit rows whose body rows_warp holds in narrower groups, several rows a group where the
element-wise plan is rows_block, and those forward rows of a warp a row (every row of a warp a
row under PYSOFTMAX_STRADDLE_BLOCK=0); PYSOFTMAX_STRADDLE_WARP=0 turns it off. test_straddling_under_other_rules runs the cases so in
processes of their own (the variables are read once a device).

The cases sit on both sides of the thresholds: the tile's widest rows (element-wise below), each
group width and count of packs rows_warp holds the bodies in, rows_block's shortest and longest
rows, and one past what the element-wise plan holds (the stream of the bodies). They check the
plan, every column against float64, that nothing outside the arrays is written (outputs inside
poisoned buffers), every offset inside the pack, grids of one and three blocks walking every row
(each row its own head), the same bits from every grid, and the output over an input at its
offset.
"""

import os

import numpy
import pytest

from _util import (assert_close, assert_grad_close, at_every_offset, pack, pytest_in_process, ref_softmax, rng, rounded,
                   to_device, to_host64)

pytestmark = pytest.mark.gpu

try:
    import cupy
    import pysoftmax
    from pysoftmax import _ops
except ImportError:  # pragma: no cover
    pass

BLOCK_SETTING = os.environ.get("PYSOFTMAX_STRADDLE_BLOCK", "1")
WARP_ON = os.environ.get("PYSOFTMAX_STRADDLE_WARP", "1") != "0"
DEFAULT = BLOCK_SETTING == "1" and WARP_ON


def block_straddles(dtype):
    """Whether the rule in force takes this dtype's rows to rows_block<kStraddle>."""
    return BLOCK_SETTING == "2" or (BLOCK_SETTING == "1" and pack(dtype) == 8)


def warp_straddles(dtype):
    """Whether the rule in force takes this dtype's rows to rows_warp<kStraddle>."""
    return WARP_ON and pack(dtype) == 8


def stages():
    """The stream of the bodies needs staged rows (NVIDIA sm_80+); elsewhere past rows_block the
    rows stay element-wise, and every value is still checked."""
    return not cupy.cuda.runtime.is_hip


def expected(family, dtype):
    """The family the rows straddle in under the rules in force: "block", "warp", "stream", None
    (element-wise), or "any" (rows_block's rows under PYSOFTMAX_STRADDLE_BLOCK=0: rows_warp takes
    those whose body it holds a warp a row)."""
    if family is None or not stages():
        return None
    if family == "stream":
        return "stream"
    if family == "warp":
        return "warp" if warp_straddles(dtype) else None
    if family == "warp/block":  # a warp a row that rows_warp leaves fewer slots idle in than rows_block
        return "warp" if warp_straddles(dtype) else "block" if block_straddles(dtype) else None
    if block_straddles(dtype):
        return "block"
    return "any" if warp_straddles(dtype) else None


# (rows, cols, dtype, direction, family): the plan the rows straddle in under the default rules
# (None: element-wise; "warp/block": rows_warp a warp a row, rows_block where the warp rule is
# off). The element-wise plan holds 16-bit rows in registers up to 16384 columns forward and 8192
# backward, and streams longer ones (the stream of the bodies). On the H200's plans rows_tile
# takes the shortest (to 127 columns forward, 134 backward); past it, the forward's bodies go to
# rows_warp in groups of 8 and 16 lanes (129-397), stay element-wise where the body would take two
# rows a group and the element-wise plan is rows_warp (399-511), take two rows a group where it is
# rows_block (513-525), a warp a row of three packs a lane (527-781), and rows_block from 783.
# The backward's go to rows_warp in groups of 8 and 16 lanes (135-398) and rows_block from 399
# (a warp a row made a block). Bodies held in registers are whole packs,
# with 7 to 14 columns outside them (527 and 1031: 7, 1033: 9, 525: 13; the even 526 and 1030: 14).
CASES = [
    (300, 127, "bfloat16", "forward", None),
    (300, 129, "bfloat16", "forward", "warp"),
    (257, 137, "float16", "forward", "warp"),
    (300, 199, "bfloat16", "forward", "warp"),
    (300, 257, "bfloat16", "forward", "warp"),
    (301, 391, "float16", "forward", "warp"),
    (300, 397, "bfloat16", "forward", "warp"),
    (300, 449, "bfloat16", "forward", None),
    (299, 519, "bfloat16", "forward", "warp"),
    (300, 525, "bfloat16", "forward", "warp"),
    (300, 526, "float16", "forward", "warp"),
    (300, 527, "bfloat16", "forward", "warp/block"),
    (301, 781, "float16", "forward", "warp/block"),
    (300, 783, "bfloat16", "forward", "block"),
    (300, 135, "bfloat16", "backward", "warp"),
    (300, 199, "float16", "backward", "warp"),
    (301, 391, "bfloat16", "backward", "warp"),
    (300, 399, "bfloat16", "backward", "block"),
    (299, 599, "float16", "backward", "block"),
    (300, 641, "bfloat16", "backward", "block"),
    (300, 1030, "bfloat16", "forward", "block"),
    (300, 1031, "bfloat16", "forward", "block"),
    (300, 1033, "bfloat16", "forward", "block"),
    (300, 1033, "float16", "backward", "block"),
    (129, 4097, "bfloat16", "backward", "block"),
    (100, 4099, "float16", "forward", "block"),
    (3, 10001, "bfloat16", "forward", "block"),
    (64, 8191, "bfloat16", "backward", "block"),
    (64, 8199, "float16", "backward", "stream"),
    (64, 16383, "bfloat16", "forward", "block"),
    (64, 16385, "float16", "forward", "stream"),
    (1, 2049, "bfloat16", "backward", "block"),
    (300, 129, "float32", "forward", None),
    (300, 1029, "float32", "forward", "block"),
    (130, 4097, "float32", "backward", "block"),
    (64, 16389, "float32", "forward", "stream"),
    (70, 515, "float64", "forward", "block"),
    (70, 4097, "float64", "backward", "stream"),
]


def inputs(g, rows, cols, dtype, direction):
    if direction == "forward":
        return [rounded(g.standard_normal((rows, cols)) * 3, dtype)]
    return [rounded(ref_softmax(g.standard_normal((rows, cols)) * 3), dtype), rounded(g.standard_normal((rows, cols)), dtype)]


def call(direction, dev, out, **kw):
    if direction == "forward":
        return _ops.forward(dev[0], out=out, scale=0.7, **kw)
    return _ops.backward_impl(dev[0], dev[1], out=out, scale=0.7, **kw)


def check(direction, got, host, dtype, what):
    if direction == "forward":
        assert_close(to_host64(got), ref_softmax(host[0], scale=0.7), dtype, what)
    else:
        assert_grad_close(to_host64(got), host[0], host[1], 0.7, dtype, what)


@pytest.mark.parametrize("rows,cols,dtype,direction,family", CASES)
def test_straddling_rows(rows, cols, dtype, direction, family):
    g = rng()
    plan = _ops.plan((rows, cols), dtype, direction=direction)
    want = expected(family, dtype)
    if want in ("block", "warp", "stream"):
        assert plan["family"] == want and plan["straddle"] == 1 and plan["pack"] == pack(dtype), plan
    elif want == "any":
        assert not (plan["family"] == "block" and plan["straddle"]), plan
        assert not plan["straddle"] or plan["family"] == "warp", plan
    else:  # no register family straddles this dtype's rows under the rules in force
        assert not (plan["family"] in ("block", "warp") and plan["straddle"]), plan
    host = inputs(g, rows, cols, dtype, direction)
    at_every_offset(host, dtype, lambda dev, out, **kw: call(direction, dev, out, **kw),
                    lambda got, what: check(direction, got, host, dtype, what),
                    f"{rows}x{cols} {dtype} {direction} {plan} seed={g.seed}")


def test_straddling_views_and_requests():
    """Views one element into wider rows straddle (every array at the same offset); arrays at
    different offsets, a requested family or block size keep the element-wise kernels; and all
    are right."""
    g = rng()
    rows, cols, dtype = 67, 4097, "bfloat16"
    x64 = rounded(g.standard_normal((rows, cols)) * 3, dtype)
    width = cols + 15
    xv = to_device(numpy.pad(x64, ((0, 0), (1, width - cols - 1))), dtype)[:, 1:1 + cols]
    assert _ops.plan((rows, cols), dtype, aligned=False)["straddle"] == int(block_straddles(dtype) and stages())
    assert _ops.plan((100, 257), dtype, aligned=False)["straddle"] == int(warp_straddles(dtype) and stages())
    assert _ops.plan((100, 257), dtype, family="warp")["straddle"] == 0
    assert _ops.plan((rows, cols), dtype, aligned="mixed")["straddle"] == 0
    assert _ops.plan((rows, cols), dtype, family="block")["straddle"] == 0
    assert _ops.plan((rows, cols), dtype, threads=256)["straddle"] == 0
    ref = ref_softmax(x64)
    for kw in (dict(), dict(family=2), dict(threads=256)):
        out_buf = to_device(numpy.full((rows, width), numpy.nan), dtype)
        out = out_buf[:, 1:1 + cols]
        assert_close(to_host64(_ops.forward(xv, out=out, **kw)), ref, dtype, f"view {kw} seed={g.seed}")
        rest = to_host64(out_buf)
        assert numpy.isnan(rest[:, 0]).all() and numpy.isnan(rest[:, 1 + cols:]).all(), f"{kw}: written outside"
    fresh = pysoftmax.fused(xv)  # x one element in, a fresh (aligned) output: element-wise
    assert_close(to_host64(fresh), ref, dtype, f"fresh output seed={g.seed}")


@pytest.mark.parametrize("setting", ["PYSOFTMAX_STRADDLE_BLOCK=0", "PYSOFTMAX_STRADDLE_BLOCK=2",
                                     "PYSOFTMAX_STRADDLE_WARP=0"])
def test_straddling_under_other_rules(setting):
    """The cases under PYSOFTMAX_STRADDLE_BLOCK=0 (no rows_block straddles; rows_warp takes the
    whole-warp bodies), =2 (every dtype's rows_block does) and PYSOFTMAX_STRADDLE_WARP=0 (no rows_warp
    straddles), in a process of their own."""
    if not DEFAULT:
        pytest.skip("this process runs under another rule")
    name, value = setting.split("=")
    env = dict(os.environ, **{name: value})
    pytest_in_process(__file__, "test_straddling_rows or views", env, len(CASES) + 1, timeout=600)
