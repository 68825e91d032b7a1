"""Loading, ABI mirror and argument validation: needs no GPU (runs on any machine).

Device arrays are faked with objects exposing ``__cuda_array_interface__`` whose pointers are
never dereferenced. The `no_gpu` fixture turns any GPU touch (CuPy, the array's device, the
launch) into an AssertionError, so every validation error below is shown to be raised before
anything reaches the GPU; a valid call reaches the launch stage and trips the guard instead.
"""

import ctypes
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy
import pytest

import pysoftmax
from pysoftmax import _lib, _ops

from conftest import HAS_GPU  # tests/ is not a package: pytest puts tests/ itself on sys.path

try:
    import cupy
except ImportError:  # pragma: no cover
    cupy = None

REPO = Path(__file__).resolve().parent.parent
# The directory pysoftmax was imported from: the checkout, or site-packages for an installed one;
# the subprocesses below import the same.
IMPORT_ROOT = Path(pysoftmax.__file__).resolve().parent.parent
CC = shutil.which("gcc") or shutil.which("cc")


# ---------------------------------------------------------------------------------------------
# Fake device arrays and the GPU guard


class FakeDeviceArray:
    """Metadata of a device array through ``__cuda_array_interface__`` v3; no memory behind it."""

    _next = 0x7F00_0000_0000

    def __init__(self, shape, dtype="float32", ptr=None, strides=None):
        if ptr is None:  # a fresh, disjoint 16 MiB region per array
            ptr = FakeDeviceArray._next
            FakeDeviceArray._next += 1 << 24
        self.ptr = ptr
        self.__cuda_array_interface__ = {
            "version": 3,
            "shape": tuple(shape),
            "typestr": numpy.dtype(dtype).str,
            "data": (ptr, False),
            "strides": None if strides is None else tuple(strides),
        }


def fake(shape, dtype="float32", **kw):
    return FakeDeviceArray(shape, dtype, **kw)


class GpuTouched(AssertionError):
    pass


class _CupyGuard:
    """Stands in for the cupy module in _ops: `isinstance(x, cupy.ndarray)` works, the rest fails."""

    ndarray = cupy.ndarray if cupy is not None else type("NoNdarray", (), {})

    def __getattr__(self, name):
        raise GpuTouched(f"validation touched the GPU: cupy.{name}")


@pytest.fixture
def no_gpu(monkeypatch):
    def touched(what):
        def fail(*args, **kwargs):
            raise GpuTouched(f"validation touched the GPU: {what}")

        return fail

    monkeypatch.setattr(_ops, "cupy", _CupyGuard())
    monkeypatch.setattr(_ops._Arr, "device", touched("_Arr.device"))
    monkeypatch.setattr(_ops._Arr, "cupy", touched("_Arr.cupy"))
    monkeypatch.setattr(_ops, "_run", touched("_ops._run"))


FORWARD = {"fused": pysoftmax.fused, "naive": pysoftmax.naive, "online": pysoftmax.online}
BACKWARD = {"backward": pysoftmax.backward, "naive_backward": pysoftmax.naive_backward}
ALL = {**FORWARD, **BACKWARD}


def call(name, x, **kw):
    """Call `name` with `x` as its (first) data argument; backward gets a matching dy."""
    dy = kw.pop("dy", None)
    if name in BACKWARD:
        return ALL[name](x, fake((4, 8)) if dy is None else dy, **kw)
    return ALL[name](x, **kw)


def first_arg(name):
    return "y" if name in BACKWARD else "x"


# ---------------------------------------------------------------------------------------------
# Import, public names, build info, loading


def test_import_without_loading_the_library():
    # A fresh interpreter, no library anywhere: import still works and loads nothing.
    code = "import pysoftmax, pysoftmax._lib as L; print(L._lib is None, pysoftmax.__version__)"
    env = dict(os.environ, PYSOFTMAX_LIB=str(REPO / "no-such-dir" / "libsoftmax.so"))
    env["PYTHONPATH"] = os.pathsep.join([str(IMPORT_ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=IMPORT_ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", pysoftmax.__version__]


def test_all():
    expected = {"naive", "online", "fused", "backward", "naive_backward", "build_info",
                "SoftmaxError", "LibraryNotFoundError", "__version__"}
    assert set(pysoftmax.__all__) == expected
    assert len(pysoftmax.__all__) == len(expected)
    for name in expected:
        assert hasattr(pysoftmax, name), name
    for name in ("naive", "online", "fused", "backward", "naive_backward", "build_info"):
        assert callable(getattr(pysoftmax, name)) and getattr(pysoftmax, name).__doc__


def test_exception_hierarchy():
    assert issubclass(pysoftmax.SoftmaxError, RuntimeError)
    assert issubclass(pysoftmax.LibraryNotFoundError, pysoftmax.SoftmaxError)
    assert issubclass(pysoftmax.LibraryNotFoundError, ImportError)
    assert pysoftmax.SoftmaxError("m", 3).status == 3


def test_version_string():
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", pysoftmax.__version__)


def test_build_info():
    info = pysoftmax.build_info()
    assert {"platform", "archs", "version", "abi", "max_dims", "path"} <= set(info)
    assert info["platform"] in {"nvidia", "amd"}
    assert info["version"] == pysoftmax.__version__
    assert info["abi"] == "1" == str(_lib.ABI_VERSION)
    assert info["max_dims"] == str(_lib.MAX_DIMS)
    assert os.path.isfile(info["path"]) and info["path"] in _lib.candidates()
    archs = info["archs"].split(",")
    pattern = r"sm_\d+a?" if info["platform"] == "nvidia" else r"gfx[0-9a-f]+"
    assert archs and all(re.fullmatch(pattern, a) for a in archs), info["archs"]


def test_candidates_default(monkeypatch):
    monkeypatch.delenv("PYSOFTMAX_LIB", raising=False)
    package_dir = Path(pysoftmax.__file__).resolve().parent
    expected = [str(package_dir / "libsoftmax.so")]
    if (IMPORT_ROOT / "hip" / "softmax.h").is_file():  # imported from a checkout: its build dirs too
        expected += [str(IMPORT_ROOT / "build" / p / "libsoftmax.so") for p in ("nvidia", "amd")]
    assert _lib.candidates() == expected


def test_candidates_honour_env(monkeypatch, tmp_path):
    path = str(tmp_path / "custom" / "libsoftmax.so")
    monkeypatch.setenv("PYSOFTMAX_LIB", path)
    assert _lib.candidates() == [path]
    monkeypatch.setenv("PYSOFTMAX_LIB", "")  # empty means unset
    assert _lib.candidates()[0].endswith(os.path.join("pysoftmax", "libsoftmax.so"))


def _load_in_subprocess(lib_path):
    """build_info() in a fresh interpreter with PYSOFTMAX_LIB=lib_path: (type name, message)."""
    code = textwrap.dedent("""
        import pysoftmax
        try:
            pysoftmax.build_info()
            print("LOADED")
        except pysoftmax.LibraryNotFoundError as e:
            print(type(e).__name__, isinstance(e, ImportError), isinstance(e, pysoftmax.SoftmaxError))
            print(e)
    """)
    env = dict(os.environ, PYSOFTMAX_LIB=str(lib_path))
    env["PYTHONPATH"] = os.pathsep.join([str(IMPORT_ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=IMPORT_ROOT)
    assert r.returncode == 0, r.stderr
    head, _, message = r.stdout.partition("\n")
    return head, message


def test_missing_library_says_run_make(tmp_path):
    missing = tmp_path / "nowhere" / "libsoftmax.so"
    head, message = _load_in_subprocess(missing)
    assert head == "LibraryNotFoundError True True"
    assert "`make`" in message
    assert f"{missing} (missing)" in message


def test_unloadable_library(tmp_path):
    bogus = tmp_path / "libsoftmax.so"
    bogus.write_text("not an ELF file\n")
    head, message = _load_in_subprocess(bogus)
    assert head == "LibraryNotFoundError True True"
    assert str(bogus) in message and "`make`" in message


@pytest.mark.skipif(CC is None, reason="no C compiler (gcc/cc) to build a stub library")
def test_wrong_abi_version_refused(tmp_path):
    stub = tmp_path / "stub.c"
    stub.write_text(textwrap.dedent("""
        int softmax_abi_version(void) { return 999; }
        const char* softmax_build_info(void) { return "platform=nvidia"; }
        const char* softmax_last_error(void) { return ""; }
        int softmax_workspace_size(void) { return 0; }
        int softmax_forward(void) { return 0; }
        int softmax_backward(void) { return 0; }
        int softmax_describe(void) { return 0; }
    """))
    so = tmp_path / "libsoftmax.so"
    subprocess.run([CC, "-shared", "-fPIC", str(stub), "-o", str(so)], check=True)
    head, message = _load_in_subprocess(so)
    assert head == "LibraryNotFoundError True True"
    assert "ABI version 999" in message and "expects 1" in message and "`make`" in message


@pytest.mark.skipif(CC is None, reason="no C compiler (gcc/cc) to build a stub library")
def test_library_missing_a_symbol(tmp_path):
    stub = tmp_path / "stale.c"
    stub.write_text("int softmax_abi_version(void) { return 1; }\n")
    so = tmp_path / "libsoftmax.so"
    subprocess.run([CC, "-shared", "-fPIC", str(stub), "-o", str(so)], check=True)
    head, message = _load_in_subprocess(so)
    assert head == "LibraryNotFoundError True True"
    assert "`make`" in message


# ---------------------------------------------------------------------------------------------
# The ctypes mirror of softmax_problem_t against the C header

_FIELDS = ["struct_size", "rows", "x", "dy", "out", "scale", "causal_queries", "mask", "mask_ndim",
           "family", "chunks", "threads", "blocks", "mask_shape", "mask_stride", "mask_col_stride", "workspace",
           "workspace_bytes"]
_CONSTANTS = {
    "SOFTMAX_ABI_VERSION": _lib.ABI_VERSION, "SOFTMAX_MAX_DIMS": _lib.MAX_DIMS,
    "SOFTMAX_FLOAT32": _lib.FLOAT32, "SOFTMAX_FLOAT16": _lib.FLOAT16, "SOFTMAX_BFLOAT16": _lib.BFLOAT16,
    "SOFTMAX_FLOAT64": _lib.FLOAT64, "SOFTMAX_BOOL": _lib.BOOL, "SOFTMAX_NONE": _lib.NONE,
    "SOFTMAX_ALGO_FUSED": _lib.ALGO_FUSED, "SOFTMAX_ALGO_ONLINE": _lib.ALGO_ONLINE,
    "SOFTMAX_ALGO_NAIVE": _lib.ALGO_NAIVE, "SOFTMAX_FAMILY_AUTO": _lib.FAMILY_AUTO,
    "SOFTMAX_FAMILY_WARP": _lib.FAMILY_WARP, "SOFTMAX_FAMILY_BLOCK": _lib.FAMILY_BLOCK,
    "SOFTMAX_FAMILY_STREAM": _lib.FAMILY_STREAM,
}


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory):
    """{name: value} printed by a C program compiled against hip/softmax.h."""
    if CC is None:
        pytest.skip("no C compiler (gcc/cc) to check the struct layout against hip/softmax.h")
    lines = ['printf("sizeof %zu\\n", sizeof(softmax_problem_t));']
    lines += [f'printf("{f} %zu\\n", offsetof(softmax_problem_t, {f}));' for f in _FIELDS]
    lines += [f'printf("{c} %d\\n", (int){c});' for c in _CONSTANTS]
    src = tmp_path_factory.mktemp("layout") / "layout.c"
    src.write_text("#include <stdio.h>\n#include <stddef.h>\n#include \"softmax.h\"\n"
                   "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n")
    exe = src.with_suffix("")
    subprocess.run([CC, "-std=c99", "-Wall", "-Werror", "-I", str(REPO / "hip"), str(src), "-o", str(exe)],
                   check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return {k: int(v) for k, v in (line.split() for line in out.splitlines())}


def test_problem_size_matches_c(c_layout):
    assert ctypes.sizeof(_lib.Problem) == c_layout["sizeof"]
    p = _lib.Problem()
    assert p.struct_size == c_layout["sizeof"]
    assert p.mask_dtype == _lib.NONE and p.family == _lib.FAMILY_AUTO and p.workspace is None


@pytest.mark.parametrize("field", _FIELDS)
def test_problem_offsets_match_c(c_layout, field):
    assert getattr(_lib.Problem, field).offset == c_layout[field]


def test_constants_match_c(c_layout):
    assert {c: c_layout[c] for c in _CONSTANTS} == _CONSTANTS


# ---------------------------------------------------------------------------------------------
# Validation: every error names the argument and comes before any GPU touch


@pytest.mark.parametrize("name", ALL)
def test_host_array_rejected(no_gpu, name):
    host = numpy.zeros((4, 8), numpy.float32)
    with pytest.raises(TypeError, match=rf"^{first_arg(name)}: expected a device array .*numpy\.ndarray in host memory"):
        call(name, host)


@pytest.mark.parametrize("name", ALL)
def test_list_rejected(no_gpu, name):
    with pytest.raises(TypeError, match=rf"^{first_arg(name)}: expected a CuPy array .*got builtins\.list"):
        call(name, [[0.0] * 8] * 4)


@pytest.mark.parametrize("name", BACKWARD)
def test_host_dy_rejected(no_gpu, name):
    with pytest.raises(TypeError, match=r"^dy: expected a device array .*host memory"):
        ALL[name](fake((4, 8)), numpy.zeros((4, 8), numpy.float32))


@pytest.mark.parametrize("dtype", ["int32", "complex64", "bool", "int8", "uint16"])
@pytest.mark.parametrize("name", ALL)
def test_unsupported_dtype(no_gpu, name, dtype):
    arg = first_arg(name)
    with pytest.raises(TypeError, match=rf"^{arg}: dtype {dtype} is not supported; expected float32, float16, bfloat16 or float64"):
        call(name, fake((4, 8), dtype), dy=fake((4, 8), dtype))


@pytest.mark.parametrize("dtype", ["int32", "uint8", "int64", "complex64"])
def test_mask_bad_dtype(no_gpu, dtype):
    with pytest.raises(TypeError, match=rf"^mask: dtype {dtype} is not supported; expected bool"):
        pysoftmax.fused(fake((2, 4, 8)), mask=fake((4, 8), dtype))


def test_mask_host_array(no_gpu):
    with pytest.raises(TypeError, match=r"^mask: .*host memory"):
        pysoftmax.fused(fake((4, 8)), mask=numpy.ones((4, 8), bool))


@pytest.mark.parametrize("mshape", [(3, 5), (7,), (4,), (3, 1, 8), (2, 3, 8)])
def test_mask_does_not_broadcast(no_gpu, mshape):
    with pytest.raises(ValueError, match=rf"^mask: shape {re.escape(str(mshape))} does not broadcast to x\.shape \(2, 4, 8\)"):
        pysoftmax.fused(fake((2, 4, 8)), mask=fake(mshape, "bool"))


def test_mask_more_dims_than_x(no_gpu):
    with pytest.raises(ValueError, match=r"^mask: shape \(1, 1, 4, 8\) has more dimensions than x\.shape \(4, 8\)"):
        pysoftmax.fused(fake((4, 8)), mask=fake((1, 1, 4, 8), "bool"))


def test_mask_odd_strides_does_not_broadcast(no_gpu):
    odd = fake((3, 5), "float32", strides=(22, 4))
    with pytest.raises(ValueError, match=r"^mask: shape \(3, 5\) does not broadcast"):
        pysoftmax.fused(fake((4, 7)), mask=odd)


def test_causal_needs_2d(no_gpu):
    with pytest.raises(ValueError, match=r"^causal: needs x with at least 2 dimensions .*\(8,\)"):
        pysoftmax.fused(fake((8,)), causal=True)


@pytest.mark.parametrize("causal", [1, 0, "yes", None, 1.0])
def test_causal_not_bool(no_gpu, causal):
    with pytest.raises(TypeError, match=rf"^causal: expected a bool, got {type(causal).__name__}"):
        pysoftmax.fused(fake((4, 8)), causal=causal)


@pytest.mark.parametrize("scale", ["0.125", True, numpy.bool_(False), None, 1j, [1.0]])
@pytest.mark.parametrize("name", ["fused", "backward", "naive_backward"])
def test_scale_not_real(no_gpu, name, scale):
    with pytest.raises(TypeError, match=r"^scale: expected a real number"):
        call(name, fake((4, 8)), scale=scale)


@pytest.mark.parametrize("axis", [2, -3, 100])
@pytest.mark.parametrize("name", ["naive", "online"])
def test_axis_out_of_range(no_gpu, name, axis):
    with pytest.raises(ValueError, match=rf"^axis: {axis} is out of range for an array of 2 dimension"):
        call(name, fake((4, 8)), axis=axis)


@pytest.mark.parametrize("axis", [1.0, "0", True, None])
@pytest.mark.parametrize("name", ["naive", "online"])
def test_axis_not_int(no_gpu, name, axis):
    with pytest.raises(TypeError, match=rf"^axis: expected an int, got {type(axis).__name__}"):
        call(name, fake((4, 8)), axis=axis)


@pytest.mark.parametrize("name", ALL)
def test_out_wrong_shape(no_gpu, name):
    with pytest.raises(ValueError, match=rf"^out: shape \(8, 4\) does not match {first_arg(name)}\.shape \(4, 8\)"):
        call(name, fake((4, 8)), out=fake((8, 4)))


@pytest.mark.parametrize("name", ALL)
def test_out_wrong_dtype(no_gpu, name):
    with pytest.raises(TypeError, match=rf"^out: dtype float16 does not match {first_arg(name)}\.dtype float32"):
        call(name, fake((4, 8)), out=fake((4, 8), "float16"))


@pytest.mark.parametrize("name", ALL)
def test_out_host_array(no_gpu, name):
    with pytest.raises(TypeError, match=r"^out: expected a device array .*host memory"):
        call(name, fake((4, 8)), out=numpy.zeros((4, 8), numpy.float32))


@pytest.mark.parametrize("shift", [4, 32, 124, -32, -124])
@pytest.mark.parametrize("name", ALL)
def test_out_partially_overlaps_input(no_gpu, name, shift):
    x = fake((4, 8))  # 128 bytes
    out = fake((4, 8), ptr=x.ptr + shift)
    arg = first_arg(name)
    with pytest.raises(ValueError, match=rf"^out: overlaps {arg} without being {arg} itself"):
        call(name, x, out=out)


@pytest.mark.parametrize("name", ALL)
def test_out_same_pointer_other_strides(no_gpu, name):
    x = fake((4, 8), strides=(64, 4))
    out = fake((4, 8), ptr=x.ptr)  # contiguous: rows 1..3 land inside x's padded rows
    with pytest.raises(ValueError, match=rf"^out: overlaps {first_arg(name)}"):
        call(name, x, out=out)


@pytest.mark.parametrize("strides", [(0, 4), (4, 4), (16, 2)])
@pytest.mark.parametrize("name", ALL)
def test_out_elements_share_memory(no_gpu, name, strides):
    """A broadcast or self-overlapping out would be written by several threads at once."""
    with pytest.raises(ValueError, match=r"^out: strides .* make elements share memory"):
        call(name, fake((4, 8)), out=fake((4, 8), strides=strides))


@pytest.mark.parametrize("name", BACKWARD)
def test_out_partially_overlaps_dy(no_gpu, name):
    dy = fake((4, 8))
    with pytest.raises(ValueError, match=r"^out: overlaps dy without being dy itself"):
        ALL[name](fake((4, 8)), dy, out=fake((4, 8), ptr=dy.ptr + 64))


@pytest.mark.parametrize("dshape", [(4, 7), (8, 4), (1, 4, 8), (4,)])
@pytest.mark.parametrize("name", BACKWARD)
def test_dy_shape_mismatch(no_gpu, name, dshape):
    with pytest.raises(ValueError, match=rf"^dy: shape {re.escape(str(dshape))} does not match y\.shape \(4, 8\)"):
        ALL[name](fake((4, 8)), fake(dshape))


@pytest.mark.parametrize("name", BACKWARD)
def test_dy_dtype_mismatch(no_gpu, name):
    with pytest.raises(TypeError, match=r"^dy: dtype float64 does not match y\.dtype float32"):
        ALL[name](fake((4, 8)), fake((4, 8), "float64"))


def test_bad_typestr(no_gpu):
    bad = fake((4, 8))
    bad.__cuda_array_interface__["typestr"] = "<Q9"
    with pytest.raises(TypeError, match=r"^x: typestr '<Q9' is not a dtype NumPy knows"):
        pysoftmax.fused(bad)


# ---------------------------------------------------------------------------------------------
# Valid calls pass validation: they reach the GPU stage (the guard), or fail for want of a GPU

VALID = {
    "fused": lambda: pysoftmax.fused(fake((2, 3, 16, 16)), scale=0.125, mask=fake((2, 1, 1, 16), "bool"), causal=True),
    "fused-float-mask": lambda: pysoftmax.fused(fake((4, 8), "float16"), mask=fake((8,), "float32")),
    "fused-out-is-x": lambda: (lambda x: pysoftmax.fused(x, out=x))(fake((4, 8), "float64")),
    "fused-disjoint-out": lambda: pysoftmax.fused(fake((4, 8)), out=fake((4, 8))),
    "fused-numpy-scale": lambda: pysoftmax.fused(fake((4, 8)), scale=numpy.float32(0.5), causal=numpy.bool_(True)),
    "naive": lambda: pysoftmax.naive(fake((4, 8))),
    "online": lambda: pysoftmax.online(fake((3, 5), strides=(80, 4))),
    "online-axis-last": lambda: pysoftmax.online(fake((2, 3, 5)), axis=-1),
    "backward": lambda: (lambda y: pysoftmax.backward(y, fake((4, 8)), scale=2, out=y))(fake((4, 8))),
    "naive_backward": lambda: pysoftmax.naive_backward(fake((4, 8)), fake((4, 8))),
}


@pytest.mark.parametrize("blocks", [-1, 1 << 31])
def test_grid_cap_out_of_range(no_gpu, blocks):
    """The tests' grid cap is a 32-bit field of the C problem: out of range, it is refused, not wrapped."""
    with pytest.raises(ValueError, match=rf"^blocks: {blocks} is not a grid size"):
        _ops.forward(fake((4, 8)), blocks=blocks)


@pytest.mark.parametrize("case", VALID)
def test_valid_call_passes_validation(no_gpu, case):
    with pytest.raises(GpuTouched):
        VALID[case]()


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present: the fake device pointers would reach it")
@pytest.mark.parametrize("case", list(VALID) + ["online-axis-0"])
def test_valid_call_without_gpu(case):
    fn = VALID.get(case, lambda: pysoftmax.online(fake((4, 8)), axis=0))
    expected = "no usable GPU" if cupy is not None else "CuPy is not installed"
    with pytest.raises(pysoftmax.SoftmaxError, match=expected):
        fn()


# ---------------------------------------------------------------------------------------------
# _ops._row_stride and _ops._mask_layout on metadata alone


def _meta(shape, dtype="float32", strides=None, name="x"):
    return _ops._arr(fake(shape, dtype, strides=strides), name)


@pytest.mark.parametrize("shape, strides, expected", [
    ((4, 8), None, 8),                      # contiguous
    ((2, 3, 5), None, 5),                   # contiguous N-d
    ((5, 16), (128, 4), 32),                # every other row of a (10, 16)
    ((10, 8), (64, 4), 16),                 # first 8 columns of a (10, 16)
    ((2, 3, 5), (120, 40, 4), 10),          # every other row of a (2, 6, 5): one stride still walks it
    ((2, 3, 5), (80, 20, 4), None),         # first 3 rows of a (2, 4, 5): no single row stride
    ((8, 4), (4, 32), None),                # transposed (4, 8)
    ((4, 8), (32, 8), None),                # every other column
    ((4, 8), (34, 4), None),                # row stride not a whole number of elements
    ((1, 8), (999, 4), 8),                  # a single row: its stride never matters
    ((4, 1), (4, 8), 1),                    # one column: the column stride never matters
    ((1, 4, 1, 8), (0, 32, 0, 4), 8),       # size-1 axes ignored
    ((), None, 1),                          # 0-d
])
def test_row_stride(shape, strides, expected):
    assert _ops._row_stride(_meta(shape, strides=strides)) == expected


def test_row_stride_float64_units_are_elements():
    assert _ops._row_stride(_meta((3, 4), "float64", strides=(64, 8))) == 8


@pytest.mark.parametrize("mshape, mstrides, xshape, expected", [
    ((4, 8), None, (4, 8), (1, [(4, 8)])),                                   # same shape
    ((2, 3, 16, 16), None, (2, 3, 16, 16), (1, [(96, 16)])),               # contiguous: fully merged
    ((2, 1, 1, 16), None, (2, 3, 16, 16), (1, [(2, 16), (48, 0)])),        # padding [B,1,1,S]
    ((16, 16), None, (2, 3, 16, 16), (1, [(6, 0), (16, 16)])),             # [S,S] over B, H
    ((2, 1, 16, 16), None, (2, 3, 16, 16), (1, [(2, 256), (3, 0), (16, 16)])),  # [B,1,S,S]
    ((16,), None, (4, 16), (1, [(4, 0)])),                                 # [S]
    ((4, 1), None, (4, 16), (0, [(4, 1)])),                                # one value per row
    ((), None, (2, 3, 16, 16), (0, [(96, 0)])),                            # scalar
    ((), None, (16,), (0, [(1, 0)])),                                      # scalar, 1-d x
    ((1, 16), None, (1, 16), (1, [(1, 0)])),                               # one row
    ((4, 16), (128, 4), (4, 16), (1, [(4, 32)])),                          # strided rows
])
def test_mask_layout(mshape, mstrides, xshape, expected):
    m = _meta(mshape, "float32", mstrides, name="mask")
    assert _ops._mask_layout(m, xshape) == expected


def test_mask_layout_bool_itemsize():
    m = _meta((2, 1, 1, 16), "bool", name="mask")
    assert _ops._mask_layout(m, (2, 3, 16, 16)) == (1, [(2, 16), (48, 0)])


def test_mask_layout_odd_strides_gives_none():
    m = _meta((4, 8), "float32", (34, 4), name="mask")
    assert _ops._mask_layout(m, (4, 8)) is None


def test_mask_layout_errors():
    with pytest.raises(ValueError, match=r"^mask: shape \(3,\) does not broadcast to x\.shape \(4, 8\) \(axis -1: 3 vs 8"):
        _ops._mask_layout(_meta((3,), name="mask"), (4, 8))
    with pytest.raises(ValueError, match=r"^mask: shape \(1, 4, 8\) has more dimensions"):
        _ops._mask_layout(_meta((1, 4, 8), name="mask"), (4, 8))


def test_read_only_out_is_refused(no_gpu):
    out = fake((4, 8))
    out.__cuda_array_interface__["data"] = (out.ptr, True)
    with pytest.raises(ValueError, match="out: is read-only"):
        pysoftmax.fused(fake((4, 8)), out=out)
