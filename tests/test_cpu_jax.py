"""The JAX face without a GPU: argument checks at trace time, and the FFI handlers' library
(libsoftmax_jax.so, built by `make` where jax imports) exports what pysoftmax.jax binds."""

import ctypes
import os

import numpy

import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed")
import jax.numpy as jnp  # noqa: E402

import pysoftmax.jax as psj  # noqa: E402
from pysoftmax import _lib  # noqa: E402

X = jnp.ones((4, 8), jnp.float32)


@pytest.mark.parametrize("call, error, message", [
    (lambda: psj.softmax(X, scale="a"), TypeError, r"^scale: expected a real number, got str 'a'"),
    (lambda: psj.softmax(X, scale=True), TypeError, r"^scale: expected a real number"),
    (lambda: psj.softmax(X, causal=1), TypeError, r"^causal: expected a bool, got int"),
    (lambda: psj.softmax(X, algorithm="fast"), ValueError, r"^algorithm: 'fast' is not one of"),
    (lambda: psj.softmax(X, algorithm="naive", causal=True), ValueError, r"^algorithm: 'naive' takes no mask"),
    (lambda: psj.softmax(X, axis=2), ValueError, r"^axis: 2 is out of range for an array of 2 dimension"),
    (lambda: psj.softmax(X, axis=1.0), TypeError, r"^axis: expected an int, got float"),
    (lambda: psj.softmax(X, axis=0, causal=True), ValueError, r"^causal: needs x with at least 2 axes, normalised over the last"),
    (lambda: psj.softmax(jnp.ones(3), causal=True), ValueError, r"^causal: needs x with at least 2 axes"),
    (lambda: psj.softmax(jnp.ones((4, 8), jnp.int32)), TypeError, r"^x: dtype int32 is not supported; expected float32"),
    (lambda: psj.softmax([1.0, 2.0]), TypeError, r"^x: expected a JAX array, got builtins.list"),
    (lambda: psj.softmax(X, mask=jnp.ones((3,), bool)), ValueError,
     r"^mask: shape \(3,\) does not broadcast to x.shape \(4, 8\)"),
    (lambda: psj.softmax(X, mask=jnp.ones((2, 4, 8), bool)), ValueError, r"^mask: shape \(2, 4, 8\) has more dimensions"),
    (lambda: psj.softmax(X, mask=jnp.ones((8,), jnp.int8)), TypeError, r"^mask: dtype int8 is not supported"),
    (lambda: psj.softmax_backward(X, jnp.ones((4, 7))), ValueError, r"^dy: shape \(4, 7\) does not match y.shape"),
    (lambda: psj.softmax_backward(X, jnp.ones((4, 8), jnp.float16)), TypeError, r"^dy: dtype float16 does not match"),
])
def test_bad_arguments_named_at_trace_time(call, error, message):
    with pytest.raises(error, match=message):
        call()
    with pytest.raises(error, match=message):  # the same under jit: raised while tracing
        jax.jit(lambda: call())()


def test_numpy_scalars_are_arguments_too():
    with pytest.raises(TypeError, match=r"^causal: expected a bool, got str"):
        psj.softmax(X, causal="yes")
    with pytest.raises(ValueError, match=r"^algorithm: \['fused'\] is not one of"):
        psj.softmax(X, algorithm=["fused"])
    with pytest.raises(ValueError, match=r"^axis: 3 is out of range"):
        psj.softmax(X, axis=numpy.int64(3))  # an integer of NumPy's is an axis, checked like an int


def test_handlers_found_in_the_package_when_not_beside_the_library(monkeypatch, tmp_path):
    monkeypatch.delenv("PYSOFTMAX_JAX_LIB", raising=False)
    monkeypatch.setattr(_lib, "lib", lambda: type("L", (), {"path": str(tmp_path / "libsoftmax.so")})())
    package = os.path.join(os.path.dirname(psj.__file__), "libsoftmax_jax.so")
    if os.path.exists(package):
        assert psj._handler_path() == package
    else:
        assert psj._handler_path() == str(tmp_path / "libsoftmax_jax.so")


def test_empty_arrays_need_no_kernel():
    assert psj.softmax(jnp.zeros((0, 8))).shape == (0, 8)
    assert jax.jit(psj.softmax)(jnp.zeros((3, 0))).shape == (3, 0)
    assert psj.softmax_backward(jnp.zeros((0, 2)), jnp.zeros((0, 2))).shape == (0, 2)


def _handlers():
    try:
        path = psj._handler_path()
    except _lib.LibraryNotFoundError as e:
        pytest.skip(f"libsoftmax.so not loadable: {e}")
    if not os.path.exists(path):
        pytest.skip(f"{path} not built (make jax)")
    return ctypes.CDLL(path)


def test_handlers_export_the_ffi_targets_and_bind():
    handlers = _handlers()
    for name in psj._TARGETS:
        assert hasattr(handlers, name), name
    handlers.pysoftmax_jax_bind.restype = ctypes.c_int
    handlers.pysoftmax_jax_bind.argtypes = [ctypes.c_void_p] * 3
    lib = _lib.lib()
    addr = lambda fn: ctypes.cast(fn, ctypes.c_void_p).value  # noqa: E731
    assert handlers.pysoftmax_jax_bind(addr(lib.softmax_forward), addr(lib.softmax_backward),
                                       addr(lib.softmax_last_error)) == _lib.ABI_VERSION


def test_missing_handlers_say_make_jax(monkeypatch, tmp_path):
    monkeypatch.setenv("PYSOFTMAX_JAX_LIB", str(tmp_path / "nowhere.so"))
    monkeypatch.setattr(psj, "_registered", False)
    with pytest.raises(_lib.LibraryNotFoundError, match=r"make jax"):
        psj._register()


# ---------------------------------------------------------------------------------------------
# The handlers on XLA's CPU backend: a build without the stream (PYSOFTMAX_JAX_CPU_TEST), bound
# to stand-in entry points that record the problems the handlers fill.

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PROTO = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_lib.Problem), ctypes.c_void_p)
_LAST = ctypes.CFUNCTYPE(ctypes.c_void_p)
_MESSAGE = ctypes.create_string_buffer(b"a stand-in's message")


@pytest.fixture(scope="module")
def cpu_handlers(tmp_path_factory):
    import shutil
    import subprocess

    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the CPU test handlers")
    out = str(tmp_path_factory.mktemp("ffi") / "libsoftmax_jax_cpu.so")
    subprocess.run([cxx, "-std=c++17", "-O1", "-fPIC", "-shared", "-DPYSOFTMAX_JAX_CPU_TEST", "-isystem",
                    jax.ffi.include_dir(), os.path.join(REPO, "ffi", "jax_ffi.cc"), "-o", out], check=True)
    handlers = ctypes.CDLL(out)
    calls = {"forward": [], "backward": [], "status": 0}

    def record(kind):
        def entry(p, stream):
            q = p.contents
            calls[kind].append(dict(
                rows=q.rows, cols=q.cols, algo=q.algo, dtype=q.dtype, scale=q.scale, causal=q.causal_queries,
                strides=(q.x_row_stride, q.dy_row_stride, q.out_row_stride), mask_dtype=q.mask_dtype,
                mask=(q.mask_col_stride, [(q.mask_shape[d], q.mask_stride[d]) for d in range(q.mask_ndim)]),
                ws=q.workspace_bytes, has_ws=bool(q.workspace), stream=stream, struct=q.struct_size))
            return calls["status"]
        return _PROTO(entry)

    entries = [record("forward"), record("backward"), _LAST(lambda: ctypes.addressof(_MESSAGE))]
    handlers.pysoftmax_jax_bind.argtypes = [ctypes.c_void_p] * 3
    handlers.pysoftmax_jax_bind(*[ctypes.cast(e, ctypes.c_void_p) for e in entries])
    for name in psj._TARGETS:
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(handlers, name)), platform="cpu")
    calls["keep"] = (handlers, entries)
    return calls


@pytest.fixture
def on_cpu(cpu_handlers, monkeypatch):
    if jax.default_backend() != "cpu":
        pytest.skip("JAX's default backend is not the CPU")
    monkeypatch.setattr(psj, "_register", lambda: None)
    monkeypatch.setattr(psj, "_workspace", lambda *key: 96)  # the planner needs a GPU (its key: GPU tests)
    cpu_handlers["forward"].clear()
    cpu_handlers["backward"].clear()
    cpu_handlers["status"] = 0
    return cpu_handlers


@pytest.mark.parametrize("xshape, mshape", [((2, 3, 5, 6), (2, 1, 1, 6)), ((2, 3, 5, 6), (6,)), ((2, 3, 5, 6), (3, 5, 6)),
                                            ((4, 7), (4, 1)), ((2, 3, 5, 6), (1, 3, 1, 6))])
def test_handlers_fill_the_mask_layout_of_the_cupy_path(on_cpu, xshape, mshape):
    x = jnp.ones(xshape, jnp.float32)
    m = jnp.ones(mshape, jnp.float32)
    jax.block_until_ready(jax.jit(lambda a, b: psj.softmax(a, scale=0.5, mask=b))(x, m))
    (p,) = on_cpu["forward"]
    rows = 1
    for n in xshape[:-1]:
        rows *= n
    assert (p["rows"], p["cols"], p["algo"], p["dtype"], p["scale"], p["causal"]) == (rows, xshape[-1], 0, 0, 0.5, 0)
    assert p["strides"][0] == p["strides"][2] == xshape[-1]
    full = (1,) * (len(xshape) - len(mshape)) + mshape
    assert p["mask"] == _ops_layout(full, xshape) and p["mask_dtype"] == _lib.FLOAT32
    assert p["ws"] == 96 and p["has_ws"] and p["stream"] is None and p["struct"] == ctypes.sizeof(_lib.Problem)


def _ops_layout(mshape, xshape):
    from pysoftmax import _ops

    col, dims = _ops.mask_layout("mask", mshape, psj._contiguous(mshape), xshape)
    return (col, [tuple(d) for d in dims])


def test_handlers_causal_dtypes_and_algorithms(on_cpu):
    x = jnp.ones((3, 8, 8), jnp.bfloat16)
    jax.block_until_ready(jax.jit(lambda a: psj.softmax(a, causal=True, algorithm="online"))(x))
    jax.block_until_ready(jax.jit(lambda a: psj.softmax(a, mask=jnp.ones((8,), bool)))(x.astype(jnp.float16)))
    a, b = on_cpu["forward"]
    assert (a["causal"], a["algo"], a["dtype"], a["mask_dtype"]) == (8, _lib.ALGO_ONLINE, _lib.BFLOAT16, _lib.NONE)
    assert (b["causal"], b["dtype"], b["mask_dtype"], b["mask"]) == (0, _lib.FLOAT16, _lib.BOOL, (1, [(24, 0)]))


def test_handlers_under_vmap_see_the_batched_shapes(on_cpu):
    x = jnp.ones((5, 3, 8), jnp.float32)
    m = jnp.ones((5, 8), bool)
    jax.block_until_ready(jax.jit(jax.vmap(lambda a, b: psj.softmax(a, mask=b)))(x, m))
    (p,) = on_cpu["forward"]
    assert (p["rows"], p["cols"]) == (15, 8)
    assert p["mask"] == _ops_layout((5, 1, 8), (5, 3, 8))


def test_handlers_backward_through_grad(on_cpu):
    x = jnp.ones((4, 16), jnp.float32)
    jax.block_until_ready(jax.jit(jax.grad(lambda a: jnp.sum(psj.softmax(a, scale=0.25))))(x))
    (f,) = on_cpu["forward"]
    (b,) = on_cpu["backward"]
    assert (b["rows"], b["cols"], b["scale"], b["strides"]) == (4, 16, 0.25, (16, 16, 16))
    bias = jnp.ones((16,), jnp.float32)
    on_cpu["backward"].clear()
    jax.block_until_ready(jax.jit(jax.grad(lambda a, c: jnp.sum(psj.softmax(a, scale=0.25, mask=c)), argnums=1))(x, bias))
    (b,) = on_cpu["backward"]
    assert b["scale"] == 1.0  # dz first: the bias's gradient is dz summed, x's is scale * dz
    on_cpu["backward"].clear()
    keep = jnp.ones((4, 1), bool)  # a boolean mask: x's gradient only, with the scale
    jax.block_until_ready(jax.jit(jax.grad(lambda a: jnp.sum(psj.softmax(a, scale=0.25, mask=keep))))(x))
    (b,) = on_cpu["backward"]
    assert b["scale"] == 0.25
    dx, db = jax.jit(jax.grad(lambda a, c: jnp.sum(psj.softmax(a, mask=c)), argnums=(0, 1)))(x, jnp.ones((4, 1)))
    assert dx.shape == (4, 16) and db.shape == (4, 1) and db.dtype == jnp.float32


def test_library_errors_come_back_with_the_message(on_cpu):
    on_cpu["status"] = 3  # SOFTMAX_ERROR_RUNTIME
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"INTERNAL.*libsoftmax: a stand-in's message"):
        jax.block_until_ready(jax.jit(psj.softmax)(jnp.ones((2, 4))))
