"""The main job: time pysoftmax against its peers and report GB/s and % of copy bandwidth.

Timing: CUDA events around each call, L2 flushed (a 256 MiB write) before every timed call so
that no shape is measured out of cache, a warm-up first, the median of the repeats reported.
Bytes are the fewest the op must move: forward reads x and writes y; backward reads y and dy and
writes dx (masks are not counted). The ceiling is a device-to-device copy measured in the same run.
"""

import json
import math
import sys
import time

import numpy


# PERF.md's first table (rows, cols) and the attention shapes (B, H, S).
PERF_SHAPES = [
    (8388608, 32), (2097152, 128), (524288, 512), (262144, 1024), (131072, 2048), (65536, 4096),
    (32768, 8192), (16384, 16384), (8192, 32768), (2048, 131072), (256, 1048576), (4096, 262144),
    (64, 1048576), (8, 4194304), (1, 16777216), (256, 2048), (256, 8192),
]
ATTENTION_SHAPES = [(8, 32, 1024), (2, 16, 4096), (1, 8, 8192), (64, 16, 128)]
DTYPES = ["float32", "float16", "bfloat16"]


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
    nbytes_elem = numpy.dtype("float32").itemsize if dtype == "float32" else (8 if dtype == "float64" else 2)
    size = math.prod(shape)
    tdt = None
    if torch is not None:
        tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
               "float64": torch.float64}[dtype]

    def add(algo, fn, nbytes, check=None):
        try:
            ms = timer(fn)
        except Exception as e:  # a peer that cannot run this case (memory, dtype) is reported
            results.append(dict(case=kind, shape=list(shape), dtype=dtype, algo=algo, error=str(e)[:200]))
            return
        results.append(dict(case=kind, shape=list(shape), dtype=dtype, algo=algo, ms=ms, gbs=nbytes / ms / 1e6,
                            error_vs_f64=check() if check else None))

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
                if kind == "attn causal":
                    q, k = xv.shape[-2], xv.shape[-1]
                    add_mask = torch.zeros(q, k, device="cuda", dtype=tdt).masked_fill(
                        torch.ones(q, k, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
                else:
                    tk = torch.from_dlpack(keep)
                    add_mask = torch.zeros(tk.shape, device="cuda", dtype=tdt).masked_fill(~tk, float("-inf"))
                    if causal:
                        q, k = xv.shape[-2], xv.shape[-1]
                        add_mask = add_mask + torch.zeros(q, k, device="cuda", dtype=tdt).masked_fill(
                            torch.ones(q, k, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
                add("torch composed", lambda: torch.softmax(tx * scale + add_mask, -1), nbytes)
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
    and the largest error of pysoftmax's algorithms against float64 on sampled rows."""
    rows = {}
    for r in report["results"]:
        key = (r["case"], tuple(r["shape"]), r["dtype"])
        rows.setdefault(key, {})[r["algo"]] = r
    lines = [f"device: {report['device']}   copy bandwidth: {report['copy_gbs']:.0f} GB/s",
             f"{'case':16} {'shape':>22} {'dtype':9} {'fused ms':>9} {'GB/s':>6} {'%copy':>6} {'online':>7} {'naive':>7} "
             f"{'torch':>7} {'t.comp':>7} {'cupy':>7} {'x torch':>8} {'x cupy':>7} {'max err':>8}"]
    for (case, shape, dtype), algos in rows.items():
        g = lambda a: algos.get(a, {}).get("gbs")
        f = g("fused")
        torch_gbs = g("torch") or g("torch composed")  # the masked cases' torch is the composed one
        cell = lambda v: f"{v:7.0f}" if v else f"{'-':>7}"
        speedup = lambda peer, width: f"{f / peer:{width - 1}.2f}x" if f and peer else f"{'-':>{width}}"
        errs = [a.get("error_vs_f64") for a in algos.values() if a.get("error_vs_f64") is not None]
        ms = algos.get("fused", {}).get("ms")
        lines.append(f"{case:16} {'x'.join(map(str, shape)):>22} {dtype:9} {ms or 0:9.3f} {f or 0:6.0f} "
                     f"{100 * (f or 0) / report['copy_gbs']:6.1f} {cell(g('online'))} {cell(g('naive'))} "
                     f"{cell(g('torch'))} {cell(g('torch composed'))} {cell(g('cupy'))} "
                     f"{speedup(torch_gbs, 8)} {speedup(g('cupy'), 7)} "
                     + (f"{max(errs):8.1e}" if errs else f"{'-':>8}"))
    return "\n".join(lines)


def plot(report, path):
    """GB/s against row length for inputs of 64 MiB or more (the launch-bound cases would hide the
    trend), colour per algorithm, line style per dtype, with the copy ceiling as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"fused": "tab:blue", "online": "tab:cyan", "naive": "tab:gray", "torch": "tab:red",
               "cupy": "tab:orange"}
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
