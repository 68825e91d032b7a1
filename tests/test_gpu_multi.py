"""Several GPUs in one process: each array's work on the device that holds it.

The library follows the input's device: the Python layer enters it (hip/dispatch.cuh's planner
then reads that device's properties, cached per device) and launches on that device's stream; the
output, `out=` and the workspace live there too. These tests need two visible GPUs and skip with
that reason otherwise, but for one that a single GPU runs: a mismatched device refused from the
arguments' metadata alone, with the second device faked.
"""

import threading

import numpy
import pytest

from _util import assert_close, assert_grad_close, poisoned, ref_softmax, rng, rounded, to_device, to_host64

try:
    import cupy
    import pysoftmax
    from pysoftmax import _ops
except ImportError:  # pragma: no cover
    cupy = None


def _devices():
    try:
        return cupy.cuda.runtime.getDeviceCount() if cupy is not None else 0
    except Exception:
        return 0


pytestmark = pytest.mark.gpu
two_gpus = pytest.mark.skipif(_devices() < 2, reason="multi-GPU tests need two visible GPUs")

# Shapes that reach the families and the workspace: rows_warp, rows_block, the resident stream,
# one long odd row (straddling; on the cooperative grid where the GPU launches cooperatively, a
# workspace) and three long rows (the grid too). SPLIT is also run with a boolean mask: masked rows
# are never staged, so it takes the two-launch split (a workspace of another layout).
SHAPES = [(4099, 100), (300, 5000), (64, 70000), (1, 3_000_001), (3, 1_048_576)]
SPLIT = (1, 3_000_001)


def on(device, fn, *args, **kw):
    with cupy.cuda.Device(device):
        return fn(*args, **kw)


@two_gpus
@pytest.mark.parametrize("shape", SHAPES)
def test_work_lands_on_the_inputs_device(shape):
    """x on device 1 while device 0 is current: the output, out= and the workspace are on device
    1, the values right, and device 0's current stream untouched."""
    g = rng()
    x64 = rounded(g.standard_normal(shape) * 3, "float32")
    x = on(1, to_device, x64, "float32")
    assert x.device.id == 1 and cupy.cuda.runtime.getDevice() == 0
    y = pysoftmax.fused(x)
    assert y.device.id == 1
    out = on(1, poisoned, shape, "float32")
    y2 = pysoftmax.fused(x, out=out)
    assert y2.data.ptr == out.data.ptr
    if shape == SPLIT:
        p = on(1, _ops.plan, shape, "float32", mask=True)
        assert p["grid"] == 0 and p["chunks"] > 1 and p["workspace"] > 0, p
        keep64 = g.random((1, shape[1])) < 0.7
        keep = on(1, cupy.asarray, keep64)
        masked = on(1, poisoned, shape, "float32")
        pysoftmax.fused(x, mask=keep, out=masked)
    with cupy.cuda.Device(1):
        cupy.cuda.Device(1).synchronize()
        assert_close(to_host64(y), ref_softmax(x64), "float32", f"fused {shape} seed={g.seed}")
        assert_close(to_host64(out), ref_softmax(x64), "float32", f"out= {shape} seed={g.seed}")
        if shape == SPLIT:
            assert_close(to_host64(masked), ref_softmax(x64, mask=keep64), "float32", f"masked {shape} seed={g.seed}")
        dy64 = rounded(g.standard_normal(shape), "float32")
        dy = to_device(dy64, "float32")
        y64 = to_host64(y)
    dx = pysoftmax.backward(y, dy, scale=0.5)
    assert dx.device.id == 1
    with cupy.cuda.Device(1):
        assert_grad_close(to_host64(dx), y64, dy64, 0.5, "float32", f"backward {shape} seed={g.seed}")
    assert cupy.cuda.runtime.getDevice() == 0, "the caller's current device must be left as it was"


@two_gpus
def test_plans_follow_the_device():
    """A smoke test of the planner under each device (its properties cached per device): under
    each, in turn and back, a single long row's grid has at most two blocks of that device's SMs
    and many short rows take rows_warp. (Two identical GPUs cannot tell a plan of the wrong
    device's properties from the right one.)"""
    for d in (1, 0, 1):
        dev = cupy.cuda.Device(d)
        sms = dev.attributes["MultiProcessorCount"]
        with dev:
            long_row = _ops.plan((1, 16 << 20), "float32")
            short = _ops.plan((1 << 20, 32), "float32")
        assert long_row["family"] == "stream" and long_row["blocks"] <= 2 * sms, (d, sms, long_row)
        assert short["family"] == "warp", (d, short)


@two_gpus
@pytest.mark.parametrize("which", ["mask", "out", "dy"])
def test_operands_on_another_device_are_refused(which):
    """A mask, out= or dy on another device than x: ValueError naming it, before any launch
    (the poisoned output stays poisoned)."""
    g = rng()
    x = on(0, to_device, g.standard_normal((8, 64)), "float32")
    other = on(1, to_device, g.standard_normal((8, 64)), "float32")
    out = on(0, poisoned, (8, 64), "float32")
    keep = on(1, lambda: other > 0)
    out1 = on(1, poisoned, (8, 64), "float32")
    with pytest.raises(ValueError, match=rf"^{which}: is on device 1"):
        if which == "mask":
            pysoftmax.fused(x, mask=keep, out=out)
        elif which == "out":
            pysoftmax.fused(x, out=out1)
        else:
            pysoftmax.backward(x, other, out=out)
    cupy.cuda.Device(0).synchronize()
    cupy.cuda.Device(1).synchronize()
    written = out1 if which == "out" else out
    assert on(written.device.id, lambda: bool(cupy.isnan(written).all())), "nothing may be written before the error"


@two_gpus
def test_two_threads_two_devices_at_once():
    """One thread per device, each calling forward and backward many times on its own arrays
    (grid and split plans included): every result right."""
    g = rng()
    errors = []

    def work(device, seed):
        try:
            h = numpy.random.default_rng(seed)
            with cupy.cuda.Device(device):
                for shape in SHAPES:
                    x64 = rounded(h.standard_normal(shape) * 3, "float32")
                    x = to_device(x64, "float32")
                    for _ in range(10):
                        y = pysoftmax.fused(x)
                    assert y.device.id == device
                    assert_close(to_host64(y), ref_softmax(x64), "float32", f"device {device} {shape}")
                    dy64 = rounded(h.standard_normal(shape), "float32")
                    dx = pysoftmax.backward(y, to_device(dy64, "float32"))
                    assert_grad_close(to_host64(dx), to_host64(y), dy64, 1.0, "float32", f"device {device} {shape}")
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(d, g.seed + d)) for d in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@two_gpus
def test_torch_on_the_second_device():
    """pysoftmax.torch on cuda:1 runs on that device's current stream: a side stream of cuda:1
    that writes x late orders the launch, and the result is on cuda:1."""
    torch = pytest.importorskip("torch")
    import pysoftmax.torch as pst

    dev = torch.device("cuda", 1)
    s = torch.cuda.Stream(device=dev)
    src = torch.randn(2048, 1024, device=dev) * 3
    w = torch.randn(2048, 1024, device=dev)  # weights of the rows: a gradient that is not zero
    torch.cuda.synchronize(dev)
    with torch.cuda.device(dev), torch.cuda.stream(s):
        x = torch.full_like(src, float("nan"))
        torch.cuda._sleep(20_000_000)
        x.copy_(src)
        y = pst.softmax(x, scale=0.5)
        (g,) = torch.autograd.grad((pst.softmax(x.requires_grad_(True), scale=0.5) * w).sum(), x)
    s.synchronize()
    assert y.device == dev and g.device == dev
    ref = ref_softmax(src.double().cpu().numpy(), 0.5)
    assert_close(y.double().cpu().numpy(), ref, "float32", "torch on cuda:1")
    assert_grad_close(g.double().cpu().numpy(), ref, w.double().cpu().numpy(), 0.5, "float32", "torch grad on cuda:1")


@pytest.mark.parametrize("which", ["mask", "out", "dy"])
def test_mismatched_device_refused_from_metadata(which, monkeypatch):
    """On one GPU: an operand that reports another device (faked) is refused with a ValueError
    naming it and both devices, before anything is launched or allocated."""
    g = rng()
    x = to_device(g.standard_normal((8, 64)), "float32")
    keep = x > 0
    out = poisoned((8, 64), "float32")
    here = cupy.cuda.runtime.getDevice()
    real = _ops._Arr.device
    monkeypatch.setattr(_ops._Arr, "device", lambda self: here + 1 if self.name == which else real(self))
    stream = cupy.cuda.get_current_stream()  # a stream= takes the general path, which reads _Arr
    with pytest.raises(ValueError, match=rf"^{which}: is on device {here + 1}, (x|y) on device {here}"):
        if which == "dy":
            pysoftmax.backward(x, x, out=out, stream=stream)
        else:
            pysoftmax.fused(x, mask=keep if which == "mask" else None, out=out, stream=stream)
    cupy.cuda.Device().synchronize()
    assert bool(cupy.isnan(out).all()), "nothing may be written before the error"
