"""Dense rows of odd widths (9 to 30001 columns, every dtype) at offsets 0, 1 and pack - 1 inside
poisoned buffers: the fused forward (scale 0.8) and the backward (scale 0.7) against float64 with
the tests' bounds (tests/_util.py), and nothing outside the arrays written. One line a width
(offset 0) with both plans, then the count of bad cases. A quick check of rows_tile's paths on a
GPU: run it as is (the default rule), with PYSOFTMAX_TILE_COLS=1000000 (every width tiled,
straddling) and with PYSOFTMAX_TILE_VEC=0 added (element-wise), each in its own process.

    PYSOFTMAX_TILE_COLS=1000000 python3 tools/tile_check.py
"""
import os
import sys

import numpy

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(HERE, "tests"))
sys.path.insert(0, HERE)
from _util import (assert_close, assert_grad_close, dense_at, pack, ref_softmax, rounded, to_host64,  # noqa: E402
                   written_outside)
import pysoftmax  # noqa: E402
from pysoftmax import _ops  # noqa: E402

SHAPES = [(777, 9), (513, 17), (1203, 33), (901, 65), (1203, 99), (517, 127), (333, 257), (129, 1001), (70, 4097),
          (13, 10001), (5, 30001)]


def check(dt, rows, cols, off, g):
    """The case's problems, as text (empty: none)."""
    x64 = rounded(g.standard_normal((rows, cols)) * 3, dt)
    y64 = rounded(ref_softmax(x64, scale=0.8), dt)
    dy64 = rounded(g.standard_normal((rows, cols)), dt)
    y_flat, y = dense_at(numpy.full((rows, cols), numpy.nan), dt, off, poison=True)
    dx_flat, dx = dense_at(numpy.full((rows, cols), numpy.nan), dt, off, poison=True)
    pysoftmax.fused(dense_at(x64, dt, off)[1], out=y, scale=0.8)
    pysoftmax.backward(dense_at(y64, dt, off)[1], dense_at(dy64, dt, off)[1], out=dx, scale=0.7)
    problems = []
    try:
        assert_close(to_host64(y), ref_softmax(x64, scale=0.8), dt, "fwd")
    except AssertionError as e:
        problems.append(str(e))
    try:
        assert_grad_close(to_host64(dx), y64, dy64, 0.7, dt, "bwd")
    except AssertionError as e:
        problems.append(str(e))
    for name, flat in (("fwd", y_flat), ("bwd", dx_flat)):
        n = written_outside(flat, off, rows * cols)
        if n:
            problems.append(f"{name}: {n} elements outside written")
    return "; ".join(problems)


bad = 0
for dt in ["bfloat16", "float16", "float32", "float64"]:
    for rows, cols in SHAPES:
        g = numpy.random.default_rng(cols)
        for off in sorted({0, 1, pack(dt) - 1}):
            problems = check(dt, rows, cols, off, g)
            bad += bool(problems)
            if problems or off == 0:
                pf = _ops.plan((rows, cols), dt)
                pb = _ops.plan((rows, cols), dt, direction="backward")
                print(f"{'BAD' if problems else 'OK '} {dt:8} {rows}x{cols} off={off} fwd={pf['family']}/{pf['pack']}/"
                      f"{pf['group']} bwd={pb['family']}/{pb['pack']}/{pb['group']} {problems}", flush=True)
print("BAD CASES:", bad)
