"""JAX face: pysoftmax's kernels under ``jax.jit``, ``jax.grad`` and ``jax.vmap``.

    import pysoftmax.jax as psj
    p = psj.softmax(scores, scale=d ** -0.5, mask=keep, causal=True)   # a jax.Array

The kernels run as XLA FFI custom calls (``jax.ffi.ffi_call``) on XLA's stream, so they trace,
compile, batch and differentiate like any JAX operation. The handlers live in
``libsoftmax_jax.so`` beside ``libsoftmax.so`` (``make jax``, or ``make`` where JAX is installed;
``PYSOFTMAX_JAX_LIB`` points elsewhere): they fill the library's C problem from the buffers'
dimensions and call its entry points. The workspace a call needs is sized at trace time and
passed as an extra result, so nothing is allocated inside a call (CUDA graphs keep working).

Gradients come from ``jax.custom_vjp``: the backward saves only ``y``; a float mask gets its
gradient, summed over the axes it was broadcast along; a boolean mask and ``causal`` get none.
``vmap`` batches the custom calls over a leading axis (the mask is broadcast with x).

Importing this module imports JAX; ``import pysoftmax`` alone never does. The kernels need the
GPU the library was built for: the workspace is sized while tracing, by the library's planner for
the current device, so without one a call raises SoftmaxError ("no usable GPU") as it is traced.
"""

import ctypes
import functools
import numbers
import os
import threading

import jax
import jax.numpy as jnp
import numpy

from . import _lib, _ops

__all__ = ["softmax", "softmax_backward"]

_CODES = {numpy.dtype(jnp.float32): _lib.FLOAT32, numpy.dtype(jnp.float16): _lib.FLOAT16,
          numpy.dtype(jnp.bfloat16): _lib.BFLOAT16, numpy.dtype(jnp.float64): _lib.FLOAT64}
_EXPECTED = "float32, float16, bfloat16 or float64"
_ALGOS = {"fused": _lib.ALGO_FUSED, "online": _lib.ALGO_ONLINE, "naive": _lib.ALGO_NAIVE}
_TARGETS = ("pysoftmax_jax_forward", "pysoftmax_jax_forward_masked", "pysoftmax_jax_backward")
_ALIGNED = 1 << 20  # a pointer the planner sees at trace time: XLA's buffers are aligned

_lock = threading.Lock()
_registered = False


def _handler_path():
    """$PYSOFTMAX_JAX_LIB, else libsoftmax_jax.so beside the loaded library, else in this package
    (where `make jax` writes it)."""
    env = os.environ.get("PYSOFTMAX_JAX_LIB")
    if env:
        return env
    beside = os.path.join(os.path.dirname(_lib.lib().path), "libsoftmax_jax.so")
    package = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libsoftmax_jax.so")
    return beside if os.path.exists(beside) or not os.path.exists(package) else package


def _register():
    """Load the handlers, hand them the library's entry points, register them for CUDA (once)."""
    global _registered
    if _registered:
        return
    with _lock:
        if _registered:
            return
        path = _handler_path()
        if not os.path.exists(path):
            raise _lib.LibraryNotFoundError(
                f"{path} not found: build the JAX handlers with `make jax` (needs jax importable), "
                "or point PYSOFTMAX_JAX_LIB at them")
        handlers = ctypes.CDLL(path)
        lib = _lib.lib()
        addr = lambda fn: ctypes.cast(fn, ctypes.c_void_p).value  # noqa: E731
        handlers.pysoftmax_jax_bind.restype = ctypes.c_int
        handlers.pysoftmax_jax_bind.argtypes = [ctypes.c_void_p] * 3
        version = handlers.pysoftmax_jax_bind(addr(lib.softmax_forward), addr(lib.softmax_backward),
                                              addr(lib.softmax_last_error))
        if version != _lib.ABI_VERSION:
            raise _lib.LibraryNotFoundError(f"{path} has ABI version {version}, this pysoftmax expects "
                                            f"{_lib.ABI_VERSION}: rebuild it with `make jax`")
        platform = "ROCM" if _lib.build_info().get("platform") == "amd" else "CUDA"
        for name in _TARGETS:
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(handlers, name)), platform=platform)
        _registered = True


# ---------------------------------------------------------------------------------------------
# Trace-time checks and sizes: shapes and dtypes only.


def _dtype_of(x, name, table=_CODES, expected=_EXPECTED):
    dtype = numpy.dtype(x.dtype)
    if dtype not in table:
        raise TypeError(f"{name}: dtype {dtype} is not supported; expected {expected}")
    return dtype


def _contiguous(shape):
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


@functools.lru_cache(maxsize=512)
def _workspace(direction, algo, dtype_code, shape, mask_shape, mask_code, causal, scale):
    """Workspace bytes of a call, from the library's planner (the current device's): the same
    problem the handler will fill, but for its pointers (the scale picks the kernels' kind)."""
    rows, cols = _ops._rows_cols(shape)
    if rows * cols == 0:
        return 0
    p = _lib.Problem()
    p.algo, p.dtype = algo, dtype_code
    p.rows, p.cols = rows, cols
    p.x_row_stride = p.dy_row_stride = p.out_row_stride = cols
    p.x = p.dy = p.out = _ALIGNED
    p.scale = scale
    p.causal_queries = shape[-2] if causal else 0
    if mask_shape is not None:
        layout = _ops.mask_layout("mask", mask_shape, _contiguous(mask_shape), shape)
        if len(layout[1]) > _lib.MAX_DIMS:
            raise ValueError(f"mask: shape {mask_shape} broadcasts along too many separate axes of x.shape "
                             f"{shape} (at most {_lib.MAX_DIMS} groups of row axes)")
        _ops.set_mask(p, layout, _ALIGNED, mask_code)
    nbytes = ctypes.c_int64(0)
    _lib.check(_lib.lib().softmax_workspace_size(ctypes.byref(p), direction, ctypes.byref(nbytes)))
    return nbytes.value


def _forward_call(x, mask, scale, causal, algo):
    """The forward custom call on x (softmax over its last axis); mask, if any, has x's rank."""
    _register()
    code = _CODES[numpy.dtype(x.dtype)]
    mshape = None if mask is None else tuple(mask.shape)
    mcode = None if mask is None else (_lib.BOOL if mask.dtype == jnp.bool_ else _CODES[numpy.dtype(mask.dtype)])
    ws = _workspace(_lib.FORWARD, algo, code, tuple(x.shape), mshape, mcode, causal, scale)
    results = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct((ws,), jnp.uint8))
    attrs = dict(algo=numpy.int32(algo), scale=numpy.float64(scale), causal=numpy.int32(causal))
    if mask is None:
        call = jax.ffi.ffi_call("pysoftmax_jax_forward", results, vmap_method="broadcast_all")
        return call(x, **attrs)[0]
    call = jax.ffi.ffi_call("pysoftmax_jax_forward_masked", results, vmap_method="broadcast_all")
    return call(x, mask, **attrs)[0]


def _backward_call(y, dy, scale):
    _register()
    code = _CODES[numpy.dtype(y.dtype)]
    ws = _workspace(_lib.BACKWARD, _lib.ALGO_FUSED, code, tuple(y.shape), None, None, False, scale)
    results = (jax.ShapeDtypeStruct(y.shape, y.dtype), jax.ShapeDtypeStruct((ws,), jnp.uint8))
    call = jax.ffi.ffi_call("pysoftmax_jax_backward", results, vmap_method="broadcast_all")
    return call(y, dy, algo=numpy.int32(_lib.ALGO_FUSED), scale=numpy.float64(scale))[0]


# ---------------------------------------------------------------------------------------------
# Differentiation: y = softmax(x * scale + mask) over the last axis.


def _sum_to(t, shape, dtype):
    """`t` summed over the axes a tensor of `shape` (t's rank) was broadcast along, in `dtype`."""
    axes = tuple(d for d, n in enumerate(shape) if n == 1 and t.shape[d] != 1)
    return (jnp.sum(t, axis=axes, keepdims=True, dtype=dtype) if axes else t.astype(dtype)).reshape(shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _softmax(x, mask, scale, causal, algo):
    return _forward_call(x, mask, scale, causal, algo)


def _softmax_fwd(x, mask, scale, causal, algo):
    y = _forward_call(x, mask, scale, causal, algo)
    return y, (y, mask)  # the mask only for its shape and dtype (and it is usually small)


def _softmax_bwd(scale, causal, algo, res, g):
    y, mask = res
    g = g.astype(y.dtype)
    if mask is None:
        return _backward_call(y, g, scale), None
    if mask.dtype == jnp.bool_:  # a boolean mask takes no gradient
        return _backward_call(y, g, scale), numpy.zeros(mask.shape, dtype=jax.dtypes.float0)
    dz = _backward_call(y, g, 1.0)
    return (dz if scale == 1.0 else dz * jnp.asarray(scale, y.dtype)), _sum_to(dz, mask.shape, mask.dtype)


_softmax.defvjp(_softmax_fwd, _softmax_bwd)


# ---------------------------------------------------------------------------------------------
# The user's face.


def softmax(x, axis=-1, *, scale=1.0, mask=None, causal=False, algorithm="fused"):
    """``softmax(x * scale + mask)`` along `axis`, under ``jit``, ``grad`` and ``vmap``.

    Parameters
    ----------
    x : jax.Array
        Logits: float32, float16, bfloat16 or float64 (with ``jax_enable_x64``), any shape.
    axis : int, optional
        The axis to normalise over (default the last).
    scale : float, optional
        Multiplies `x` first (e.g. ``head_dim ** -0.5``); the gradient w.r.t. `x` includes it.
    mask : jax.Array, optional
        Boolean (True keeps, as ``jax.nn.softmax(where=)``) or float, added to the scaled logits;
        broadcast to ``x.shape`` by NumPy rules without being expanded in memory. A float mask
        receives its gradient, summed over the axes it was broadcast along.
    causal : bool, optional
        Mask key ``j > i`` for query ``i`` over the last two axes, top-left aligned. Needs `axis`
        to be the last.
    algorithm : {'fused', 'online', 'naive'}, optional
        'fused' picks the fastest kernel for the shape; 'online' (2 passes) and 'naive' (3
        passes, no mask or causal) are the reference algorithms.

    Returns
    -------
    jax.Array
        Probabilities of `x`'s dtype and shape; a row with every position masked gives zeros
        (and a zero gradient).

    Raises
    ------
    TypeError, ValueError
        For a bad argument, naming it, when the call is traced.
    """
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"x: expected a JAX array, got {type(x).__module__}.{type(x).__name__}")
    _dtype_of(x, "x")
    scale = _ops._scale(scale)
    if not isinstance(causal, (bool, numpy.bool_)):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    causal = bool(causal)
    if not isinstance(algorithm, str) or algorithm not in _ALGOS:
        raise ValueError(f"algorithm: {algorithm!r} is not one of 'fused', 'online', 'naive'")
    if algorithm == "naive" and (mask is not None or causal):
        raise ValueError("algorithm: 'naive' takes no mask or causal flag; use 'fused' (or 'online')")
    if isinstance(axis, (bool, numpy.bool_)) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"axis: expected an int, got {type(axis).__name__}")
    axis = int(axis)
    nd = max(x.ndim, 1)
    if not -nd <= axis < nd:
        raise ValueError(f"axis: {axis} is out of range for an array of {x.ndim} dimension(s)")
    axis %= nd
    moved = x.ndim > 0 and axis != x.ndim - 1
    if causal and (x.ndim < 2 or moved):
        raise ValueError(f"causal: needs x with at least 2 axes, normalised over the last; got shape "
                         f"{tuple(x.shape)} and axis={axis}")
    if mask is not None:
        if not hasattr(mask, "shape") or not hasattr(mask, "dtype"):
            raise TypeError(f"mask: expected a JAX array, got {type(mask).__name__}")
        if mask.dtype != jnp.bool_:
            _dtype_of(mask, "mask", expected="bool (True keeps) or a float dtype (added to the logits)")
        _ops.mask_layout("mask", tuple(mask.shape), None, tuple(x.shape))  # the broadcast check
        mask = jnp.reshape(mask, (1,) * (x.ndim - mask.ndim) + tuple(mask.shape))
        if moved:
            mask = jnp.moveaxis(jnp.broadcast_to(mask, x.shape), axis, -1)
    if moved:
        x = jnp.moveaxis(x, axis, -1)
    if x.size == 0:
        y = jnp.zeros(x.shape, x.dtype)
    else:
        y = _softmax(x, mask, scale, causal, _ALGOS[algorithm])
    return jnp.moveaxis(y, -1, axis) if moved else y


def softmax_backward(y, dy, *, scale=1.0):
    """The gradient of :func:`softmax` w.r.t. its logits, ``scale * y * (dy - sum(dy * y))``,
    over the last axis (`dy` of `y`'s shape and dtype); jit- and vmap-able, not differentiable
    itself (differentiate :func:`softmax` twice with ``jax.nn.softmax`` instead)."""
    for name, a in (("y", y), ("dy", dy)):
        if not hasattr(a, "shape") or not hasattr(a, "dtype"):
            raise TypeError(f"{name}: expected a JAX array, got {type(a).__name__}")
    _dtype_of(y, "y")
    if tuple(dy.shape) != tuple(y.shape):
        raise ValueError(f"dy: shape {tuple(dy.shape)} does not match y.shape {tuple(y.shape)}")
    if dy.dtype != y.dtype:
        raise TypeError(f"dy: dtype {dy.dtype} does not match y.dtype {y.dtype}")
    scale = _ops._scale(scale)
    if y.size == 0:
        return jnp.zeros(y.shape, y.dtype)
    return _backward_call(y, dy, scale)
