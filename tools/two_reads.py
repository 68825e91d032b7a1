"""The paths that read a row twice from global memory: naive_backward, online on rows too long for
a cluster, and the stream with one chunk or a few requested (rows_stream not resident, its ring of
steps in flight, carried across passes and rows in the backward's 512-thread blocks and its
narrower float32 and float64 ones:
docs/TUNING.md, "rows_stream ring"). One JSON line a case (ONLY=kind: that kind's cases alone), %
of the copy measured in the same run, timed by pysoftmax._bench.Timer (L2 flushed, the median),
with the plan; the first argument labels the lines. Compare settings in turn, one process each:

    PYSOFTMAX_CARRY=0 python3 tools/two_reads.py pass > ring.jsonl; python3 tools/two_reads.py carry >> ring.jsonl
"""
import json, os, sys

import cupy

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pysoftmax  # noqa: E402
from pysoftmax import _bench, _ops  # noqa: E402
label = sys.argv[1]
timer = _bench.Timer()
copy = _bench.copy_bandwidth(timer)
print(json.dumps(dict(label=label, copy=copy)), flush=True)
F32, BF = "float32", "bfloat16"
cases = []
for shape, dt in [((8192, 32768), F32), ((8192, 32768), BF), ((2048, 131072), F32), ((2048, 131072), BF),
                  ((256, 1048576), F32), ((64, 1048576), BF), ((16384, 16384), F32), ((32768, 8192), F32),
                  ((32768, 4096), BF), ((65536, 2048), F32), ((32768, 8192), BF), ((16384, 16384), BF),
                  ((8192, 24576), BF),
                  # narrower blocks (rows of one step, 96-384 threads): float32's carry the ring (the one-step walk)
                  ((13421, 5000), F32), ((16384, 4096), F32), ((87381, 1536), BF), ((26843, 5000), BF),
                  ((21845, 6144), BF), ((10922, 6144), F32), ((22369, 3000), F32), ((43690, 1536), F32),
                  ((13421, 2500), "float64"), ((65536, 1024), "float64")]:
    cases.append(("naive_bwd", shape, dt, {}))
for shape, dt in [((256, 1048576), F32), ((256, 1048576), BF), ((64, 1048576), F32), ((8, 4194304), F32), ((2048, 131072), F32),
                  ((8192, 32768), F32), ((8192, 32768), BF), ((16384, 16384), F32), ((32768, 8192), BF)]:
    cases.append(("online", shape, dt, {}))
cases.append(("bwd", (8192, 32768), F32, dict(family=3, chunks=1)))
cases.append(("bwd", (2048, 131072), BF, dict(family=3, chunks=1)))
cases.append(("fwd", (2048, 131072), F32, dict(family=3, chunks=1)))
cases.append(("fwd", (256, 1048576), F32, dict(family=3, chunks=4)))
only = os.environ.get("ONLY")
cases = [c for c in cases if not only or c[0] == only]
cases.sort(key=lambda c: (c[1], c[2]))  # the inputs made once a shape
last = None
for kind, shape, dt, kw in cases:
    if (shape, dt) != last:
        if last is not None:
            del x, y, dy, dx
            cupy.get_default_memory_pool().free_all_blocks()
        x = _bench._make(cupy, shape, dt); y = cupy.empty_like(x); dy = _bench._make(cupy, shape, dt); dx = cupy.empty_like(x)
        pysoftmax.fused(x, out=y)
        last = (shape, dt)
    n = x.size * x.dtype.itemsize
    pk = dict(kw, family="stream") if kw else {}
    if kind == "fwd":
        fn, nb, pl = (lambda: _ops.forward(x, out=y, **kw)), 2 * n, _ops.plan(shape, dt, **pk)
    elif kind == "bwd":
        fn, nb, pl = (lambda: _ops.backward_impl(y, dy, out=dx, **kw)), 3 * n, _ops.plan(shape, dt, direction="backward", **pk)
    elif kind == "online":
        fn, nb, pl = (lambda: pysoftmax.online(x, out=dx)), 2 * n, _ops.plan(shape, dt, algo="online")
    else:
        fn, nb, pl = (lambda: pysoftmax.naive_backward(y, dy, out=dx)), 3 * n, _ops.plan(shape, dt, direction="backward", algo="naive")
    try:
        pct = round(100 * nb / timer(fn) / 1e6 / copy, 1)
    except Exception as e:
        pct = str(e)[:80]
    plan = {k: pl[k] for k in ("family", "threads", "chunks", "cluster", "grid", "resident", "held", "carry", "stage")}
    print(json.dumps(dict(label=label, kind=kind, shape=shape, dtype=dt, kw=kw, pct=pct, plan=plan)), flush=True)
