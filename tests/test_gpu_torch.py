"""pysoftmax.torch on the GPU: values against a float64 reference, the operators under opcheck,
gradcheck, torch.compile (static and dynamic shapes), CUDA graphs, torch's streams, errors, and
the CuPy API's handling of torch tensors (stream order, empty tensors, tensors that need grad).

Outputs come from torch's caching allocator, so each check first fills and frees a block of
NaNs the size of the output: the allocator hands it back, and an element the kernel does not
write shows up.
"""

import math
import sys

import numpy
import pytest

from _util import TOL, ref_backward, ref_softmax, row_error

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the torch face's GPU tests skip")
if not torch.cuda.is_available():  # pragma: no cover - a machine with CuPy's GPU but no CUDA torch
    pytest.skip("torch has no CUDA device", allow_module_level=True)

import pysoftmax  # noqa: E402
import pysoftmax.torch as pst  # noqa: E402

pytestmark = pytest.mark.gpu

DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


def _rand(*shape, dtype="float32", scale=3.0, gen=None):
    return (torch.randn(*shape, dtype=torch.float64, device="cuda", generator=gen) * scale).to(DT[dtype])


def _poison_pool(like):
    """Fill and free a block of the output's size: the caching allocator hands it back next."""
    torch.empty(like.shape, dtype=like.dtype, device="cuda").fill_(float("nan"))


def _np(t):
    return t.detach().double().cpu().numpy()


def _check(got, ref, dtype, what):
    err = row_error(_np(got), ref)
    assert math.isfinite(err) and err <= TOL[dtype], f"{what}: max row error {err:.3e} > {TOL[dtype]:.0e}"


def _grad_check(got, y, dy, scale, dtype, what):
    y, dy = numpy.asarray(y, numpy.float64), numpy.asarray(dy, numpy.float64)
    ref = ref_backward(y, dy, scale)
    size = numpy.abs(scale * y) * (numpy.abs(dy) + numpy.abs((dy * y).sum(-1, keepdims=True)))
    num = numpy.sqrt(((_np(got).reshape(ref.shape) - ref) ** 2).sum(-1))
    den = numpy.sqrt((size**2).sum(-1))
    err = float(numpy.where(den == 0, num, num / numpy.where(den == 0, 1, den)).max()) if num.size else 0.0
    assert math.isfinite(err) and err <= TOL[dtype], f"{what}: max row error {err:.3e} > {TOL[dtype]:.0e}"


# Row lengths on both sides of the dispatcher's thresholds (rows_warp tiny/medium, rows_block,
# rows_stream resident, clusters, split rows) and odd widths.
SHAPES = [(1000, 1), (777, 7), (513, 32), (129, 33), (300, 100), (64, 1024), (65, 1025), (33, 4096), (9, 8191),
          (5, 32768), (3, 33000), (2, 140000), (1, 1 << 20)]


# Rows of 1M: most of y lies below 16-bit's normal range, rounded past the 16-bit tolerance.
CASES = [(s, d) for s in SHAPES for d in DT if s[1] <= 1 << 18 or DT[d].itemsize > 2]


@pytest.mark.parametrize("shape, dtype", CASES, ids=lambda c: f"{c[0]}x{c[1]}" if isinstance(c, tuple) else c)
def test_forward_and_backward_match_float64(shape, dtype):
    x = _rand(*shape, dtype=dtype)
    _poison_pool(x)
    y = pst.softmax(x, scale=0.7)
    assert y.dtype == x.dtype and y.shape == x.shape and y.is_contiguous()
    _check(y, ref_softmax(_np(x), 0.7), dtype, f"fwd {shape} {dtype}")
    dy = _rand(*shape, dtype=dtype, scale=1.0)
    _poison_pool(x)
    dx = pst.softmax_backward(y, dy, scale=0.7)
    _grad_check(dx, _np(y), _np(dy), 0.7, dtype, f"bwd {shape} {dtype}")


@pytest.mark.parametrize("algorithm", ["fused", "online", "naive"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_algorithms(algorithm, dtype):
    for shape in [(4097, 64), (7, 50000)]:
        x = _rand(*shape, dtype=dtype)
        _poison_pool(x)
        _check(pst.softmax(x, algorithm=algorithm), ref_softmax(_np(x)), dtype, f"{algorithm} {shape}")


MASKS = {  # mask shape for x of [2, 3, 37, 53]
    "padding [B,1,1,S]": (2, 1, 1, 53),
    "[S,S]": (37, 53),
    "[B,1,S,S]": (2, 1, 37, 53),
    "[S]": (53,),
    "[B,H,S,1]": (2, 3, 37, 1),
    "full": (2, 3, 37, 53),
}


@pytest.mark.parametrize("kind", ["bool", "float32", "bfloat16"])
@pytest.mark.parametrize("where", list(MASKS))
@pytest.mark.parametrize("causal", [False, True])
def test_masks_and_causal(kind, where, causal):
    x = _rand(2, 3, 37, 53, dtype="float16")
    shape = MASKS[where]
    if kind == "bool":
        mask = torch.rand(shape, device="cuda") > 0.3
        ref_mask = _np(mask).astype(bool)
    else:
        mask = _rand(*shape, dtype=kind, scale=1.0)
        ref_mask = _np(mask)
    _poison_pool(x)
    y = pst.softmax(x, scale=0.3, mask=mask, causal=causal)
    _check(y, ref_softmax(_np(x), 0.3, ref_mask, causal), "float16", f"{kind} {where} causal={causal}")


@pytest.mark.parametrize("queries, keys", [(5, 9), (9, 5), (64, 64)])
def test_causal_is_top_left_aligned(queries, keys):
    x = _rand(2, queries, keys, dtype="float32")
    keep = torch.ones(queries, keys, dtype=torch.bool, device="cuda").tril()
    y = pst.softmax(x, causal=True)
    torch.testing.assert_close(y, torch.softmax(x.masked_fill(~keep, float("-inf")), -1), rtol=1e-5, atol=1e-6)


def test_fully_masked_rows_and_their_gradient():
    x = _rand(4, 300, dtype="float32").requires_grad_(True)
    keep = torch.rand(4, 300, device="cuda") > 0.5
    keep[1] = False
    y = pst.softmax(x, mask=keep)
    assert torch.equal(y[1], torch.zeros_like(y[1]))
    y.backward(torch.randn_like(y))
    assert torch.equal(x.grad[1], torch.zeros_like(x.grad[1]))


@pytest.mark.parametrize("dim", [0, 1, -2])
def test_any_dim_with_mask(dim):
    x = _rand(6, 7, 8, dtype="float32")
    bias = _rand(7, 1, dtype="float32", scale=1.0)
    want = torch.softmax(x.double() * 0.5 + bias.double(), dim)
    got = pst.softmax(x, dim, scale=0.5, mask=bias)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_non_contiguous_inputs():
    base = _rand(64, 2 * 300, dtype="float32")
    for x in (base[:, ::2], base.t()[:300], base[::3, 50:350], base.view(64, 2, 300)[:, 1]):
        _poison_pool(x)
        _check(pst.softmax(x), ref_softmax(_np(x)), "float32", f"strides {x.stride()}")


def test_zero_d_and_empty():
    assert pst.softmax(torch.tensor(3.0, device="cuda")).item() == 1.0
    for shape in [(0, 5), (5, 0), (2, 0, 3)]:
        x = torch.empty(shape, device="cuda")
        y = pst.softmax(x)
        assert y.shape == x.shape
        assert pst.softmax_backward(y, y).shape == x.shape


# ---------------------------------------------------------------------------------------------
# Autograd


def test_autograd_matches_torch_and_saves_only_y():
    x = _rand(16, 333, dtype="float32").requires_grad_(True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = pst.softmax(x, scale=0.25)
    assert len(saved) == 1 and saved[0].data_ptr() == y.data_ptr()
    g = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, g)
    xr = x.detach().double().requires_grad_(True)
    (want,) = torch.autograd.grad(torch.softmax(xr * 0.25, -1), xr, g.double())
    torch.testing.assert_close(dx.double(), want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("reduce", ["sum", "mean", "slice"])
def test_strided_and_stride_zero_grads(reduce):
    x = _rand(8, 40, dtype="float32").requires_grad_(True)
    y = pst.softmax(x, scale=2.0)
    loss = {"sum": lambda: y.sum(), "mean": lambda: y.mean(), "slice": lambda: (y[:, ::3] * 2).sum()}[reduce]()
    (dx,) = torch.autograd.grad(loss, x)
    xr = x.detach().double().requires_grad_(True)
    yr = torch.softmax(xr * 2.0, -1)
    lr = {"sum": lambda: yr.sum(), "mean": lambda: yr.mean(), "slice": lambda: (yr[:, ::3] * 2).sum()}[reduce]()
    (want,) = torch.autograd.grad(lr, xr)
    torch.testing.assert_close(dx.double(), want, rtol=1e-4, atol=1e-6)  # .sum()'s gradient is 0 up to rounding


@pytest.mark.parametrize("mask_shape", [(3, 1, 6), (6,), (2, 3, 5, 6), (1, 1, 5, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_float64_with_learned_bias(mask_shape, causal):
    x = _rand(2, 3, 5, 6, dtype="float64").requires_grad_(True)
    bias = _rand(*mask_shape, dtype="float64", scale=1.0).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x, b: pst.softmax(x, scale=0.6, mask=b, causal=causal), (x, bias))


def test_gradcheck_float64_bool_mask_and_double_backward():
    x = _rand(3, 4, 7, dtype="float64").requires_grad_(True)
    keep = torch.rand(4, 7, device="cuda") > 0.4
    f = lambda x: pst.softmax(x, scale=1.3, mask=keep, causal=True)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x,))
    assert torch.autograd.gradgradcheck(f, (x,))


def test_bias_gradient_in_low_precision():
    """bfloat16 scores with a float32 learned bias: dx in bfloat16, the bias's gradient in float32,
    summed over the batch it was broadcast along. Both are checked against float64 arithmetic on
    the same y and upstream gradient, measured against the size of the terms (dz's rows cancel)."""
    x = _rand(2, 4, 64, 64, dtype="bfloat16").requires_grad_(True)
    bias = _rand(4, 64, 64, dtype="float32", scale=1.0).requires_grad_(True)
    y = pst.softmax(x, scale=0.125, mask=bias, causal=True)
    _check(y, ref_softmax(_np(x), 0.125, _np(bias), True), "bfloat16", "forward")
    g = _rand(2, 4, 64, 64, dtype="bfloat16", scale=1.0)
    dx, db = torch.autograd.grad(y, (x, bias), g)
    assert dx.dtype == torch.bfloat16 and db.dtype == torch.float32 and db.shape == bias.shape
    y64, g64 = _np(y), _np(g)
    _grad_check(dx, y64, g64, 0.125, "bfloat16", "dx")
    dz = ref_backward(y64, g64)
    size = (numpy.abs(y64) * (numpy.abs(g64) + numpy.abs((g64 * y64).sum(-1, keepdims=True)))).sum(0)
    num = numpy.sqrt(((_np(db) - dz.sum(0)) ** 2).sum(-1))
    den = numpy.sqrt((size**2).sum(-1))
    err = float(numpy.where(den == 0, num, num / numpy.where(den == 0, 1, den)).max())
    assert err < TOL["bfloat16"], f"bias gradient: max row error {err:.3e}"


# ---------------------------------------------------------------------------------------------
# The operators under opcheck


def _opcheck_cases():
    cases = []
    for dtype in DT:
        for shape in [(0, 16), (37, 1), (19, 97), (8, 1000), (3, 33000), (1, 300000)]:
            cases.append((f"{dtype}-{shape[0]}x{shape[1]}", dtype, shape, None, False, False))
    for grad in (False, True):
        cases += [
            (f"strided-grad{grad}", "float32", "strided", None, False, grad),
            (f"bool-pad-causal-grad{grad}", "float16", (2, 3, 16, 16), (2, 1, 1, 16), True, grad),
            (f"float-bias-grad{grad}", "float32", (2, 3, 16, 16), (3, 1, 16), False, grad),
            (f"bfloat16-rows-grad{grad}", "bfloat16", (2, 3, 16, 16), (2, 3, 16, 1), True, grad),
        ]
    return cases


@pytest.mark.parametrize("name, dtype, shape, mask_shape, causal, grad", _opcheck_cases(), ids=lambda c: str(c))
def test_opcheck(name, dtype, shape, mask_shape, causal, grad):
    x = _rand(64, 200, dtype=dtype)[:, 3:130:2].detach() if shape == "strided" else _rand(*shape, dtype=dtype)
    mask = None
    if mask_shape is not None:
        mask = torch.rand(mask_shape, device="cuda") > 0.2 if dtype == "float16" else \
            _rand(*mask_shape, dtype="float32", scale=1.0).requires_grad_(grad)
    x = x.requires_grad_(grad)
    torch.library.opcheck(torch.ops.pysoftmax.softmax.default, (x, mask, 0.5, causal, "fused"))
    y = pst.softmax(x.detach(), scale=0.5, mask=mask if mask is None else mask.detach(), causal=causal)
    dy = _rand(*y.shape, dtype=dtype, scale=1.0)
    torch.library.opcheck(torch.ops.pysoftmax.softmax_backward.default,
                          (y.requires_grad_(grad), dy.requires_grad_(grad), 0.5))


# ---------------------------------------------------------------------------------------------
# torch.compile, CUDA graphs, streams


def _attention_loss(x, bias):
    return (pst.softmax(x, scale=0.125, mask=bias, causal=True).float() ** 2).sum()


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_forward_and_backward_equal_eager(dynamic):
    torch._dynamo.reset()
    compiled = torch.compile(_attention_loss, fullgraph=True, dynamic=dynamic)
    for s in (64, 96, 200):
        x = _rand(2, 4, s, s, dtype="bfloat16").requires_grad_(True)
        bias = _rand(4, 1, s, dtype="float32", scale=1.0).requires_grad_(True)
        want = torch.autograd.grad(_attention_loss(x, bias), (x, bias))
        got = torch.autograd.grad(compiled(x, bias), (x, bias))
        for w, g in zip(want, got):  # the same kernels; Inductor may sum the bias's gradient in another order
            torch.testing.assert_close(g.float(), w.float(), rtol=2e-2, atol=1e-4)


def test_compile_sees_the_operator():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    f = torch.compile(lambda x: pst.softmax(x, 1, scale=2.0), backend=backend, fullgraph=True)
    x = _rand(4, 5, 6)
    torch.testing.assert_close(f(x), torch.softmax(x * 2.0, 1))
    assert len(graphs) == 1 and "pysoftmax.softmax" in str(graphs[0].code)


def test_cuda_graph_replay_with_new_inputs():
    x = _rand(3, 4, 50, 50, dtype="float16")
    keep = torch.rand(3, 1, 1, 50, device="cuda") > 0.2
    dy = _rand(3, 4, 50, 50, dtype="float16", scale=1.0)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up off the capture: plans cached, kernels loaded
        pst.softmax(x, scale=0.5, mask=keep, causal=True)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = pst.softmax(x, scale=0.5, mask=keep, causal=True)
        dx = pst.softmax_backward(y, dy, scale=0.5)
    for _ in range(3):
        x.copy_(_rand(3, 4, 50, 50, dtype="float16"))
        keep.copy_(torch.rand(3, 1, 1, 50, device="cuda") > 0.2)
        dy.copy_(_rand(3, 4, 50, 50, dtype="float16", scale=1.0))
        y.fill_(float("nan"))
        dx.fill_(float("nan"))
        graph.replay()
        ref = ref_softmax(_np(x), 0.5, _np(keep).astype(bool), True)
        _check(y, ref, "float16", "graph forward")
        _grad_check(dx, _np(y), _np(dy), 0.5, "float16", "graph backward")


def _produced_late(stream, shape=(2048, 1024)):
    """x written on `stream` behind a long sleep: a consumer not ordered after it reads garbage."""
    src = _rand(*shape)
    x = torch.full(shape, float("nan"), device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(20_000_000)  # ~10 ms of spinning
        x.copy_(src)
    return x, src


def test_torch_side_stream_orders_the_launch():
    s = torch.cuda.Stream()
    for _ in range(5):
        src = _rand(2048, 1024)
        with torch.cuda.stream(s):
            x = torch.full_like(src, float("nan"))
            torch.cuda._sleep(20_000_000)
            x.copy_(src)
            y = pst.softmax(x, scale=0.5)  # on s: torch's current stream
        s.synchronize()
        _check(y, ref_softmax(_np(src), 0.5), "float32", "side stream")


def test_cupy_api_waits_for_a_torch_side_stream():
    """pysoftmax.fused(torch_tensor) with no stream= runs on CuPy's stream; DLPack's handshake
    orders it after torch's current stream (where the producer wrote x)."""
    s = torch.cuda.Stream()
    for _ in range(5):
        with torch.cuda.stream(s):
            x, src = _produced_late(s)
            y = pysoftmax.fused(x, scale=0.5)
        torch.cuda.synchronize()
        _check(torch.from_dlpack(y), ref_softmax(_np(src), 0.5), "float32", "CuPy API after a torch side stream")


def test_cupy_api_refuses_a_tensor_that_requires_grad():
    x = _rand(4, 8).requires_grad_(True)
    with pytest.raises(TypeError, match=r"^x: is a tensor that requires grad.*pysoftmax\.torch\.softmax"):
        pysoftmax.fused(x)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cupy_api_empty_torch_tensors(dtype):
    for shape in [(0, 7), (3, 0)]:
        y = pysoftmax.fused(torch.empty(shape, dtype=DT[dtype], device="cuda"))
        assert y.shape == shape
        assert pysoftmax.backward(torch.empty(shape, device="cuda"), torch.empty(shape, device="cuda")).shape == shape


# ---------------------------------------------------------------------------------------------
# Errors, before any launch


def test_errors_name_the_argument():
    x = _rand(4, 8)
    with pytest.raises(ValueError, match=r"^mask: is on cpu, x on cuda:0"):
        pst.softmax(x, mask=torch.ones(8, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^x: expected a CUDA tensor, got one on cpu"):
        pst.softmax(torch.ones(4, 8))
    with pytest.raises(TypeError, match=r"^x: dtype torch.int32 is not supported"):
        pst.softmax(torch.ones(4, 8, dtype=torch.int32, device="cuda"))
    with pytest.raises(TypeError, match=r"^mask: dtype torch.uint8 is not supported"):
        pst.softmax(x, mask=torch.ones(8, dtype=torch.uint8, device="cuda"))
    with pytest.raises(ValueError, match=r"^mask: shape \(3,\) does not broadcast to x.shape \(4, 8\)"):
        pst.softmax(x, mask=torch.ones(3, dtype=torch.bool, device="cuda"))
    with pytest.raises(TypeError, match=r"^dy: dtype torch.float16 does not match y.dtype torch.float32"):
        pst.softmax_backward(x, x.half())
    with pytest.raises(ValueError, match=r"^dy: shape \(4, 7\) does not match y.shape \(4, 8\)"):
        pst.softmax_backward(x, x[:, :7])
    with pytest.raises(ValueError, match=r"^algorithm: 'naive' takes no mask"):
        pst.softmax(x, causal=True, algorithm="naive")
    with pytest.raises(ValueError, match=r"^dy: is on cpu, y on cuda:0"):
        pst.softmax_backward(x, x.cpu())
    with pytest.raises(TypeError, match=r"^dy: expected a torch.Tensor, got builtins.NoneType"):
        pst.softmax_backward(x, None)


# ---------------------------------------------------------------------------------------------
# A real client: a small GPT trained both ways


def test_gpt_training_agrees_with_torch_softmax():
    import importlib.util
    import pathlib

    # The example lives in the checkout (beside tests/), whether pysoftmax is imported from it or installed.
    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "train_gpt.py"
    spec = importlib.util.spec_from_file_location("train_gpt", path)
    g = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = g  # dataclasses look their module up there
    spec.loader.exec_module(g)
    result = g.compare(steps=80, device="cuda", n_layers=2, d_model=128, n_heads=4, seq_len=128, batch_size=16)
    a, b = result["pysoftmax"]["losses"], result["torch"]["losses"]
    assert a[0] == pytest.approx(b[0], rel=2e-2)  # same weights, same batch
    assert a[-1] < 0.85 * a[0] and b[-1] < 0.85 * b[0]  # both learn
    assert abs(a[-1] - b[-1]) / b[-1] < 0.03  # and agree within bf16 noise
