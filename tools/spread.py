"""Run-to-run spread of the benchmark suite: per-benchmark difference of a statistic between two
saved runs (pytest-benchmark JSON), to justify the gate's threshold.

    python3 tools/spread.py run1.json run2.json [--stats median,min] [--all]

By default only the gated benchmarks count (pysoftmax's algorithms; the torch and CuPy references
are not gated, see pysoftmax/_gate.py); --all includes them.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pysoftmax import _gate  # noqa: E402


def stats(path, stat, gated):
    with open(path) as f:
        data = json.load(f)["benchmarks"]
    return {b["fullname"]: b["stats"][stat] for b in data if not (gated and _gate.is_peer(b["name"]))}


def spread(a, b, stat, gated=True):
    """(sorted |differences| in %, signed (difference, name) list largest first)."""
    m1, m2 = stats(a, stat, gated), stats(b, stat, gated)
    diffs = [(100 * (m2[k] - m1[k]) / m1[k], k) for k in m1 if k in m2]
    return sorted(abs(d) for d, _ in diffs), sorted(diffs, key=lambda t: -abs(t[0]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("run1")
    ap.add_argument("run2")
    ap.add_argument("--stats", default="median,min")
    ap.add_argument("--all", action="store_true", help="include the torch and CuPy references")
    args = ap.parse_args(argv)
    for stat in args.stats.split(","):
        absd, signed = spread(args.run1, args.run2, stat, not args.all)
        pick = lambda q: absd[min(len(absd) - 1, int(q * len(absd)))]
        print(f"{stat}: {len(absd)} benchmarks; |difference| p50 {pick(0.5):.2f}%  p90 {pick(0.9):.2f}%  "
              f"p99 {pick(0.99):.2f}%  max {absd[-1]:.2f}%; "
              f"over {_gate.THRESHOLD_PERCENT}%: {sum(d > _gate.THRESHOLD_PERCENT for d in absd)}")
        for d, k in signed[:6]:
            print(f"  {d:+6.2f}%  {k.split('::')[-1]}")


if __name__ == "__main__":
    main()
