"""Dense rows of odd widths (9 to 30001 columns, every dtype) at offsets 0, 1 and pack - 1 inside
poisoned buffers: the fused forward (scale 0.8) and the backward (scale 0.7) against float64, and
nothing outside the arrays written. One line a width (offset 0) with both plans, then the count of
bad cases. A quick check of rows_tile's paths on a GPU: run it as is (the default rule), with
PYSOFTMAX_TILE_COLS=1000000 (every width tiled, straddling) and with PYSOFTMAX_TILE_VEC=0 added
(element-wise), each in its own process.

    PYSOFTMAX_TILE_COLS=1000000 python3 tools/tile_check.py
"""
import os, sys, numpy, cupy
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(HERE, "tests"))
sys.path.insert(0, HERE)
from _util import ref_softmax, rounded, to_device, to_host64, np_dtype
import pysoftmax
from pysoftmax import _ops
bad = 0
for dt in ["bfloat16", "float16", "float32", "float64"]:
    pk = 16 // np_dtype(dt).itemsize
    tol = {"float32": 1e-5, "float16": 3e-3, "bfloat16": 2e-2, "float64": 1e-12}[dt]
    for rows, cols in [(777, 9), (513, 17), (1203, 33), (901, 65), (1203, 99), (517, 127), (333, 257), (129, 1001), (70, 4097), (13, 10001), (5, 30001)]:
        g = numpy.random.default_rng(cols)
        for off in sorted({0, 1, pk - 1}):
            x64 = rounded(g.standard_normal((rows, cols)) * 3, dt)
            flat = to_device(numpy.concatenate([g.standard_normal(off), x64.reshape(-1), g.standard_normal(pk)]), dt)
            x = flat[off:off + rows * cols].reshape(rows, cols)
            oflat = to_device(numpy.full(rows * cols + off + pk, numpy.nan), dt)
            out = oflat[off:off + rows * cols].reshape(rows, cols)
            y = pysoftmax.fused(x, out=out, scale=0.8)
            ref = ref_softmax(x64, scale=0.8)
            err = numpy.abs(to_host64(y) - ref).max()
            oh = to_host64(oflat)
            outside = (~numpy.isnan(numpy.concatenate([oh[:off], oh[off + rows * cols:]]))).sum()
            # backward
            dy64 = rounded(g.standard_normal((rows, cols)), dt)
            y64 = rounded(ref, dt)
            yd = to_device(numpy.concatenate([numpy.zeros(off), y64.reshape(-1), numpy.zeros(pk)]), dt)[off:off + rows * cols].reshape(rows, cols)
            dyd = to_device(numpy.concatenate([numpy.zeros(off), dy64.reshape(-1), numpy.zeros(pk)]), dt)[off:off + rows * cols].reshape(rows, cols)
            oflat2 = to_device(numpy.full(rows * cols + off + pk, numpy.nan), dt)
            out2 = oflat2[off:off + rows * cols].reshape(rows, cols)
            dx = pysoftmax.backward(yd, dyd, out=out2, scale=0.7)
            dref = 0.7 * y64 * (dy64 - (dy64 * y64).sum(-1, keepdims=True))
            derr = numpy.abs(to_host64(dx) - dref).max() / max(1e-30, numpy.abs(dref).max())
            oh2 = to_host64(oflat2)
            outside2 = (~numpy.isnan(numpy.concatenate([oh2[:off], oh2[off + rows * cols:]]))).sum()
            pf = _ops.plan((rows, cols), dt)
            pb = _ops.plan((rows, cols), dt, direction="backward")
            ok = err < tol and derr < 10 * tol and not outside and not outside2 and numpy.isfinite(to_host64(y)).all() and numpy.isfinite(to_host64(dx)).all()
            bad += not ok
            if not ok or off == 0:
                print(f"{'OK ' if ok else 'BAD'} {dt:8} {rows}x{cols} off={off} fwd err={err:.2e} bwd rel={derr:.2e} outside={outside},{outside2} "
                      f"fwd={pf['family']}/{pf.get('pack')}/{pf.get('group')} bwd={pb['family']}/{pb.get('pack')}/{pb.get('group')}", flush=True)
print("BAD CASES:", bad)
