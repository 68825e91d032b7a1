"""The fused backward's automatic plan against forced ones, beside torch.compile's backward: for
each width (32 Mi elements a shape), `pysoftmax.backward` as planned, then with the family, the
block size and the grid cap forced (`_ops.backward_impl(family=, threads=, blocks=)`; plans the
dispatcher refuses are left out), and `torch._softmax_backward_data` through `torch.compile`
(static shapes), each timed by pysoftmax._bench.Timer as % of the copy bandwidth measured in the
same process. One JSON line a width (every setting's % and plan), and a summary line on stderr: the
automatic plan, the compiled peer and the six fastest settings. docs/NOTES.md §48.

    python3 tools/backward_plans.py > plans.jsonl
    COLS=80,200,2500 DTYPE=float16 python3 tools/backward_plans.py
"""
import json, os, sys

import cupy

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pysoftmax  # noqa: E402
from pysoftmax import _bench, _lib, _ops  # noqa: E402

COLS = [int(c) for c in os.environ.get("COLS", "48,80,96,160,200,320,768,1536,2500,12288").split(",")]
DTYPE = os.environ.get("DTYPE", "bfloat16")
FAMILIES = {"warp": _lib.FAMILY_WARP, "block": _lib.FAMILY_BLOCK, "stream": _lib.FAMILY_STREAM}
# rows_warp: block sizes and grid caps; rows_block and the stream: their default and 256 threads.
WARP_THREADS, WARP_BLOCKS, OTHER_THREADS = (0, 128, 256, 512), (0, 264, 1056, 4224), (0, 256)


def settings():
    for name in FAMILIES:
        for threads in WARP_THREADS if name == "warp" else OTHER_THREADS:
            for blocks in WARP_BLOCKS if name == "warp" else (0,):
                yield name, threads, blocks


def main():
    timer = _bench.Timer()
    copy = _bench.copy_bandwidth(timer)
    try:
        import torch
    except ImportError:
        torch = None
    for cols in COLS:
        shape = ((32 << 20) // cols, cols)
        y, dy = _bench._make(cupy, shape, DTYPE), _bench._make(cupy, shape, DTYPE)
        dx = cupy.empty_like(y)
        moved = 3 * y.size * y.dtype.itemsize
        pct = lambda fn: round(100 * moved / timer(fn) / 1e6 / copy, 1)
        res = {"auto": dict(pct=pct(lambda: pysoftmax.backward(y, dy, out=dx)),
                            plan=_ops.plan(shape, DTYPE, direction="backward"))}
        for name, threads, blocks in settings():
            f = FAMILIES[name]
            try:
                plan = _ops.plan(shape, DTYPE, direction="backward", family=name, threads=threads, blocks=blocks)
                res[f"{name}/t{threads}/b{blocks}"] = dict(
                    pct=pct(lambda: _ops.backward_impl(y, dy, out=dx, family=f, threads=threads, blocks=blocks)),
                    plan=plan)
            except (pysoftmax.SoftmaxError, ValueError):
                continue
        if torch is not None:
            tdt = getattr(torch, DTYPE)
            ty, tdy = torch.from_dlpack(y), torch.from_dlpack(dy)
            try:
                compiled = _bench.compile_peer(torch, lambda g, p: torch._softmax_backward_data(g, p, -1, tdt), tdy, ty)
                res["torch_compile"] = dict(pct=pct(lambda: compiled(tdy, ty)))
            except _bench.PeerUnavailable as e:
                res["torch_compile"] = dict(error=str(e))
        print(json.dumps(dict(shape=shape, dtype=DTYPE, copy=round(copy, 1), results=res)), flush=True)
        ranked = sorted(((v["pct"], k) for k, v in res.items() if "pct" in v), reverse=True)
        a = res["auto"]["plan"]
        print(f"{shape[0]}x{cols} auto {res['auto']['pct']} ({a['family']} group={a['group']} threads={a['threads']} "
              f"blocks={a['blocks']}) torch_compile {res.get('torch_compile', {}).get('pct')} | "
              + ", ".join(f"{k} {v}" for v, k in ranked[:6]), file=sys.stderr, flush=True)
        del y, dy, dx
        cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
