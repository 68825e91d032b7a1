"""Jitted pysoftmax against jitted jax.nn.softmax, in one run: GB/s on large shapes, and the
host cost of a small call.

    python3 -m pysoftmax jaxbench [--json jaxbench.json]

Each case is a function compiled once with jax.jit; a measurement is the wall time of n
back-to-back calls over n, after a warm-up, with the device idle before the clock starts and
every result ready (block_until_ready) before it stops: the best of 3 such rounds. Inputs of the
large shapes are 64 MiB or more (past the L2), and GB/s counts x + y (forward) or y + dy + dx
(backward), as the main bench does; % is of the CuPy device-to-device copy measured in the same
run. The masked cases use a [B, 1, 1, S] padding mask and jax.nn.softmax(where=) for JAX.
"""

import time

SHAPES = [(8388608, 32), (2097152, 128), (262144, 1024), (65536, 4096), (16384, 16384), (4096, 262144)]
ATTENTION = (8, 32, 1024, 1024)


def _time(fn, args, n):
    import jax

    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(3):
        jax.block_until_ready(args)
        t0 = time.perf_counter()
        out = None
        for _ in range(n):
            out = fn(*args)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def run(progress=True):
    import os

    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # CuPy's copy shares the GPU
    import jax
    import jax.numpy as jnp
    import numpy

    import pysoftmax.jax as psj
    from . import _bench

    copy = _bench.copy_bandwidth(_bench.Timer())
    rng = numpy.random.default_rng(0)
    rows = []

    def add(case, shape, dtype, ours, theirs, args, nbytes, n):
        a, b = _time(ours, args, n), _time(theirs, args, n)
        r = dict(case=case, shape=list(shape), dtype=dtype, pysoftmax_ms=a * 1e3, jax_ms=b * 1e3,
                 pysoftmax_gbs=nbytes / a / 1e9 if nbytes else None, jax_gbs=nbytes / b / 1e9 if nbytes else None)
        if nbytes:
            r["pysoftmax_pct_copy"], r["jax_pct_copy"] = 100 * r["pysoftmax_gbs"] / copy, 100 * r["jax_gbs"] / copy
        rows.append(r)
        if progress:
            print(f"  {case:10} {str(tuple(shape)):22} {dtype:9} {a * 1e3:8.3f} ms vs {b * 1e3:8.3f} ms", flush=True)

    for dtype in ("float32", "bfloat16"):
        jdt = getattr(jnp, dtype)
        item = numpy.dtype(jdt).itemsize
        for shape in SHAPES:
            x = jnp.asarray(rng.standard_normal(shape, dtype=numpy.float32), jdt)
            add("forward", shape, dtype, jax.jit(psj.softmax), jax.jit(jax.nn.softmax), (x,), 2 * x.size * item, 10)
            g = jnp.asarray(rng.standard_normal(shape, dtype=numpy.float32), jdt)
            ours = jax.jit(lambda a, b: jax.vjp(psj.softmax, a)[1](b)[0])
            theirs = jax.jit(lambda a, b: jax.vjp(jax.nn.softmax, a)[1](b)[0])
            add("fwd+bwd", shape, dtype, ours, theirs, (x, g), 5 * x.size * item, 5)
            del x, g
        s = jnp.asarray(rng.standard_normal(ATTENTION, dtype=numpy.float32), jdt)
        keep = jnp.asarray(rng.random((ATTENTION[0], 1, 1, ATTENTION[3])) > 0.1)
        scale = 0.125
        ours = jax.jit(lambda a, m: psj.softmax(a, scale=scale, mask=m))
        theirs = jax.jit(lambda a, m: jax.nn.softmax(a * scale, where=m))
        add("pad mask", ATTENTION, dtype, ours, theirs, (s, keep), 2 * s.size * item, 20)
        ours = jax.jit(lambda a: psj.softmax(a, scale=scale, causal=True))
        tril = jnp.tril(jnp.ones(ATTENTION[2:], bool))
        theirs = jax.jit(lambda a: jax.nn.softmax(a * scale, where=tril))
        add("causal", ATTENTION, dtype, ours, theirs, (s,), 2 * s.size * item, 20)
        del s
    small = jnp.asarray(rng.standard_normal((64, 128), dtype=numpy.float32))
    add("host cost", (64, 128), "float32", jax.jit(psj.softmax), jax.jit(jax.nn.softmax), (small,), 0, 1000)
    return dict(device=str(jax.devices()[0].device_kind), copy_gbs=copy, results=rows)


def table(report):
    lines = [f"device: {report['device']}   copy bandwidth (CuPy): {report['copy_gbs']:.0f} GB/s", "",
             "| case | shape | dtype | pysoftmax | jax.nn.softmax | ratio |", "|---|---|---|---|---|---|"]
    for r in report["results"]:
        shape = "x".join(map(str, r["shape"]))
        if r["pysoftmax_gbs"] is None:
            cells = f"{r['pysoftmax_ms'] * 1e3:.1f} µs/call | {r['jax_ms'] * 1e3:.1f} µs/call"
        else:
            cells = (f"{r['pysoftmax_gbs']:.0f} GB/s ({r['pysoftmax_pct_copy']:.0f}%) | "
                     f"{r['jax_gbs']:.0f} GB/s ({r['jax_pct_copy']:.0f}%)")
        lines.append(f"| {r['case']} | {shape} | {r['dtype']} | {cells} | {r['jax_ms'] / r['pysoftmax_ms']:.2f}x |")
    return "\n".join(lines)
