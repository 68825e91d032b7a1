"""online vs naive vs fused vs torch.softmax on the long-row shapes of issue 2 (float32): GB/s and
% of a device copy measured in the same run. Needs a GPU (and torch for its column).

    python3 tools/online_vs_naive.py
"""

import os
import sys

import cupy

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pysoftmax  # noqa: E402
from pysoftmax import _bench  # noqa: E402


def main():
    timer = _bench.Timer()
    copy = _bench.copy_bandwidth(timer)
    torch = _bench._torch()
    print(f"copy {copy:.0f} GB/s")
    for rows, cols in [(4096, 262144), (256, 2097152)]:
        x = cupy.random.standard_normal((rows, cols), dtype=cupy.float32)
        y = cupy.empty_like(x)
        cases = [("naive", lambda: pysoftmax.naive(x, out=y)), ("online", lambda: pysoftmax.online(x, out=y)),
                 ("fused", lambda: pysoftmax.fused(x, out=y))]
        if torch is not None:
            tx = torch.from_dlpack(x)
            cases.append(("torch", lambda: torch.softmax(tx, -1)))
        ms = {}
        for name, fn in cases:
            ms[name] = timer(fn, repeat=15)
            gbs = 2 * x.nbytes / ms[name] / 1e6
            print(f"{rows}x{cols} float32 {name:7} {ms[name]:8.3f} ms {gbs:6.0f} GB/s ({100 * gbs / copy:4.1f}% of copy)")
        line = f"  online/naive speed-up {ms['naive'] / ms['online']:.2f}x"
        if "torch" in ms:
            line += f", online vs torch {ms['torch'] / ms['online']:.2f}x"
        print(line)
        del x, y
        cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
