"""Odd widths: fused forward, the forward with a padding mask and causal limit, and the backward
(fused and naive) on the width sweep's odd shapes (32 Mi elements each), as % of the copy
bandwidth measured in the same run, one JSON line a case with the plans, over
pysoftmax._bench.measure (L2 flushed before each call, the median). PEERS=1 adds torch and
torch.compile (static shapes); SHAPES=RxC,... names other shapes; KINDS=bwd,... some of the
cases; LABEL names the run.

    LABEL=tile python3 tools/odd_widths.py bfloat16,float32 > odd.jsonl
"""
import json, os, sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pysoftmax import _bench, _ops  # noqa: E402

SHAPES = [_bench.sweep_shape(c) for c in (33, 99, 257, 1001, 2049, 4097, 10001)]
if os.environ.get("SHAPES"):
    SHAPES = [tuple(int(n) for n in s.split("x")) for s in os.environ["SHAPES"].split(",")]
DT = sys.argv[1].split(",") if len(sys.argv) > 1 else ["bfloat16", "float32"]
label = os.environ.get("LABEL", "new")
torch = _bench._torch() if os.environ.get("PEERS") == "1" else None
timer = _bench.Timer()
copy = _bench.copy_bandwidth(timer)
print(json.dumps(dict(label=label, copy=copy)), flush=True)
for shape in SHAPES:
    for dt in DT:
        for kind in os.environ.get("KINDS", "fwd,fwd+mask+causal,bwd").split(","):
            direction = "backward" if kind == "bwd" else "forward"
            masked = dict(mask=True, causal_queries=min(shape)) if kind == "fwd+mask+causal" and shape[0] % min(shape) == 0 else {}
            plan = _ops.plan(shape, dt, direction=direction, **masked)
            for r in _bench.measure(kind, shape, dt, timer, torch, algos=("fused",)):
                r.update(label=label, plan=plan["family"], pct=100 * r["gbs"] / copy if "gbs" in r else None)
                print(json.dumps(r), flush=True)
