"""Registers and spills of every kernel, from the compiler's own report: no GPU needed.

    make spills                                 this platform's build line over hip/forward.cu and
                                                hip/backward.cu (SPILLS_ARGS passes options)
    python3 tools/spills.py [--all] [--match RE] [--source F]... -- COMPILER FLAGS...
    python3 tools/spills.py [--all] [--match RE] --read LOG...

NVIDIA (nvcc): ptxas's report (-Xptxas -v), per kernel and architecture: registers a thread and
the bytes a thread spills to local memory (stores, loads). AMD (clang or hipcc): the
kernel-resource-usage remarks (-Rpass-analysis=kernel-resource-usage), one target at a time, as
they do not name theirs: VGPRs and SGPRs, the registers spilled, and scratch bytes a lane; a
kernel spills where VGPRs do or it uses scratch (SGPRs spill into VGPR lanes, not to memory).
--read parses reports saved from either. Prints the kernels that spill, most first (every kernel
with --all), demangled where c++filt is found. A register cap that a kernel's launch bound sets
too low shows here first (docs/NOTES.md §44).
"""
import argparse
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

SOURCES = ["hip/forward.cu", "hip/backward.cu"]
_NV_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_NV_PROPS = re.compile(r"Function properties for (\S+)")
_NV_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_NV_REGS = re.compile(r"Used (\d+) registers")
_AMD_FIELD = re.compile(r"remark:\s+(Function Name|VGPRs|SGPRs|AGPRs|ScratchSize \[bytes/lane\]|VGPRs Spill|SGPRs Spill):\s*(\S+)")


def parse(text, target=""):
    """Kernels in a compiler report: dicts with name, arch, regs, spill (> 0: it reaches memory) and,
    by platform, stores/loads (NVIDIA) or sgprs/scratch (AMD). `target` names the AMD report's."""
    kernels, cur, props = [], None, None
    for line in text.splitlines():
        if m := _NV_ENTRY.search(line):
            cur = {"name": m[1], "arch": m[2], "regs": 0, "stores": 0, "loads": 0}
            kernels.append(cur)
        elif m := _NV_PROPS.search(line):
            props = m[1]
        elif (m := _NV_SPILL.search(line)) and cur and props == cur["name"]:
            cur["stores"], cur["loads"] = int(m[2]), int(m[3])
        elif (m := _NV_REGS.search(line)) and cur:
            cur["regs"] = int(m[1])
        elif m := _AMD_FIELD.search(line):
            key, value = m[1], m[2]
            if key == "Function Name":
                cur = {"name": value, "arch": target, "regs": 0, "sgprs": 0, "agprs": 0, "vspill": 0, "sspill": 0, "scratch": 0}
                kernels.append(cur)
            elif cur is not None:
                field = {"VGPRs": "regs", "SGPRs": "sgprs", "AGPRs": "agprs", "VGPRs Spill": "vspill",
                         "SGPRs Spill": "sspill", "ScratchSize [bytes/lane]": "scratch"}[key]
                cur[field] = int(value)
    # What reaches memory: NVIDIA's spilled bytes; AMD's spilled VGPRs and scratch (its SGPRs spill
    # into VGPR lanes, no memory, so they are shown but do not count).
    for k in kernels:
        k["spill"] = k["stores"] + k["loads"] if "stores" in k else k["vspill"] + k["scratch"]
    return kernels


def demangle(names):
    tool = shutil.which("c++filt") or shutil.which("llvm-cxxfilt-19")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def report(build, sources):
    """Compiles each source with `build` (a compiler and its flags) for its report: (target, text) pairs."""
    is_nvcc = any(re.search(r"nvcc$", w) for w in build[:1])
    jobs = []
    if is_nvcc:
        for src in sources:
            jobs.append(("", build + ["-Xptxas", "-v", "-c", src, "-o", "/dev/null"]))
    else:
        targets = [w.split("=", 1)[1] for w in build if w.startswith("--offload-arch=")] or [""]
        rest = [w for w in build if not w.startswith("--offload-arch=")]
        for t in targets:
            for src in sources:
                arch = [f"--offload-arch={t}"] if t else []
                # Assembly only (-S): the remarks come from code generation, before any link.
                jobs.append((t, rest + arch + ["--cuda-device-only", "-S", "-Rpass-analysis=kernel-resource-usage",
                                                src, "-o", "/dev/null"]))

    def run(job):
        target, cmd = job
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"spills: the compile failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr[-2000:]}")
        return target, done.stdout + done.stderr

    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(run, jobs))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--all", action="store_true", help="every kernel, not only those that spill")
    ap.add_argument("--match", default="", help="only kernels whose demangled name matches this regex")
    ap.add_argument("--source", action="append", help=f"sources to compile (default: {' '.join(SOURCES)})")
    ap.add_argument("--read", nargs="+", metavar="LOG", help="parse saved reports instead of compiling")
    ap.add_argument("build", nargs="*", help="after --: the compiler and its flags (the Makefile's BUILD_LINE)")
    args = ap.parse_args(argv)
    if args.read:
        kernels = [k for f in args.read for k in parse(open(f).read())]
    elif args.build:
        kernels = [k for t, text in report(args.build, args.source or SOURCES) for k in parse(text, t)]
    else:
        ap.error("give -- COMPILER FLAGS... or --read LOG...")
    names = demangle(sorted({k["name"] for k in kernels}))
    shown = [k for k in kernels if (args.all or k["spill"]) and re.search(args.match, names[k["name"]])]
    shown.sort(key=lambda k: (-k["spill"], names[k["name"]], k["arch"]))
    amd = any("scratch" in k for k in kernels)
    if amd:
        print("| target | VGPRs | SGPRs | VGPRs spilled | SGPRs spilled | scratch bytes a lane | kernel |")
        print("|---|---|---|---|---|---|---|")
        for k in shown:
            print(f"| {k['arch'] or '-'} | {k['regs']} | {k['sgprs']} | {k['vspill']} | {k['sspill']} | {k['scratch']} | {names[k['name']]} |")
    else:
        print("| arch | registers | spill stores | spill loads | kernel |")
        print("|---|---|---|---|---|")
        for k in shown:
            print(f"| {k['arch']} | {k['regs']} | {k['stores']} | {k['loads']} | {names[k['name']]} |")
    spilling = sum(1 for k in kernels if k["spill"])
    print(f"kernels: {len(kernels)}, spilling: {spilling}" + ("" if args.all else f", shown: {len(shown)}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
