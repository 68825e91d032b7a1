"""Helpers for the GPU tests: float64 references, dtype conversion, per-row error, poisoning."""

import numpy

try:
    import cupy
except ImportError:  # pragma: no cover
    cupy = None

try:
    import ml_dtypes

    BF16 = numpy.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    BF16 = None

DTYPES = ["float32", "float16", "bfloat16", "float64"]
# Max over rows of ||y - ref|| / ||ref|| (the acceptance bounds).
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2, "float64": 1e-12}
# A magnitude near each dtype's largest finite value: edge-value tests draw logits up to it.
NEAR_LARGEST = {"float16": 6e4, "bfloat16": 3e38, "float32": 3e38, "float64": 1e300}


def np_dtype(name):
    return BF16 if name == "bfloat16" else numpy.dtype(name)


class _Rng:
    """numpy Generator that remembers its seed, for failure messages."""

    def __init__(self, seed):
        self.seed = seed
        self._g = numpy.random.default_rng(seed)

    def __getattr__(self, name):
        return getattr(self._g, name)


def rng():
    """A fresh generator per call (inputs differ run to run); the seed is kept for messages."""
    return _Rng(int(numpy.random.SeedSequence().entropy % (1 << 32)))


def to_device(a64, dtype):
    """A float64 host array as a device array of `dtype` (bfloat16 rounded on the host)."""
    host = numpy.asarray(a64).astype(np_dtype(dtype))
    if dtype == "bfloat16":
        return cupy.asarray(host.view(numpy.uint16)).view(BF16)
    return cupy.asarray(host)


def to_host64(a):
    """A device array back as float64 on the host."""
    if a.dtype == BF16:
        return cupy.asnumpy(a.view(cupy.uint16)).view(BF16).astype(numpy.float64)
    return cupy.asnumpy(a).astype(numpy.float64)


def rounded(a64, dtype):
    """What the device sees after the input is stored in `dtype`."""
    return numpy.asarray(a64).astype(np_dtype(dtype)).astype(numpy.float64)


def poisoned(shape, dtype, value=numpy.nan):
    """An output buffer full of `value`: any element the kernel fails to write shows up."""
    return to_device(numpy.full(shape, value), dtype)


def pack(dtype):
    """Elements of `dtype` in a 16-byte vector pack."""
    return 16 // np_dtype(dtype).itemsize


def dense_at(host64, dtype, offset, poison=False):
    """A dense device array of host64's shape that starts `offset` elements into a flat buffer
    (a pack of poison, or of random values, on each side), and the buffer."""
    rows, cols = host64.shape
    size = rows * cols + 2 * pack(dtype)
    flat64 = numpy.full(size, numpy.nan) if poison else numpy.random.default_rng(1).standard_normal(size)
    flat64[offset:offset + rows * cols] = host64.reshape(-1)
    flat = to_device(flat64, dtype)
    return flat, flat[offset:offset + rows * cols].reshape(rows, cols)


def written_outside(flat, offset, size):
    """Elements of a poisoned flat buffer (dense_at) written outside [offset, offset + size)."""
    host = to_host64(flat)
    return int((~numpy.isnan(numpy.concatenate([host[:offset], host[offset + size:]]))).sum())


def at_every_offset(host, dtype, call, check, label):
    """For each offset inside the pack: every array of `host` (float64, one shape) placed that many
    elements into a flat buffer (dense_at), and `call(dev, out, **kw)` writing a poisoned output at
    the same offset through the planned grid, one block, three blocks (each walking every row) and
    the planned grid again. Each result passes `check(got, what)`, nothing outside the output is
    written, and all four give the same bits. Then the output written over the last input, at the
    same offset. `label` starts each message."""
    rows, cols = host[0].shape
    for offset in range(pack(dtype)):
        dev = [dense_at(a, dtype, offset)[1] for a in host]
        first = None
        for kw in (dict(), dict(blocks=1), dict(blocks=3), dict()):
            flat, out = dense_at(numpy.full((rows, cols), numpy.nan), dtype, offset, poison=True)
            what = f"{label} offset={offset} {kw}"
            got = call(dev, out, **kw)
            check(got, what)
            n = written_outside(flat, offset, rows * cols)
            assert n == 0, f"{what}: {n} elements outside the array written"
            bits = got.view(numpy.uint16 if got.dtype.itemsize == 2 else f"u{got.dtype.itemsize}").get()
            if first is None:
                first = bits
            else:
                assert numpy.array_equal(bits, first), f"{what}: not the bits of the planned grid's first call"
        inout = dense_at(host[-1], dtype, offset)[1]
        check(call(dev[:-1] + [inout], inout), f"in place {label} offset={offset}")


def ref_softmax(x, scale=1.0, mask=None, causal=False):
    """softmax(x * scale + mask) in float64; rows with nothing kept are zeros."""
    z = numpy.asarray(x, numpy.float64) * scale
    if mask is not None:
        mask = numpy.asarray(mask)
        z = numpy.where(mask, z, -numpy.inf) if mask.dtype == bool else z + mask.astype(numpy.float64)
    if causal:
        q, k = z.shape[-2], z.shape[-1]
        z = numpy.where(numpy.arange(k)[None, :] > numpy.arange(q)[:, None], -numpy.inf, z)
    with numpy.errstate(invalid="ignore", over="ignore"):
        m = numpy.max(z, axis=-1, keepdims=True) if z.shape[-1] else numpy.zeros(z.shape[:-1] + (1,))
        m = numpy.where(m == -numpy.inf, 0.0, m)
        e = numpy.exp(z - m)
        s = e.sum(axis=-1, keepdims=True)
        return numpy.where(s == 0, 0.0, e / numpy.where(s == 0, 1.0, s))


def ref_backward(y, dy, scale=1.0):
    y = numpy.asarray(y, numpy.float64)
    dy = numpy.asarray(dy, numpy.float64)
    return scale * y * (dy - (dy * y).sum(axis=-1, keepdims=True))


def row_error(got, ref):
    """Max over rows of ||got - ref|| / ||ref||; rows whose reference is all zero must be zero."""
    got = numpy.asarray(got, numpy.float64).reshape(-1, ref.shape[-1] if ref.ndim else 1)
    ref = numpy.asarray(ref, numpy.float64).reshape(got.shape)
    num = numpy.sqrt(((got - ref) ** 2).sum(axis=-1))
    den = numpy.sqrt((ref**2).sum(axis=-1))
    zero = den == 0
    err = numpy.where(zero, num, num / numpy.where(zero, 1.0, den))
    return float(err.max()) if err.size else 0.0


def assert_close(got, ref, dtype, what=""):
    err = row_error(got, ref)
    assert numpy.isfinite(err) and err <= TOL[dtype], f"{what}: max row error {err:.3e} > {TOL[dtype]:.0e} ({dtype})"
    return err


def assert_grad_close(got, y, dy, scale, dtype, what=""):
    """Backward check. dx = scale * y * (dy - d) cancels where dy is close to d, so the error is
    measured against the size of the terms, ||scale * y * (|dy| + |d|)|| per row, not ||dx||:
    that is what rounding in `dtype` can be held to (the forward bounds of TOL)."""
    y = numpy.asarray(y, numpy.float64)
    dy = numpy.asarray(dy, numpy.float64)
    ref = ref_backward(y, dy, scale)
    d = (dy * y).sum(axis=-1, keepdims=True)
    size = numpy.abs(scale * y) * (numpy.abs(dy) + numpy.abs(d))
    got = numpy.asarray(got, numpy.float64)
    num = numpy.sqrt(((got - ref) ** 2).sum(axis=-1))
    den = numpy.sqrt((size**2).sum(axis=-1))
    zero = den == 0
    err = numpy.where(zero, num, num / numpy.where(zero, 1.0, den))
    err = float(err.max()) if err.size else 0.0
    assert numpy.isfinite(err) and err <= TOL[dtype], f"{what}: max row error {err:.3e} > {TOL[dtype]:.0e} ({dtype})"
    return err


# hip/span.cuh's kMaxCluster, and dispatch.cuh's kStaticSharedBytes: the static shared memory
# of a block, (kMaxWarpsPerBlock + 2 * kMaxCluster) float64 (max, sum) pairs, left out of its stage.
MAX_CLUSTER = 8
STATIC_SHARED_BYTES = (32 + 2 * MAX_CLUSTER) * 16


def packed_clusters():
    """The cluster sizes this GPU's planner takes first (a bit a size): those whose clusters, one
    block an SM, keep 90% of the SMs busy (hip/dispatch.cuh, kClusterFill; 2, 4 and 8 on an H200)."""
    from pysoftmax import _ops
    return _ops.plan((1, 1), "float32")["packed"]


def resident_blocks(cols, step_bytes, stride):
    """How hip/dispatch.cuh's plan_stream keeps rows of `cols` on chip on this GPU, for rows_stream
    steps of `stride` columns and `step_bytes` of stage a block (512 threads): 1 where one block's
    stage holds the row, k > 1 for a cluster of k blocks that each hold a chunk (NVIDIA sm_90+: the
    fewest of up to 8 blocks that do, of the sizes that pack the GPU with every block holding a
    chunk where one does, else of any size), 0 where the row is streamed twice."""
    if cupy.cuda.runtime.is_hip:
        return 0  # no asynchronous copy: nothing is staged
    dev = cupy.cuda.Device()
    cc = int(dev.compute_capability)
    budget = dev.attributes["MaxSharedMemoryPerBlockOptin"] - STATIC_SHARED_BYTES
    steps = -(-cols // stride)
    if cc < 80:
        return 0
    if steps * step_bytes <= budget:
        return 1
    packed = packed_clusters() if cc >= 90 else 0
    for first in (True, False):
        for k in range(2, MAX_CLUSTER + 1 if cc >= 90 else 2):
            if first and not packed >> k & 1:
                continue
            chunk_steps = -(-steps // k)
            chunks = -(-cols // (chunk_steps * stride))
            if chunk_steps * step_bytes <= budget and (chunks == k or not first):
                return chunks
    return 0


def pytest_in_process(path, select, env, passed, timeout=900):
    """Runs the tests of `path` that the pytest -k expression `select` names in a pytest process of
    their own under `env` (settings the library reads once a device), and asserts that `passed` of
    them passed and none failed."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path, "-k", select],
                          env=env, capture_output=True, text=True, timeout=timeout)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    assert done.returncode == 0 and f"{passed} passed" in summary, done.stdout[-4000:] + done.stderr[-2000:]
