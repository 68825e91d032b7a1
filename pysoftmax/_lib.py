"""The one module that owns libsoftmax.so.

Finds the library (``PYSOFTMAX_LIB``, then this package's directory, then, in a checkout, the
repository's ``build/<platform>/``), declares every function's argtypes/restype in one table, mirrors
``softmax_problem_t`` from ``hip/softmax.h``, and turns C status codes into ``SoftmaxError``
in one place. Nothing here touches the GPU: loading works on a machine without one.
"""

import ctypes
import os
import threading

from ._errors import LibraryNotFoundError, SoftmaxError

ABI_VERSION = 1
MAX_DIMS = 8

# enum softmax_dtype / softmax_algo / softmax_family (hip/softmax.h)
FLOAT32, FLOAT16, BFLOAT16, FLOAT64, BOOL, NONE = 0, 1, 2, 3, 4, -1
ALGO_FUSED, ALGO_ONLINE, ALGO_NAIVE = 0, 1, 2
FAMILY_AUTO, FAMILY_WARP, FAMILY_BLOCK, FAMILY_STREAM = 0, 1, 2, 3
FORWARD, BACKWARD = 0, 1

_STATUS_NAMES = {1: "invalid argument", 2: "unsupported", 3: "GPU runtime error", 4: "internal error"}


class Problem(ctypes.Structure):
    """Mirror of ``softmax_problem_t``; the library checks ``struct_size`` against its own."""

    _fields_ = [
        ("struct_size", ctypes.c_int32),
        ("algo", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("mask_dtype", ctypes.c_int32),
        ("rows", ctypes.c_int64),
        ("cols", ctypes.c_int64),
        ("x", ctypes.c_void_p),
        ("x_row_stride", ctypes.c_int64),
        ("dy", ctypes.c_void_p),
        ("dy_row_stride", ctypes.c_int64),
        ("out", ctypes.c_void_p),
        ("out_row_stride", ctypes.c_int64),
        ("scale", ctypes.c_double),
        ("causal_queries", ctypes.c_int64),
        ("mask", ctypes.c_void_p),
        ("mask_ndim", ctypes.c_int32),
        ("family", ctypes.c_int32),
        ("chunks", ctypes.c_int64),
        ("threads", ctypes.c_int32),
        ("blocks", ctypes.c_int32),
        ("mask_shape", ctypes.c_int64 * MAX_DIMS),
        ("mask_stride", ctypes.c_int64 * MAX_DIMS),
        ("mask_col_stride", ctypes.c_int64),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_int64),
    ]

    def __init__(self):
        super().__init__()
        self.struct_size = ctypes.sizeof(Problem)
        self.mask_dtype = NONE


_P = ctypes.POINTER(Problem)
# name: (restype, argtypes) — the whole ABI in one table.
_SIGNATURES = {
    "softmax_abi_version": (ctypes.c_int, []),
    "softmax_build_info": (ctypes.c_char_p, []),
    "softmax_last_error": (ctypes.c_char_p, []),
    "softmax_workspace_size": (ctypes.c_int, [_P, ctypes.c_int32, ctypes.POINTER(ctypes.c_int64)]),
    "softmax_forward": (ctypes.c_int, [_P, ctypes.c_void_p]),
    "softmax_backward": (ctypes.c_int, [_P, ctypes.c_void_p]),
    "softmax_describe": (ctypes.c_int, [_P, ctypes.c_int32, ctypes.c_char_p, ctypes.c_int64]),
}

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_DIR = os.path.dirname(_PACKAGE_DIR)
_LIB_NAME = "libsoftmax.so"
_lock = threading.Lock()
_lib = None


def candidates():
    """Paths tried, in order: $PYSOFTMAX_LIB, the package directory, and, for a package imported
    from a checkout (not an installed one), the checkout's build dirs."""
    env = os.environ.get("PYSOFTMAX_LIB")
    if env:
        return [env]
    paths = [os.path.join(_PACKAGE_DIR, _LIB_NAME)]
    if os.path.isfile(os.path.join(_REPO_DIR, "hip", "softmax.h")):
        paths += [os.path.join(_REPO_DIR, "build", p, _LIB_NAME) for p in ("nvidia", "amd")]
    return paths


def _load():
    tried = []
    for path in candidates():
        if not os.path.exists(path):
            tried.append(f"{path} (missing)")
            continue
        try:
            handle = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        try:
            for name, (restype, argtypes) in _SIGNATURES.items():
                fn = getattr(handle, name)
                fn.restype, fn.argtypes = restype, argtypes
        except AttributeError as e:
            raise LibraryNotFoundError(f"{path} lacks a function this pysoftmax needs ({e}): rebuild it with `make`") from None
        version = handle.softmax_abi_version()
        if version != ABI_VERSION:
            raise LibraryNotFoundError(
                f"{path} has ABI version {version}, this pysoftmax expects {ABI_VERSION}: rebuild it with `make`"
            )
        handle.path = path
        return handle
    raise LibraryNotFoundError(
        "libsoftmax.so not found; build it with `make` in the repository root, or install the "
        "package with `pip install .` there (or point PYSOFTMAX_LIB at it). Tried: " + "; ".join(tried)
    )


def lib():
    """The loaded library (loaded on first use). Raises LibraryNotFoundError if it is missing."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                _lib = _load()
    return _lib


def check(status):
    """Raise SoftmaxError with the library's message for a non-zero status."""
    if status != 0:
        message = lib().softmax_last_error().decode(errors="replace")
        raise SoftmaxError(f"libsoftmax: {_STATUS_NAMES.get(status, status)}: {message}", status)


def build_info():
    """The library's build description as a dict (platform, archs, version, abi, path)."""
    info = dict(kv.split("=", 1) for kv in lib().softmax_build_info().decode().split(";") if "=" in kv)
    info["path"] = lib().path
    return info
