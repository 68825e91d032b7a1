"""Masked 16-bit rows of odd widths with masked straddling off and on: `pysoftmax.fused` on 32 Mi
elements a shape seen as [rows/S, S, cols] query blocks (_bench._attention_view), scale 0.125, with
a padding mask (one row of keys broadcast over the queries), a causal limit, and both. Each setting
runs in a process of its own (PYSOFTMAX_STRADDLE_MASKED is read once a device), ROUNDS times in
turn; one JSON line a case: % of the copy bandwidth measured in that process, the plan's family,
the error against float64 and the copy's GB/s. docs/TUNING.md, "plan_straddling".

    ROUNDS=2 python3 tools/masked_rows.py > masked.jsonl
"""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = r"""
import json, os
import cupy as cp
import pysoftmax
from pysoftmax import _bench, _ops
timer = _bench.Timer()
copy = _bench.copy_bandwidth(timer)
for dt in ("bfloat16", "float16"):
    for c in (33, 99, 129, 257, 1001, 2049, 4097, 10001, 32001):
        shape = _bench.sweep_shape(c)
        view = _bench._attention_view(shape)
        x = _bench._make(cp, shape, dt).reshape(view)
        y = cp.empty_like(x)
        keep = cp.random.random((view[0], 1, view[2])) > 0.1
        for case, mask, causal in (("pad", keep, False), ("causal", None, True), ("pad+causal", keep, True)):
            ms = timer(lambda: pysoftmax.fused(x, scale=0.125, mask=mask, causal=causal, out=y))
            err = _bench._masked_forward_error(cp, x, y, 0.125, mask, causal)
            plan = _ops.plan(shape, dt, mask=mask is not None, causal_queries=view[1] if causal else 0)
            print(json.dumps(dict(label=os.environ["LABEL"], dtype=dt, cols=c, case=case, plan=plan["family"], err=err,
                                  copy=round(copy, 1), pct=round(100 * 2 * x.nbytes / ms / 1e6 / copy, 1))), flush=True)
        del x, y
        cp.get_default_memory_pool().free_all_blocks()
"""


def main():
    for r in range(int(os.environ.get("ROUNDS", "2"))):
        for label, setting in (("off", "0"), ("on", "1")):
            env = dict(os.environ, LABEL=label, PYSOFTMAX_STRADDLE_MASKED=setting,
                       PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
            out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
            for line in out.stdout.splitlines():
                print(json.dumps(dict(json.loads(line), round=r)), flush=True)
            if out.returncode:
                print(out.stderr[-3000:], file=sys.stderr)


if __name__ == "__main__":
    main()
