"""pysoftmax.torch without a GPU: import isolation, and the operators' registration, fake kernels,
autograd formulas and torch.compile tracing, checked through a float64 CPU stand-in kernel.

The stand-in is registered for the CPU key only for the length of a test (its Library object is
destroyed after), and the eager path is sent through the dispatcher, so what is exercised is the
schema, the fake kernels, the formulas and the wrapper's argument handling; the CUDA kernels are
tests/test_gpu_torch.py's.
"""

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the torch face's CPU tests skip")

import pysoftmax.torch as pst  # noqa: E402
from pysoftmax import torch as face  # noqa: E402


def test_import_pysoftmax_does_not_import_torch():
    code = "import sys, pysoftmax; pysoftmax.fused; print('torch' in sys.modules, 'jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def _stand_in_forward(x, mask, scale, causal, algorithm):
    z = x.double() * scale
    if mask is not None:
        z = z.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else z + mask.double()
    if causal:
        q, k = z.shape[-2], z.shape[-1]
        z = z.masked_fill(torch.ones(q, k, dtype=torch.bool).triu(1), float("-inf"))
    m = z.amax(-1, keepdim=True) if z.shape[-1] else z.sum(-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = (z - m).exp()
    s = e.sum(-1, keepdim=True)
    return torch.where(s == 0, torch.zeros_like(e), e / s).to(x.dtype).contiguous()


def _stand_in_backward(y, dy, scale):
    return (scale * y * (dy - (dy * y).sum(-1, keepdim=True))).contiguous()


@pytest.fixture
def cpu_kernels(monkeypatch):
    lib = torch.library.Library("pysoftmax", "IMPL")
    lib.impl("softmax", _stand_in_forward, "CPU")
    lib.impl("softmax_backward", _stand_in_backward, "CPU")
    real = face._check_tensor

    def anywhere(t, name, *args, **kwargs):  # the stand-in runs on the CPU; everything else is checked
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            return real(t, name, *args, **dict(kwargs, like=t))
        return real(t, name, *args, **kwargs)

    monkeypatch.setattr(face, "_check_tensor", anywhere)
    monkeypatch.setattr(face, "_direct", lambda x, mask: False)
    yield
    lib._destroy()


def _x(*shape, dtype=torch.float64, grad=True):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


@pytest.mark.parametrize("case", ["plain", "scale", "bool-causal", "float-mask-grad", "float-mask", "nonsquare-causal",
                                  "strided", "one-column", "empty"])
def test_opcheck_forward(cpu_kernels, case):
    x = _x(2, 3, 5, 7)
    args = {
        "plain": (x, None, 1.0, False, "fused"),
        "scale": (x, None, 0.3, False, "online"),
        "bool-causal": (x, torch.rand(2, 1, 1, 7) > 0.3, 1.0, True, "fused"),
        "float-mask-grad": (x, _x(3, 1, 7), 0.7, True, "fused"),
        "float-mask": (x, _x(5, 7, grad=False), 0.7, False, "fused"),
        "nonsquare-causal": (_x(2, 9, 4), None, 1.0, True, "fused"),
        "strided": (_x(4, 16, grad=False)[:, ::2].detach().requires_grad_(True), None, 2.0, False, "fused"),
        "one-column": (_x(6, 1), None, 1.0, False, "fused"),
        "empty": (_x(0, 5), None, 1.0, False, "fused"),
    }[case]
    torch.library.opcheck(torch.ops.pysoftmax.softmax.default, args)


@pytest.mark.parametrize("grad", [False, True])
def test_opcheck_backward(cpu_kernels, grad):
    y = pst.softmax(_x(3, 4, 6, grad=False), scale=0.5).detach().requires_grad_(grad)
    dy = _x(3, 4, 6, grad=grad)
    torch.library.opcheck(torch.ops.pysoftmax.softmax_backward.default, (y, dy, 0.5))


def test_gradcheck_with_learned_bias(cpu_kernels):
    x, bias = _x(2, 3, 5, 5), _x(3, 1, 5)
    f = lambda x, b: pst.softmax(x, scale=0.7, mask=b, causal=True)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, bias))
    assert torch.autograd.gradgradcheck(f, (x, bias))


def test_gradcheck_other_dim(cpu_kernels):
    x, bias = _x(4, 3, 5), _x(3, 1)
    assert torch.autograd.gradcheck(lambda x, b: pst.softmax(x, 1, scale=0.7, mask=b), (x, bias))


def test_fully_masked_rows_give_zero_and_zero_grad(cpu_kernels):
    x = _x(3, 4)
    keep = torch.tensor([[True] * 4, [False] * 4, [True, False, True, False]])
    y = pst.softmax(x, mask=keep)
    assert torch.equal(y[1], torch.zeros(4, dtype=y.dtype))
    (g,) = torch.autograd.grad(y, x, torch.randn_like(y))
    assert torch.equal(g[1], torch.zeros(4, dtype=g.dtype))


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_traces_one_graph(cpu_kernels, dynamic):
    def loss(x, b):
        return (pst.softmax(x, scale=0.7, mask=b, causal=True) ** 2).sum()

    compiled = torch.compile(loss, fullgraph=True, dynamic=dynamic, backend="aot_eager")
    for n in (5, 9, 12):
        x, b = _x(2, 3, n, n, dtype=torch.float32), _x(3, 1, n, dtype=torch.float32)
        want = torch.autograd.grad(loss(x, b), (x, b))
        got = torch.autograd.grad(compiled(x, b), (x, b))
        for w, g in zip(want, got):
            torch.testing.assert_close(g, w)


def test_errors_name_the_argument():
    meta = dict(device="meta")
    x = torch.empty(4, 8, **meta)
    with pytest.raises(ValueError, match=r"^x: expected a CUDA tensor, got one on meta"):
        pst.softmax(x)
    with pytest.raises(TypeError, match=r"^x: dtype torch.int64 is not supported"):
        face._check_forward(torch.empty(4, 8, dtype=torch.long), None, 1.0, False, "fused")
    with pytest.raises(IndexError, match=r"^dim: 2 is out of range"):
        pst.softmax(x, 2)
    with pytest.raises(TypeError, match=r"^scale: expected a real number"):
        pst.softmax(x, scale="0.5")
    with pytest.raises(TypeError, match=r"^causal: expected a bool"):
        pst.softmax(x, causal=1)
    with pytest.raises(ValueError, match=r"^causal: needs dim to be the last axis"):
        pst.softmax(x, 0, causal=True)
    with pytest.raises(ValueError, match=r"^algorithm: 'fast' is not one of"):
        pst.AttentionSoftmax(algorithm="fast")


def test_module_repr():
    assert repr(pst.AttentionSoftmax(scale=0.125, causal=True)) == \
        "AttentionSoftmax(scale=0.125, causal=True, algorithm='fused')"


_REAL_DIRECT = face._direct


@pytest.fixture
def eager_stand_in(cpu_kernels, monkeypatch):
    """The eager path (the direct launchers and the autograd.Function) with the stand-in kernels;
    the operator's CPU stand-in serves what goes through the dispatcher (the second order)."""
    monkeypatch.setattr(face, "_direct", _REAL_DIRECT)
    monkeypatch.setattr(face, "_forward_cuda", _stand_in_forward)
    monkeypatch.setattr(face, "_backward_cuda", _stand_in_backward)


def test_gradcheck_eager_function(eager_stand_in):
    x, bias = _x(2, 3, 5, 5), _x(3, 1, 5)
    assert face._direct(x, bias)
    f = lambda x, b: pst.softmax(x, scale=0.7, mask=b, causal=True)  # noqa: E731
    assert type(f(x, bias).grad_fn).__name__ == "_SoftmaxBackward"
    assert torch.autograd.gradcheck(f, (x, bias))
    assert torch.autograd.gradgradcheck(f, (x, bias))  # the second order goes through the operator
    assert torch.autograd.gradcheck(lambda x: pst.softmax(x, 0, scale=1.3), (_x(4, 6),))
    only_bias = lambda b: pst.softmax(x.detach(), mask=b)  # noqa: E731
    assert torch.autograd.gradcheck(only_bias, (bias,))


def test_direct_path_conditions():
    x = torch.empty(4, 8)
    bias = torch.nn.Parameter(torch.zeros(8))
    assert face._direct(x, None) and face._direct(x, bias) and face._direct(bias, None)
    assert not face._direct(x.to_sparse(), None)
    seen = []

    def traced(t):
        seen.append(face._direct(t, None))
        return t * 2

    torch.jit.trace(traced, (x,), check_trace=False)
    traced(x)
    assert seen == [False, True], "under torch.jit.trace the call must go through the operator"


def test_forward_mode_ad_is_refused():
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level():
        x = fwad.make_dual(torch.randn(3, 4), torch.randn(3, 4))
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            pst.softmax(x)
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            pst.softmax_backward(torch.rand(3, 4), x)


def test_argument_errors_before_any_tensor_is_read():
    x = torch.empty(4, 8, device="meta")
    with pytest.raises(TypeError, match=r"^y: expected a torch.Tensor, got builtins.NoneType"):
        pst.softmax_backward(None, x)
    with pytest.raises(ValueError, match=r"^algorithm: \['fused'\] is not one of"):
        pst.softmax(x, algorithm=["fused"])


class _FakeLibrary:
    """Stands in for libsoftmax's launchers: records what each launch was given."""

    def __init__(self):
        self.calls = []

    def _record(self, ref, stream):
        p = ref._obj
        self.calls.append({f: getattr(p, f) for f in ("x", "dy", "out", "x_row_stride", "dy_row_stride", "rows",
                                                      "cols", "mask", "mask_ndim", "workspace", "scale",
                                                      "causal_queries")} | {"stream": stream})
        return 0

    softmax_forward = softmax_backward = _record


@pytest.fixture
def fake_library(monkeypatch):
    fake = _FakeLibrary()
    monkeypatch.setattr(face._lib, "lib", lambda: fake)
    monkeypatch.setattr(face, "_workspace_bytes", lambda p, direction, dev: 256 if p.cols > 100 else 0)
    monkeypatch.setattr(face, "_current_device", lambda: -1)  # CPU tensors report device -1
    monkeypatch.setattr(face, "_raw_stream", lambda dev: 1234)
    monkeypatch.setattr(face, "_check_tensor", lambda t, name, *a, **k: None)
    face._local.__dict__.clear()
    yield fake
    face._local.__dict__.clear()  # the plans hold the fake's launchers


def test_launchers_fill_the_problem(fake_library):
    calls = fake_library.calls
    base = torch.randn(6, 300)
    x = base[:, :200]  # walkable in place: row stride 300
    y = face._forward_cuda(x, None, 0.5, False, "fused")
    c = calls[-1]
    assert (c["x"], c["x_row_stride"], c["out"], c["stream"]) == (x.data_ptr(), 300, y.data_ptr(), 1234)
    assert (c["rows"], c["cols"], c["scale"], c["mask"]) == (6, 200, 0.5, None) and c["workspace"]
    xt = base[:, :10].t()  # last axis not unit-stride: copied, the copy's row stride
    face._forward_cuda(xt, None, 1.0, False, "fused")
    c = calls[-1]
    assert c["x"] != xt.data_ptr() and c["x_row_stride"] == 6 and not c["workspace"]
    q = torch.randn(2, 3, 4, 5)
    keep = torch.rand(2, 1, 1, 5) > 0.5
    face._forward_cuda(q, keep, 1.0, True, "fused")
    c = calls[-1]
    assert c["mask"] == keep.data_ptr() and c["mask_ndim"] == 2 and c["causal_queries"] == 4
    y = face._forward_cuda(q, keep, 1.0, True, "fused")  # the kept plan, new output
    assert calls[-1]["out"] == y.data_ptr() and len(face._local.cache) == 3
    yb = torch.rand(4, 7)
    dy = torch.ones(()).expand(4, 7)  # .sum()'s gradient: stride 0 throughout, copied
    dx = face._backward_cuda(yb, dy, 2.0)
    c = calls[-1]
    assert (c["x"], c["out"], c["scale"], c["dy_row_stride"]) == (yb.data_ptr(), dx.data_ptr(), 2.0, 7)
    assert c["dy"] != dy.data_ptr()
