"""The bench's multi-device section: pysoftmax on every visible GPU, each alone, then all at once.

``python3 -m pysoftmax bench --devices`` runs it.

* Each device alone: fused forward and backward of the same shape, timed as the bench times a
  case (``_bench.Timer``: L2 flushed before every call, the median), against that device's own
  copy bandwidth, measured first.
* All devices at once, one thread a device: each thread enters its device, warms up, waits for
  the others at a barrier, then queues the same calls back to back for about `seconds` (input sets
  rotating through more than 3x its L2) between two events of its stream. Each device's GB/s
  comes from its own events; the aggregate is every device's bytes over the wall time from the
  first thread past the barrier to the last device done, against the sum of the devices' copy
  ceilings.

Bytes are the bench's (forward: x + y, backward: y + dy + dx). The shapes are large (1 GiB in
float32 by default), so that a call is long beside its host cost and the threads, which share
Python's interpreter lock, keep every device fed.
"""

import json
import math
import sys
import threading
import time

from . import _bench

DEFAULT_SHAPES = [(16384, 16384), (262144, 1024), (2048, 131072)]
DEFAULT_DTYPES = ["float32", "bfloat16"]
DIRECTIONS = ("fwd", "bwd")


def _case(cp, direction, shape, dtype):
    """A callable running one call on the next input set of the current device, and its sets."""
    import pysoftmax

    nbytes = math.prod(shape) * _bench.itemsize(dtype)
    l2 = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["l2CacheSize"]
    count = max(1, math.ceil(3 * l2 / nbytes))
    if direction == "fwd":
        sets = [(_bench._make(cp, shape, dtype),) for _ in range(count)]
    else:  # y a softmax output (rows sum to 1), dy random
        sets = [(pysoftmax.fused(_bench._make(cp, shape, dtype)), _bench._make(cp, shape, dtype)) for _ in range(count)]
    out = cp.empty(shape, dtype=sets[0][0].dtype)
    state = {"i": 0}

    def call():
        s = sets[state["i"] % len(sets)]
        state["i"] += 1
        if direction == "fwd":
            pysoftmax.fused(s[0], out=out)
        else:
            pysoftmax.backward(s[0], s[1], out=out)

    return call


def _together(cp, calls_by_device, count):
    """Runs `count` calls on every device at once, a thread each. (per-device ms, wall seconds)."""
    devices = sorted(calls_by_device)
    barrier = threading.Barrier(len(devices))
    ms, spans, errors = {}, {}, []

    def worker(d):
        try:
            with cp.cuda.Device(d):
                call = calls_by_device[d]
                call()
                cp.cuda.Device(d).synchronize()
                start, end = cp.cuda.Event(), cp.cuda.Event()
                barrier.wait()
                t0 = time.perf_counter()
                start.record()
                for _ in range(count):
                    call()
                end.record()
                end.synchronize()
                spans[d] = (t0, time.perf_counter())
                ms[d] = cp.cuda.get_elapsed_time(start, end)
        except Exception as e:  # reported by the caller; the barrier is broken so nobody waits forever
            errors.append(e)
            barrier.abort()

    # Daemon threads: an interrupted run does not leave workers waiting at the barrier for ever.
    threads = [threading.Thread(target=worker, args=(d,), daemon=True) for d in devices]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    except BaseException:
        barrier.abort()
        raise
    if errors:
        raise errors[0]
    wall = max(end for _, end in spans.values()) - min(start for start, _ in spans.values())
    return ms, wall


def run(shapes=None, dtypes=None, seconds=1.0, json_path=None, progress=True):
    """Measures every visible device alone and all of them at once. Returns the report (a dict:
    device names, each device's copy GB/s, and one result per case and mode)."""
    cp = _bench._cupy()
    shapes = shapes or DEFAULT_SHAPES
    dtypes = dtypes or DEFAULT_DTYPES
    devices = list(range(cp.cuda.runtime.getDeviceCount()))
    names, copies, timers = {}, {}, {}
    for d in devices:
        with cp.cuda.Device(d):
            names[d] = cp.cuda.runtime.getDeviceProperties(d)["name"].decode()
            timers[d] = _bench.Timer()
            copies[d] = _bench.copy_bandwidth(timers[d])
    results = []
    for dtype in dtypes:
        for shape in shapes:
            for direction in DIRECTIONS:
                if progress:
                    sys.stderr.write(f"\r{direction} {shape} {dtype} on {len(devices)} devices   ")
                    sys.stderr.flush()
                nbytes = (2 if direction == "fwd" else 3) * math.prod(shape) * _bench.itemsize(dtype)
                calls, alone = {}, {}
                for d in devices:
                    with cp.cuda.Device(d):
                        calls[d] = _case(cp, direction, shape, dtype)
                        alone[d] = timers[d](calls[d])
                        results.append(dict(mode="alone", direction=direction, shape=list(shape), dtype=dtype, device=d,
                                            ms=alone[d], gbs=nbytes / alone[d] / 1e6,
                                            pct_copy=100 * nbytes / alone[d] / 1e6 / copies[d]))
                count = max(1, int(seconds * 1e3 / min(alone.values())))
                ms, wall = _together(cp, calls, count)
                total = len(devices) * count * nbytes / wall / 1e9
                results.append(dict(mode="together", direction=direction, shape=list(shape), dtype=dtype,
                                    calls=count, wall_s=wall,
                                    gbs_each={str(d): count * nbytes / ms[d] / 1e6 for d in devices},
                                    gbs_total=total, pct_of_ceilings=100 * total / sum(copies.values())))
                del calls
                for d in devices:
                    with cp.cuda.Device(d):
                        cp.get_default_memory_pool().free_all_blocks()
    if progress:
        sys.stderr.write("\n")
    report = dict(devices={str(d): n for d, n in names.items()}, copy_gbs={str(d): c for d, c in copies.items()},
                  results=results)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1)
    return report


def table(report):
    """The report as text: each device's copy ceiling, then a line per case: each device alone
    (GB/s, % of its copy), each device while all run, and the aggregate against the sum of the
    ceilings."""
    devices = sorted(report["devices"], key=int)
    lines = ["devices: " + ", ".join(f"{d}: {report['devices'][d]} (copy {report['copy_gbs'][d]:.0f} GB/s)"
                                     for d in devices)]
    head = (f"{'case':4} {'shape':>14} {'dtype':9} "
            + " ".join(f"{'alone ' + d:>13}" for d in devices)
            + " " + " ".join(f"{'together ' + d:>11}" for d in devices)
            + f" {'total GB/s':>10} {'% of ceilings':>13}")
    lines.append(head)
    alone = {}
    for r in report["results"]:
        key = (r["direction"], tuple(r["shape"]), r["dtype"])
        if r["mode"] == "alone":
            alone.setdefault(key, {})[str(r["device"])] = r
            continue
        a = alone.get(key, {})
        cells = " ".join(f"{a[d]['gbs']:6.0f} {a[d]['pct_copy']:5.1f}%" if d in a else f"{'-':>13}" for d in devices)
        each = " ".join(f"{r['gbs_each'].get(d, 0):11.0f}" for d in devices)
        lines.append(f"{key[0]:4} {'x'.join(map(str, key[1])):>14} {key[2]:9} {cells} {each} "
                     f"{r['gbs_total']:10.0f} {r['pct_of_ceilings']:12.1f}%")
    return "\n".join(lines)
