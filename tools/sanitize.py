"""compute-sanitizer over every kernel family: memcheck, racecheck and synccheck.

`make sanitize` runs this. It starts the sanitizer on tools/sanitize_workload.py (small shapes
that reach rows_warp (tiny and medium tables, vector and scalar packs), rows_block, rows_stream
whole, split, in clusters and on a cooperative grid, rows_passes, forward and backward, masks and causal) once per tool, and
its grid steps again with lagged grid plans preferred (PYSOFTMAX_GRID_LAG=1) and its masked
straddling steps with masked rows kept element-wise (PYSOFTMAX_STRADDLE_MASKED=0), and fails
unless every tool reports 0 errors. CuPy's memory pool is off in the workload, so every array is
its own allocation and an out-of-bounds access cannot hide inside a pooled chunk. The three tools
run concurrently.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

TOOLS = ["memcheck", "racecheck", "synccheck"]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    exe = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.path.exists(exe):
        print("sanitize: compute-sanitizer not found (it ships with the CUDA toolkit)", file=sys.stderr)
        return 2
    workload = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sanitize_workload.py")
    failed = []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    # The tools run at once, each its own process on the GPU: racecheck alone takes minutes, and
    # the others finish under it. Their outputs go to files (a pipe left unread would fill).
    # Each tool runs the whole workload, its grid steps once more with lagged plans preferred and
    # its masked straddling steps with masked rows kept element-wise (PYSOFTMAX_GRID_LAG and
    # PYSOFTMAX_STRADDLE_MASKED are read once a device, so in processes of their own).
    runs = []
    lagged = dict(env, PYSOFTMAX_GRID_LAG="1", SANITIZE_ONLY="grid")
    masked = dict(env, PYSOFTMAX_STRADDLE_MASKED="0", SANITIZE_ONLY="masked")
    for tool in TOOLS:
        cmd = [exe, "--tool", tool, "--error-exitcode", "17", sys.executable, workload]
        for name, run_env in ((tool, env), (f"{tool} (lagged grid)", lagged), (f"{tool} (masked element-wise)", masked)):
            log = tempfile.TemporaryFile(mode="w+")
            runs.append((name, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=run_env, cwd=REPO), log))
    for tool, proc, log in runs:
        proc.wait()
        log.seek(0)
        out = log.read()
        summary = re.findall(r"ERROR SUMMARY: (\d+) error", out) or re.findall(r"RACECHECK SUMMARY: (\d+) hazard", out)
        errors = int(summary[-1]) if summary else -1
        kernels = out.count("[sanitize] ok")
        print(f"{tool:24} exit={proc.returncode} errors={errors} workload_steps_ok={kernels}")
        if proc.returncode != 0 or errors != 0:
            failed.append(tool)
            print(out[-4000:])
    print("sanitize:", "FAILED " + ",".join(failed) if failed else "all clean")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
