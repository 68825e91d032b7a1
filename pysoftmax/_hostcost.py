"""Host cost per small call: pysoftmax through CuPy and through torch, against torch's own softmax.

    python3 -m pysoftmax hostcost [--json hostcost.json]

A small problem (64 x 128 float32 by default) takes the GPU about as long to run as the host
takes to launch it, so a loop of such calls is bound by the host: microseconds per call are the
wall time of N back-to-back calls over N, with the device synchronised before the clock starts
and after it stops, garbage collection off, after a warm-up. Every row is timed once per round,
the rounds interleaved so that a slow spell of a shared machine falls on all rows alike; the
table gives the best and the median round. What each row calls is written next to it; all rows
run in one process, side by side.
"""

import ctypes
import gc
import statistics
import time


def _time_once(fn, sync, n):
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t0) / n * 1e6


def _measure(cases, rounds=15, warmup=300):
    """cases: [(group, call, fn, sync, n)]; returns rows with the best and median round."""
    for _, _, fn, sync, _ in cases:
        for _ in range(warmup):
            fn()
        sync()
    times = [[] for _ in cases]
    gc.disable()
    try:
        for _ in range(rounds):
            for t, (_, _, fn, sync, n) in zip(times, cases):
                t.append(_time_once(fn, sync, n))
    finally:
        gc.enable()
    return [{"group": g, "call": c, "us": round(min(t), 2), "median_us": round(statistics.median(t), 2)}
            for (g, c, _, _, _), t in zip(cases, times)]


def _case(fn, sync, n=1000):
    return fn, sync, n


def _torch_rows(torch, shape, add):
    import pysoftmax
    import pysoftmax.torch as pst

    sync = torch.cuda.synchronize
    t = torch.randn(shape, device="cuda")
    g = torch.randn(shape, device="cuda")
    keep = torch.rand(shape[-1], device="cuda") > 0.1
    bias = torch.where(keep, 0.0, float("-inf"))
    tg = t.clone().requires_grad_(True)

    def fwd_bwd(f):
        def run():
            f(tg).backward(g)
        return run

    add("torch.softmax", "torch.softmax(t, -1)", _case(lambda: torch.softmax(t, -1), sync))
    add("torch.softmax", "torch.softmax(t * s + additive mask, -1)",
        _case(lambda: torch.softmax(t * 0.125 + bias, -1), sync))
    add("torch.softmax", "forward + backward through autograd",
        _case(fwd_bwd(lambda x: torch.softmax(x, -1)), sync, 500))
    add("torch.softmax", "forward only, t requires grad", _case(lambda: torch.softmax(tg, -1), sync))
    add("pysoftmax.torch", "softmax(t)", _case(lambda: pst.softmax(t), sync))
    add("pysoftmax.torch", "forward only, t requires grad", _case(lambda: pst.softmax(tg), sync))
    y = pst.softmax(t)
    add("pysoftmax.torch", "softmax_backward(y, g)", _case(lambda: pst.softmax_backward(y, g), sync))
    add("torch.softmax", "torch._softmax_backward_data(g, y, -1, float32)",
        _case(lambda: torch._softmax_backward_data(g, y, -1, torch.float32), sync))
    add("pysoftmax.torch", "softmax(t, scale=s, mask=keep)", _case(lambda: pst.softmax(t, scale=0.125, mask=keep), sync))
    add("pysoftmax.torch", "forward + backward through autograd",
        _case(fwd_bwd(lambda x: pst.softmax(x)), sync, 500))
    # The floor of any Python autograd node: torch's own kernels, inside an autograd.Function.
    if not hasattr(_torch_rows, "node"):
        class _TorchKernelsInPythonNode(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                y = torch._softmax(x, -1, False)
                ctx.save_for_backward(y)
                return y

            @staticmethod
            def backward(ctx, dy):
                (y,) = ctx.saved_tensors
                return torch._softmax_backward_data(dy, y, -1, y.dtype)

        _torch_rows.node = _TorchKernelsInPythonNode
    add("parts", "torch's softmax kernels in a Python autograd.Function: forward + backward",
        _case(fwd_bwd(_torch_rows.node.apply), sync, 500))
    add("pysoftmax.torch", "torch.ops.pysoftmax.softmax (the registered operator, eager)",
        _case(lambda: torch.ops.pysoftmax.softmax(t, None, 1.0, False, "fused"), sync))

    # The other registration pattern, measured to choose between them: torch.library.custom_op
    # around the same CUDA implementation.
    from pysoftmax import torch as face

    name = "pysoftmax_hostcost::softmax"
    if not hasattr(_torch_rows, "custom"):
        @torch.library.custom_op(name, mutates_args=(), device_types="cuda")
        def custom(x: torch.Tensor, scale: float) -> torch.Tensor:
            return face._forward_cuda(x, None, scale, False, "fused")

        custom.register_fake(lambda x, scale: x.new_empty(x.shape))
        _torch_rows.custom = custom
    add("pysoftmax.torch", "the same kernel as a torch.library.custom_op (eager)",
        _case(lambda: _torch_rows.custom(t, 1.0), sync))

    compiled_pst = torch.compile(lambda x: pst.softmax(x), fullgraph=True)
    compiled_torch = torch.compile(lambda x: torch.softmax(x, -1), fullgraph=True)
    add("torch.compile", "compiled pst.softmax(t)", _case(lambda: compiled_pst(t), sync, 500))
    add("torch.compile", "compiled torch.softmax(t, -1)", _case(lambda: compiled_torch(t), sync, 500))
    add("pysoftmax (CuPy API)", "pysoftmax.fused(torch tensor) through DLPack",
        _case(lambda: pysoftmax.fused(t), sync, 500))
    add("parts", "torch.empty(64, 128)", _case(lambda: torch.empty(shape, device="cuda"), sync))
    add("parts", "torch.empty_like(t)", _case(lambda: torch.empty_like(t), sync))
    add("parts", "torch._C._cuda_getCurrentRawStream(0)",
        _case(lambda: torch._C._cuda_getCurrentRawStream(0), sync))


def run(shape=(64, 128)):
    """Measure every row; returns a list of dicts (group, call, us: best round, median_us)."""
    import cupy

    import pysoftmax
    from pysoftmax import _lib

    cases = []

    def add(group, call, case):
        cases.append((group, call) + case)

    sync = cupy.cuda.runtime.deviceSynchronize
    x = cupy.random.standard_normal(shape, dtype=cupy.float32)
    dy = cupy.random.standard_normal(shape, dtype=cupy.float32)
    keep = cupy.random.random(shape[-1]) > 0.1
    y = pysoftmax.fused(x)
    add("pysoftmax (CuPy API)", "fused(x)", _case(lambda: pysoftmax.fused(x), sync))
    add("pysoftmax (CuPy API)", "fused(x, scale=s, mask=keep)", _case(lambda: pysoftmax.fused(x, scale=0.125, mask=keep), sync))
    add("pysoftmax (CuPy API)", "online(x)", _case(lambda: pysoftmax.online(x), sync))
    add("pysoftmax (CuPy API)", "backward(y, dy)", _case(lambda: pysoftmax.backward(y, dy), sync))

    lib = _lib.lib()
    p = _lib.Problem()
    p.algo, p.dtype = _lib.ALGO_FUSED, _lib.FLOAT32
    p.rows, p.cols = shape
    p.x_row_stride = p.out_row_stride = shape[-1]
    p.scale = 1.0
    out = cupy.empty_like(x)
    p.x, p.out = x.data.ptr, out.data.ptr
    ref = ctypes.byref(p)
    nbytes = ctypes.c_int64(0)
    stream = cupy.cuda.get_current_stream().ptr
    add("parts", "ctypes call of a no-op (softmax_abi_version)", _case(lambda: lib.softmax_abi_version(), sync))
    add("parts", "softmax_workspace_size (the C planner, no launch)",
        _case(lambda: lib.softmax_workspace_size(ref, 0, ctypes.byref(nbytes)), sync))
    add("parts", "softmax_forward on a built problem (the planner + the launch)",
        _case(lambda: lib.softmax_forward(ref, stream), sync))
    add("parts", "cupy.empty(64, 128)", _case(lambda: cupy.empty(shape, dtype=cupy.float32), sync))
    add("parts", "cupy.cuda.get_current_stream().ptr", _case(lambda: cupy.cuda.get_current_stream().ptr, sync))

    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        _torch_rows(torch, shape, add)
    return _measure(cases)


def table(rows):
    lines = ["| group | call | host us per call (best round) | median round |", "|---|---|---|---|"]
    lines += [f"| {r['group']} | {r['call']} | {r['us']:.2f} | {r['median_us']:.2f} |" for r in rows]
    return "\n".join(lines)
