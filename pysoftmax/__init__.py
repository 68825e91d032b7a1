"""pysoftmax — softmax forward and backward on GPU arrays, from HIP kernels written once.

Every function works over the last axis (``naive``/``online`` take ``axis=``), accepts CuPy arrays
and any object with ``__cuda_array_interface__`` or ``__dlpack__`` (PyTorch, JAX) without a copy,
returns a CuPy array (or writes ``out=``), and queues its work on the current CuPy stream unless
``stream=`` is given. Supported dtypes: float32, float16, bfloat16, float64; arithmetic is float32
(float64 for float64). Importing works without a GPU or the library; calls then raise
``SoftmaxError``.
"""

from . import _lib, _ops
from ._errors import LibraryNotFoundError, SoftmaxError
from ._version import __version__

# C-contiguous-or-walkable CuPy arrays on the current device and stream take _ops._fast (a cached
# plan); everything else, and every error, takes the general path behind it.
_fast, _FORWARD, _BACKWARD = _ops._fast, _lib.FORWARD, _lib.BACKWARD

__all__ = [
    "naive",
    "online",
    "fused",
    "backward",
    "naive_backward",
    "build_info",
    "SoftmaxError",
    "LibraryNotFoundError",
    "__version__",
]


def naive(x, *, axis=-1, out=None, stream=None):
    """Softmax by the textbook 3-pass algorithm (max, sum of exp, normalise).

    Parameters
    ----------
    x : cupy.ndarray or device array
        Logits, float32, float16, bfloat16 or float64.
    axis : int, optional
        Axis to normalise over (default the last).
    out : cupy.ndarray, optional
        Where to write the result: same shape and dtype as `x`; may be `x` itself.
    stream : cupy.cuda.Stream, torch.cuda.Stream or int, optional
        Stream to queue the work on (default: CuPy's current stream).

    Returns
    -------
    cupy.ndarray
        ``exp(x - max) / sum(exp(x - max))`` along `axis`. A row of all ``-inf`` gives zeros;
        a NaN in a row gives NaN in that row.

    Notes
    -----
    Reads `x` three times and writes once; kept as the reference the fast paths are checked and
    measured against. Use :func:`fused` for speed.
    """
    if stream is None and type(axis) is int and axis == -1:
        y = _fast(_FORWARD, _lib.ALGO_NAIVE, (x,), None, out, 1.0, False)
        if y is not None:
            return y
    return _ops.forward(x, algo=_lib.ALGO_NAIVE, axis=axis, out=out, stream=stream)


def online(x, *, axis=-1, out=None, stream=None):
    """Softmax by the 2-pass online algorithm (running max and sum, then normalise).

    Parameters and returns as :func:`naive`.

    Notes
    -----
    Reads `x` twice and writes once (Milakov & Gimelshein, 2018). Rows are split across blocks
    when there are too few rows to fill the GPU, so a single very long row is still fast.
    """
    if stream is None and type(axis) is int and axis == -1:
        y = _fast(_FORWARD, _lib.ALGO_ONLINE, (x,), None, out, 1.0, False)
        if y is not None:
            return y
    return _ops.forward(x, algo=_lib.ALGO_ONLINE, axis=axis, out=out, stream=stream)


def fused(x, *, scale=1.0, mask=None, causal=False, out=None, stream=None):
    """``softmax(x * scale + mask)`` over the last axis in one pass: attention probabilities.

    Parameters
    ----------
    x : cupy.ndarray or device array
        Scores, float32, float16, bfloat16 or float64, any number of dimensions.
    scale : float, optional
        Multiplies `x` before the mask is applied (e.g. ``head_dim ** -0.5``).
    mask : device array, optional
        Boolean (True keeps, as ``torch.nn.functional.scaled_dot_product_attention``) or a float
        array added to the scaled logits. Broadcast to ``x.shape`` by NumPy rules through strides,
        never expanded in memory: ``[B,1,1,S]`` padding, ``[B,1,S,S]``, ``[S,S]``, ``[S]`` ...
    causal : bool, optional
        Mask key ``j > i`` for query ``i`` over the last two axes (queries, keys). Top-left aligned
        like torch's ``is_causal``: with more keys than queries, query ``i`` still sees keys
        ``0..i``; with more queries than keys, queries ``i >= keys - 1`` see every key.
    out : cupy.ndarray, optional
        Same shape and dtype as `x`; may be `x` itself.
    stream : cupy.cuda.Stream, torch.cuda.Stream or int, optional
        Stream to queue the work on (default: CuPy's current stream).

    Returns
    -------
    cupy.ndarray
        The probabilities. A row with every position masked gives zeros.

    Notes
    -----
    Rows that fit on chip are read once and written once; longer rows (any length works) take a
    2-pass path whose second read mostly hits L2.
    """
    if stream is None:
        y = _fast(_FORWARD, _lib.ALGO_FUSED, (x,), mask, out, scale, causal)
        if y is not None:
            return y
    return _ops.forward(x, algo=_lib.ALGO_FUSED, scale=scale, mask=mask, causal=causal, out=out, stream=stream)


def backward(y, dy, *, scale=1.0, out=None, stream=None):
    """Gradient of the softmax w.r.t. its scores: ``scale * y * (dy - sum(dy * y))``.

    Parameters
    ----------
    y : cupy.ndarray or device array
        The forward output (probabilities).
    dy : cupy.ndarray or device array
        Gradient w.r.t. `y`; same shape and dtype as `y`.
    scale : float, optional
        The forward `scale`, so that the result is the gradient w.r.t. the unscaled `x`.
    out : cupy.ndarray, optional
        Same shape and dtype as `y`; may be `y` or `dy` itself.
    stream : cupy.cuda.Stream, torch.cuda.Stream or int, optional
        Stream to queue the work on (default: CuPy's current stream).

    Returns
    -------
    cupy.ndarray
        ``dx`` along the last axis. Masked positions (``y == 0``) get zero gradient.
    """
    if stream is None:
        dx = _fast(_BACKWARD, _lib.ALGO_FUSED, (y, dy), None, out, scale, False)
        if dx is not None:
            return dx
    return _ops.backward_impl(y, dy, algo=_lib.ALGO_FUSED, scale=scale, out=out, stream=stream)


def naive_backward(y, dy, *, scale=1.0, out=None, stream=None):
    """:func:`backward` in two passes over global memory (the reference it is checked against).

    Parameters and returns as :func:`backward`.
    """
    return _ops.backward_impl(y, dy, algo=_lib.ALGO_NAIVE, scale=scale, out=out, stream=stream)


def build_info():
    """How the loaded library was built.

    Returns
    -------
    dict
        ``platform`` (nvidia or amd), ``archs``, ``version``, ``abi``, ``max_dims`` and ``path``.
        Raises :class:`LibraryNotFoundError` if the library is missing (run ``make``).
    """
    return _lib.build_info()
