"""The dispatcher's plans on the CPU: tests/native/plan_check.cu runs plan_rows() (hip/dispatch.cuh)
over row lengths 1..70000 (and sparsely to 1.1M), for 1000, 8192 and 2^40 rows, every operation and
dtype, vector and element-wise rows, automatic and forced families and requested block sizes, on
three shared-memory sizes, and checks that every plan covers its row, stays inside the compiled
instantiations, the device's shared memory and the largest grid, and sizes its stage exactly as
the kernel indexes it. Host code only: no GPU is needed, nvcc is."""

import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc not found: the plan checker is built with the CUDA toolkit")
def test_plans_cover_rows_and_match_kernel_stages(tmp_path):
    exe = tmp_path / "plan_check"
    src = os.path.join(REPO, "tests", "native", "plan_check.cu")
    built = subprocess.run([NVCC, "-O1", "-std=c++17", "--expt-relaxed-constexpr", "-I", os.path.join(REPO, "hip"), src,
                            "-o", str(exe)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-4000:]
    out = subprocess.run([str(exe)], capture_output=True, text=True)
    last = out.stdout.strip().splitlines()[-1]
    assert out.returncode == 0 and last.endswith("violations=0"), out.stdout[-4000:]
    assert int(last.split()[0].split("=")[1]) > 1_000_000  # the sweep really ran
