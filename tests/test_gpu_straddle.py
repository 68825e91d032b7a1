"""Straddling rows in rows_block on the GPU: dense rows of an odd width held a row a block.

Each row of an odd width starts at another offset inside the 16-byte pack. Where every array of
the call shares that offset (a contiguous array, in place or into a fresh one; views one element
into rows of one width), the fused algorithm's rows that its element-wise plan holds in registers
take rows_block<kStraddle> where their body, cols - (pack - 1) columns from the row's first pack
boundary, takes rows_block as an aligned row (or rows_warp a warp a row): the body in vector
packs, and the pack - 1 columns outside it (the head before it, the rest after it) one element
each of threads 0..pack-2 (plan_straddling in hip/dispatch.cuh). By default 16-bit rows do
(kStraddleBlock 1); PYSOFTMAX_STRADDLE_BLOCK=2 takes every dtype's and =0 none, and
test_block_straddling_every_dtype runs the cases so in processes of their own (the variable is
read once a device).

The cases sit on both sides of the thresholds: rows whose body rows_warp holds in narrower groups
(element-wise), a warp a row (a block each), rows_block's shortest and longest rows, and one past
what the element-wise plan holds (the stream of the bodies). They check the plan, every column against float64, that nothing outside the arrays is written
(outputs inside poisoned buffers), every offset inside the pack, grids of one and three blocks
walking every row (each row its own head), the same bits twice, and the output over an input.
"""

import os
import subprocess
import sys

import numpy
import pytest

from _util import (assert_close, assert_grad_close, dense_at, pack, ref_softmax, rng, rounded, to_device, to_host64,
                   written_outside)

pytestmark = pytest.mark.gpu

try:
    import cupy
    import pysoftmax
    from pysoftmax import _ops
except ImportError:  # pragma: no cover
    pass

SETTING = os.environ.get("PYSOFTMAX_STRADDLE_BLOCK", "1")


def block_straddles(dtype):
    """Whether the rule in force takes this dtype's rows to rows_block<kStraddle>."""
    return SETTING == "2" or (SETTING == "1" and pack(dtype) == 8)


def stages():
    """The stream of the bodies needs staged rows (NVIDIA sm_80+); elsewhere past rows_block the
    rows stay element-wise, and every value is still checked."""
    return not cupy.cuda.runtime.is_hip


# (rows, cols, dtype, direction, family): the plan the rows straddle in where the rule in force
# takes their dtype (None: element-wise). The element-wise plan holds 16-bit rows in registers up
# to 16384 columns forward and 8192 backward (rows_block straddles them where the body takes
# rows_block, or rows_warp a warp a row: 1031 on) and streams longer ones (the stream of the
# bodies); rows_tile takes the shortest, and rows of narrower rows_warp groups (301) stay
# element-wise.
CASES = [
    (300, 301, "bfloat16", "forward", None),
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
def test_block_straddling_rows(rows, cols, dtype, direction, family):
    g = rng()
    plan = _ops.plan((rows, cols), dtype, direction=direction)
    straddling = family is not None and stages() and (family == "stream" or block_straddles(dtype))
    if straddling:
        assert plan["family"] == family and plan["straddle"] == 1 and plan["pack"] == pack(dtype), plan
    else:  # rows_block does not straddle this dtype's rows under the rule in force
        assert not (plan["family"] == "block" and plan["straddle"]), plan
    host = inputs(g, rows, cols, dtype, direction)
    for offset in range(pack(dtype)):
        dev = [dense_at(a, dtype, offset)[1] for a in host]
        first = None
        for kw in (dict(), dict(blocks=1), dict(blocks=3), dict()):
            flat, out = dense_at(numpy.full((rows, cols), numpy.nan), dtype, offset, poison=True)
            what = f"{rows}x{cols} {dtype} {direction} offset={offset} {kw} {plan} seed={g.seed}"
            got = call(direction, dev, out, **kw)
            check(direction, got, host, dtype, what)
            n = written_outside(flat, offset, rows * cols)
            assert n == 0, f"{what}: {n} elements outside the array written"
            bits = cupy.ascontiguousarray(got).view(cupy.uint8)
            if first is None:
                first = bits
            elif not kw:
                assert bool((bits == first).all()), f"{what}: repeated calls differ"
    inout = dev[-1].copy()
    check(direction, call(direction, dev[:-1] + [inout], inout), host, dtype, f"in place {rows}x{cols} {dtype} seed={g.seed}")


def test_block_straddling_views_and_requests():
    """Views one element into wider rows straddle (every array at the same offset); arrays at
    different offsets, a requested family or block size keep the element-wise kernels; and all
    are right."""
    g = rng()
    rows, cols, dtype = 67, 4097, "bfloat16"
    x64 = rounded(g.standard_normal((rows, cols)) * 3, dtype)
    width = cols + 15
    xv = to_device(numpy.pad(x64, ((0, 0), (1, width - cols - 1))), dtype)[:, 1:1 + cols]
    assert _ops.plan((rows, cols), dtype, aligned=False)["straddle"] == int(block_straddles(dtype) and stages())
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


@pytest.mark.parametrize("setting", ["0", "2"])
def test_block_straddling_every_dtype(setting):
    """The cases under PYSOFTMAX_STRADDLE_BLOCK=0 (no rows_block straddles) and =2 (every dtype's
    does), in a process of their own."""
    if SETTING != "1":
        pytest.skip("this process runs under another rule")
    env = dict(os.environ, PYSOFTMAX_STRADDLE_BLOCK=setting)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                           "test_block_straddling_rows or views"], env=env, capture_output=True, text=True, timeout=600)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    assert done.returncode == 0 and f"{len(CASES) + 1} passed" in summary, done.stdout[-4000:] + done.stderr[-2000:]
