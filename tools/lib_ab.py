"""Builds of the library side by side: each named library (and environment) times the same
algorithms on the same shapes in a process of its own, in turn, ROUNDS times, so that one call of
the lent GPU compares a change with its parent. One JSON line a shape, dtype, library and round:
% of the copy bandwidth measured in that process, the plans, `lib` and `round`. Timed by
pysoftmax._bench.Timer (L2 flushed, the median). docs/TUNING.md, "passes_group_blocks", has a run.

    LIBS=before:/path/a.so,after:build/nvidia/libsoftmax.so,cols:a.so:PYSOFTMAX_PASSES_COLS=32768 \\
    SHAPES=262144x1024,349526x96 ALGOS=online,naive DTYPES=bfloat16 ROUNDS=2 python3 tools/lib_ab.py

LIBS: name:path[:VAR=value...], comma-separated. ALGOS: fused, online, naive (forward, bytes x
read and y written) and naive_backward or backward (y and dy read, dx written).
"""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = r"""
import json, os, sys
import cupy
import pysoftmax
from pysoftmax import _bench, _ops
shapes = [tuple(int(v) for v in s.split("x")) for s in os.environ["SHAPES"].split(",")]
algos = os.environ.get("ALGOS", "online,naive").split(",")
timer = _bench.Timer()
copy = _bench.copy_bandwidth(timer)
for dt in os.environ.get("DTYPES", "bfloat16").split(","):
    for shape in shapes:
        x = _bench._make(cupy, shape, dt)
        y = cupy.empty_like(x)
        n, item = x.size, x.dtype.itemsize
        row = dict(shape=shape, dtype=dt, copy=copy)
        for algo in algos:
            if algo in ("backward", "naive_backward"):
                dy = _bench._make(cupy, shape, dt)
                f = getattr(pysoftmax, algo)
                t, moved = timer(lambda: f(y, dy, out=x)), 3
                p = _ops.plan(shape, dt, algo="naive" if algo == "naive_backward" else "fused", direction="backward")
            else:
                f = getattr(pysoftmax, algo)
                t, moved = timer(lambda: f(x, out=y)), 2
                p = _ops.plan(shape, dt, algo=algo)
            row["plan_" + algo] = "%s/g%s" % (p["family"], p.get("group"))
            row[algo] = round(100 * moved * n * item / t / 1e6 / copy, 2)
        print(json.dumps(row), flush=True)
        del x, y
        cupy.get_default_memory_pool().free_all_blocks()
"""


def main():
    libs = [spec.split(":") for spec in os.environ["LIBS"].split(",")]
    rounds = int(os.environ.get("ROUNDS", "2"))
    for r in range(rounds):
        for name, path, *sets in libs:
            env = dict(os.environ, PYSOFTMAX_LIB=os.path.abspath(path))
            env.update(kv.split("=", 1) for kv in sets)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
            out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
            if out.returncode:
                print(json.dumps(dict(lib=name, round=r, error=out.stderr[-2000:])), flush=True)
            for line in out.stdout.splitlines():
                row = json.loads(line)
                row.update(lib=name, round=r)
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
