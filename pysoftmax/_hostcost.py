"""Host cost per small call: pysoftmax through CuPy and through torch, against torch's own softmax.

    python3 -m pysoftmax hostcost [--json hostcost.json]

A small problem (64 x 128 float32 by default) takes the GPU about as long to run as the host
takes to launch it, so a loop of such calls is bound by the host: microseconds per call are the
wall time of N back-to-back calls over N, with the device synchronised before the clock starts
and after it stops, garbage collection off, warmed up first, the median of several repeats. What
each row calls is written next to it; all rows run in one process, side by side.
"""

import ctypes
import gc
import statistics
import time


def _per_call_us(fn, sync, n=2000, repeats=9, warmup=300):
    for _ in range(warmup):
        fn()
    sync()
    times = []
    gc.disable()
    try:
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            sync()
            times.append((time.perf_counter() - t0) / n * 1e6)
    finally:
        gc.enable()
    return statistics.median(times)


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

    add("torch.softmax", "torch.softmax(t, -1)", _per_call_us(lambda: torch.softmax(t, -1), sync))
    add("torch.softmax", "torch.softmax(t * s + additive mask, -1)",
        _per_call_us(lambda: torch.softmax(t * 0.125 + bias, -1), sync))
    add("torch.softmax", "forward + backward through autograd",
        _per_call_us(fwd_bwd(lambda x: torch.softmax(x, -1)), sync, n=1000))
    add("torch.softmax", "forward only, t requires grad", _per_call_us(lambda: torch.softmax(tg, -1), sync))
    add("pysoftmax.torch", "softmax(t)", _per_call_us(lambda: pst.softmax(t), sync))
    add("pysoftmax.torch", "forward only, t requires grad", _per_call_us(lambda: pst.softmax(tg), sync))
    y = pst.softmax(t)
    add("pysoftmax.torch", "softmax_backward(y, g)", _per_call_us(lambda: pst.softmax_backward(y, g), sync))
    add("torch.softmax", "torch._softmax_backward_data(g, y, -1, float32)",
        _per_call_us(lambda: torch._softmax_backward_data(g, y, -1, torch.float32), sync))
    add("pysoftmax.torch", "softmax(t, scale=s, mask=keep)", _per_call_us(lambda: pst.softmax(t, scale=0.125, mask=keep), sync))
    add("pysoftmax.torch", "forward + backward through autograd",
        _per_call_us(fwd_bwd(lambda x: pst.softmax(x)), sync, n=1000))
    add("pysoftmax.torch", "torch.ops.pysoftmax.softmax (the registered operator, eager)",
        _per_call_us(lambda: torch.ops.pysoftmax.softmax(t, None, 1.0, False, "fused"), sync))

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
        _per_call_us(lambda: _torch_rows.custom(t, 1.0), sync))

    compiled_pst = torch.compile(lambda x: pst.softmax(x), fullgraph=True)
    compiled_torch = torch.compile(lambda x: torch.softmax(x, -1), fullgraph=True)
    add("torch.compile", "compiled pst.softmax(t)", _per_call_us(lambda: compiled_pst(t), sync, n=1000))
    add("torch.compile", "compiled torch.softmax(t, -1)", _per_call_us(lambda: compiled_torch(t), sync, n=1000))
    add("pysoftmax (CuPy API)", "pysoftmax.fused(torch tensor) through DLPack",
        _per_call_us(lambda: pysoftmax.fused(t), sync, n=1000))
    add("parts", "torch.empty(64, 128)", _per_call_us(lambda: torch.empty(shape, device="cuda"), sync))
    add("parts", "torch.empty_like(t)", _per_call_us(lambda: torch.empty_like(t), sync))
    add("parts", "torch._C._cuda_getCurrentRawStream(0)",
        _per_call_us(lambda: torch._C._cuda_getCurrentRawStream(0), sync))


def run(shape=(64, 128)):
    """Measure every row; returns a list of dicts (group, call, us)."""
    import cupy

    import pysoftmax
    from pysoftmax import _lib

    rows = []

    def add(group, call, us):
        rows.append({"group": group, "call": call, "us": round(us, 2)})

    sync = cupy.cuda.runtime.deviceSynchronize
    x = cupy.random.standard_normal(shape, dtype=cupy.float32)
    dy = cupy.random.standard_normal(shape, dtype=cupy.float32)
    keep = cupy.random.random(shape[-1]) > 0.1
    y = pysoftmax.fused(x)
    add("pysoftmax (CuPy API)", "fused(x)", _per_call_us(lambda: pysoftmax.fused(x), sync))
    add("pysoftmax (CuPy API)", "fused(x, scale=s, mask=keep)", _per_call_us(lambda: pysoftmax.fused(x, scale=0.125, mask=keep), sync))
    add("pysoftmax (CuPy API)", "online(x)", _per_call_us(lambda: pysoftmax.online(x), sync))
    add("pysoftmax (CuPy API)", "backward(y, dy)", _per_call_us(lambda: pysoftmax.backward(y, dy), sync))

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
    add("parts", "ctypes call of a no-op (softmax_abi_version)", _per_call_us(lambda: lib.softmax_abi_version(), sync))
    add("parts", "softmax_workspace_size (the C planner, no launch)",
        _per_call_us(lambda: lib.softmax_workspace_size(ref, 0, ctypes.byref(nbytes)), sync))
    add("parts", "softmax_forward on a built problem (planner + launch)",
        _per_call_us(lambda: lib.softmax_forward(ref, stream), sync))
    add("parts", "cupy.empty(64, 128)", _per_call_us(lambda: cupy.empty(shape, dtype=cupy.float32), sync))
    add("parts", "cupy.cuda.get_current_stream().ptr", _per_call_us(lambda: cupy.cuda.get_current_stream().ptr, sync))

    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        _torch_rows(torch, shape, add)
    return rows


def table(rows):
    lines = ["| group | call | host us per call |", "|---|---|---|"]
    lines += [f"| {r['group']} | {r['call']} | {r['us']:.2f} |" for r in rows]
    return "\n".join(lines)
