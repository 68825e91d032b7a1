"""Measure the dispatcher's choices against the alternatives, to set the thresholds in
hip/dispatch.cuh from data (`make tune`, on the GPU).

For each row length it times every family that can hold the row (rows_warp, rows_block with
several block sizes, rows_stream) forward and backward, on ~1 GiB inputs, L2 flushed between
calls, and prints GB/s per variant with the dispatcher's own pick marked `*`. A threshold is
right when the pick is the fastest variant (or within noise of it) on both sides of it.
"""

import argparse
import os
import sys

import cupy

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo's package

from pysoftmax import _bench, _lib, _ops

COLS = [32, 64, 128, 256, 512, 768, 1024, 1536, 2048, 4096, 8192, 16384, 24576, 32768, 49152, 65536]
VARIANTS = [("warp", 0), ("block", 128), ("block", 256), ("block", 512), ("block", 1024), ("stream", 0)]
FAMILY = {"warp": _lib.FAMILY_WARP, "block": _lib.FAMILY_BLOCK, "stream": _lib.FAMILY_STREAM}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--cols", default=",".join(map(str, COLS)))
    ap.add_argument("--bytes", type=int, default=1 << 30, help="input size per case")
    ap.add_argument("--directions", default="fwd,bwd")
    args = ap.parse_args(argv)
    timer = _bench.Timer()
    copy = _bench.copy_bandwidth(timer)
    print(f"copy bandwidth {copy:.0f} GB/s; GB/s per variant, * = dispatcher's pick")
    header = f"{'dir':4} {'dtype':8} {'cols':>6} " + " ".join(f"{f[:5] + (str(t) if t else ''):>10}" for f, t in VARIANTS)
    print(header)
    for direction in args.directions.split(","):
        for dtype in args.dtypes.split(","):
            item = cupy.dtype(dtype).itemsize
            for cols in map(int, args.cols.split(",")):
                rows = max(1, args.bytes // (cols * item))
                x = _bench._make(cupy, (rows, cols), dtype)
                y = cupy.empty_like(x)
                dy = _bench._make(cupy, (rows, cols), dtype) if direction == "bwd" else None
                nbytes = (3 if dy is not None else 2) * x.nbytes
                auto = _ops.plan((rows, cols), dtype, direction="forward" if dy is None else "backward")
                cells = []
                for fam, threads in VARIANTS:
                    try:
                        plan = _ops.plan((rows, cols), dtype, direction="forward" if dy is None else "backward",
                                         family=fam, threads=threads)
                    except _lib.SoftmaxError:
                        cells.append(f"{'-':>10}")
                        continue
                    kw = dict(family=FAMILY[fam], threads=threads)
                    fn = (lambda: _ops.forward(x, out=y, **kw)) if dy is None else (
                        lambda: _ops.backward_impl(x, dy, out=y, **kw))
                    try:
                        ms = timer(fn, budget_ms=60)
                    except _lib.SoftmaxError as e:
                        cells.append(f"{'err':>10}")
                        print(f"  {fam}{threads} {cols}: {e}", file=sys.stderr)
                        continue
                    pick = auto["family"] == fam and auto["threads"] == plan["threads"] and auto["packs"] == plan["packs"]
                    cells.append(f"{nbytes / ms / 1e6:9.0f}{'*' if pick else ' '}")
                print(f"{direction:4} {dtype:8} {cols:6} " + " ".join(cells) + f"   auto: {auto['family']} "
                      f"threads={auto['threads']} packs={auto['packs']}", flush=True)
                del x, y, dy
                cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    sys.exit(main())
