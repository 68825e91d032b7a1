"""The main job: time pysoftmax against its peers and report GB/s and % of copy bandwidth.

Timing: CUDA events around each call, L2 flushed (a 256 MiB write) before every timed call so
that no shape is measured out of cache, a warm-up first, the median of the repeats reported.
Bytes are the fewest the op must move: forward reads x and writes y; backward reads y and dy and
writes dx (masks are not counted). The ceiling is a device-to-device copy measured in the same run.
Peers: torch.softmax (and its backward), the composed ``softmax(x * scale + mask)`` for the masked
cases, each of those through torch.compile with static shapes (compiled before the timing, once a
case), and CuPy's composed softmax.
"""

import json
import math
import sys
import time

import numpy


# PERF.md's first table (rows, cols) and the attention shapes (B, H, S): B*H*S query rows over S
# keys, long contexts and the small blocks of short ones (S = 64 to 512, one of them odd).
PERF_SHAPES = [
    (8388608, 32), (2097152, 128), (524288, 512), (262144, 1024), (131072, 2048), (65536, 4096),
    (32768, 8192), (16384, 16384), (8192, 32768), (2048, 131072), (256, 1048576), (4096, 262144),
    (64, 1048576), (8, 4194304), (1, 16777216), (256, 2048), (256, 8192),
]
ATTENTION_SHAPES = [(8, 32, 1024), (2, 16, 4096), (1, 8, 8192), (64, 16, 128),
                    (512, 16, 64), (128, 16, 256), (64, 16, 257), (32, 16, 512)]
DTYPES = ["float32", "float16", "bfloat16"]
# The width sweep: row lengths between the powers of two that are whole 16-byte packs (multiples of
# 4 elements: packs of float32, and of 16-bit too but for 2500), as head and hidden sizes are, and
# odd lengths, where no pack divides a row and the kernels take their element-wise tails.
SWEEP_PACKED = [48, 80, 96, 160, 200, 320, 384, 640, 768, 1536, 2500, 5000, 12288, 24576]
SWEEP_ODD = [33, 99, 257, 1001, 2049, 4097, 10001, 32001, 100003]
SWEEP_WIDTHS = SWEEP_PACKED + SWEEP_ODD
# Every sweep shape holds at least this many elements (64 MiB in 16-bit, 128 MiB in float32): out
# of L2 and long enough that the launch is noise, so widths compare by bandwidth alone.
SWEEP_ELEMENTS = 32 << 20


def sweep_shape(cols, elements=SWEEP_ELEMENTS):
    """(rows, cols) with the fewest rows that hold `elements` or more."""
    return (-(-elements // cols), cols)


SWEEP_SHAPES = [sweep_shape(c) for c in SWEEP_WIDTHS]
# Rows too long for one block (65536 to 32M columns), powers of two and odd lengths, 1 to 4096 rows,
# each 64 MiB or more in 16-bit (a single row needs 32M columns for that; 2 x 16M + 1 stands in
# for the single row of 16M + 1).
LONG_SHAPES = [
    (1024, 65536), (1024, 65537), (2048, 131072), (2048, 131071), (4096, 262144), (256, 1048576),
    (64, 1048577), (8, 4194304), (5, 8388607), (2, 16777216), (2, 16777217), (1, 33554433),
]
# The pytest-benchmark suite's shapes (benchmarks/), and so the gate's: PERF.md's table, a few
# widths of the sweep (packed and odd) and a few long rows of odd length. Kept to a subset so that
# the suite's run stays short; `bench --shapes sweep|long` times the whole sets.
SUITE_SHAPES = (PERF_SHAPES + [sweep_shape(c) for c in (96, 200, 768, 33, 1001, 4097, 32001)]
                + [(2048, 131071), (64, 1048577), (2, 16777217)])
# The named sets of `bench --shapes`; "all" is every shape once, in this order.
SHAPE_SETS = {"perf": PERF_SHAPES, "sweep": SWEEP_SHAPES, "long": LONG_SHAPES, "suite": SUITE_SHAPES}
SHAPE_SETS["all"] = list(dict.fromkeys(PERF_SHAPES + SWEEP_SHAPES + LONG_SHAPES))


def itemsize(dtype):
    """Bytes of one element of `dtype` (a name: float32, float16, bfloat16, float64)."""
    return 4 if dtype == "float32" else 8 if dtype == "float64" else 2


def gpu_clock():
    """Host clock read once the device is idle: the pytest-benchmark timer of benchmarks/."""
    import cupy

    cupy.cuda.runtime.deviceSynchronize()
    return time.perf_counter()


def _cupy():
    import cupy

    return cupy


class Timer:
    """Median GPU time of a callable, with an L2 flush before each timed call."""

    def __init__(self, flush_bytes=256 << 20):
        cp = _cupy()
        self.cp = cp
        self.flush = cp.empty(flush_bytes, dtype=cp.uint8)
        self.start, self.end = cp.cuda.Event(), cp.cuda.Event()

    def __call__(self, fn, repeat=None, budget_ms=150.0):
        fn()  # warm-up (module load, allocator)
        self.cp.cuda.get_current_stream().synchronize()
        once = self._time(fn)
        n = repeat or int(min(50, max(5, budget_ms / max(once, 1e-3))))
        times = sorted(self._time(fn) for _ in range(n))
        return times[len(times) // 2]

    def _time(self, fn):
        self.flush.fill(1)
        self.start.record()
        fn()
        self.end.record()
        self.end.synchronize()
        return self.cp.cuda.get_elapsed_time(self.start, self.end)


def copy_bandwidth(timer, nbytes=4 << 30):
    """GB/s of a device-to-device copy of `nbytes`, counting the read and the write."""
    cp = _cupy()
    a = cp.ones(nbytes // 4, dtype=cp.float32)
    b = cp.empty_like(a)
    ms = timer(lambda: cp.copyto(b, a), repeat=10)
    del a, b
    return 2 * nbytes / ms / 1e6


def _make(cp, shape, dtype):
    """Fresh timing inputs: N(0, 9) logits of `dtype` on the device."""
    x = cp.random.standard_normal(shape, dtype=cp.float32) * 3
    if dtype == "bfloat16":
        # float32 -> bfloat16 by truncation of the bit pattern (enough for timing inputs)
        import ml_dtypes

        return (x.view(cp.uint32) >> 16).astype(cp.uint16).view(numpy.dtype(ml_dtypes.bfloat16))
    return x.astype(dtype)


def _f64(cp, a, rows=256):
    """The first `rows` rows of a device array as float64 (bfloat16 widened through its bits)."""
    a = a.reshape(-1, a.shape[-1])[:rows]
    if a.dtype.name == "bfloat16":
        a = (a.view(cp.uint16).astype(cp.uint32) << 16).view(cp.float32)
    return a.astype(cp.float64)


def _row_error(cp, got, ref, scale):
    num = cp.sqrt(((got - ref) ** 2).sum(axis=-1))
    den = cp.sqrt((scale**2).sum(axis=-1))
    return float(cp.max(cp.where(den > 0, num / cp.where(den > 0, den, 1), num)))


def _forward_error(cp, x, y):
    """Max over sampled rows of ||y - ref|| / ||ref||, ref = softmax(x) in float64."""
    z = _f64(cp, x)
    e = cp.exp(z - z.max(axis=-1, keepdims=True))
    ref = e / e.sum(axis=-1, keepdims=True)
    return _row_error(cp, _f64(cp, y), ref, ref)


def _masked_forward_error(cp, x, y, scale, keep, causal, rows=256):
    """_forward_error for fused(x, scale=, mask=keep, causal=): keep broadcasts over x's leading
    dims; causal hides key j > query i (i = the second-to-last index). Fully masked rows must be 0."""
    lead = x.shape[:-1]
    n = min(rows, int(numpy.prod(lead)))
    idx = cp.unravel_index(cp.arange(n), lead)
    z = _f64(cp, x, n) * scale
    if keep is not None:
        kidx = tuple(i if k > 1 else cp.zeros_like(i) for i, k in zip(idx, keep.shape[:-1]))
        z = cp.where(keep[kidx], z, -cp.inf)
    if causal:
        z = cp.where(cp.arange(x.shape[-1])[None, :] > idx[-1][:, None], -cp.inf, z)
    m = z.max(axis=-1, keepdims=True)
    e = cp.exp(z - cp.where(cp.isfinite(m), m, 0))
    total = e.sum(axis=-1, keepdims=True)
    ref = cp.where(total > 0, e / cp.where(total > 0, total, 1), 0)
    return _row_error(cp, _f64(cp, y, n), ref, ref)


def _backward_error(cp, y, dy, dx):
    """As the tests measure it: error over the size of the terms, ||y * (|dy| + |<y, dy>|)||."""
    y64, dy64 = _f64(cp, y), _f64(cp, dy)
    d = (y64 * dy64).sum(axis=-1, keepdims=True)
    ref = y64 * (dy64 - d)
    return _row_error(cp, _f64(cp, dx), ref, cp.abs(y64) * (cp.abs(dy64) + cp.abs(d)))


def _torch():
    try:
        import torch

        return torch if torch.cuda.is_available() else None
    except ImportError:
        return None


# The torch peers of a case, of which `table`'s "x best" takes the fastest: the bar is fused at
# 1.00x or more of the fastest of them on every shape, forward and backward.
TORCH_PEERS = ("torch", "torch composed", "torch_compile")


class PeerUnavailable(Exception):
    """A peer that cannot run on this machine (not installed, or its compilation failed): it is
    reported as unavailable, never timed as something else."""


def compile_peer(torch, fn, *args):
    """`fn` through ``torch.compile`` with static shapes, compiled for `args` and run once.

    The compilation (seconds) happens here, outside any timing. Dynamo's caches are reset first:
    every case compiles the same few functions for new shapes, and past its recompile limit dynamo
    would run them eagerly; ``fullgraph=True`` makes any fallback to eager (a graph break, the limit)
    an error instead, so a compiled peer never silently times eager torch. Call it with arguments
    like `args` (other shapes recompile, in the timing).

    Raises
    ------
    PeerUnavailable
        When compilation fails (no Triton, an unsupported dtype, an inductor error).
    """
    try:
        torch._dynamo.reset()
        compiled = torch.compile(fn, dynamic=False, fullgraph=True)
        compiled(*args)
        torch.cuda.synchronize()
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise PeerUnavailable(f"torch.compile failed: {type(e).__name__}: {first}"[:200]) from e
    return compiled


def additive_mask(torch, dtype, shape, keep=None, causal=False):
    """The mask of the composed torch peers, ``softmax(x * scale + mask)``: a `dtype` tensor that
    is 0 where a logit is kept and -inf where `keep` (a boolean CuPy array broadcasting to `shape`)
    is False or, with `causal`, at key j > query i over the last two axes of `shape`."""
    mask = torch.zeros((), device="cuda", dtype=dtype)
    if keep is not None:
        tk = torch.from_dlpack(keep)
        mask = torch.zeros(tk.shape, device="cuda", dtype=dtype).masked_fill(~tk, float("-inf"))
    if causal:
        q, k = shape[-2], shape[-1]
        mask = mask + torch.zeros(q, k, device="cuda", dtype=dtype).masked_fill(
            torch.ones(q, k, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
    return mask


def cases(shapes, dtypes, attention=True):
    """(label, kind, shape, dtype) for every measurement the table holds."""
    out = []
    for dtype in dtypes:
        for rows, cols in shapes:
            out.append(("fwd", (rows, cols), dtype))
            out.append(("fwd+mask+causal", (rows, cols), dtype))
            out.append(("bwd", (rows, cols), dtype))
    if attention:
        for dtype in [d for d in dtypes if d != "float32"]:
            for b, h, s in ATTENTION_SHAPES:
                out.append(("attn pad", (b, h, s, s), dtype))
                out.append(("attn causal", (b, h, s, s), dtype))
                out.append(("attn bwd", (b, h, s, s), dtype))
    return out


def _attention_view(shape):
    """A 2-D (rows, cols) problem seen as [rows/S, S, cols] query blocks with S = min(rows, cols)."""
    rows, cols = shape
    s = min(rows, cols)
    return (rows // s, s, cols) if rows % s == 0 else (1, rows, cols)


def measure(kind, shape, dtype, timer, torch=None, algos=("fused", "online", "naive")):
    """Times pysoftmax and its peers on one case. Returns a list of result dicts."""
    cp = _cupy()
    import pysoftmax

    results = []
    nbytes_elem = itemsize(dtype)
    size = math.prod(shape)
    tdt = None
    if torch is not None:
        tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
               "float64": torch.float64}[dtype]

    def fail(algo, e):
        results.append(dict(case=kind, shape=list(shape), dtype=dtype, algo=algo, error=str(e)[:200]))

    def add(algo, fn, nbytes, check=None):
        try:
            ms = timer(fn)
        except Exception as e:  # a peer that cannot run this case (memory, dtype) is reported
            fail(algo, e)
            return
        results.append(dict(case=kind, shape=list(shape), dtype=dtype, algo=algo, ms=ms, gbs=nbytes / ms / 1e6,
                            error_vs_f64=check() if check else None))

    def add_compiled(fn, args, nbytes):
        """torch_compile: `fn` compiled for `args` before the timing, then timed on them."""
        try:
            compiled = compile_peer(torch, fn, *args)
        except PeerUnavailable as e:
            fail("torch_compile", e)
            return
        add("torch_compile", lambda: compiled(*args), nbytes)

    if kind in ("fwd", "fwd+mask+causal", "attn pad", "attn causal"):
        x = _make(cp, shape, dtype)
        y = cp.empty_like(x)
        nbytes = 2 * size * nbytes_elem
        if kind == "fwd":
            for algo in algos:
                fn = getattr(pysoftmax, algo)
                add(algo, lambda fn=fn: fn(x, out=y), nbytes, check=lambda: _forward_error(cp, x, y))
            if tdt is not None:
                tx = torch.from_dlpack(x)
                add("torch", lambda: torch.softmax(tx, -1), nbytes)
                add_compiled(lambda t: torch.softmax(t, -1), (tx,), nbytes)
            if dtype != "bfloat16":
                import cupyx.scipy.special

                add("cupy", lambda: cupyx.scipy.special.softmax(x, axis=-1), nbytes)
        else:
            if kind == "fwd+mask+causal":
                view = _attention_view(shape)
                xv, yv = x.reshape(view), y.reshape(view)
                keep = cp.random.random((view[0], 1, view[2])) > 0.1
                causal = True
            else:
                b, h, s, _ = shape
                xv, yv = x, y
                keep = cp.random.random((b, 1, 1, s)) > 0.1
                causal = kind == "attn causal"
            scale = 0.125
            mask = None if kind == "attn causal" else keep
            add("fused", lambda: pysoftmax.fused(xv, scale=scale, mask=mask, causal=causal, out=yv), nbytes,
                check=lambda: _masked_forward_error(cp, xv, yv, scale, mask, causal))
            if tdt is not None:
                tx = torch.from_dlpack(xv)
                add_mask = additive_mask(torch, tdt, xv.shape, mask, causal)
                add("torch composed", lambda: torch.softmax(tx * scale + add_mask, -1), nbytes)
                add_compiled(lambda t, m: torch.softmax(t * scale + m, -1), (tx, add_mask), nbytes)
    else:
        y = pysoftmax.fused(_make(cp, shape, dtype))  # a softmax output: rows sum to 1
        dy = _make(cp, shape, dtype)
        dx = cp.empty_like(y)
        nbytes = 3 * size * nbytes_elem
        check = lambda: _backward_error(cp, y, dy, dx)
        add("fused", lambda: pysoftmax.backward(y, dy, out=dx), nbytes, check)
        add("naive", lambda: pysoftmax.naive_backward(y, dy, out=dx), nbytes, check)
        if tdt is not None:
            ty, tdy = torch.from_dlpack(y), torch.from_dlpack(dy)
            add("torch", lambda: torch._softmax_backward_data(tdy, ty, -1, tdt), nbytes)
            add_compiled(lambda g, p: torch._softmax_backward_data(g, p, -1, tdt), (tdy, ty), nbytes)
    return results


def run(shapes=None, dtypes=None, attention=True, json_path=None, progress=True, algos=("fused", "online", "naive")):
    cp = _cupy()
    shapes = shapes or PERF_SHAPES
    dtypes = dtypes or DTYPES
    timer = Timer()
    copy = copy_bandwidth(timer)
    torch = _torch()
    todo = cases(shapes, dtypes, attention)
    results = []
    t0 = time.time()
    for i, (kind, shape, dtype) in enumerate(todo):
        if progress:
            sys.stderr.write(f"\r[{i + 1}/{len(todo)}] {kind} {shape} {dtype} ({time.time() - t0:.0f}s)   ")
            sys.stderr.flush()
        results += measure(kind, shape, dtype, timer, torch, algos)
        cp.get_default_memory_pool().free_all_blocks()
        if torch is not None:
            torch.cuda.empty_cache()
    if progress:
        sys.stderr.write("\n")
    for r in results:
        if "gbs" in r:
            r["pct_copy"] = 100 * r["gbs"] / copy
    report = dict(device=cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode(),
                  copy_gbs=copy, results=results)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1)
    return report


def table(report):
    """The report as a text table: one line per case, pysoftmax and peers side by side (GB/s),
    fused's speed-up over torch, over the fastest torch peer (``x best``: torch.softmax, the
    composed masked softmax or torch.compile, whichever ran fastest on the case) and over CuPy,
    and the largest error of pysoftmax's algorithms against float64 on sampled rows."""
    rows = {}
    for r in report["results"]:
        key = (r["case"], tuple(r["shape"]), r["dtype"])
        rows.setdefault(key, {})[r["algo"]] = r
    lines = [f"device: {report['device']}   copy bandwidth: {report['copy_gbs']:.0f} GB/s",
             f"{'case':16} {'shape':>22} {'dtype':9} {'fused ms':>9} {'GB/s':>6} {'%copy':>6} {'online':>7} {'naive':>7} "
             f"{'torch':>7} {'composed':>8} {'t.compile':>9} {'cupy':>7} {'x torch':>8} {'x best':>7} {'x cupy':>7} "
             f"{'max err':>8}"]
    for (case, shape, dtype), algos in rows.items():
        g = lambda a: algos.get(a, {}).get("gbs")
        f = g("fused")
        torch_gbs = g("torch") or g("torch composed")  # the masked cases' torch is the composed one
        best = max((v for v in map(g, TORCH_PEERS) if v), default=None)
        cell = lambda v, width=7: f"{v:{width}.0f}" if v else f"{'-':>{width}}"
        speedup = lambda peer, width: f"{f / peer:{width - 1}.2f}x" if f and peer else f"{'-':>{width}}"
        errs = [a.get("error_vs_f64") for a in algos.values() if a.get("error_vs_f64") is not None]
        ms = algos.get("fused", {}).get("ms")
        lines.append(f"{case:16} {'x'.join(map(str, shape)):>22} {dtype:9} {ms or 0:9.3f} {f or 0:6.0f} "
                     f"{100 * (f or 0) / report['copy_gbs']:6.1f} {cell(g('online'))} {cell(g('naive'))} "
                     f"{cell(g('torch'))} {cell(g('torch composed'), 8)} {cell(g('torch_compile'), 9)} "
                     f"{cell(g('cupy'))} "
                     f"{speedup(torch_gbs, 8)} {speedup(best, 7)} {speedup(g('cupy'), 7)} "
                     + (f"{max(errs):8.1e}" if errs else f"{'-':>8}"))
    return "\n".join(lines)


def plot(report, path):
    """GB/s against row length for inputs of 64 MiB or more (the launch-bound cases would hide the
    trend), colour per algorithm, line style per dtype, with the copy ceiling as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"fused": "tab:blue", "online": "tab:cyan", "naive": "tab:gray", "torch": "tab:red",
               "torch_compile": "tab:purple", "cupy": "tab:orange"}
    styles = {"float32": "-", "float16": "--", "bfloat16": ":", "float64": "-."}
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.5), sharey=True)
    for ax, case in zip(axes, ("fwd", "bwd")):
        lines = {}
        for r in report["results"]:
            item = 4 if r["dtype"] == "float32" else 8 if r["dtype"] == "float64" else 2
            if r["case"] != case or "gbs" not in r or math.prod(r["shape"]) * item < 64 << 20:
                continue
            lines.setdefault((r["algo"], r["dtype"]), []).append((r["shape"][-1], r["gbs"]))
        for (algo, dtype), pts in sorted(lines.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], styles.get(dtype, "-"), color=colours.get(algo),
                    marker="o", ms=3, label=f"{algo} {dtype}")
        ax.axhline(report["copy_gbs"], color="k", lw=1)
        ax.text(32, report["copy_gbs"] * 1.01, f"device copy {report['copy_gbs']:.0f} GB/s", fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("row length (columns); inputs of 64 MiB or more")
        ax.set_title(f"{'forward' if case == 'fwd' else 'backward'} softmax, {report['device']}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=3)
    axes[0].set_ylabel("GB/s (fewest bytes moved)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
