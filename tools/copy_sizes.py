"""The copy ceiling by size: GB/s of a device-to-device copy (`cupy.copyto`, read + write counted)
of 32 MiB to 4 GiB, timed two ways: one call after an L2 flush (pysoftmax._bench.Timer, as `bench`
and tools/lib_ab.py time every case), and calls back to back in a CUDA graph over inputs that
rotate through more than L2 holds (as the suite times pysoftmax's calls). A shape moves what a copy
of half its bytes moves (forward: x and y; backward: y, dy and dx), so its ceiling under the same
timing is the copy of that size, not the 4 GiB one. One JSON line a size. docs/NOTES.md §48.

    python3 tools/copy_sizes.py > copy.jsonl
    SIZES_MIB=64,96,128 python3 tools/copy_sizes.py
"""
import json, os, sys

import cupy

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pysoftmax import _bench  # noqa: E402

SIZES_MIB = [int(v) for v in os.environ.get("SIZES_MIB", "32,64,96,128,192,256,512,4096").split(",")]
ROTATE_BYTES = 192 << 20  # graph inputs: more than 3x an H100's or H200's L2
GRAPH_BYTES = 2 << 30     # bytes a graph copies in all (its calls: this over the size, 2 to 50)


def graph_ms(dst, srcs, calls, stream, repeat=5):
    """Median milliseconds a call of `calls` copies into dst, captured in one graph."""
    with stream:
        cupy.copyto(dst, srcs[0])  # outside the capture: the stream's first work
        stream.synchronize()
        stream.begin_capture()
        for i in range(calls):
            cupy.copyto(dst, srcs[i % len(srcs)])
        graph = stream.end_capture()
    graph.launch(stream=stream)
    stream.synchronize()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(repeat):
        start.record(stream)
        graph.launch(stream=stream)
        end.record(stream)
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / calls)
    return sorted(times)[len(times) // 2]


def main():
    timer = _bench.Timer()
    stream = cupy.cuda.Stream(non_blocking=True)
    device = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
    for mib in SIZES_MIB:
        n = mib << 20
        srcs = [cupy.ones(n // 4, dtype=cupy.float32) for _ in range(max(1, ROTATE_BYTES // n))]
        dst = cupy.empty_like(srcs[0])
        alone = timer(lambda: cupy.copyto(dst, srcs[0]), repeat=20)
        calls = max(2, min(50, GRAPH_BYTES // n))
        graphed = graph_ms(dst, srcs, calls, stream)
        print(json.dumps(dict(device=device, mib=mib, alone_gbs=round(2 * n / alone / 1e6, 1),
                              graph_gbs=round(2 * n / graphed / 1e6, 1), graph_calls=calls, inputs=len(srcs))),
              flush=True)
        del srcs, dst
        cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
