"""Run-to-run spread of the benchmark suite: per-benchmark median difference between two saved
runs (pytest-benchmark JSON), to justify the gate's threshold.

    python3 tools/spread.py run1.json run2.json
"""

import json
import sys


def medians(path):
    with open(path) as f:
        return {b["fullname"]: b["stats"]["median"] for b in json.load(f)["benchmarks"]}


def main(a, b):
    m1, m2 = medians(a), medians(b)
    diffs = sorted((100 * (m2[k] - m1[k]) / m1[k], k) for k in m1 if k in m2)
    absd = sorted(abs(d) for d, _ in diffs)
    pick = lambda q: absd[min(len(absd) - 1, int(q * len(absd)))]
    print(f"{len(diffs)} benchmarks in both runs")
    print(f"|median difference|: p50 {pick(0.5):.2f}%  p90 {pick(0.9):.2f}%  p99 {pick(0.99):.2f}%  max {absd[-1]:.2f}%")
    print("largest differences:")
    for d, k in sorted(diffs, key=lambda t: -abs(t[0]))[:8]:
        print(f"  {d:+6.2f}%  {k.split('::')[-1]}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
