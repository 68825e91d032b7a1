"""Long rows: fused forward and backward (and, with PEERS=1, torch.softmax,
torch._softmax_backward_data and both through torch.compile with static shapes) in GB/s and % of
the copy bandwidth measured in the same run, one JSON line a shape and dtype (with the plans),
timed by pysoftmax._bench.Timer (L2 flushed before each call, the median). ONLY=odd keeps the
shapes of odd length (straddling rows); SHAPES=RxC,... names others. docs/NOTES.md §21 and §24
have its tables.

    PEERS=1 LABEL=after python3 tools/long_rows.py float32,bfloat16,float16 > long.jsonl
"""
import json, os, sys

import cupy

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pysoftmax  # noqa: E402
from pysoftmax import _bench, _ops  # noqa: E402
SHAPES = [(2048, 131072), (4096, 262144), (256, 1048576), (64, 1048576), (8, 4194304), (1, 16777216),
          (64, 1048577), (1, 16777217), (512, 131071), (1024, 65536), (256, 300000), (4, 8388608),
          (2048, 32001), (1024, 50257), (128, 524287)]
if os.environ.get("ONLY") == "odd":
    SHAPES = [s for s in SHAPES if s[1] % 2]
if os.environ.get("SHAPES"):  # e.g. SHAPES=33521x1001,16377x2049
    SHAPES = [tuple(int(n) for n in s.split("x")) for s in os.environ["SHAPES"].split(",")]
DT = sys.argv[1].split(",") if len(sys.argv) > 1 else ["float32", "bfloat16", "float16"]
label = os.environ.get("LABEL", "new")
peers = os.environ.get("PEERS") == "1"
timer = _bench.Timer()
copy = _bench.copy_bandwidth(timer)
print(json.dumps(dict(label=label, copy=copy)), flush=True)
if peers:
    import torch
for shape in SHAPES:
    for dt in DT:
        x = _bench._make(cupy, shape, dt)
        item = x.dtype.itemsize
        n = x.size
        y = cupy.empty_like(x)
        dy = _bench._make(cupy, shape, dt)
        dx = cupy.empty_like(x)
        tf = timer(lambda: pysoftmax.fused(x, out=y))
        tb = timer(lambda: pysoftmax.backward(y, dy, out=dx))
        row = dict(label=label, shape=shape, dtype=dt, fwd_gbs=2 * n * item / tf / 1e6, bwd_gbs=3 * n * item / tb / 1e6,
                   plan_fwd=_ops.plan(shape, dt), plan_bwd=_ops.plan(shape, dt, direction="backward"))
        row["fwd_pct"], row["bwd_pct"] = 100 * row["fwd_gbs"] / copy, 100 * row["bwd_gbs"] / copy
        if peers:
            tx, ty, tdy = torch.from_dlpack(x), torch.from_dlpack(y), torch.from_dlpack(dy)
            tt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dt]
            row["torch_fwd_gbs"] = 2 * n * item / timer(lambda: torch.softmax(tx, -1)) / 1e6
            row["torch_bwd_gbs"] = 3 * n * item / timer(lambda: torch._softmax_backward_data(tdy, ty, -1, tt)) / 1e6
            for key, fn, args, nbytes in (("compile_fwd_gbs", lambda t: torch.softmax(t, -1), (tx,), 2 * n * item),
                                          ("compile_bwd_gbs", lambda g, p: torch._softmax_backward_data(g, p, -1, tt),
                                           (tdy, ty), 3 * n * item)):
                try:
                    compiled = _bench.compile_peer(torch, fn, *args)
                    row[key] = nbytes / timer(lambda: compiled(*args)) / 1e6
                except _bench.PeerUnavailable as e:
                    row[key] = str(e)
        print(json.dumps(row), flush=True)
        del x, y, dy, dx
        cupy.get_default_memory_pool().free_all_blocks()
