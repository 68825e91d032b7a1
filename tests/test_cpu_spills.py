"""tools/spills.py: the compilers' register reports parsed (no GPU needed), and one compile end to end
where nvcc is found."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import spills  # noqa: E402

# ptxas -v as nvcc prints it: an entry function with its properties, a device function's
# properties between two entries (not the entry's), and an entry that spills.
NVCC_REPORT = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z1aPf' for 'sm_90'
ptxas info    : Function properties for _Z1aPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers
ptxas info    : Function properties for _Z6helperv
    64 bytes stack frame, 12 bytes spill stores, 12 bytes spill loads
ptxas info    : Compiling entry function '_Z1bPf' for 'sm_80'
ptxas info    : Function properties for _Z1bPf
    240 bytes stack frame, 492 bytes spill stores, 1288 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers
"""

# clang's kernel-resource-usage remarks for one target.
CLANG_REPORT = """k.cu:2:1: remark: Function Name: _Z1cPf [-Rpass-analysis=kernel-resource-usage]
k.cu:2:1: remark:     SGPRs: 38 [-Rpass-analysis=kernel-resource-usage]
k.cu:2:1: remark:     VGPRs: 128 [-Rpass-analysis=kernel-resource-usage]
k.cu:2:1: remark:     AGPRs: 0 [-Rpass-analysis=kernel-resource-usage]
k.cu:2:1: remark:     ScratchSize [bytes/lane]: 36 [-Rpass-analysis=kernel-resource-usage]
k.cu:2:1: remark:     Dynamic Stack: False [-Rpass-analysis=kernel-resource-usage]
k.cu:2:1: remark:     Occupancy [waves/SIMD]: 4 [-Rpass-analysis=kernel-resource-usage]
k.cu:2:1: remark:     SGPRs Spill: 0 [-Rpass-analysis=kernel-resource-usage]
k.cu:2:1: remark:     VGPRs Spill: 9 [-Rpass-analysis=kernel-resource-usage]
k.cu:2:1: remark:     LDS Size [bytes/block]: 2048 [-Rpass-analysis=kernel-resource-usage]
k.cu:3:1: remark: Function Name: _Z1dPf [-Rpass-analysis=kernel-resource-usage]
k.cu:3:1: remark:     SGPRs: 20 [-Rpass-analysis=kernel-resource-usage]
k.cu:3:1: remark:     VGPRs: 12 [-Rpass-analysis=kernel-resource-usage]
k.cu:3:1: remark:     ScratchSize [bytes/lane]: 0 [-Rpass-analysis=kernel-resource-usage]
k.cu:3:1: remark:     SGPRs Spill: 6 [-Rpass-analysis=kernel-resource-usage]
k.cu:3:1: remark:     VGPRs Spill: 0 [-Rpass-analysis=kernel-resource-usage]
"""


def test_nvcc_report_parsed():
    a, helper, b = spills.parse(NVCC_REPORT)
    assert (a["name"], a["arch"], a["regs"], a["stores"], a["loads"], a["spill"]) == ("_Z1aPf", "sm_90", 40, 0, 0, 0)
    assert (b["name"], b["arch"], b["regs"], b["stores"], b["loads"]) == ("_Z1bPf", "sm_80", 64, 492, 1288)
    assert b["spill"] == 492 + 1288
    # The device function's spills are its own row, not the entry's before it.
    assert (helper["name"], helper["arch"], helper["regs"], helper["spill"]) == ("_Z6helperv", "sm_90", None, 24)


def test_clang_report_parsed():
    c, d = spills.parse(CLANG_REPORT, "gfx942")
    assert (c["name"], c["arch"], c["regs"], c["sgprs"], c["vspill"], c["scratch"], c["waves"]) == \
        ("_Z1cPf", "gfx942", 128, 38, 9, 36, 4)
    assert c["spill"] > 0 and d["regs"] == 12 and d["sspill"] == 6
    assert d["spill"] == 0  # SGPRs spill into VGPR lanes: no memory


def test_read_lists_spilling_kernels_first(tmp_path, capsys):
    log = tmp_path / "ptxas.txt"
    log.write_text(NVCC_REPORT)
    assert spills.main(["--read", str(log)]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if line.startswith("| sm_")]
    assert len(rows) == 2 and "| 492 | 1288 |" in rows[0] and "(device function)" in rows[1], out
    assert out[-1] == "kernels: 3, spilling: 2, shown: 2"
    assert spills.main(["--read", str(log), "--all"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| sm_")]
    assert len(rows) == 3 and "| 492 |" in rows[0] and "| 40 | 0 | 0 |" in rows[2], rows  # most spilled first
    amd = tmp_path / "remarks.txt"
    amd.write_text(CLANG_REPORT)
    assert spills.main(["--read", str(log), str(amd), "--target", "gfx942", "--match", "c"]) == 0
    out = capsys.readouterr().out.splitlines()  # a table a platform, each with its own columns
    rows = [line for line in out if line.startswith("| gfx942 |")]
    assert len(rows) == 1 and rows[0].startswith("| gfx942 | 128 | 38 | 9 | 0 | 36 | 4 |"), out
    assert "c(float*)" in rows[0] or "_Z1cPf" in rows[0], rows  # demangled where c++filt is found
    assert not [line for line in out if line.startswith("| sm_")], out  # --match kept only c


def test_bad_arguments_are_errors(tmp_path, capsys):
    for argv, says in (([], "COMPILER FLAGS"), (["--match", "("], "not a regular expression"),
                       (["--read", "x.txt", "--", "nvcc"], "not both")):
        with pytest.raises(SystemExit) as e:
            spills.main(argv)
        assert e.value.code == 2 and says in capsys.readouterr().err, argv
    empty = tmp_path / "empty.txt"
    empty.write_text("ptxas info    : 0 bytes gmem\n")
    with pytest.raises(SystemExit) as e:  # nothing parsed is not "no spills"
        spills.main(["--read", str(empty)])
    assert "no kernel found" in str(e.value)


def test_build_line_environment_split():
    env, cmd = spills.split_env(["HIP_PLATFORM=amd", "hipcc", "-O3", "-DX=1"])
    assert env["HIP_PLATFORM"] == "amd" and cmd == ["hipcc", "-O3", "-DX=1"]
    with pytest.raises(SystemExit) as e:
        spills.report(["ONLY=env"], ["k.cu"])
    assert "no compiler" in str(e.value)
    with pytest.raises(SystemExit) as e:
        spills.report(["X=1", "/nonexistent/nvcc"], ["k.cu"])
    assert "cannot run /nonexistent/nvcc" in str(e.value)


def test_failed_compile_names_the_command(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text("this is not C++\n")
    with pytest.raises(SystemExit) as e:
        spills.report([sys.executable, "-c", "import sys; sys.exit(3)"], [str(bad)], "nvidia")
    assert "the compile failed (3)" in str(e.value) and "-Xptxas -v" in str(e.value)
    with pytest.raises(SystemExit) as e:
        spills.report([sys.executable, "-c", "import sys; sys.exit(4)", "--offload-arch=gfx942"], [str(bad)])
    assert "the compile failed (4)" in str(e.value) and "--cuda-device-only -S" in str(e.value)


@pytest.mark.skipif(not shutil.which("nvcc"), reason="nvcc not found")
def test_nvcc_end_to_end(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text("__global__ void twice(float* p) { p[threadIdx.x] *= 2.0f; }\n")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "spills.py"), "--all", "--source", str(src),
                          "--", "nvcc", "-O3", "-gencode=arch=compute_90,code=sm_90"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| sm_90 |")]
    assert len(rows) == 1 and "twice" in rows[0], out.stdout
    assert out.stdout.splitlines()[-1] == "kernels: 1, spilling: 0"
