"""pip's build of pysoftmax: the Makefile builds libsoftmax.so, and the wheel carries it.

pyproject.toml holds the metadata; this file adds what needs the machine:

- ``build_py`` runs ``make lib jax-if-found`` (the platform found, or ``HIP_PLATFORM`` / ``GPU_ARCHS`` from the
  environment, as for ``make``), then copies the library, and the JAX handlers where jax was
  importable, into the package being built. An
  editable install (``pip install -e .``) uses the checkout's ``pysoftmax/libsoftmax.so``, which
  ``make lib`` writes.
- The wheel is a platform wheel (platlib), tagged for any Python 3: ctypes needs no Python ABI.
- The ``cupy`` extra names the CuPy wheel for the toolkit the library was built with.
"""

import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "tools"))
import deps  # noqa: E402  (tools/deps.py: the CuPy wheel for a toolkit)


def _make(*targets):
    cmd = [os.environ.get("MAKE", "make"), "-C", HERE, f"PYTHON={sys.executable}", *targets]
    if "-j" not in os.environ.get("MAKEFLAGS", ""):
        cmd.insert(1, f"-j{os.cpu_count() or 1}")
    return cmd


def _platform():
    """nvidia, amd or none: the Makefile's own detection (HIP_PLATFORM overrides it)."""
    out = subprocess.run(_make("-s", "platform"), capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else "none"


class BuildWithMake(build_py):
    def run(self):
        super().run()
        print("pysoftmax: " + " ".join(_make("lib", "jax-if-found")), flush=True)
        if subprocess.call(_make("lib", "jax-if-found")) != 0:
            raise SystemExit("pysoftmax: `make lib` failed (above); it needs nvcc (CUDA) or ROCm's hipcc, "
                             "or HIP_PLATFORM=nvidia|amd with that compiler on PATH")
        built = os.path.join(HERE, "pysoftmax", "libsoftmax.so")
        if not self.editable_mode:
            target = os.path.join(self.build_lib, "pysoftmax")
            os.makedirs(target, exist_ok=True)
            shutil.copy2(built, os.path.join(target, "libsoftmax.so"))
            # The JAX handlers, where jax was importable to this build (not one left from an older source).
            handlers = os.path.join(HERE, "pysoftmax", "libsoftmax_jax.so")
            source = os.path.join(HERE, "ffi", "jax_ffi.cc")
            if os.path.exists(handlers) and os.path.getmtime(handlers) >= os.path.getmtime(source):
                shutil.copy2(handlers, os.path.join(target, "libsoftmax_jax.so"))


class WithLibrary(Distribution):
    def has_ext_modules(self):  # a shared library for one platform: a platlib, non-pure wheel
        return True


class PlatformWheel(bdist_wheel):
    def get_tag(self):
        return ("py3", "none") + tuple(super().get_tag()[2:])


_CUPY = {"cuda12": "cupy-cuda12x>=13", "cuda13": "cupy-cuda13x>=14", "rocm": "cupy-rocm-7-0>=14"}
_built_for = _platform()
_cupy = deps.cupy_wheel(_built_for, required=False) if _built_for != "none" else None
extras = {name: [dist, "ml_dtypes"] for name, dist in _CUPY.items()}
extras["cupy"] = [_cupy, "ml_dtypes"] if _cupy else []
extras["torch"] = ["torch>=2.4"]
extras["plot"] = ["matplotlib"]
extras["test"] = ["pytest>=7", "pytest-benchmark>=4", "ml_dtypes"]

setup(cmdclass={"build_py": BuildWithMake, "bdist_wheel": PlatformWheel}, distclass=WithLibrary,
      extras_require=extras)
