"""Command line: ``python -m pysoftmax info|bench|plot|report|gate|hostcost|jaxbench|gpt`` (``bench`` is the main job)."""

import argparse
import sys


def _shapes(text):
    """--shapes: named sets (_bench.SHAPE_SETS) and ROWSxCOLS, comma-separated, in order, each shape once."""
    from . import _bench  # numpy only, already imported by the package

    out = []
    for item in (s.strip().lower() for s in text.split(",")):
        if item in _bench.SHAPE_SETS:
            out += _bench.SHAPE_SETS[item]
        elif item:
            try:
                rows, cols = (int(n) for n in item.split("x"))
            except ValueError:
                raise argparse.ArgumentTypeError(f"--shapes: expected {'|'.join(_bench.SHAPE_SETS)} or "
                                                 f"ROWSxCOLS[,ROWSxCOLS...], got {text!r}") from None
            out.append((rows, cols))
    return list(dict.fromkeys(out))


def _gpu_or_exit(what):
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return True
    except Exception as e:
        print(f"{what}: no usable GPU ({str(e).splitlines()[0]})", file=sys.stderr)
        return False
    print(f"{what}: no GPU device found", file=sys.stderr)
    return False


def info(args):
    import pysoftmax

    print(f"pysoftmax {pysoftmax.__version__}")
    try:
        for k, v in pysoftmax.build_info().items():
            print(f"  {k:9} {v}")
    except pysoftmax.LibraryNotFoundError as e:
        print(f"  library: {e}")
        return 1
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
        for d in range(n):
            p = cupy.cuda.runtime.getDeviceProperties(d)
            print(f"  gpu {d}    {p['name'].decode()} ({p['multiProcessorCount']} SMs, warp {p['warpSize']})")
    except Exception as e:
        print(f"  gpu       none usable ({str(e).splitlines()[0]})")
    return 0


def bench(args):
    if not _gpu_or_exit("bench"):
        return 2
    from . import _bench

    if args.devices:
        from . import _multibench

        report = _multibench.run(shapes=args.shapes, dtypes=args.dtypes, json_path=args.json)
        print(_multibench.table(report))
        return 0
    report = _bench.run(shapes=args.shapes, dtypes=args.dtypes, attention=not args.no_attention,
                        json_path=args.json)
    print(_bench.table(report))
    return _draw(report, args.plot) if args.plot else 0


def _draw(report, path):
    from . import _bench

    try:
        _bench.plot(report, path)
    except ImportError:
        print("plotting needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return 1
    print(f"plot written to {path}")
    return 0


def plot(args):
    import json

    with open(args.report) as f:
        return _draw(json.load(f), args.out)


def report(args):
    from . import _gate, _report

    path = args.baseline or _gate.baseline_path("NVIDIA H200")
    print(_report.markdown(*_report.load(path)))
    return 0


def gate(args):
    if not _gpu_or_exit("gate"):
        return 2
    from . import _gate

    gpu = _gate.current_gpu()
    path = args.baseline or _gate.baseline_path(gpu)
    if args.save:
        return _gate.save(path, extra=args.pytest_args)
    try:
        return _gate.compare(path, gpu, threshold=args.threshold, extra=args.pytest_args)
    except _gate.GateError as e:
        print(f"gate: {e}", file=sys.stderr)
        return 3


def hostcost(args):
    if not _gpu_or_exit("hostcost"):
        return 2
    import json

    from . import _hostcost

    rows = _hostcost.run()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(_hostcost.table(rows))
    return 0


def jaxbench(args):
    if not _gpu_or_exit("jaxbench"):
        return 2
    import json

    from . import _jaxbench

    report = _jaxbench.run()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print(_jaxbench.table(report))
    return 0


def gpt(gpt_args):
    """examples/train_gpt.py with these arguments (its own --help lists them)."""
    import os
    import runpy

    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "train_gpt.py")
    if not os.path.exists(script):
        print(f"gpt: {script} not found (the example lives in the repository, not the package)", file=sys.stderr)
        return 2
    argv, sys.argv = sys.argv, [script] + list(gpt_args)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = argv
    return 0


def main(argv=None):
    from . import _gate  # standard library only: no GPU or CuPy needed to build the parser

    parser = argparse.ArgumentParser(prog="python -m pysoftmax", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="platform, architectures built, library path, GPUs found").set_defaults(fn=info)
    b = sub.add_parser("bench", help="time pysoftmax against CuPy and torch: GB/s and %% of copy bandwidth")
    b.add_argument("--shapes", type=_shapes,
                   help="perf (PERF.md's table, the default), sweep (widths between the powers of two, odd "
                        "widths), long (rows of 64K to 32M), suite (the benchmark suite's), all, or ROWSxCOLS; "
                        "several comma-separated")
    b.add_argument("--dtypes", type=lambda s: s.split(","), help="float32,float16,bfloat16 (default all three)")
    b.add_argument("--no-attention", action="store_true", help="skip the [B,H,S,S] attention cases")
    b.add_argument("--json", help="write every measurement to this JSON file")
    b.add_argument("--plot", help="draw GB/s against row length per algorithm into this PNG (needs matplotlib)")
    b.add_argument("--devices", action="store_true",
                   help="the multi-device section instead: fused forward and backward on every visible GPU, each "
                        "alone, then all at once, one thread a device (default shapes: 1 GiB in float32)")
    b.set_defaults(fn=bench)
    p = sub.add_parser("plot", help="draw a saved `bench --json` report (no GPU needed)")
    p.add_argument("report")
    p.add_argument("out")
    p.set_defaults(fn=plot)
    r = sub.add_parser("report", help="a saved suite run (a baseline) as Markdown tables and the goals it misses "
                                      "(no GPU needed)")
    r.add_argument("baseline", nargs="?", help="pytest-benchmark JSON (default: this repo's H200 baseline)")
    r.set_defaults(fn=report)
    g = sub.add_parser("gate", help="benchmark regression gate against this GPU's stored baseline")
    g.add_argument("--save", action="store_true", help="run the suite and (re)write this GPU's baseline")
    g.add_argument("--baseline", help="baseline file (default benchmarks/baselines/<gpu>.json)")
    g.add_argument("--threshold", default=_gate.THRESHOLD,
                   help=f"--benchmark-compare-fail value (default {_gate.THRESHOLD.replace('%', '%%')})")
    g.add_argument("pytest_args", nargs="*", help="extra pytest arguments, after --")
    g.set_defaults(fn=gate)
    h = sub.add_parser("hostcost", help="host microseconds per small call: CuPy, torch eager and compiled, torch.softmax")
    h.add_argument("--json", help="write the rows to this JSON file")
    h.set_defaults(fn=hostcost)
    j = sub.add_parser("jaxbench", help="jitted pysoftmax.jax against jitted jax.nn.softmax: GB/s and host cost")
    j.add_argument("--json", help="write the report to this JSON file")
    j.set_defaults(fn=jaxbench)
    sub.add_parser("gpt", add_help=False,
                   help="train a small GPT with pysoftmax's and torch's softmax (examples/train_gpt.py; its --help)")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["gpt"]:  # every further argument is the example's
        return gpt(argv[1:])
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
