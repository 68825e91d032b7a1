"""Shared test setup: GPU detection (one visible skip reason), references and tolerances.

GPU tests carry the `gpu` marker and skip with one reason when no usable GPU (or no library) is
present; CPU tests always run.
"""

import os

import pytest

# JAX would otherwise take 75% of the GPU's memory on first use, leaving little to CuPy and torch
# in the same process.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

try:
    import cupy
except ImportError:  # pragma: no cover
    cupy = None


def _gpu_reason():
    if cupy is None:
        return "CuPy is not installed"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver / no device
        return f"no usable GPU ({type(e).__name__}: {str(e).splitlines()[0]})"
    if n == 0:
        return "no GPU device found"
    try:
        import pysoftmax

        pysoftmax.build_info()
    except Exception as e:
        return f"libsoftmax.so not loadable ({e}); run make"
    return None


GPU_REASON = _gpu_reason()
HAS_GPU = GPU_REASON is None


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a GPU and the built library")


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason=f"GPU tests skipped: {GPU_REASON}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config):
    import pysoftmax
    from pysoftmax import _lib

    try:
        library = _lib.lib().path
    except Exception as e:
        library = f"not loadable ({type(e).__name__})"
    return [f"pysoftmax {pysoftmax.__version__} from {pysoftmax.__file__}; library {library}",
            f"pysoftmax GPU tests: {'enabled' if HAS_GPU else 'SKIPPED — ' + GPU_REASON}"]
