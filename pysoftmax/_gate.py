"""The benchmark regression gate: one baseline per GPU model, compared with pytest-benchmark.

Baselines live in ``benchmarks/baselines/<gpu-slug>.json`` (e.g. ``nvidia-h200.json``), written by
the suite itself (``--save``). pytest-benchmark files its runs under a machine id that ignores the
GPU, so the gate refuses a baseline from another GPU model itself, then lays the file out in a
temporary storage folder the way pytest-benchmark expects and runs
``pytest benchmarks --benchmark-compare=0001 --benchmark-compare-fail=<threshold>``.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINES = os.path.join(REPO, "benchmarks", "baselines")
SUITE = os.path.join(REPO, "benchmarks")
TIMER = "--benchmark-timer=pysoftmax._bench.gpu_clock"
# Median run-to-run spread measured on the H200 is a few percent per benchmark (README, "The
# threshold"); 10% stays clear of it while a kernel 20% slower still fails.
THRESHOLD_PERCENT = 10
THRESHOLD = f"median:{THRESHOLD_PERCENT}%"
# The gate judges pysoftmax's own algorithms. torch and CuPy are measured by the suite and kept
# in the baseline as references, but a change in them (an upgrade, their own variance) is not a
# regression of this project and must not fail its gate. Matched as substrings of a benchmark's
# name (is_peer, pytest -k): "torch" covers torch_compile and torch_compile_masked too.
PEERS = ("torch", "cupy")
GATED = " and ".join(f"not {peer}" for peer in PEERS)
# Statistics of a pytest-benchmark entry that are counts or rates, not times.
_NOT_TIMES = ("rounds", "iterations", "outliers", "ops", "iqr_outliers", "stddev_outliers")


def is_peer(name):
    """Whether a benchmark (its name) times a reference rather than pysoftmax."""
    return any(peer in name for peer in PEERS)


def scale_times(data, factor, match=""):
    """Multiply the times of the benchmarks in a pytest-benchmark JSON document whose fullname
    contains `match` by `factor` (0.8: they ran 20% faster). Returns how many were scaled. For
    checking the gate: tools/faster_baseline.py and tests/test_cpu_gate.py."""
    hit = 0
    for b in data["benchmarks"]:
        if match not in b["fullname"]:
            continue
        hit += 1
        stats = b["stats"]
        for k, v in stats.items():
            if isinstance(v, float) and k not in _NOT_TIMES:
                stats[k] = v * factor
        if "data" in stats:
            stats["data"] = [x * factor for x in stats["data"]]
    return hit


class GateError(Exception):
    """The gate could not run the comparison it was asked for (missing or foreign baseline)."""


def slug(gpu_name):
    """'NVIDIA H200' -> 'nvidia-h200'."""
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")


def current_gpu():
    import cupy

    return cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()


def baseline_path(gpu_name):
    return os.path.join(BASELINES, slug(gpu_name) + ".json")


def _pytest(args, suite):
    """pytest in the suite's parent directory (the checkout, for the real suite)."""
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=os.path.dirname(os.path.abspath(suite)))


def _need_suite(suite):
    if not os.path.isdir(suite):
        raise GateError(f"the gate runs the benchmark suite of a checkout ({suite} is missing): "
                        "run it from the repository, where `make gate` works")


def save(path, suite=SUITE, extra=(), timer=TIMER):
    """Run the suite and write its results to `path` (the baseline of this GPU model)."""
    _need_suite(suite)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return _pytest([suite, timer, f"--benchmark-json={path}", "-q", *extra], suite)


def fold_selection(select, extra):
    """(`select` and every ``-k EXPR``, ``-kEXPR`` or ``-k=EXPR`` of `extra`, the rest of `extra`):
    pytest keeps only the last -k it is given, so a caller's -k would otherwise replace the gate's
    and compare the peers. (A -k inside a cluster of short flags, ``-xk EXPR``, is not seen: spell
    it apart.)"""
    exprs, rest, args = [select], [], list(extra)
    while args:
        a = args.pop(0)
        if a == "-k" and args:
            exprs.append(args.pop(0))
        elif a.startswith("-k") and len(a) > 2:
            exprs.append(a[3:] if a.startswith("-k=") else a[2:])
        else:
            rest.append(a)
    exprs = [e for e in exprs if e.strip()]
    return " and ".join(f"({e})" for e in exprs) if len(exprs) > 1 else select, rest


def compare(baseline, gpu_name, suite=SUITE, threshold=THRESHOLD, extra=(), timer=TIMER, select=GATED):
    """Run the suite's gated benchmarks (`select`, a pytest -k expression, and any -k of `extra`)
    against `baseline`; the exit status is pytest's (non-zero on a regression)."""
    _need_suite(suite)
    select, extra = fold_selection(select, extra)
    if not os.path.exists(baseline):
        raise GateError(f"no baseline for GPU {gpu_name!r} at {baseline}; create it with `make baseline`")
    with open(baseline) as f:
        data = json.load(f)
    theirs = (data.get("machine_info", {}).get("gpu") or {}).get("name")
    if theirs != gpu_name:
        raise GateError(
            f"refusing to compare: {baseline} was saved on GPU {theirs!r}, this is {gpu_name!r}; "
            "each GPU model has its own baseline"
        )
    from pytest_benchmark.utils import get_machine_id

    # pytest-benchmark reports storage paths relative to the working directory: keep it inside.
    scratch = os.path.join(os.path.dirname(os.path.abspath(suite)), ".benchmarks")
    os.makedirs(scratch, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch) as storage:
        folder = os.path.join(storage, get_machine_id())
        os.makedirs(folder)
        shutil.copy(baseline, os.path.join(folder, "0001_baseline.json"))
        return _pytest([suite, timer, f"--benchmark-storage=file://{storage}", "--benchmark-compare=0001",
                        f"--benchmark-compare-fail={threshold}", "--benchmark-columns=median,iqr,rounds",
                        "--benchmark-sort=fullname", "-q", "-k", select, *extra], suite)
