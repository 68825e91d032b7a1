"""PyTorch face: registered operators with autograd, for eager, ``torch.compile`` and CUDA graphs.

    import pysoftmax.torch as pst
    p = pst.softmax(scores, scale=d ** -0.5, mask=keep, causal=True)   # a torch.Tensor

Operators, in the ``pysoftmax`` namespace, functional (no argument is mutated, outputs alias
nothing), each with a fake implementation for tracing and an autograd formula:

    pysoftmax::softmax(Tensor x, Tensor? mask, float scale, bool causal, str algorithm) -> Tensor
    pysoftmax::softmax_backward(Tensor y, Tensor dy, float scale) -> Tensor

Both work over the last axis and return contiguous tensors. Their CUDA implementations fill the
library's C problem from the tensors' metadata (``data_ptr()``, sizes, strides, dtype), with no
CuPy and no DLPack on the way; outputs and workspaces come from torch's caching allocator, and the
kernels go on ``torch.cuda.current_stream()`` of the input's device, so torch's own ordering,
memory statistics and CUDA-graph pools apply. What metadata alone decides (validation, the mask's
layout, the problem struct, the workspace size) is decided once per key and kept per thread.

Eager calls of :func:`softmax` on plain tensors skip the dispatcher (its Python round trips cost
more than the launch); under ``torch.compile``, ``torch.jit.trace``, a dispatch or function mode,
a functorch transform or a tensor subclass, they go through the registered operator instead.
Not supported: forward-mode AD (refused with NotImplementedError), and ``torch.func.grad`` /
``jacrev`` over the operator (torch's custom-operator autograd does not compose with them);
``torch.func.vmap`` runs through torch's per-sample fallback.

Importing this module imports torch; ``import pysoftmax`` alone never does.
"""

import ctypes
import threading

import torch

from . import _lib, _ops

__all__ = ["softmax", "softmax_backward", "AttentionSoftmax"]

_CODES = {torch.float32: _lib.FLOAT32, torch.float16: _lib.FLOAT16, torch.bfloat16: _lib.BFLOAT16,
          torch.float64: _lib.FLOAT64}
_MASK_CODES = {**_CODES, torch.bool: _lib.BOOL}
_ALGOS = {"fused": _lib.ALGO_FUSED, "online": _lib.ALGO_ONLINE, "naive": _lib.ALGO_NAIVE}
_EXPECTED = "float32, float16, bfloat16 or float64"
_MASK_EXPECTED = "bool (True keeps) or a float dtype (added to the logits)"
_PACK_BYTES = _ops._PACK_BYTES
_CACHE_MAX = 256

_C = torch._C
# The raw current stream and device, without building Stream objects (CUDA builds of torch).
_raw_stream = getattr(_C, "_cuda_getCurrentRawStream", None) or (lambda d: torch.cuda.current_stream(d).cuda_stream)
_current_device = getattr(_C, "_cuda_getDevice", None) or torch.cuda.current_device
_is_compiling = torch.compiler.is_compiling
# Parameters (a learned bias) behave as plain tensors: no __torch_function__ of their own.
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_strided = torch.strided
_function_mode, _dispatch_modes = _C._is_torch_function_mode_enabled, _C._len_torch_dispatch_stack
_functorch, _jit_tracing = _C._are_functorch_transforms_active, _C._get_tracing_state
_forward_ad = torch.autograd.forward_ad


# ---------------------------------------------------------------------------------------------
# Validation: metadata only, so fake tensors (tracing) and real ones are checked alike.


def _check_tensor(t, name, table=_CODES, expected=_EXPECTED, like=None, like_name="x"):
    """Type and dtype of `t`; then its device: CUDA, or `like`'s device when `like` is given."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__module__}.{type(t).__name__}")
    if t.dtype not in table:
        raise TypeError(f"{name}: dtype {t.dtype} is not supported; expected {expected}")
    if like is not None:
        if t.device != like.device:
            raise ValueError(f"{name}: is on {t.device}, {like_name} on {like.device}; expected one device")
    elif t.device.type != "cuda":
        raise ValueError(f"{name}: expected a CUDA tensor, got one on {t.device}")


def _check_forward(x, mask, scale, causal, algorithm):
    _check_tensor(x, "x")
    _ops._scale(scale)
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    if algorithm not in _ALGOS:
        raise ValueError(f"algorithm: {algorithm!r} is not one of 'fused', 'online', 'naive'")
    if causal and x.dim() < 2:
        raise ValueError(f"causal: needs x with at least 2 dimensions (queries, keys), got shape {tuple(x.shape)}")
    if mask is not None:
        _check_tensor(mask, "mask", _MASK_CODES, _MASK_EXPECTED, like=x)
        _ops.mask_layout("mask", tuple(mask.shape), None, tuple(x.shape))  # broadcast check only
    if algorithm == "naive" and (mask is not None or causal):
        raise ValueError("algorithm: 'naive' takes no mask or causal flag; use 'fused' (or 'online')")


def _check_backward(y, dy, scale):
    _check_tensor(y, "y")
    _check_tensor(dy, "dy", like=y, like_name="y")
    _ops._scale(scale)
    if y.shape != dy.shape:
        raise ValueError(f"dy: shape {tuple(dy.shape)} does not match y.shape {tuple(y.shape)}")
    if y.dtype != dy.dtype:
        raise TypeError(f"dy: dtype {dy.dtype} does not match y.dtype {y.dtype}")


# ---------------------------------------------------------------------------------------------
# The CUDA implementations (also the eager path): a cached plan per key, then pointers and a launch.

_local = threading.local()


class _Plan:
    __slots__ = ("p", "ref", "ws", "launch", "copy", "copy_mask", "empty", "like", "shape", "device")


def _new_plan(shape, device):
    """A plan's common part; `like`: the output can be torch.empty_like(the input) (contiguous)."""
    plan = _Plan()
    plan.shape, plan.device = shape, device
    plan.copy = plan.copy_mask = plan.like = False
    plan.empty = _ops._rows_cols(shape)[0] * _ops._rows_cols(shape)[1] == 0
    return plan


def _walk(t):
    """The row stride of `t` as the kernels walk it, or None when it must be copied first."""
    return _ops.walk_stride(tuple(t.shape), t.stride())


def _contiguous_strides(shape):
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _thread_cache():
    try:
        cache = _local.cache
    except AttributeError:
        cache = _local.cache = {}
    if len(cache) >= _CACHE_MAX:
        cache.clear()
    return cache


def _workspace_bytes(p, direction, dev):
    nbytes = ctypes.c_int64(0)
    with torch.cuda.device(dev):
        _lib.check(_lib.lib().softmax_workspace_size(ctypes.byref(p), direction, ctypes.byref(nbytes)))
    return nbytes.value


def _launch(plan, dev):
    """Queue the planned kernels on torch's current stream of device `dev`, with their workspace
    from the caching allocator (stream-ordered: reused only after this launch)."""
    ws = None
    if plan.ws:
        ws = torch.empty(plan.ws, dtype=torch.uint8, device=plan.device)
        plan.p.workspace, plan.p.workspace_bytes = ws.data_ptr(), plan.ws
    if dev == _current_device():
        status = plan.launch(plan.ref, _raw_stream(dev))
    else:
        with torch.cuda.device(dev):
            status = plan.launch(plan.ref, _raw_stream(dev))
    if status:
        _lib.check(status)


def _plan_forward(x, mask, scale, causal, algorithm, xptr, mptr):
    _check_forward(x, mask, scale, causal, algorithm)
    shape = tuple(x.shape)
    plan = _new_plan(shape, x.device)
    if plan.empty:
        return plan
    rows, cols = _ops._rows_cols(shape)
    stride = _walk(x)
    plan.copy = stride is None
    plan.like = x.stride() == _contiguous_strides(shape)
    p = plan.p = _lib.Problem()
    p.algo, p.dtype = _ALGOS[algorithm], _CODES[x.dtype]
    p.rows, p.cols = rows, cols
    p.x_row_stride = cols if plan.copy else stride
    p.out_row_stride = cols
    p.scale = float(scale)
    p.causal_queries = shape[-2] if causal else 0
    aligned = 1 << 20  # never dereferenced: a copy or a fresh output is always aligned
    p.x, p.out = aligned if plan.copy else xptr, aligned
    if mask is not None:
        layout = _ops.mask_layout("mask", tuple(mask.shape), mask.stride(), shape)
        plan.copy_mask = len(layout[1]) > _lib.MAX_DIMS  # too many axes to describe: expanded once a call
        if plan.copy_mask:
            layout = _ops.mask_layout("mask", shape, _contiguous_strides(shape), shape)
        _ops.set_mask(p, layout, aligned if plan.copy_mask else mptr, _MASK_CODES[mask.dtype])
    plan.ws = _workspace_bytes(p, _lib.FORWARD, x.get_device())
    plan.ref = ctypes.byref(p)
    plan.launch = _lib.lib().softmax_forward
    return plan


def _forward_cuda(x, mask, scale, causal, algorithm):
    """pysoftmax::softmax on CUDA tensors: softmax(x * scale + mask) over the last axis."""
    xptr = x.data_ptr()
    dev = x.get_device()
    if mask is None:
        mptr = 0
        key = (x.shape, x.stride(), x.dtype, dev, scale, causal, algorithm, not xptr % _PACK_BYTES)
    else:
        mptr = mask.data_ptr()
        key = (x.shape, x.stride(), x.dtype, dev, scale, causal, algorithm, not xptr % _PACK_BYTES,
               mask.shape, mask.stride(), mask.dtype, mask.get_device(), not mptr % _PACK_BYTES)
    try:
        plan = _local.cache[key]
    except (AttributeError, KeyError):
        plan = _thread_cache()[key] = _plan_forward(x, mask, scale, causal, algorithm, xptr, mptr)
    y = torch.empty_like(x) if plan.like else torch.empty(plan.shape, dtype=x.dtype, device=plan.device)
    if plan.empty:
        return y
    p = plan.p
    if plan.copy:
        x = x.contiguous()
        xptr = x.data_ptr()
    p.x, p.out = xptr, y.data_ptr()
    if mask is not None:
        if plan.copy_mask:
            mask = mask.expand(plan.shape).contiguous()
            mptr = mask.data_ptr()
        p.mask = mptr
    _launch(plan, dev)
    return y


def _plan_backward(y, dy, scale, yptr, dptr):
    _check_backward(y, dy, scale)
    shape = tuple(y.shape)
    plan = _new_plan(shape, y.device)
    if plan.empty:
        return plan
    rows, cols = _ops._rows_cols(shape)
    ys, ds = _walk(y), _walk(dy)
    plan.copy = ys is None  # y
    plan.copy_mask = ds is None  # dy (a grad from .sum() is stride 0 throughout)
    plan.like = y.stride() == _contiguous_strides(shape)
    p = plan.p = _lib.Problem()
    p.algo, p.dtype = _lib.ALGO_FUSED, _CODES[y.dtype]
    p.rows, p.cols = rows, cols
    p.x_row_stride = cols if plan.copy else ys
    p.dy_row_stride = cols if plan.copy_mask else ds
    p.out_row_stride = cols
    p.scale = float(scale)
    aligned = 1 << 20
    p.x = aligned if plan.copy else yptr
    p.dy = aligned if plan.copy_mask else dptr
    p.out = aligned
    plan.ws = _workspace_bytes(p, _lib.BACKWARD, y.get_device())
    plan.ref = ctypes.byref(p)
    plan.launch = _lib.lib().softmax_backward
    return plan


def _backward_cuda(y, dy, scale):
    """pysoftmax::softmax_backward on CUDA tensors: scale * y * (dy - sum(dy * y)) over the last axis."""
    yptr, dptr = y.data_ptr(), dy.data_ptr()
    dev = y.get_device()
    key = (y.shape, y.stride(), dy.shape, dy.stride(), y.dtype, dy.dtype, dev, dy.get_device(), scale,
           not (yptr | dptr) % _PACK_BYTES)
    try:
        plan = _local.cache[key]
    except (AttributeError, KeyError):
        plan = _thread_cache()[key] = _plan_backward(y, dy, scale, yptr, dptr)
    dx = torch.empty_like(y) if plan.like else torch.empty(plan.shape, dtype=y.dtype, device=plan.device)
    if plan.empty:
        return dx
    if plan.copy:
        y = y.contiguous()
        yptr = y.data_ptr()
    if plan.copy_mask:
        dy = dy.contiguous()
        dptr = dy.data_ptr()
    p = plan.p
    p.x, p.dy, p.out = yptr, dptr, dx.data_ptr()
    _launch(plan, dev)
    return dx


# ---------------------------------------------------------------------------------------------
# The operators: schema, CUDA kernels, fake kernels, autograd.

_library = torch.library.Library("pysoftmax", "DEF")
_library.define("softmax(Tensor x, Tensor? mask, float scale, bool causal, str algorithm) -> Tensor",
                tags=(torch.Tag.pt2_compliant_tag,))
_library.define("softmax_backward(Tensor y, Tensor dy, float scale) -> Tensor", tags=(torch.Tag.pt2_compliant_tag,))
_library.impl("softmax", _forward_cuda, "CUDA")
_library.impl("softmax_backward", _backward_cuda, "CUDA")


@torch.library.register_fake("pysoftmax::softmax", lib=_library)
def _forward_fake(x, mask, scale, causal, algorithm):
    _check_forward(x, mask, scale, causal, algorithm)
    return x.new_empty(x.shape)


@torch.library.register_fake("pysoftmax::softmax_backward", lib=_library)
def _backward_fake(y, dy, scale):
    _check_backward(y, dy, scale)
    return y.new_empty(y.shape)


def _sum_to(t, shape, dtype):
    """`t` summed over the axes a tensor of `shape` was broadcast along, accumulated and returned
    in `dtype` (a float32 bias of bfloat16 scores keeps float32's precision)."""
    lead = t.dim() - len(shape)
    dims = list(range(lead)) + [lead + i for i, n in enumerate(shape) if n == 1 and t.shape[lead + i] != 1]
    return (t.sum(dims, keepdim=True, dtype=dtype) if dims else t.to(dtype)).reshape(shape)


def _grads(needs, y, dy, scale, mask_shape, mask_dtype, backward):
    """(dx, dmask) for y = softmax(x * scale + mask): with dz = y * (dy - sum(dy * y)),
    dx = scale * dz and dmask = dz summed over the axes the mask was broadcast along."""
    dx = dmask = None
    if needs[1]:  # a float mask that requires grad: a learned bias (ALiBi, relative positions)
        dz = backward(y, dy, 1.0)
        dmask = _sum_to(dz, mask_shape, mask_dtype)
        if needs[0]:
            dx = dz if scale == 1.0 else dz * scale
    elif needs[0]:
        dx = backward(y, dy, scale)
    return dx, dmask


def _setup_forward(ctx, inputs, output):
    x, mask, scale, causal, algorithm = inputs
    ctx.save_for_backward(output)
    ctx.scale = scale
    ctx.mask_shape = None if mask is None else mask.shape
    ctx.mask_dtype = None if mask is None else mask.dtype


def _op_backward(ctx, dy):
    (y,) = ctx.saved_tensors
    dx, dmask = _grads(ctx.needs_input_grad, y, dy, ctx.scale, ctx.mask_shape, ctx.mask_dtype,
                       torch.ops.pysoftmax.softmax_backward)
    return dx, dmask, None, None, None


def _setup_backward(ctx, inputs, output):
    y, dy, scale = inputs
    ctx.save_for_backward(y, dy)
    ctx.scale = scale


def _op_double_backward(ctx, g):
    """Gradients of dx = s * y * (dy - c), c = sum(dy * y), for an upstream g:
    d/d(dy) = s * y * (g - sum(g * y)) (the softmax backward of g again) and
    d/dy = s * (g * (dy - c) - dy * sum(g * y))."""
    y, dy = ctx.saved_tensors
    s = ctx.scale
    gy = gdy = None
    if ctx.needs_input_grad[1]:
        gdy = torch.ops.pysoftmax.softmax_backward(y, g, s)
    if ctx.needs_input_grad[0]:
        c = (dy * y).sum(-1, keepdim=True)
        gy = s * (g * (dy - c) - dy * (g * y).sum(-1, keepdim=True))
    return gy, gdy, None


torch.library.register_autograd("pysoftmax::softmax", _op_backward, setup_context=_setup_forward, lib=_library)
torch.library.register_autograd("pysoftmax::softmax_backward", _op_double_backward, setup_context=_setup_backward,
                                lib=_library)


class _Softmax(torch.autograd.Function):
    """The eager autograd node: the same formula as the operator's, launched without the dispatcher."""

    @staticmethod
    def forward(ctx, x, mask, scale, causal, algorithm):
        y = _forward_cuda(x, mask, scale, causal, algorithm)
        ctx.save_for_backward(y)
        ctx.meta = (scale, None, None) if mask is None else (scale, mask.shape, mask.dtype)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        scale, mask_shape, mask_dtype = ctx.meta
        if torch.is_grad_enabled():  # create_graph=True: the operator's own backward gives a second order
            bwd = torch.ops.pysoftmax.softmax_backward
        elif mask_shape is None:
            return _backward_cuda(y, dy, scale), None, None, None, None
        else:
            bwd = _backward_cuda
        dx, dmask = _grads(ctx.needs_input_grad, y, dy, scale, mask_shape, mask_dtype, bwd)
        return dx, dmask, None, None, None


# Function.apply's own Python (argument binding for functorch) is for transforms, which _direct
# has excluded: the eager path calls the C implementation it ends in.
try:
    _apply_softmax = super(torch.autograd.Function, _Softmax).apply
except AttributeError:  # pragma: no cover - another torch's layout
    _apply_softmax = _Softmax.apply


# ---------------------------------------------------------------------------------------------
# The user's face.


def _direct(x, mask):
    """Whether an eager call may skip the dispatcher: plain tensors, and nothing (compilation,
    a mode, a functorch transform) that expects to see the operator."""
    return (not _is_compiling() and type(x) in _PLAIN and (mask is None or type(mask) in _PLAIN)
            and x.layout is _strided and not _function_mode() and not _dispatch_modes() and not _functorch()
            and not _jit_tracing())


def _refuse_dual(*tensors):
    """Forward-mode AD has no formula here: a dual input is refused, not given a zero tangent."""
    for t in tensors:
        if t is not None and _forward_ad.unpack_dual(t).tangent is not None:
            raise NotImplementedError("pysoftmax.torch: forward-mode AD (torch.autograd.forward_ad, torch.func.jvp) "
                                      "is not supported; use reverse mode, or torch.softmax for this call")


def softmax(x, dim=-1, *, scale=1.0, mask=None, causal=False, algorithm="fused"):
    """``softmax(x * scale + mask)`` along `dim`, differentiable, for eager and compiled code.

    Parameters
    ----------
    x : torch.Tensor
        Logits on a CUDA device: float32, float16, bfloat16 or float64, any shape.
    dim : int, optional
        The axis to normalise over (default the last), as in ``torch.softmax``.
    scale : float, optional
        Multiplies `x` first (e.g. ``head_dim ** -0.5``); the gradient w.r.t. `x` includes it.
    mask : torch.Tensor, optional
        Boolean (True keeps, as in ``scaled_dot_product_attention``) or float, added to the scaled
        logits; broadcast to ``x.shape`` by the usual rules without being expanded in memory. A
        float mask that requires grad (a learned bias) receives its gradient, summed over the
        axes it was broadcast along.
    causal : bool, optional
        Mask key ``j > i`` for query ``i`` over the last two axes, top-left aligned as in torch's
        ``is_causal``. Needs `dim` to be the last axis.
    algorithm : {'fused', 'online', 'naive'}, optional
        'fused' picks the fastest kernel for the shape; 'online' (2 passes) and 'naive' (3
        passes, no mask or causal) are the reference algorithms.

    Returns
    -------
    torch.Tensor
        Probabilities of `x`'s dtype and shape. A row with every position masked gives zeros,
        and a zero gradient.

    Raises
    ------
    TypeError, ValueError, IndexError
        For a bad argument, naming it, before anything is launched.
    """
    if type(scale) is not float:
        scale = _ops._scale(scale)
    if type(causal) is not bool:
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    if type(algorithm) is not str or algorithm not in _ALGOS:
        raise ValueError(f"algorithm: {algorithm!r} is not one of 'fused', 'online', 'naive'")
    if _forward_ad._current_level >= 0:
        _refuse_dual(x, mask)
    moved = dim != -1
    if moved:
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"dim: expected an int, got {type(dim).__name__}")
        nd = max(x.dim(), 1)
        if not -nd <= dim < nd:
            raise IndexError(f"dim: {dim} is out of range for a tensor of {x.dim()} dimension(s) "
                             f"(expected -{nd} <= dim < {nd})")
        dim %= nd
        moved = dim != x.dim() - 1 and x.dim() > 0
        if moved:
            if causal:
                raise ValueError(f"causal: needs dim to be the last axis (keys), got dim={dim} for shape "
                                 f"{tuple(x.shape)}")
            if mask is not None:  # broadcast first, so the mask's axes move with x's
                _check_tensor(mask, "mask", _MASK_CODES, _MASK_EXPECTED, like=x)
                _ops.mask_layout("mask", tuple(mask.shape), None, tuple(x.shape))
                mask = mask.expand(x.shape).movedim(dim, -1)
            x = x.movedim(dim, -1)
    if _direct(x, mask):
        if not x.is_cuda:
            _check_forward(x, mask, scale, causal, algorithm)  # raises, naming the device
        if torch.is_grad_enabled() and (x.requires_grad or (mask is not None and mask.requires_grad)):
            y = _apply_softmax(x, mask, scale, causal, algorithm)
        else:
            y = _forward_cuda(x, mask, scale, causal, algorithm)
    else:
        y = torch.ops.pysoftmax.softmax(x, mask, scale, causal, algorithm)
    return y.movedim(-1, dim) if moved else y


def softmax_backward(y, dy, *, scale=1.0):
    """The gradient of :func:`softmax` w.r.t. its logits: ``scale * y * (dy - sum(dy * y))``.

    Parameters
    ----------
    y : torch.Tensor
        The forward output (probabilities), over the last axis.
    dy : torch.Tensor
        The gradient w.r.t. `y`: `y`'s shape, dtype and device; any strides.
    scale : float, optional
        The forward's scale.

    Returns
    -------
    torch.Tensor
        ``dx``, contiguous, of `y`'s dtype.
    """
    if not (isinstance(y, torch.Tensor) and isinstance(dy, torch.Tensor)):
        _check_backward(y, dy, scale)  # raises, naming the argument
    if type(scale) is not float:
        scale = _ops._scale(scale)
    if _forward_ad._current_level >= 0:
        _refuse_dual(y, dy)
    if _direct(y, dy) and not (torch.is_grad_enabled() and (y.requires_grad or dy.requires_grad)):
        if not y.is_cuda:
            _check_backward(y, dy, scale)
        return _backward_cuda(y, dy, scale)
    return torch.ops.pysoftmax.softmax_backward(y, dy, scale)


class AttentionSoftmax(torch.nn.Module):
    """Attention probabilities ``softmax(scores * scale + mask)`` over the keys (the last axis).

    Parameters
    ----------
    scale : float, optional
        Multiplies the scores, typically ``head_dim ** -0.5``.
    causal : bool, optional
        Mask key ``j > i`` for query ``i`` (top-left aligned, as torch's ``is_causal``).
    algorithm : {'fused', 'online', 'naive'}, optional
        See :func:`softmax`.

    ``forward(scores, mask=None)`` takes a boolean (True keeps) or additive float mask that
    broadcasts to the scores, e.g. ``[B, 1, 1, S]`` padding or a learned ``[H, S, S]`` bias.
    """

    def __init__(self, scale=1.0, causal=False, algorithm="fused"):
        super().__init__()
        self.scale = _ops._scale(scale)
        if not isinstance(causal, bool):
            raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
        if algorithm not in _ALGOS:
            raise ValueError(f"algorithm: {algorithm!r} is not one of 'fused', 'online', 'naive'")
        self.causal, self.algorithm = causal, algorithm

    def forward(self, scores, mask=None):
        return softmax(scores, -1, scale=self.scale, mask=mask, causal=self.causal, algorithm=self.algorithm)

    def extra_repr(self):
        return f"scale={self.scale}, causal={self.causal}, algorithm={self.algorithm!r}"
