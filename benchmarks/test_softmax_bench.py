"""The benchmark suite: pysoftmax vs CuPy's composed softmax, torch and torch.compile, on
_bench.SUITE_SHAPES (PERF.md's shapes, a few widths between the powers of two and odd ones, a few
long rows of odd length).

Groups are "<direction> <rows>x<cols> <dtype>"; within a group each algorithm is one benchmark.
pysoftmax's algorithms are timed as CUDA graphs of a fixed number of calls (extra_info
graph_calls; the statistics are per graph), the peers call by call. The torch.compile peers
(static shapes; torch_compile_masked is the composed softmax(x * scale + mask) of fused_masked's
problem) compile once a test, before the timing, and skip with the reason where they cannot.
extra_info records the bytes the op must move, GB/s and % of the copy bandwidth (per call)
measured at the start of the session. Run through `make gate` (compare) or `make baseline` (save).
New benchmark ids absent from a baseline run uncompared (pytest-benchmark checks only the ids
both runs hold) until the baseline is re-made.
"""

import math

import pytest

from pysoftmax import _bench, _gate

try:
    import cupy
except ImportError:  # pragma: no cover
    cupy = None

DTYPES = ["float32", "float16", "bfloat16"]
FORWARD = ["fused", "fused_masked", "online", "naive", "cupy", "torch", "torch_compile", "torch_compile_masked"]
BACKWARD = ["backward", "naive_backward", "torch", "torch_compile"]
ROUND_SECONDS = 5e-3  # each round runs this long or more: one synchronisation is then noise
ROUNDS = 15
MASK_SCALE = 0.125  # fused_masked's scale, and its compiled composed peer's
# pysoftmax's calls are timed as CUDA graphs: on small shapes the host's time per call (10-30 us,
# bimodal on a shared machine: 60-70% apart between two runs of the suite on the H200) would be
# measured instead of the kernels. A graph holds about GRAPH_SECONDS of work at NOMINAL_BYTES_PER_S
# (at most GRAPH_MAX_CALLS calls, and at least one per input set), a count fixed by the shape so
# that runs compare: statistics are per graph, extra_info's GB/s per call. The peers (torch, CuPy)
# run as they are.
GRAPH_SECONDS = 2e-3
NOMINAL_BYTES_PER_S = 3e12
GRAPH_MAX_CALLS = 100


@pytest.fixture(scope="session")
def copy_gbs():
    return _bench.copy_bandwidth(_bench.Timer(), nbytes=2 << 30)


class _Inputs:
    """Input sets for one (shape, dtype), kept while consecutive tests use them."""

    key = None
    sets = None

    @classmethod
    def get(cls, shape, dtype, arrays):
        key = (shape, dtype, arrays)
        if cls.key != key:
            cls.sets = None
            cupy.get_default_memory_pool().free_all_blocks()
            nbytes = math.prod(shape) * (4 if dtype == "float32" else 2)
            l2 = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["l2CacheSize"]
            copies = max(1, math.ceil(3 * l2 / nbytes))  # rotate through > 3x L2 of inputs
            cls.sets = [[_bench._make(cupy, shape, dtype) for _ in range(arrays)] for _ in range(copies)]
            cls.key = key
        return cls.sets


def _torch():
    try:
        import torch

        return torch if torch.cuda.is_available() else None
    except ImportError:
        return None


def _case_fn(direction, algo, shape, dtype):
    """A callable running the case once on the next input set, or None if the peer is missing;
    raises _bench.PeerUnavailable when a compiled peer does not compile."""
    import pysoftmax

    sets = _Inputs.get(shape, dtype, 1 if direction == "fwd" else 2)
    out = cupy.empty_like(sets[0][0])
    state = {"i": 0}
    torch = _torch()
    if algo in ("cupy",) and dtype == "bfloat16":
        return None
    if algo.startswith("torch") and torch is None:
        return None
    tdt = None if torch is None else {"float32": torch.float32, "float16": torch.float16,
                                      "bfloat16": torch.bfloat16}[dtype]

    def nxt():
        s = sets[state["i"] % len(sets)]
        state["i"] += 1
        return s

    if direction == "fwd":
        if algo == "fused":
            return lambda: pysoftmax.fused(nxt()[0], out=out)
        if algo == "fused_masked":
            view = _bench._attention_view(shape)
            keep = cupy.random.random((view[0], 1, view[2])) > 0.1
            outv = out.reshape(view)
            return lambda: pysoftmax.fused(nxt()[0].reshape(view), scale=MASK_SCALE, mask=keep, causal=True, out=outv)
        if algo in ("online", "naive"):
            fn = getattr(pysoftmax, algo)
            return lambda: fn(nxt()[0], out=out)
        if algo == "cupy":
            import cupyx.scipy.special

            return lambda: cupyx.scipy.special.softmax(nxt()[0], axis=-1)
        if algo == "torch_compile_masked":
            view = _bench._attention_view(shape)
            keep = cupy.random.random((view[0], 1, view[2])) > 0.1
            mask = _bench.additive_mask(torch, tdt, view, keep, causal=True)
            tsets = [torch.from_dlpack(s[0]).view(view) for s in sets]
            softmax = _bench.compile_peer(torch, lambda x, m: torch.softmax(x * MASK_SCALE + m, -1), tsets[0], mask)
            args = lambda x: (x, mask)
        else:
            tsets = [torch.from_dlpack(s[0]) for s in sets]
            softmax = lambda x: torch.softmax(x, -1)
            if algo == "torch_compile":
                softmax = _bench.compile_peer(torch, softmax, tsets[0])
            args = lambda x: (x,)

        def tf():
            x = tsets[state["i"] % len(tsets)]
            state["i"] += 1
            return softmax(*args(x))

        return tf
    if algo in ("backward", "naive_backward"):
        fn = getattr(pysoftmax, algo)
        return lambda: fn(*nxt(), out=out)
    tsets = [(torch.from_dlpack(a), torch.from_dlpack(b)) for a, b in sets]
    grad = lambda dy, y: torch._softmax_backward_data(dy, y, -1, tdt)
    if algo == "torch_compile":
        grad = _bench.compile_peer(torch, grad, tsets[0][1], tsets[0][0])

    def tb():
        y, dy = tsets[state["i"] % len(tsets)]
        state["i"] += 1
        return grad(dy, y)

    return tb


def _graph_calls(nbytes):
    return max(1, min(GRAPH_MAX_CALLS, int(GRAPH_SECONDS * NOMINAL_BYTES_PER_S / nbytes)))


def _graphed(fn, calls):
    """(calls, replay): `fn` captured `calls` times into a CUDA graph, replayed on its own stream;
    None when the calls cannot be captured (the test then fails: pysoftmax's calls with `out=`
    allocate nothing and never synchronise, so they must be capturable)."""
    stream = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.runtime.deviceSynchronize()  # the caller's warm-up ran on another stream
    try:
        with stream:
            fn()  # this stream's first call: memory pool and module state outside the capture
            stream.synchronize()
            stream.begin_capture()
            try:
                for _ in range(calls):
                    fn()
            finally:
                graph = stream.end_capture()
        graph.launch(stream=stream)
        stream.synchronize()
    except Exception as e:  # pragma: no cover - reported by the caller
        print(f"capture failed: {e}")
        return None
    return calls, lambda: graph.launch(stream=stream)


def _cases():
    for rows, cols in _bench.SUITE_SHAPES:
        for dtype in DTYPES:
            for algo in FORWARD:
                yield pytest.param("fwd", algo, (rows, cols), dtype, id=f"fwd-{rows}x{cols}-{dtype}-{algo}")
            for algo in BACKWARD:
                yield pytest.param("bwd", algo, (rows, cols), dtype, id=f"bwd-{rows}x{cols}-{dtype}-{algo}")


@pytest.mark.parametrize("direction,algo,shape,dtype", list(_cases()))
def test_softmax(benchmark, copy_gbs, direction, algo, shape, dtype):
    try:
        fn = _case_fn(direction, algo, shape, dtype)
    except _bench.PeerUnavailable as e:
        pytest.skip(f"{algo}: {e}")
    if fn is None:
        pytest.skip(f"{algo} not available for {dtype}")
    benchmark.group = f"{direction} {shape[0]}x{shape[1]} {dtype}"

    def time_once(f):
        cupy.cuda.runtime.deviceSynchronize()
        start = _bench.gpu_clock()
        f()
        return _bench.gpu_clock() - start

    nbytes = (2 if direction == "fwd" else 3) * math.prod(shape) * (4 if dtype == "float32" else 2)
    fn()  # warm-up: module load, allocator, autotuning of peers
    calls = 1
    if not _gate.is_peer(algo):
        # A graph replays the same calls: it must walk every input set, or its inputs would
        # fit in L2 on the small shapes (256x2048 16-bit: 100 calls are 1.7x L2, 180 sets 3x).
        graphed = _graphed(fn, max(_graph_calls(nbytes), len(_Inputs.sets)))
        if graphed is None:
            pytest.fail(f"{algo}: the calls could not be captured into a CUDA graph")
        calls, fn = graphed
        benchmark.extra_info["graph_calls"] = calls
    once = time_once(fn)
    iterations = max(1, int(ROUND_SECONDS / max(once, 1e-7)))
    benchmark.pedantic(fn, rounds=ROUNDS, iterations=iterations, warmup_rounds=1)
    median = benchmark.stats.stats.median / calls  # per softmax call
    benchmark.extra_info.update(bytes=nbytes, gbs=nbytes / median / 1e9, pct_copy=100 * nbytes / median / 1e9 / copy_gbs,
                                copy_gbs=copy_gbs, iterations=iterations)
