"""Registers and spills of every kernel, from the compiler's own report: no GPU needed.

    make spills                                 this platform's build line over hip/forward.cu and
                                                hip/backward.cu (SPILLS_ARGS passes options)
    python3 tools/spills.py [--platform P] [--all] [--match RE] [--source F]... -- COMPILER FLAGS...
    python3 tools/spills.py [--all] [--match RE] [--target T] --read LOG...

NVIDIA (nvcc): ptxas's report (-Xptxas -v), per kernel and architecture: registers a thread and
the bytes a thread spills to local memory (stores, loads); device functions that were not inlined
are rows of their own (their registers are their callers'). AMD (clang or hipcc): the
kernel-resource-usage remarks (-Rpass-analysis=kernel-resource-usage), one target at a time, as
they do not name theirs: VGPRs and SGPRs, the registers spilled, scratch bytes a lane and the
waves a SIMD the registers leave; a kernel spills where VGPRs do or it takes scratch (SGPRs spill
into VGPR lanes, not to memory). --read parses saved reports (--target names an AMD report's).
Prints the kernels that spill, most first (every kernel with --all), demangled where c++filt is
found; a report in which no kernel is found is an error. A register cap that a kernel's launch
bound sets too low shows here first (docs/NOTES.md §44).
"""
import argparse
import os
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
_AMD_FIELDS = {"VGPRs": "regs", "SGPRs": "sgprs", "AGPRs": "agprs", "VGPRs Spill": "vspill",
               "SGPRs Spill": "sspill", "ScratchSize [bytes/lane]": "scratch", "Occupancy [waves/SIMD]": "waves"}
_AMD_LINE = re.compile(r"remark:\s+(Function Name|" + "|".join(re.escape(k) for k in _AMD_FIELDS) + r"):\s*(\S+)")


def parse(text, target=""):
    """Kernels in a compiler report: dicts with platform, name, arch, regs and spill (> 0: it
    reaches memory), and by platform stores/loads (NVIDIA) or sgprs/vspill/sspill/scratch/waves
    (AMD). `target` names an AMD report's target."""
    kernels, entry, props, arch = [], None, None, ""
    for line in text.splitlines():
        if m := _NV_ENTRY.search(line):
            arch = m[2]
            entry = {"platform": "nvidia", "name": m[1], "arch": arch, "regs": 0, "stores": 0, "loads": 0}
            kernels.append(entry)
        elif m := _NV_PROPS.search(line):
            props = m[1]
        elif m := _NV_SPILL.search(line):
            if entry is not None and props == entry["name"]:
                entry["stores"], entry["loads"] = int(m[2]), int(m[3])
            elif props:  # a device function that was not inlined
                kernels.append({"platform": "nvidia", "name": props, "arch": arch, "regs": None,
                                "stores": int(m[2]), "loads": int(m[3])})
            props = None
        elif (m := _NV_REGS.search(line)) and entry is not None:
            entry["regs"] = int(m[1])
        elif m := _AMD_LINE.search(line):
            if m[1] == "Function Name":
                entry = {"platform": "amd", "name": m[2], "arch": target, "regs": 0, "sgprs": 0, "agprs": 0,
                         "vspill": 0, "sspill": 0, "scratch": 0, "waves": 0}
                kernels.append(entry)
            elif entry is not None and entry["platform"] == "amd":
                entry[_AMD_FIELDS[m[1]]] = int(m[2])
    for k in kernels:
        k["spill"] = k["stores"] + k["loads"] if k["platform"] == "nvidia" else k["vspill"] + k["scratch"]
    return kernels


def demangle(names):
    tool = shutil.which("c++filt") or shutil.which("llvm-cxxfilt-19")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def split_env(build):
    """Leading NAME=value words of a build line (the Makefile's `HIP_PLATFORM=amd hipcc`) as an
    environment, and the command."""
    env, i = dict(os.environ), 0
    while i < len(build) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", build[i]):
        name, value = build[i].split("=", 1)
        env[name], i = value, i + 1
    return env, build[i:]


def report(build, sources, platform=""):
    """Compiles each source with `build` (a compiler and its flags) for its report: (target, text)
    pairs. `platform` (nvidia or amd) defaults to nvidia where the compiler is nvcc."""
    env, cmd = split_env(build)
    if not cmd:
        sys.exit("spills: no compiler in the build line")
    if not platform:
        platform = "nvidia" if any(os.path.basename(w).startswith("nvcc") for w in cmd[:2]) else "amd"
    jobs = []
    if platform == "nvidia":
        jobs = [("", cmd + ["-Xptxas", "-v", "-c", src, "-o", os.devnull]) for src in sources]
    else:
        targets = [w.split("=", 1)[1] for w in cmd if w.startswith("--offload-arch=")] or [""]
        rest = [w for w in cmd if not w.startswith("--offload-arch=")]
        for t in targets:
            arch = [f"--offload-arch={t}"] if t else []
            # Assembly only (-S): the remarks come from code generation, before any link.
            jobs += [(t, rest + arch + ["--cuda-device-only", "-S", "-Rpass-analysis=kernel-resource-usage", src,
                                        "-o", os.devnull]) for src in sources]

    def run(job):
        target, line = job
        try:
            done = subprocess.run(line, capture_output=True, text=True, env=env)
        except OSError as e:
            return target, None, f"spills: cannot run {line[0]}: {e}"
        if done.returncode:
            return target, None, f"spills: the compile failed ({done.returncode}): {' '.join(line)}\n{done.stderr[-2000:]}"
        return target, done.stdout + done.stderr, None

    pool = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1))
    futures = [pool.submit(run, job) for job in jobs]
    reports = []
    try:
        for f in futures:
            target, text, error = f.result()
            if error:
                sys.exit(error)
            reports.append((target, text))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a failure leaves the queued compiles unrun
    return reports


def table(kernels, names):
    if kernels[0]["platform"] == "amd":
        rows = ["| target | VGPRs | SGPRs | VGPRs spilled | SGPRs spilled | scratch bytes a lane | waves a SIMD | kernel |",
                "|---|---|---|---|---|---|---|---|"]
        rows += [f"| {k['arch'] or '-'} | {k['regs']} | {k['sgprs']} | {k['vspill']} | {k['sspill']} | {k['scratch']} "
                 f"| {k['waves']} | {names[k['name']]} |" for k in kernels]
    else:
        rows = ["| arch | registers | spill stores | spill loads | kernel |", "|---|---|---|---|---|"]
        rows += [f"| {k['arch']} | {'-' if k['regs'] is None else k['regs']} | {k['stores']} | {k['loads']} "
                 f"| {names[k['name']]}{'' if k['regs'] is not None else ' (device function)'} |" for k in kernels]
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--all", action="store_true", help="every kernel, not only those that spill")
    ap.add_argument("--match", default="", help="only kernels whose demangled name matches this regex")
    ap.add_argument("--source", action="append", help=f"sources to compile (default: {' '.join(SOURCES)})")
    ap.add_argument("--platform", choices=["nvidia", "amd"], help="the build line's (default: nvidia where it is nvcc)")
    ap.add_argument("--read", nargs="+", metavar="LOG", help="parse saved reports instead of compiling")
    ap.add_argument("--target", default="", help="with --read: the AMD reports' target")
    ap.add_argument("build", nargs="*", help="after --: the compiler and its flags (the Makefile's BUILD_LINE)")
    args = ap.parse_args(argv)
    try:
        match = re.compile(args.match)
    except re.error as e:
        ap.error(f"--match {args.match!r} is not a regular expression: {e}")
    if args.read and args.build:
        ap.error("give either --read LOG... or -- COMPILER FLAGS..., not both")
    if args.read:
        kernels = []
        for f in args.read:
            with open(f) as fh:
                kernels += parse(fh.read(), args.target)
    elif args.build:
        kernels = [k for t, text in report(args.build, args.source or SOURCES, args.platform or "") for k in parse(text, t)]
    else:
        ap.error("give -- COMPILER FLAGS... or --read LOG...")
    if not kernels:
        sys.exit("spills: no kernel found in the compiler's report (another compiler, or another format?)")
    names = demangle(sorted({k["name"] for k in kernels}))
    shown = [k for k in kernels if (args.all or k["spill"]) and match.search(names[k["name"]])]
    shown.sort(key=lambda k: (-k["spill"], names[k["name"]], k["arch"]))
    for platform in ("nvidia", "amd"):
        part = [k for k in shown if k["platform"] == platform]
        if part:
            print("\n".join(table(part, names)))
    spilling = sum(1 for k in kernels if k["spill"])
    # A kernel counts once an architecture (NVIDIA) or target (AMD).
    print(f"kernels: {len(kernels)}, spilling: {spilling}" + ("" if args.all else f", shown: {len(shown)}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
