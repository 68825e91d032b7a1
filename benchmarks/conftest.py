"""pytest-benchmark setup for GPU kernels.

* Timing: the suite must run with ``--benchmark-timer=pysoftmax._bench.gpu_clock`` (``make gate``
  and ``python -m pysoftmax gate`` pass it): that clock synchronises the device before reading the
  host clock, so a round measures launch + GPU execution. Each round runs enough calls that the
  one synchronisation is noise, and inputs rotate through buffers larger than L2 together.
  pysoftmax's calls are replayed from CUDA graphs (see test_softmax_bench.py), so that what is
  timed is the GPU's work, not the host's variable time per call.
* Machine info: GPU name, compute capability, driver, runtime, CuPy and torch versions are added to
  every saved run; a comparison against a run from another GPU model stops the session.
"""

import pytest

try:
    import cupy
except ImportError:  # pragma: no cover
    cupy = None


def _gpu():
    if cupy is None:
        return None
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            return None
        dev = cupy.cuda.Device()
        props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    except Exception:
        return None
    info = {
        "name": props["name"].decode(),
        "compute_capability": dev.compute_capability,
        "sms": props["multiProcessorCount"],
        "l2_bytes": props["l2CacheSize"],
        "driver": cupy.cuda.runtime.driverGetVersion(),
        "runtime": cupy.cuda.runtime.runtimeGetVersion(),
        "cupy": cupy.__version__,
    }
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        pass
    return info


GPU = _gpu()


def pytest_collection_modifyitems(config, items):
    if GPU is None:
        skip = pytest.mark.skip(reason="benchmarks need a GPU")
        for item in items:
            item.add_marker(skip)
    timer = str(config.getoption("benchmark_timer", default=""))
    if GPU is not None and "gpu_clock" not in timer:
        raise pytest.UsageError(
            f"benchmarks: run with --benchmark-timer=pysoftmax._bench.gpu_clock (got {timer}); "
            "a host clock alone does not wait for the GPU"
        )


def pytest_benchmark_update_machine_info(config, machine_info):
    machine_info["gpu"] = GPU or {"name": "none"}


def pytest_benchmark_compare_machine_info(config, benchmarksession, machine_info, compared_benchmark):
    mine = (machine_info.get("gpu") or {}).get("name")
    theirs = (compared_benchmark.get("machine_info", {}).get("gpu") or {}).get("name")
    if mine != theirs:
        pytest.exit(
            f"refusing to compare: this run is on GPU {mine!r}, the baseline was saved on {theirs!r}. "
            "Baselines are per GPU model (benchmarks/baselines/<gpu>.json).",
            returncode=3,
        )
