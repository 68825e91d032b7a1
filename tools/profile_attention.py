"""One attention-shaped forward, run three times, for a profiler to look at the last launch.

    python3 tools/profile_attention.py KIND:S [DTYPE]

KIND is plain, pad ([B,1,1,S] boolean padding mask), causal, or both (mask and causal); S picks a
shape of pysoftmax._bench.ATTENTION_SHAPES (1024: [8,32,1024,1024], 4096: [2,16,4096,4096],
8192: [1,8,8192,8192], 128: [64,16,128,128]); DTYPE defaults to float16. docs/NOTES.md §6 came from it under Nsight Compute on the H200:

    ncu -k regex:rows_ -c 1 -s 2 --metrics smsp__inst_executed.sum,gpu__time_duration.sum,\\
        launch__registers_per_thread python3 tools/profile_attention.py both:4096

(--section SpeedOfLight --section WarpStateStats --section Occupancy for the issue-slot and
occupancy figures; cuobjdump -sass -fun <kernel> pysoftmax/libsoftmax.so for the instructions).
"""

import os
import sys

import cupy

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import pysoftmax  # noqa: E402
from pysoftmax import _bench  # noqa: E402

SHAPES = {str(s): (b, h, s) for b, h, s in _bench.ATTENTION_SHAPES}  # "1024" -> (8, 32, 1024), ...


def main():
    kind, size = sys.argv[1].split(":")
    dtype = sys.argv[2] if len(sys.argv) > 2 else "float16"
    b, h, s = SHAPES[size]
    x = _bench._make(cupy, (b, h, s, s), dtype)
    y = cupy.empty_like(x)
    keep = cupy.random.random((b, 1, 1, s)) > 0.1
    call = {
        "plain": lambda: pysoftmax.fused(x, out=y),
        "pad": lambda: pysoftmax.fused(x, scale=0.125, mask=keep, out=y),
        "causal": lambda: pysoftmax.fused(x, scale=0.125, causal=True, out=y),
        "both": lambda: pysoftmax.fused(x, scale=0.125, mask=keep, causal=True, out=y),
    }[kind]
    for _ in range(3):
        call()
    cupy.cuda.Device().synchronize()


if __name__ == "__main__":
    main()
