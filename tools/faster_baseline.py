"""Write a copy of a baseline in which the benchmarks matching a substring ran `factor` times
faster than they really did: the gate must then fail on them (tools for checking the gate).

    python3 tools/faster_baseline.py baseline.json out.json SUBSTRING [factor=1.2]
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pysoftmax import _gate  # noqa: E402


def main(src, dst, needle, factor=1.2):
    with open(src) as f:
        data = json.load(f)
    hit = _gate.scale_times(data, 1 / factor, needle)
    with open(dst, "w") as f:
        json.dump(data, f)
    print(f"{hit} benchmark(s) matching {needle!r} made {factor}x faster in {dst}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], *(float(a) for a in sys.argv[4:5]))
