"""Validation and the public operations.

Every argument is checked from its metadata alone (shape, dtype, strides) before anything touches
the GPU, so a bad call raises ``TypeError``/``ValueError`` naming the argument and launches
nothing. Inputs are CuPy arrays or any object with ``__cuda_array_interface__`` or ``__dlpack__``
(PyTorch, JAX), used in place. A copy is made only when the last axis is not unit-stride or the
leading axes cannot be walked with one row stride. Work goes on the current CuPy stream unless
``stream=`` is given, on the device that holds the input; nothing here synchronises.
"""

import ctypes
import numbers
import threading

import numpy

try:
    import cupy

    _ndarray, _empty = cupy.ndarray, cupy.empty
    _get_device, _current_stream = cupy.cuda.runtime.getDevice, cupy.cuda.get_current_stream
except ImportError:  # pragma: no cover - exercised only on machines without CuPy
    cupy = _ndarray = _empty = _get_device = _current_stream = None

from . import _lib
from ._errors import SoftmaxError

_DTYPES = {"float32": _lib.FLOAT32, "float16": _lib.FLOAT16, "bfloat16": _lib.BFLOAT16, "float64": _lib.FLOAT64}
_MASK_DTYPES = dict(_DTYPES, bool=_lib.BOOL)
_EXPECTED_DTYPES = "float32, float16, bfloat16 or float64"


def _need_cupy():
    if cupy is None:
        raise SoftmaxError("CuPy is not installed: pip install cupy-cuda13x (or the wheel for your toolkit)")


class _Arr:
    """A device array argument: its metadata, read without touching the GPU."""

    __slots__ = ("name", "obj", "cp", "ptr", "shape", "strides", "dtype", "producer_stream", "readonly")

    @property
    def size(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def cupy(self):
        """The argument as a CuPy array (a zero-copy view)."""
        if self.cp is None:
            _need_cupy()
            self.cp = cupy.asarray(self.obj)
        return self.cp

    def device(self):
        """The device id that holds the data."""
        if self.cp is not None:
            return self.cp.device.id
        _need_cupy()
        if self.ptr == 0 and self.size == 0:  # an empty array need not name any memory
            return cupy.cuda.runtime.getDevice()
        try:
            return cupy.cuda.runtime.pointerGetAttributes(self.ptr).device
        except Exception as e:  # no driver, no GPU, or a pointer the runtime does not know
            raise SoftmaxError(f"no usable GPU for {self.name}: {e}") from e

    def extent(self):
        """[lo, hi) byte range the array's elements occupy."""
        lo = hi = self.ptr
        for n, s in zip(self.shape, self.strides):
            if n > 1:
                if s > 0:
                    hi += (n - 1) * s
                else:
                    lo += (n - 1) * s
        return lo, hi + self.dtype.itemsize


def _from_cupy(a, arr):
    a.cp = arr
    a.obj = arr
    a.ptr = arr.data.ptr
    a.shape = arr.shape
    a.strides = arr.strides
    a.dtype = arr.dtype
    a.producer_stream = None
    a.readonly = False
    return a


def _cupy_meta(arr, name):
    a = _Arr()
    a.name = name
    return _from_cupy(a, arr)


def _known_typestr(typestr):
    try:
        return numpy.dtype(typestr).kind in "fcbiu"
    except TypeError:
        return False


# DLPack device types (dlpack.h) of GPU memory (kDLCUDA 2, kDLROCM 10, kDLCUDAManaged 13) and of
# host memory (kDLCPU 1, kDLCUDAHost 3, kDLROCMHost 11).
_DLPACK_GPU = (2, 10, 13)
_DLPACK_HOST = (1, 3, 11)


def _dlpack_device(obj):
    try:
        return tuple(obj.__dlpack_device__())
    except Exception:  # an older producer: CuPy decides
        return None, None


def _import_dlpack(obj, kind, device, launch_stream):
    """A CuPy view of `obj` through DLPack, asked for on the stream the launch will use
    (`launch_stream`, or CuPy's current one when None): the producer then orders that stream
    after its pending work on `obj` (DLPack's stream handshake; an event, never a host sync)."""
    if kind not in _DLPACK_GPU:
        return cupy.from_dlpack(obj)
    with cupy.cuda.Device(device):
        if launch_stream is None:  # CuPy's current stream: the one from_dlpack hands the producer
            return cupy.from_dlpack(obj)
        with launch_stream:
            return cupy.from_dlpack(obj)


def _arr(obj, name, stream=None):
    """Read a device array argument; TypeError if `obj` is not one.

    CuPy arrays are used as they are. Other objects with ``__dlpack__`` are imported through
    DLPack for the launch `stream` (see _import_dlpack): PyTorch's ``__cuda_array_interface__``
    names no stream, so only the handshake orders the launch after a torch side stream's work.
    Objects with ``__cuda_array_interface__`` alone are read from it (v3's stream is waited on
    before the launch); so is an empty array, which has nothing to order."""
    a = _Arr()
    a.name = name
    if cupy is not None and isinstance(obj, cupy.ndarray):
        return _from_cupy(a, obj)
    if isinstance(obj, numpy.ndarray) or numpy.isscalar(obj):
        raise TypeError(
            f"{name}: expected a device array (CuPy, or an object with __cuda_array_interface__ or __dlpack__), "
            f"got {type(obj).__module__}.{type(obj).__name__} in host memory; move it with cupy.asarray()"
        )
    if getattr(obj, "requires_grad", False) is True:
        raise TypeError(
            f"{name}: is a tensor that requires grad, and this CuPy-facing function records no gradient; "
            "use pysoftmax.torch.softmax (autograd, torch.compile, CUDA graphs), or pass it .detach()ed"
        )
    try:
        cai = obj.__cuda_array_interface__
    except (AttributeError, TypeError, RuntimeError, ValueError):  # absent, or refused (torch bfloat16)
        cai = None
    dlpack = hasattr(obj, "__dlpack__")
    if cai is not None and dlpack and not _known_typestr(cai.get("typestr")):
        cai = None  # e.g. torch bfloat16 exports '<V2' here; DLPack names the type
    if cai is not None:
        a.cp = None
        a.obj = obj
        a.ptr = int(cai["data"][0] or 0)
        a.readonly = bool(cai["data"][1])
        a.shape = tuple(int(n) for n in cai["shape"])
        try:
            a.dtype = numpy.dtype(cai["typestr"])
        except TypeError:
            raise TypeError(f"{name}: typestr {cai['typestr']!r} is not a dtype NumPy knows") from None
        strides = cai.get("strides")
        if strides is None:  # C-contiguous
            strides, step = [], a.dtype.itemsize
            for n in reversed(a.shape):
                strides.append(step)
                step *= max(n, 1)
            strides = tuple(reversed(strides))
        a.strides = tuple(int(s) for s in strides)
        a.producer_stream = cai.get("stream")
        if not dlpack or a.size == 0:
            return a
    if dlpack:
        kind, device = _dlpack_device(obj)
        if kind in _DLPACK_HOST:
            raise TypeError(f"{name}: expected a device array, got {type(obj).__module__}.{type(obj).__name__} "
                            "in host memory; move it to the GPU first")
        _need_cupy()
        launch_stream = None
        if kind in _DLPACK_GPU:  # a bad stream= is its own error, not a failed import
            with cupy.cuda.Device(device):
                launch_stream = _resolve_stream(stream, device)[1]
        try:
            arr = _import_dlpack(obj, kind, device, launch_stream)
        except Exception as e:
            if cai is not None:
                return a  # the interface's metadata (and its stream, if it names one) instead
            raise TypeError(f"{name}: could not import it through DLPack ({e})") from e
        return _from_cupy(a, arr)
    raise TypeError(
        f"{name}: expected a CuPy array or an object with __cuda_array_interface__ or __dlpack__, "
        f"got {type(obj).__module__}.{type(obj).__name__}"
    )


def _dtype_code(a, table=_DTYPES, expected=_EXPECTED_DTYPES):
    code = table.get(a.dtype.name)
    if code is None:
        raise TypeError(f"{a.name}: dtype {a.dtype} is not supported; expected {expected}")
    return code


def walk_stride(shape, strides):
    """Elements between consecutive rows of an array of `shape` with element `strides`, when
    every row starts one fixed stride after the last and the last axis is unit-stride; None when
    the kernels cannot walk it as it is. Axes of length 1 never matter."""
    if not shape:
        return 1
    if shape[-1] > 1 and strides[-1] != 1:
        return None
    # Leading axes longer than 1, innermost first: each must step over the whole of the next.
    lead = [(n, s) for n, s in zip(shape[:-1], strides[:-1]) if n > 1][::-1]
    if not lead:
        return max(shape[-1], 1)
    for (n_in, s_in), (_, s_out) in zip(lead, lead[1:]):
        if s_out != s_in * n_in:
            return None
    return lead[0][1]


def _row_stride(a):
    """walk_stride() of a device array argument, whose strides are in bytes."""
    item = a.dtype.itemsize
    if any(s % item for n, s in zip(a.shape, a.strides) if n > 1):
        return None
    return walk_stride(a.shape, [s // item for s in a.strides])


def _scale(scale, name="scale"):
    if isinstance(scale, (bool, numpy.bool_)) or not isinstance(scale, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {type(scale).__name__} {scale!r}")
    return float(scale)


def _check_same(a, b):
    if a.shape != b.shape:
        raise ValueError(f"{b.name}: shape {b.shape} does not match {a.name}.shape {a.shape}")
    if a.dtype != b.dtype:
        raise TypeError(f"{b.name}: dtype {b.dtype} does not match {a.name}.dtype {a.dtype}")


def _elements_may_share_memory(a):
    """Whether two elements of `a` can share bytes: its axes, sorted by stride, must each step
    past everything the shorter-strided ones span (a broadcast view, stride 0, never does)."""
    reach = a.dtype.itemsize
    for stride, n in sorted((abs(s), n) for n, s in zip(a.shape, a.strides) if n > 1):
        if stride < reach:
            return True
        reach += stride * (n - 1)
    return False


def _check_out(out, inputs):
    """`out` must be writable and its elements distinct (the kernels write them concurrently); it
    may be one of the inputs exactly (in place) but must not partly overlap any (judged by byte
    ranges, so interleaved views are refused too)."""
    if out.readonly:
        raise ValueError("out: is read-only (its __cuda_array_interface__ says so)")
    if _elements_may_share_memory(out):
        raise ValueError(f"out: strides {out.strides} for shape {out.shape} make elements share memory "
                         "(a broadcast view?); expected an array whose elements are distinct")
    lo, hi = out.extent()
    for a in inputs:
        if a.size == 0 or out.size == 0:
            continue
        same = a.ptr == out.ptr and a.strides == out.strides
        alo, ahi = a.extent()
        if not same and lo < ahi and alo < hi:
            raise ValueError(f"out: overlaps {a.name} without being {a.name} itself (in place needs out={a.name})")


def mask_layout(name, mshape, mstrides, xshape):
    """Broadcast a mask of `mshape` to x.shape through strides (in elements). Returns
    (col_stride, [(size, stride)...]) over the row index, merged where consecutive axes allow;
    None when `mstrides` is None (strides that are not whole elements: the caller copies the
    mask). Raises ValueError naming `name` when the shapes do not broadcast."""
    nd, md = len(xshape), len(mshape)
    if md > nd:
        raise ValueError(f"{name}: shape {tuple(mshape)} has more dimensions than x.shape {tuple(xshape)}")
    shape = (1,) * (nd - md) + tuple(mshape)
    for d in range(nd):
        if shape[d] != xshape[d] and shape[d] != 1:
            raise ValueError(
                f"{name}: shape {tuple(mshape)} does not broadcast to x.shape {tuple(xshape)} "
                f"(axis {d - nd}: {shape[d]} vs {xshape[d]}; expected 1 or {xshape[d]})"
            )
    if mstrides is None:
        return None
    strides = (0,) * (nd - md) + tuple(mstrides)
    strides = [0 if shape[d] == 1 else strides[d] for d in range(nd)]
    dims = []
    for d in range(nd - 1):
        n, s = xshape[d], strides[d]
        if n == 1:
            continue
        if dims and dims[-1][1] == s * n:  # the outer axis steps exactly over the inner one
            dims[-1] = (dims[-1][0] * n, s)
        else:
            dims.append((n, s))
    rows = 1
    for n in xshape[:-1]:
        rows *= n
    return strides[-1] if nd else 0, dims or [(rows, 0)]


def _mask_layout(m, xshape):
    """mask_layout() of a device array argument, whose strides are in bytes."""
    item = m.dtype.itemsize
    strides = None if any(s % item for s in m.strides) else [s // item for s in m.strides]
    return mask_layout(m.name, m.shape, strides, xshape)


def set_mask(p, layout, ptr, code):
    """Fill the problem's mask fields from a mask_layout() result."""
    p.mask, p.mask_dtype = ptr, code
    p.mask_col_stride = layout[0]
    p.mask_ndim = len(layout[1])
    for d, (n, s) in enumerate(layout[1]):
        p.mask_shape[d], p.mask_stride[d] = n, s


def _resolve_stream(stream, device):
    """(ptr, cupy stream object or None if it is already current) for the launch."""
    if stream is None:
        return cupy.cuda.get_current_stream().ptr, None
    if isinstance(stream, (cupy.cuda.Stream, cupy.cuda.ExternalStream)):
        return int(stream.ptr), stream
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
        ptr = int(stream.cuda_stream)
    elif isinstance(stream, numbers.Integral):
        ptr = int(stream)
    else:
        raise TypeError(f"stream: expected a CuPy stream, a torch.cuda.Stream or a stream pointer, got {type(stream).__name__}")
    return ptr, cupy.cuda.ExternalStream(ptr, device)


def _wait_producers(arrs, stream_ptr, device):
    """CUDA array interface v3: work queued on the producer's stream must finish first."""
    for a in arrs:
        p = a.producer_stream
        if p is not None and int(p) != stream_ptr:
            event = cupy.cuda.Event(disable_timing=True)
            event.record(cupy.cuda.ExternalStream(int(p), device))
            cupy.cuda.ExternalStream(stream_ptr, device).wait_event(event)


class _Context:
    """Enters the input's device and the launch stream only when they are not already current."""

    def __init__(self, device, stream):
        self.device, self.stream = device, stream
        self.entered = []

    def __enter__(self):
        if cupy.cuda.runtime.getDevice() != self.device:
            d = cupy.cuda.Device(self.device)
            d.__enter__()
            self.entered.append(d)
        if self.stream is not None:
            self.stream.__enter__()
            self.entered.append(self.stream)
        return self

    def __exit__(self, *exc):
        for obj in reversed(self.entered):
            obj.__exit__(*exc)


def _workspace(problem, direction):
    nbytes = ctypes.c_int64(0)
    _lib.check(_lib.lib().softmax_workspace_size(ctypes.byref(problem), direction, ctypes.byref(nbytes)))
    if nbytes.value == 0:
        return None
    ws = cupy.empty(nbytes.value, dtype=numpy.uint8)
    problem.workspace = ws.data.ptr
    problem.workspace_bytes = nbytes.value
    return ws


def _walkable(a):
    """A CuPy array with one row stride and a unit-stride last axis: `a` itself, or a copy."""
    stride = _row_stride(a)
    if stride is not None:
        return a.cupy(), stride
    arr = cupy.ascontiguousarray(a.cupy())
    return arr, max(arr.shape[-1], 1) if arr.ndim else 1


def _check_blocks(blocks):
    if not 0 <= blocks < 1 << 31:  # the C field is 32-bit: a larger value would wrap
        raise ValueError(f"blocks: {blocks} is not a grid size (expected 0 <= blocks < 2**31, 0 = automatic)")


def _run(direction, algo, inputs, mask, out, shape, dtype, fill, stream, family, chunks, threads, blocks):
    """Common tail of every operation: device/stream, copies, output, workspace, launch.

    `inputs` are the already validated _Arr operands (x, or y and dy); `fill(problem, arrays,
    strides)` sets the direction's fields."""
    _need_cupy()
    device = inputs[0].device()
    for a in inputs[1:] + [m for m in (mask, out) if m is not None]:
        d = a.device()
        if d != device:
            raise ValueError(f"{a.name}: is on device {d}, {inputs[0].name} on device {device}")
    with _Context(device, None):
        stream_ptr, stream_obj = _resolve_stream(stream, device)
        with _Context(device, stream_obj):
            _wait_producers(inputs + [m for m in (mask, out) if m is not None], stream_ptr, device)
            if out is None:
                result = target = cupy.empty(shape, dtype=dtype)
                target_stride = max(shape[-1], 1) if shape else 1
            else:
                result = out.cupy()
                target_stride = _row_stride(out)
                target = result if target_stride is not None else cupy.empty(shape, dtype=dtype)
                if target_stride is None:
                    target_stride = max(shape[-1], 1) if shape else 1
            rows_cols = _rows_cols(shape)
            if rows_cols[0] * rows_cols[1] == 0:
                return result
            arrays, strides = zip(*(_walkable(a) for a in inputs))
            p = _lib.Problem()
            p.algo, p.rows, p.cols = algo, rows_cols[0], rows_cols[1]
            p.out, p.out_row_stride = target.data.ptr, target_stride
            p.family, p.chunks, p.threads, p.blocks = family, chunks, threads, blocks
            keep = fill(p, arrays, strides)
            ws = _workspace(p, direction)
            launch = _lib.lib().softmax_forward if direction == _lib.FORWARD else _lib.lib().softmax_backward
            _lib.check(launch(ctypes.byref(p), ctypes.c_void_p(stream_ptr)))
            del keep, ws  # the pool is stream-ordered: released only after the queued work
            if target is not result:
                result[...] = target
            return result


# ---------------------------------------------------------------------------------------------
# The fast path: CuPy arrays on the current device and stream, walkable as they are (one row
# stride, unit-stride last axis), with or without a mask, no overrides. Such a call needs none of
# the general path's interface parsing, copies or context switches: everything that can be
# decided from metadata (validation, the mask's layout, the problem struct, the workspace size)
# is decided once per key (direction, algorithm, shapes, strides, dtypes, devices, scale, causal,
# alignment) and kept per thread, so a call costs a dictionary look-up, the pointers and the C
# call. Anything else, or anything the planner refuses, takes the general path, which raises the
# errors it always has.

_fast_local = threading.local()
_FAST_CACHE_MAX = 256
# Bytes of the kernels' vector access (kPackBytes, hip/kernels.cuh): the plan depends on each
# pointer's offset inside it (aligned rows take vector packs, rows whose arrays share one offset
# may straddle, others go element by element), so the fast path's cache keys on the offsets.
_PACK_BYTES = 16
_NOT_FAST = object()  # a key the general path takes


class _FastEntry:
    __slots__ = ("p", "ref", "ws_bytes", "launch")


def _fast_plan(direction, algo, inputs, mask, out, scale, causal, ptrs, mptr):
    """The cached part of a fast call, or _NOT_FAST where the general path must decide."""
    x = inputs[0]
    shape = x.shape
    code = _DTYPES.get(x.dtype.name)
    if code is None or x.size == 0 or x.ndim == 0 or (causal and x.ndim < 2):
        return _NOT_FAST
    dev = x.data.device_id
    operands = list(inputs) + ([out] if out is not None else [])
    strides = []
    for a in operands:
        if a.shape != shape or a.dtype != x.dtype or a.data.device_id != dev:
            return _NOT_FAST
        stride = _row_stride(_cupy_meta(a, "x"))
        if stride is None:
            return _NOT_FAST
        strides.append(stride)
    if out is not None and _elements_may_share_memory(_cupy_meta(out, "out")):
        return _NOT_FAST
    p = _lib.Problem()
    p.algo, p.dtype = algo, code
    p.rows, p.cols = _rows_cols(shape)
    p.x_row_stride = strides[0]
    if len(inputs) > 1:
        p.dy_row_stride = strides[1]
    p.out_row_stride = strides[-1] if out is not None else shape[-1]
    p.causal_queries = shape[-2] if causal else 0
    p.scale = scale
    # Alignment is all the planner reads; a fresh output starts on a pack boundary.
    p.x, p.out = ptrs[0], (ptrs[0] - ptrs[0] % _PACK_BYTES if out is None else out.data.ptr)
    if len(inputs) > 1:
        p.dy = ptrs[1]
    if mask is not None:
        mcode = _MASK_DTYPES.get(mask.dtype.name)
        if mcode is None or mask.data.device_id != dev:
            return _NOT_FAST
        try:
            layout = _mask_layout(_cupy_meta(mask, "mask"), shape)
        except ValueError:
            return _NOT_FAST
        if layout is None or len(layout[1]) > _lib.MAX_DIMS:
            return _NOT_FAST
        set_mask(p, layout, mptr, mcode)
    nbytes = ctypes.c_int64(0)
    if _lib.lib().softmax_workspace_size(ctypes.byref(p), direction, ctypes.byref(nbytes)) != 0:
        return _NOT_FAST
    e = _FastEntry()
    e.p, e.ref, e.ws_bytes = p, ctypes.byref(p), nbytes.value
    e.launch = _lib.lib().softmax_forward if direction == _lib.FORWARD else _lib.lib().softmax_backward
    return e


def _fast(direction, algo, inputs, mask, out, scale, causal):
    """The call on the fast path, or None for the general path (see above)."""
    x = inputs[0]
    if type(x) is not _ndarray or type(scale) not in (float, int) or type(causal) is not bool:
        return None
    xdata = x.data
    dev = xdata.device_id
    if dev != _get_device():
        return None
    xptr = xdata.ptr
    key = (direction, algo, x.shape, x.strides, x.dtype, dev, scale, causal)
    ptrs = [xptr]
    offsets = xptr % _PACK_BYTES
    if len(inputs) > 1:
        dy = inputs[1]
        if type(dy) is not _ndarray:
            return None
        ddata = dy.data
        ptrs.append(ddata.ptr)
        offsets = (offsets, ddata.ptr % _PACK_BYTES)
        key += (dy.shape, dy.strides, dy.dtype, ddata.device_id)
    mptr = 0
    if mask is not None:
        if type(mask) is not _ndarray:
            return None
        mptr = mask.data.ptr
        key += (mask.shape, mask.strides, mask.dtype, mask.data.device_id, not mptr % _PACK_BYTES)
    if out is not None:
        # [ptr, ptr + nbytes) is an array's extent only when it is C-contiguous: an out= with any
        # other layout is the general path's, whose overlap check reads the strides.
        if type(out) is not _ndarray or not out.flags.c_contiguous or any(not a.flags.c_contiguous for a in inputs):
            return None
        optr = out.data.ptr
        offsets = (offsets, optr % _PACK_BYTES)
        hi = optr + out.nbytes
        for a, ptr in zip(inputs, ptrs):  # in place is fine; a partial overlap is the general path's error
            if ptr != optr and ptr < hi and optr < ptr + a.nbytes:
                return None
            if ptr == optr and a.strides != out.strides:
                return None
        key += (out.shape, out.strides, out.dtype, out.data.device_id)
    key += (offsets,)
    try:
        e = _fast_local.cache[key]
    except (AttributeError, KeyError):
        try:
            cache = _fast_local.cache
        except AttributeError:
            cache = _fast_local.cache = {}
        if len(cache) >= _FAST_CACHE_MAX:
            cache.clear()
        e = cache[key] = _fast_plan(direction, algo, inputs, mask, out, scale, causal, ptrs, mptr)
    if e is _NOT_FAST:
        return None
    if out is None:
        out = _empty(x.shape, dtype=x.dtype)
    p = e.p
    p.x, p.out = xptr, out.data.ptr
    if len(ptrs) > 1:
        p.dy = ptrs[1]
    if mask is not None:
        p.mask = mptr
    ws = None
    if e.ws_bytes:
        ws = _empty(e.ws_bytes, dtype=numpy.uint8)
        p.workspace, p.workspace_bytes = ws.data.ptr, e.ws_bytes
    status = e.launch(e.ref, _current_stream().ptr)
    if status:
        _lib.check(status)
    del ws  # stream-ordered pool: reused only after the queued work
    return out


def _rows_cols(shape):
    if not shape:
        return 1, 1
    rows = 1
    for n in shape[:-1]:
        rows *= n
    return rows, shape[-1]


def _axis(axis, ndim):
    if isinstance(axis, (bool, numpy.bool_)) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"axis: expected an int, got {type(axis).__name__}")
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise ValueError(f"axis: {axis} is out of range for an array of {ndim} dimension(s)")
    return axis % max(ndim, 1)


def forward(x, *, algo=_lib.ALGO_FUSED, axis=-1, scale=1.0, mask=None, causal=False, out=None, stream=None,
            family=_lib.FAMILY_AUTO, chunks=0, threads=0, blocks=0):
    """Forward softmax with every option; the public functions are thin views of this.

    `family`, `chunks`, `threads` and `blocks` (a grid cap) override the dispatcher (tests and
    tools/tune.py)."""
    _check_blocks(blocks)
    if (stream is None and axis == -1 and type(axis) is int and family == chunks == threads == blocks == 0
            and cupy is not None):
        y = _fast(_lib.FORWARD, algo, (x,), mask, out, scale, causal)
        if y is not None:
            return y
    xa = _arr(x, "x", stream)
    code = _dtype_code(xa)
    ndim = len(xa.shape)
    axis = _axis(axis, ndim)
    scale = _scale(scale)
    if not isinstance(causal, (bool, numpy.bool_)):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    if causal and ndim < 2:
        raise ValueError(f"causal: needs x with at least 2 dimensions (queries, keys), got shape {xa.shape}")
    oa = None
    if out is not None:
        oa = _arr(out, "out", stream)
        _check_same(xa, oa)
        _check_out(oa, [xa])
    ma, mcode, layout = None, _lib.NONE, None
    if mask is not None:
        ma = _arr(mask, "mask", stream)
        mcode = _dtype_code(ma, _MASK_DTYPES, "bool (True keeps) or a float dtype (added to the logits)")
        layout = _mask_layout(ma, xa.shape)
    if ndim and axis != ndim - 1:
        _need_cupy()
        xa.device()  # raises SoftmaxError without a usable GPU, before CuPy is asked for a view
        moved = cupy.moveaxis(xa.cupy(), axis, -1)
        y = forward(moved, algo=algo, scale=scale, stream=stream, family=family, chunks=chunks, threads=threads,
                    blocks=blocks)
        y = cupy.moveaxis(y, -1, axis)
        if oa is None:
            return y
        with _Context(oa.device(), _resolve_stream(stream, oa.device())[1]):
            oa.cupy()[...] = y
        return oa.cupy()
    state = {}

    def fill(p, arrays, strides):
        p.dtype = code
        p.x, p.x_row_stride = arrays[0].data.ptr, strides[0]
        p.scale = scale
        p.causal_queries = xa.shape[-2] if causal else 0
        if ma is not None:
            m, lay = ma, layout
            if lay is None or len(lay[1]) > _lib.MAX_DIMS:  # odd strides, or too many axes to describe
                state["mask"] = cupy.ascontiguousarray(cupy.broadcast_to(ma.cupy(), xa.shape))
                m = _arr(state["mask"], "mask")
                lay = _mask_layout(m, xa.shape)
            set_mask(p, lay, m.ptr, mcode)
        return arrays, state

    shape = xa.shape
    return _run(_lib.FORWARD, algo, [xa], ma, oa, shape, xa.dtype, fill, stream, family, chunks, threads, blocks)


def backward_impl(y, dy, *, algo=_lib.ALGO_FUSED, scale=1.0, out=None, stream=None, family=_lib.FAMILY_AUTO,
                  chunks=0, threads=0, blocks=0):
    """Backward softmax with every option; `backward` and `naive_backward` are views of this."""
    _check_blocks(blocks)
    if stream is None and family == chunks == threads == blocks == 0 and cupy is not None:
        dx = _fast(_lib.BACKWARD, algo, (y, dy), None, out, scale, False)
        if dx is not None:
            return dx
    ya = _arr(y, "y", stream)
    code = _dtype_code(ya)
    da = _arr(dy, "dy", stream)
    _check_same(ya, da)
    scale = _scale(scale)
    oa = None
    if out is not None:
        oa = _arr(out, "out", stream)
        _check_same(ya, oa)
        _check_out(oa, [ya, da])

    def fill(p, arrays, strides):
        p.dtype = code
        p.x, p.x_row_stride = arrays[0].data.ptr, strides[0]
        p.dy, p.dy_row_stride = arrays[1].data.ptr, strides[1]
        p.scale = scale
        return arrays

    return _run(_lib.BACKWARD, algo, [ya, da], None, oa, ya.shape, ya.dtype, fill, stream, family, chunks, threads,
                blocks)


def plan(shape, dtype, *, direction="forward", algo="fused", family="auto", chunks=0, threads=0, blocks=0,
         aligned=True, causal_queries=0, mask=False):
    """The kernel family and configuration the dispatcher picks for a contiguous array (a dict).
    causal_queries > 0 plans the forward under a causal limit over that many queries (as
    fused(causal=True) passes); mask=True with a boolean mask (one row broadcast to every row).
    aligned=False plans arrays that all start one element past a 16-byte boundary (long rows then
    straddle: rows_stream's vector packs over each row's aligned body), aligned="mixed" an input
    one element past it and an aligned output (element by element).

    For tests and tuning; needs a GPU (the plan depends on the device's SM count and warp size)."""
    _need_cupy()
    shape = tuple(shape)
    rows, cols = _rows_cols(shape)
    p = _lib.Problem()
    p.algo = {"fused": _lib.ALGO_FUSED, "online": _lib.ALGO_ONLINE, "naive": _lib.ALGO_NAIVE}[algo]
    p.dtype = _DTYPES[numpy.dtype(dtype).name]
    p.rows, p.cols = rows, cols
    p.scale = 1.0  # a scale the forward folds into its exponent, as fused() passes by default
    item = numpy.dtype(dtype).itemsize
    if isinstance(aligned, str):
        if aligned != "mixed":
            raise ValueError(f"aligned: {aligned!r} (expected True, False or 'mixed')")
        off, out_off = item, 0
    else:
        off = out_off = 0 if aligned else item
    base = 1 << 20  # never dereferenced: only alignment is read
    p.x = p.dy = base + off
    p.out = base + out_off
    p.x_row_stride = p.dy_row_stride = p.out_row_stride = cols
    p.family = {"auto": _lib.FAMILY_AUTO, "warp": _lib.FAMILY_WARP, "block": _lib.FAMILY_BLOCK,
                "stream": _lib.FAMILY_STREAM}[family]
    p.chunks, p.threads, p.blocks = chunks, threads, blocks
    p.causal_queries = causal_queries
    if mask:
        p.mask, p.mask_dtype, p.mask_ndim, p.mask_col_stride = base, _lib.BOOL, 1, 1
        p.mask_shape[0], p.mask_stride[0] = rows, 0
    buf = ctypes.create_string_buffer(512)
    _lib.check(_lib.lib().softmax_describe(ctypes.byref(p), 0 if direction == "forward" else 1, buf, len(buf)))
    out = {}
    for kv in buf.value.decode().split():
        k, v = kv.split("=", 1)
        out[k] = int(v) if v.lstrip("-").isdigit() else v
    return out
