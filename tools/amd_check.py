"""Check an AMD build on a machine without an AMD GPU: the wave width of every kernel, and a load.

    python3 tools/amd_check.py [BUILD_DIR]      (default build/amd; `make amd` runs it)

1. Wave widths. From each object's HIP fat binary (BUILD_DIR/*.o), every target's code object is
   unbundled (llvm-objcopy, clang-offload-bundler) and its kernel metadata read (llvm-readelf
   --notes). Every kernel of a gfx9 target (GCN/CDNA: MI200 gfx90a, MI300 gfx942, MI355 gfx950)
   must have wavefront size 64, every kernel of gfx10-gfx12 (RDNA) 32; every target must hold the
   same kernels; and the targets must be the ones the library names in its build info.
2. A load. In a fresh interpreter, BUILD_DIR/libsoftmax.so is loaded with ctypes through
   pysoftmax._lib (Debian's HIP runtime): its build info must read back platform=amd and the same
   targets, and a forward call on a valid problem must return the library's GPU-runtime status
   with a message (there is no GPU), not crash.

This proves that the code compiles for each target with the right wave width and that the
library links and loads; not that it runs on AMD hardware. Exits 1 on any failure.
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LLVM_DIRS = [os.environ.get("LLVM_BIN", ""), "/opt/rocm/llvm/bin", "/usr/lib/llvm-19/bin"]


def tool(name):
    for d in _LLVM_DIRS:
        path = os.path.join(d, name)
        if d and os.access(path, os.X_OK):
            return path
    for candidate in (name, name + "-19"):
        path = shutil.which(candidate)
        if path:
            return path
    sys.exit(f"amd_check: {name} not found (set LLVM_BIN, or apt-get install llvm-19 clang-19)")


def expected_wave(target):
    major = int(re.fullmatch(r"gfx(\d+)[0-9a-f]{2}", target).group(1))
    return 64 if major <= 9 else 32


def kernels(code_object):
    """{kernel symbol: wavefront size} from a code object's AMDGPU metadata note."""
    notes = subprocess.run([tool("llvm-readelf"), "--notes", code_object], capture_output=True, text=True,
                           check=True).stdout
    found, symbol = {}, None
    for line in notes.splitlines():
        line = line.strip()
        m = re.match(r"\.symbol:\s+(\S+)", line)
        if m:
            symbol = m.group(1)
        m = re.match(r"\.wavefront_size:\s+(\d+)", line)
        if m:
            if symbol is None or symbol in found:
                raise RuntimeError(f"{code_object}: a .wavefront_size without its own .symbol")
            found[symbol], symbol = int(m.group(1)), None
    return found


def targets_of(bundle):
    out = subprocess.run([tool("clang-offload-bundler"), "--list", "--type=o", f"--input={bundle}"],
                         capture_output=True, text=True, check=True).stdout.split()
    return {t.rsplit("--", 1)[1].split(":")[0]: t for t in out if t.startswith("hip")}


def check_waves(build, archs, scratch):
    """[(object, target, kernels, wave)] and a list of failures."""
    rows, failures = [], []
    for obj in sorted(glob.glob(os.path.join(build, "*.o"))):
        bundle = os.path.join(scratch, os.path.basename(obj) + ".fatbin")
        r = subprocess.run([tool("llvm-objcopy"), f"--dump-section=.hip_fatbin={bundle}", obj],
                           capture_output=True, text=True)
        if r.returncode != 0:  # no kernels in this translation unit (capi.cu)
            continue
        targets = targets_of(bundle)
        if set(targets) != set(archs):
            failures.append(f"{obj}: targets {sorted(targets)}, the build info names {sorted(archs)}")
        names = None
        for target, triple in sorted(targets.items()):
            co = os.path.join(scratch, f"{os.path.basename(obj)}.{target}.co")
            subprocess.run([tool("clang-offload-bundler"), "--unbundle", "--type=o", f"--input={bundle}",
                            f"--targets={triple}", f"--output={co}"], check=True)
            found = kernels(co)
            want = expected_wave(target)
            waves = sorted(set(found.values()))
            rows.append((os.path.basename(obj), target, len(found), ",".join(map(str, waves))))
            if not found:
                failures.append(f"{obj} {target}: no kernels")
            bad = [k for k, w in found.items() if w != want]
            if bad:
                failures.append(f"{obj} {target}: {len(bad)} kernels with wavefront size != {want}, e.g. {bad[0]}")
            if names is not None and set(found) != names:
                failures.append(f"{obj} {target}: another kernel set than the first target's")
            names = set(found)
    if not rows:
        failures.append(f"{build}: no object with a HIP fat binary")
    return rows, failures


_LOAD = r"""
import ctypes, sys
from pysoftmax import _lib
info = _lib.build_info()
print("info", info["platform"], info["archs"])
p = _lib.Problem()
p.algo, p.dtype, p.rows, p.cols = _lib.ALGO_FUSED, _lib.FLOAT32, 64, 128
p.x_row_stride = p.out_row_stride = 128
p.scale = 1.0
p.x = p.out = 1 << 20  # never dereferenced: the device query fails first
status = _lib.lib().softmax_forward(ctypes.byref(p), None)
print("forward", status, _lib.lib().softmax_last_error().decode(errors="replace"))
"""


def check_load(lib):
    env = dict(os.environ, PYSOFTMAX_LIB=lib, PYTHONPATH=REPO)
    r = subprocess.run([sys.executable, "-c", _LOAD], env=env, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return None, [f"loading {lib} failed (exit {r.returncode}): {r.stderr.strip()[-400:]}"]
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    platform, _, archs = lines["info"].partition(" ")
    status, _, message = lines["forward"].partition(" ")
    failures = []
    if platform != "amd":
        failures.append(f"{lib}: build info says platform={platform}")
    if status != "3" or not message.strip():
        failures.append(f"{lib}: forward without a GPU returned status {status} ({message!r}); "
                        "expected 3 (GPU runtime error) with a message")
    return (archs.split(","), status, message), failures


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    build = argv[0] if argv else os.path.join(REPO, "build", "amd")
    lib = os.path.join(build, "libsoftmax.so")
    if not os.path.exists(lib):
        sys.exit(f"amd_check: {lib} not found; run `make amd` first")
    loaded, failures = check_load(lib)
    archs = loaded[0] if loaded else []
    with tempfile.TemporaryDirectory() as scratch:
        rows, more = check_waves(build, archs, scratch)
    failures += more
    print("| object | target | kernels | wavefront size |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(v) for v in row) + " |")
    if loaded:
        print(f"load: build info archs={','.join(archs)}; forward without a GPU: status {loaded[1]}, "
              f"\"{loaded[2].strip()}\"")
    for f in failures:
        print("FAIL:", f)
    print("amd_check: " + ("FAILED" if failures else "ok"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
