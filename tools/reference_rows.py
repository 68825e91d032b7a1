"""The reference algorithms against fused: online, naive and fused forward, naive_backward and
backward, as % of the copy bandwidth measured in the same run, one JSON line a shape and dtype
(with the families planned), timed by pysoftmax._bench.Timer. docs/NOTES.md §21 has its tables.

    python3 tools/reference_rows.py float32,bfloat16 > reference.jsonl
    SHAPES=65536x4096,8192x32768 python3 tools/reference_rows.py bfloat16   # some shapes only
"""
import json, os, sys

import cupy

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pysoftmax  # noqa: E402
from pysoftmax import _bench, _ops  # noqa: E402
SHAPES = [(8388608, 32), (2097152, 128), (524288, 512), (262144, 1024), (131072, 2048), (65536, 4096),
          (32768, 8192), (16384, 16384), (8192, 32768), (4194304, 48), (1048576, 200), (262144, 768), (2048, 131072)]
if os.environ.get("SHAPES"):
    SHAPES = [tuple(int(v) for v in s.split("x")) for s in os.environ["SHAPES"].split(",")]
DT = sys.argv[1].split(",") if len(sys.argv) > 1 else ["float32", "bfloat16"]
timer = _bench.Timer()
copy = _bench.copy_bandwidth(timer)
print(json.dumps(dict(copy=copy)), flush=True)
for shape in SHAPES:
    for dt in DT:
        x = _bench._make(cupy, shape, dt)
        dy = _bench._make(cupy, shape, dt)
        y = cupy.empty_like(x)
        n, item = x.size, x.dtype.itemsize
        row = dict(shape=shape, dtype=dt)
        for algo in ("fused", "online", "naive"):
            f = getattr(pysoftmax, algo)
            row[algo] = 100 * 2 * n * item / timer(lambda: f(x, out=y)) / 1e6 / copy
            row["plan_" + algo] = _ops.plan(shape, dt, algo=algo)["family"]
        dx = cupy.empty_like(x)
        row["backward"] = 100 * 3 * n * item / timer(lambda: pysoftmax.backward(y, dy, out=dx)) / 1e6 / copy
        row["naive_backward"] = 100 * 3 * n * item / timer(lambda: pysoftmax.naive_backward(y, dy, out=dx)) / 1e6 / copy
        row["plan_naive_backward"] = _ops.plan(shape, dt, algo="naive", direction="backward")["family"]
        print(json.dumps(row), flush=True)
        del x, dy, y, dx
        cupy.get_default_memory_pool().free_all_blocks()
