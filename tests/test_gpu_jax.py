"""The JAX face on the GPU: pysoftmax.jax under jit, grad and vmap against float64 references
and jax.nn.softmax, through the XLA FFI handlers (libsoftmax_jax.so).

XLA allocates the outputs, so they cannot be poisoned before a call as the CuPy tests do; every
case compares all of the output with a float64 reference of fresh random inputs instead.
"""

import contextlib

import numpy
import pytest

from _util import TOL, assert_close, assert_grad_close, ref_softmax

jax = pytest.importorskip("jax", reason="JAX is not installed")
import jax.numpy as jnp  # noqa: E402

import pysoftmax  # noqa: E402


def _reason():
    try:
        if not any(d.platform == "gpu" for d in jax.devices()):
            return "JAX has no GPU device"
    except RuntimeError as e:
        return f"JAX has no usable backend ({e})"
    try:
        import pysoftmax.jax as psj

        psj._register()
    except Exception as e:
        return f"the JAX handlers are not loadable ({e}); run make"
    return None


REASON = _reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

if REASON is None:
    import pysoftmax.jax as psj

JDT = {"float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16, "float64": jnp.float64}


def x64():
    """float64 on inside the block (jax_enable_x64), for the float64 cases."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64  # older JAX

    return enable_x64()


def _ctx(dtype):
    return x64() if dtype == "float64" else contextlib.nullcontext()


def _rand(shape, dtype, seed, scale=3.0):
    a = numpy.random.default_rng(seed).standard_normal(shape) * scale
    return jnp.asarray(a, JDT[dtype])


def _host(a):
    return numpy.asarray(jnp.asarray(a, jnp.float32) if a.dtype == jnp.bfloat16 else a, numpy.float64)


# Row lengths on both sides of the dispatcher's thresholds: tiny and medium rows_warp tables,
# rows_block, and rows_stream (split across blocks for few rows).
COLS = [1, 7, 32, 100, 256, 1000, 1024, 4097, 33000, 300000]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("cols", COLS)
def test_jit_forward_matches_reference(dtype, cols):
    rows = 3 if cols > 10000 else 37
    with _ctx(dtype):
        x = _rand((rows, cols), dtype, cols)
        y = jax.jit(psj.softmax)(x)
        assert y.dtype == x.dtype and y.shape == x.shape
        assert_close(_host(y), ref_softmax(_host(x)), dtype, f"{rows}x{cols}")


@pytest.mark.parametrize("algorithm", ["online", "naive"])
@pytest.mark.parametrize("cols", [7, 1000, 40000])
def test_reference_algorithms(algorithm, cols):
    x = _rand((5, cols), "float32", 11)
    y = jax.jit(lambda a: psj.softmax(a, algorithm=algorithm))(x)
    assert_close(_host(y), ref_softmax(_host(x)), "float32", algorithm)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mask_shape, causal", [((2, 1, 1, 96), False), ((2, 1, 1, 96), True), ((96,), False),
                                                 ((1, 4, 96, 96), True), (None, True)])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_masks_and_causal_against_jax_nn(dtype, mask_shape, causal, kind):
    if mask_shape is None and kind == "float":
        pytest.skip("no mask: one case is enough")
    x = _rand((2, 4, 96, 96), dtype, 5)
    rng = numpy.random.default_rng(6)
    mask = None
    if mask_shape is not None:
        keep = rng.random(mask_shape) > 0.3
        # A float mask of moderate values: -1e4 at "masked" positions would leave rows whose every
        # logit sits near -1e4, where float32's own rounding of x * scale + mask is 1.6e-4 of a row.
        mask = jnp.asarray(keep) if kind == "bool" else jnp.asarray(rng.standard_normal(mask_shape) * 2, jnp.float32)
    f = jax.jit(lambda a, m: psj.softmax(a, scale=0.125, mask=m, causal=causal))
    y = f(x, mask)
    ref = ref_softmax(_host(x), 0.125, None if mask is None else numpy.asarray(mask), causal)
    assert_close(_host(y), ref, dtype, f"{mask_shape} {kind} causal={causal}")
    if kind == "bool":  # jax.nn.softmax(where=) gives the same probabilities
        where = jnp.ones(x.shape, bool) if mask is None else jnp.broadcast_to(mask, x.shape)
        if causal:
            where = where & jnp.tril(jnp.ones((96, 96), bool))
        theirs = jax.nn.softmax(x.astype(jnp.float32) * 0.125, where=where)
        theirs = jnp.where(where, theirs, 0.0)
        assert numpy.max(numpy.abs(_host(y) - _host(theirs))) < 5 * TOL[dtype] + 1e-6


def test_fully_masked_rows_are_zero_with_zero_gradient():
    x = _rand((4, 64), "float32", 1)
    mask = jnp.asarray(numpy.array([[True] * 64, [False] * 64, [True] * 64, [False] * 64]))
    y, vjp = jax.vjp(lambda a: psj.softmax(a, mask=mask), x)
    assert numpy.all(numpy.asarray(y)[1::2] == 0)
    (dx,) = vjp(jnp.ones_like(y))
    assert numpy.all(numpy.asarray(dx)[1::2] == 0)


@pytest.mark.parametrize("axis", [0, 1, -2])
def test_any_axis(axis):
    x = _rand((6, 7, 9), "float32", 3)
    y = jax.jit(lambda a: psj.softmax(a, axis=axis))(x)
    ref = numpy.moveaxis(ref_softmax(numpy.moveaxis(_host(x), axis, -1)), -1, axis)
    assert_close(numpy.moveaxis(_host(y), axis, -1), numpy.moveaxis(ref, axis, -1), "float32", f"axis={axis}")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("cols", [32, 1000, 33000])
def test_grad_matches_reference(dtype, cols):
    with _ctx(dtype):
        x = _rand((3, cols), dtype, 8)
        w = _rand((3, cols), dtype, 9, 1.0)
        y = psj.softmax(x, scale=0.5)
        # The loss in float32 for 16-bit rows (w is exact there), in float64 for float64: the
        # cotangent that reaches the backward is then w itself.
        acc = jnp.float64 if dtype == "float64" else jnp.float32
        dx = jax.jit(jax.grad(lambda a: jnp.sum(psj.softmax(a, scale=0.5).astype(acc) * w.astype(acc))))(x)
        assert dx.dtype == x.dtype
        assert_grad_close(_host(dx), _host(y), _host(w), 0.5, dtype, f"grad {dtype} {cols}")


def test_check_grads_float64_with_a_learned_bias():
    from jax.test_util import check_grads

    with x64():
        x = _rand((2, 3, 8, 8), "float64", 21, 1.0)
        bias = _rand((3, 8, 8), "float64", 22, 1.0)
        keep = jnp.asarray(numpy.random.default_rng(23).random((2, 1, 1, 8)) > 0.2)
        check_grads(lambda a, b: psj.softmax(a, scale=0.7, mask=b, causal=True), (x, bias), order=1,
                    modes=["rev"])
        check_grads(lambda a: psj.softmax(a, scale=0.7, mask=keep), (x,), order=1, modes=["rev"])


def test_float_mask_gradient_is_summed_over_broadcast_axes():
    x = _rand((2, 4, 16, 16), "float32", 31)
    bias = _rand((4, 1, 16), "float32", 32, 1.0)
    g = _rand((2, 4, 16, 16), "float32", 33, 1.0)
    _, vjp = jax.vjp(lambda a, b: psj.softmax(a, scale=2.0, mask=b), x, bias)
    dx, db = vjp(g)
    y = ref_softmax(_host(x), 2.0, numpy.asarray(bias))
    dz = y * (_host(g) - (_host(g) * y).sum(-1, keepdims=True))
    assert db.shape == bias.shape and db.dtype == bias.dtype
    numpy.testing.assert_allclose(_host(db), dz.sum(axis=(0, 2), keepdims=True)[0], rtol=1e-4, atol=1e-5)
    numpy.testing.assert_allclose(_host(dx), 2.0 * dz, rtol=1e-4, atol=1e-5)


def test_vmap_over_a_leading_axis():
    x = _rand((5, 3, 40), "float32", 41)
    mask = jnp.asarray(numpy.random.default_rng(42).random((5, 40)) > 0.3)  # batched with x
    f = jax.jit(jax.vmap(lambda a, m: psj.softmax(a, mask=m, scale=0.3)))
    y = f(x, mask)
    ref = numpy.stack([ref_softmax(_host(x[i]), 0.3, numpy.asarray(mask[i])) for i in range(5)])
    assert_close(_host(y), ref, "float32", "vmap, batched mask")
    shared = mask[0]
    y2 = jax.jit(jax.vmap(lambda a: psj.softmax(a, mask=shared)))(x)
    assert_close(_host(y2), ref_softmax(_host(x), 1.0, numpy.asarray(shared)), "float32", "vmap, shared mask")
    dx = jax.grad(lambda a: jnp.sum(jax.vmap(psj.softmax)(a) ** 2))(x)
    yy = ref_softmax(_host(x))
    assert_grad_close(_host(dx), yy, 2 * yy, 1.0, "float32", "vmap grad")


def test_jitted_attention_block_forward_and_backward():
    rng = numpy.random.default_rng(51)
    q, k, v = (jnp.asarray(rng.standard_normal((2, 4, 64, 32)), jnp.float32) for _ in range(3))
    keep = rng.random((2, 1, 1, 64)) > 0.1
    keep[..., 0] = True  # no fully masked row: jax.nn.softmax's gradient would be NaN there
    keep = jnp.asarray(keep)
    scale = 32 ** -0.5

    def ours(q, k, v):
        return psj.softmax(q @ jnp.swapaxes(k, -1, -2), scale=scale, mask=keep, causal=True) @ v

    def theirs(q, k, v):
        where = keep & jnp.tril(jnp.ones((64, 64), bool))
        p = jax.nn.softmax(q @ jnp.swapaxes(k, -1, -2) * scale, where=where)
        return jnp.where(where, p, 0.0) @ v

    loss = lambda f: lambda *a: jnp.sum(jnp.tanh(f(*a)))  # noqa: E731
    out, grads = jax.jit(jax.value_and_grad(loss(ours), argnums=(0, 1, 2)))(q, k, v)
    out2, grads2 = jax.jit(jax.value_and_grad(loss(theirs), argnums=(0, 1, 2)))(q, k, v)
    numpy.testing.assert_allclose(float(out), float(out2), rtol=1e-4)
    for a, b in zip(grads, grads2):
        numpy.testing.assert_allclose(numpy.asarray(a), numpy.asarray(b), rtol=2e-3, atol=2e-4)


def test_many_calls_in_one_jitted_function():
    x = _rand((8, 300), "float32", 61)

    @jax.jit
    def chain(a):
        for i in range(12):
            a = psj.softmax(a * 50.0, scale=1.0 + 0.1 * i, algorithm=("fused", "online")[i % 2])
        return a

    ref = _host(x)
    for i in range(12):
        ref = ref_softmax(ref * 50.0, 1.0 + 0.1 * i)
    assert_close(_host(chain(x)), ref, "float32", "12 calls")


def test_backward_function_and_empty_arrays():
    y = psj.softmax(_rand((4, 50), "float32", 71))
    dy = _rand((4, 50), "float32", 72, 1.0)
    dx = jax.jit(lambda a, b: psj.softmax_backward(a, b, scale=0.5))(y, dy)
    assert_grad_close(_host(dx), _host(y), _host(dy), 0.5, "float32", "softmax_backward")
    assert psj.softmax(jnp.zeros((0, 5))).shape == (0, 5)
    assert jax.jit(psj.softmax)(jnp.zeros((3, 0))).shape == (3, 0)


def test_bad_input_is_refused_at_trace_time():
    x = jnp.ones((4, 8))
    with pytest.raises(ValueError, match=r"^mask: shape \(3,\) does not broadcast"):
        jax.jit(lambda a: psj.softmax(a, mask=jnp.ones((3,), bool)))(x)
    with pytest.raises(TypeError, match=r"^x: dtype int32 is not supported"):
        jax.jit(psj.softmax)(jnp.ones((4, 8), jnp.int32))
    with pytest.raises(ValueError, match=r"^algorithm: 'naive' takes no mask"):
        jax.jit(lambda a: psj.softmax(a, causal=True, algorithm="naive"))(x)
    with pytest.raises(TypeError, match=r"^mask: dtype int8 is not supported"):
        psj.softmax(x, mask=jnp.ones((8,), jnp.int8))


def test_same_results_as_the_cupy_api():
    cupy = pytest.importorskip("cupy")
    a = numpy.random.default_rng(81).standard_normal((64, 777)).astype(numpy.float32)
    keep = numpy.random.default_rng(82).random(777) > 0.2
    ours = numpy.asarray(jax.jit(lambda v: psj.softmax(v, scale=0.3, mask=jnp.asarray(keep)))(jnp.asarray(a)))
    cp = cupy.asnumpy(pysoftmax.fused(cupy.asarray(a), scale=0.3, mask=cupy.asarray(keep)))
    numpy.testing.assert_allclose(ours, cp, rtol=0, atol=1e-6)


def test_scale_that_cannot_fold_and_the_reference_algorithms_with_a_workspace():
    # Few long rows are split across blocks (a workspace sized at trace time) and a scale <= 0 takes
    # the additive kernels: the trace-time plan must match the launch's.
    x = _rand((2, 300000), "float32", 91)
    keep = jnp.asarray(numpy.random.default_rng(92).random(300000) > 0.5)
    for scale, algorithm, mask in ((-0.5, "fused", None), (0.5, "online", keep), (-1.0, "online", keep), (2.0, "fused", keep)):
        y = jax.jit(lambda a, m: psj.softmax(a, scale=scale, mask=m, algorithm=algorithm))(x, mask)
        ref = ref_softmax(_host(x), scale, None if mask is None else numpy.asarray(mask))
        assert_close(_host(y), ref, "float32", f"scale={scale} {algorithm}")
