"""Small calls that reach every kernel family; run under compute-sanitizer by tools/sanitize.py."""

import os
import sys

import cupy
import numpy

import pysoftmax
from pysoftmax import _lib, _ops

cupy.cuda.set_allocator(None)  # one cudaMalloc per array: out-of-bounds accesses are visible
rng = numpy.random.default_rng()


def arr(shape, dtype="float32"):
    return cupy.asarray(rng.standard_normal(shape) * 3).astype(dtype)


def step(name, fn):
    fn()
    cupy.cuda.runtime.deviceSynchronize()
    print(f"[sanitize] ok {name}", flush=True)


# Rows on a cooperative grid whose blocks hold two rows' chunks and meet each row's barrier a row
# late (Plan::lag): tools/sanitize.py runs these alone once more, in processes with
# PYSOFTMAX_GRID_LAG=1 and SANITIZE_ONLY=grid, where every grid row that two chunks a block hold
# whole takes a lagged plan. More rows than groups (each group walking several, the partials' and
# counters' four sets reused), one group walking every row (a grid cap), a straddling row.
def grid_steps(dtype):
    for shape in ((9, 1048576), (7, 600004)):
        x = arr(shape, dtype)
        plan = _ops.plan(x.shape, dtype)
        step(f"grid {shape} {dtype} (grid={plan['grid']} lag={plan['lag']} chunks={plan['chunks']} held={plan['held']})",
             lambda: _ops.forward(x))
        step(f"grid backward {shape} {dtype}", lambda: _ops.backward_impl(x, x))
        step(f"grid one group {shape} {dtype}", lambda: _ops.forward(x, blocks=1))
        del x
    x = arr((2, 1048577), dtype)
    plan = _ops.plan(x.shape, dtype, aligned=False)
    step(f"grid straddling (2, 1048577) {dtype} (grid={plan['grid']} lag={plan['lag']})", lambda: _ops.forward(x))
    step(f"grid straddling backward (2, 1048577) {dtype}", lambda: _ops.backward_impl(x, x))
    del x


# Masked straddling rows (16-bit rows with a boolean mask, a causal limit or both): bodies in
# rows_warp's groups (the padding mask alone), rows_block and the stream (queries fewer than the
# keys), each row's mask and limit shifted with its body; three blocks walking the rows.
# tools/sanitize.py runs these alone once more with PYSOFTMAX_STRADDLE_MASKED=0 and
# SANITIZE_ONLY=masked, on their element-wise plans.
def masked_straddle_steps(dtype):
    for shape in ((2, 67, 257), (2, 40, 1033), (1, 9, 20001)):
        x = arr(shape, dtype)
        pad = cupy.asarray(rng.random((shape[0], 1, shape[2])) > 0.2)
        plan = _ops.plan((shape[0] * shape[1], shape[2]), dtype, causal_queries=shape[1], mask=True)
        step(f"masked straddling {shape} {dtype} (family={plan['family']} straddle={plan['straddle']})",
             lambda: pysoftmax.fused(x, scale=0.5, mask=pad, causal=True))
        step(f"masked straddling pad {shape} {dtype}", lambda: pysoftmax.fused(x, mask=pad))
        step(f"masked straddling walk {shape} {dtype}",
             lambda: _ops.forward(x, scale=0.5, mask=pad, causal=True, blocks=3))
        del x, pad


if os.environ.get("SANITIZE_ONLY") == "masked":
    masked_straddle_steps("float16")
    sys.exit(0)


if os.environ.get("SANITIZE_ONLY") == "grid":
    for dtype in ("float32", "float16"):
        grid_steps(dtype)
    sys.exit(0)


# rows_tile (dense odd widths whose arrays share their offset inside the pack): the plain fused
# forward and the backward of the default rule's rows (element-wise, straddling in one step and in
# two); run with PYSOFTMAX_TILE_COLS=1000000 (and PYSOFTMAX_TILE_VEC=0), every path (several steps
# a group, the block a row, float32 and float64, straddling and element-wise). The arrays at their
# allocation's start and one element into it, the last tile partial. SANITIZE_ONLY=tile stops
# after these.
for dtype in ("float16", "float32", "float64"):
    for rows, cols in ((1000, 33), (301, 99), (5, 127), (77, 599), (77, 1001), (9, 4097)):
        for off in (0, 1):
            y, dy, out = (arr((rows * cols + off,), dtype)[off:].reshape(rows, cols) for _ in range(3))
            for direction in ("backward", "forward"):
                plan = _ops.plan((rows, cols), dtype, direction=direction, aligned=off == 0)
                call = (lambda: _ops.backward_impl(y, dy, out=out)) if direction == "backward" else (lambda: pysoftmax.fused(y, out=out))
                step(f"tile {direction} {dtype} {rows}x{cols} offset={off} ({plan['family']} group={plan['group']} "
                     f"pack={plan['pack']} tile={plan['tile']})", call)
if os.environ.get("SANITIZE_ONLY") == "tile":
    sys.exit(0)


for dtype in ("float32", "float16", "float64"):
    for cols in (3, 33, 300, 1000, 1025, 5000, 17000):
        x = arr((9, cols), dtype)
        for algo in ("naive", "online", "fused"):
            step(f"{algo} {dtype} {cols}", lambda: getattr(pysoftmax, algo)(x))
        step(f"fused unaligned {dtype} {cols}", lambda: pysoftmax.fused(arr((9, cols + 1), dtype)[:, 1:]))
        y = pysoftmax.fused(x)
        dy = arr((9, cols), dtype)
        step(f"backward {dtype} {cols}", lambda: pysoftmax.backward(y, dy))
        step(f"naive_backward {dtype} {cols}", lambda: pysoftmax.naive_backward(y, dy))
        for fam in (1, 2, 3):
            name = {1: "warp", 2: "block", 3: "stream"}[fam]
            try:
                _ops.plan((9, cols), dtype, family=name)
                _ops.plan((9, cols), dtype, family=name, direction="backward")
            except pysoftmax.SoftmaxError:  # the family cannot hold this row: nothing to check
                continue
            step(f"family {fam} {dtype} {cols}", lambda: _ops.forward(x, family=fam))
            step(f"family {fam} backward {dtype} {cols}", lambda: _ops.backward_impl(y, dy, family=fam))
x = arr((777, 40))  # rows_passes: groups of 2 lanes, the last warp's groups partly past the end
for algo in ("naive", "online"):
    step(f"{algo} in groups", lambda: getattr(pysoftmax, algo)(x))
step("naive_backward in groups", lambda: pysoftmax.naive_backward(x, x))
for cols in (384, 1280):  # 16-bit groups of several steps, warming the next (1280: a ragged row of 3)
    x = arr((777, cols), "float16")
    for algo in ("naive", "online"):
        step(f"{algo} warmed groups {cols}", lambda: getattr(pysoftmax, algo)(x))
    step(f"naive_backward warmed groups {cols}", lambda: pysoftmax.naive_backward(x, x))
x = arr((3, 70000))
step("stream split", lambda: _ops.forward(x, family=3, chunks=5))
step("stream split backward", lambda: _ops.backward_impl(x, x, family=3, chunks=5))
# The backward's ring carried on from chunk to chunk of a block's walk: 2 blocks for the 15
# chunks, both launches.
step("stream split backward, 2 blocks", lambda: _ops.backward_impl(x, x, family=3, chunks=5, blocks=2))
step("online one long row", lambda: pysoftmax.online(arr((1, 300000))))
# Rows read twice through the stream's ring of steps in flight (4 steps of 8192 16-bit columns
# on an H200, rows of 5 steps, the last partial, and more rows than blocks: one chunk a row).
x = arr((600, 5 * 8192 - 24), "float16")
plan = _ops.plan(x.shape, "float16", direction="backward", algo="naive")
step(f"naive_backward ring (held={plan['held']} chunks={plan['chunks']})", lambda: pysoftmax.naive_backward(x, x))
# The ring carried on from pass to pass and row to row: rows of one step (a ring of 2 on an H200:
# a block of the automatic grid has one row, two passes), 3 blocks walking 40 rows.
x = arr((40, 8192 - 24), "float16")
step("naive_backward ring across rows, 3 blocks", lambda: _ops.backward_impl(x, x, algo=_lib.ALGO_NAIVE, blocks=3))
# float32 rows of one step of narrower blocks (320 threads), carried through the one-step walk.
x = arr((40, 5000))
step("naive_backward narrow ring across rows, 3 blocks", lambda: _ops.backward_impl(x, x, algo=_lib.ALGO_NAIVE, blocks=3))
s = arr((2, 3, 40, 40), "float16")
keep = cupy.asarray(rng.random((2, 1, 1, 40)) > 0.3)
step("fused mask causal", lambda: pysoftmax.fused(s, scale=0.5, mask=keep, causal=True))
step("fused additive mask", lambda: pysoftmax.fused(s, mask=arr((40, 40), "float32")))
step("fused strided mask", lambda: pysoftmax.fused(s, mask=arr((40, 80), "float16")[:, ::2]))
# 16-bit rows under a causal limit are read a step ahead (ForwardOp::kPipe), their boolean mask a
# word a pack where it is contiguous and aligned, else byte by byte (a column stride of 2). Rows of
# 20 in rows padded to 24 (vector packs; the row's end cuts one, read element by element, reached
# by the queries past the 20th), one block walking 10 steps.
keep2 = cupy.asarray(rng.random((2, 1, 1, 80)) > 0.3)[..., ::2]
step("fused strided boolean mask causal", lambda: pysoftmax.fused(s, scale=0.5, mask=keep2, causal=True))
xp = arr((16, 40, 24), "float16")[..., :20]
keep3 = cupy.asarray(rng.random((16, 1, 40)) > 0.3)[..., ::2]
step("read ahead, cut pack, strided mask, 1 block",
     lambda: _ops.forward(xp, scale=0.5, mask=keep3, causal=True, blocks=1))

# Enough rows that every staged register family walks a second row per block or warp: the copy
# of the next rows into shared memory overlaps the current ones (rows > the grid's blocks, 4224
# on an H200, times the rows a block holds). Grids with a block for every set of rows (unmasked
# forward, float32 backward, a padding mask's rows_block) walk under a grid cap of 4 blocks an SM
# as well.
walk = 4 * cupy.cuda.Device().attributes["MultiProcessorCount"]
for dtype in ("float32", "float16"):
    for rows, cols, what in ((300000, 40, "rows_warp tiny"), (17000, 304, "rows_warp medium"),
                             (8500, 1032, "rows_block")):  # rows_stream walks several steps a row above
        x = arr((rows, cols), dtype)
        plan = _ops.plan((rows, cols), dtype)
        step(f"many rows fused {what} {dtype} ({plan['family']} stage={plan['stage']})", lambda: pysoftmax.fused(x))
        step(f"many rows fused {what} {dtype}, {walk} blocks", lambda: _ops.forward(x, blocks=walk))
        y = pysoftmax.fused(x)
        step(f"many rows backward {what} {dtype}", lambda: pysoftmax.backward(y, x))
        step(f"many rows backward {what} {dtype}, {walk} blocks", lambda: _ops.backward_impl(y, x, blocks=walk))
        step(f"many rows masked {what} {dtype}",
             lambda: pysoftmax.fused(x.reshape(rows // 100 if rows % 100 == 0 else rows, -1, cols), causal=True))
        # A padding mask without a causal limit: kernels of their own (kKeepMask).
        xh = x.reshape(rows // 100, 100, cols)
        pad = cupy.asarray(rng.random((rows // 100, 1, cols)) > 0.3)
        step(f"many rows padding mask {what} {dtype}", lambda: pysoftmax.fused(xh, mask=pad))
        step(f"many rows padding mask {what} {dtype}, {walk} blocks", lambda: _ops.forward(xh, mask=pad, blocks=walk))
        del x, y, xh, pad
    # Boolean-masked 16-bit short rows in 4 packs a lane (groups of 16 lanes for rows of 304),
    # staged, which dispatch takes only where every walking block takes two steps or more.
    if dtype == "float16":
        # Rows for two steps of every walking block: 2 steps x 32 blocks an SM (dispatch.cuh,
        # kMaxBlocksPerSm) x 8 rows a block (128 threads in groups of 16 lanes), in heads of 100
        # queries, plus a few so that the last step is partial.
        steps, blocks_per_sm, rows_per_block, queries = 2, 32, 128 // 16, 100
        sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
        heads = -(-steps * blocks_per_sm * rows_per_block * sms // queries) + 7
        x = arr((heads, 100, 304), dtype)
        pad = cupy.asarray(rng.random((heads, 1, 304)) > 0.3)
        plan = _ops.plan((heads * 100, 304), dtype, causal_queries=100)
        assert plan["packs"] == 4, plan  # else this step no longer reaches the wide lanes
        step(f"many rows masked wide lanes {dtype} (packs={plan['packs']} group={plan['group']} stage={plan['stage']})",
             lambda: pysoftmax.fused(x, scale=0.5, mask=pad, causal=True))
        del x, pad
    # rows_stream with each row resident in its stage: 64-thread blocks make rows of 2056 three
    # steps (the last partial), and more rows than blocks make each block refill its stage.
    x = arr((4300, 2056), dtype)
    plan = _ops.plan(x.shape, dtype, family="stream", threads=64)
    step(f"many rows resident stream {dtype} (resident={plan['resident']} stage={plan['stage']})",
         lambda: _ops.forward(x, family=3, threads=64))
    step(f"many rows resident stream backward {dtype}", lambda: _ops.backward_impl(x, x, family=3, threads=64))
    del x
    # Rows too long for one block's stage (240 KiB), resident in a cluster of blocks where the GPU
    # has clusters: the grid holds the clusters that run at once, so each walks several rows,
    # refilling its stages and exchanging statistics through its blocks' shared memory.
    x = arr((530, 120000 if dtype == "float16" else 60000), dtype)
    plan = _ops.plan(x.shape, dtype)
    step(f"cluster stream {dtype} (cluster={plan['cluster']} stage={plan['stage']})", lambda: _ops.forward(x))
    step(f"cluster stream backward {dtype}", lambda: _ops.backward_impl(x, x))
    del x
    # Rows that no cluster holds, on a cooperative grid whose groups of blocks exchange their
    # statistics through global memory: 9 rows held whole (more rows than groups, so groups walk
    # several, refilling their stages), and one row past the grid's capacity (each block streams
    # the rest of its chunk twice through one more step's slots).
    for shape in ((9, 1048576), (1, 16777216 if dtype == "float16" else 8388608 + 4096)):
        x = arr(shape, dtype)
        plan = _ops.plan(x.shape, dtype)
        step(f"grid stream {shape} {dtype} (grid={plan['grid']} chunks={plan['chunks']} held={plan['held']})",
             lambda: _ops.forward(x))
        step(f"grid stream backward {shape} {dtype}", lambda: _ops.backward_impl(x, x))
        del x
    # Straddling rows (odd lengths, rows_stream kStraddle): each row's aligned body in vector packs
    # and the pack - 1 columns around it an element a thread, in one block, a cluster, the grid,
    # and the two-launch split; the last row's body ends one partial pack before the allocation.
    for shape in ((40, 20001), (3, 70001), (2, 1048577)):
        x = arr(shape, dtype)
        plan = _ops.plan(x.shape, dtype, aligned=False)
        step(f"straddling {shape} {dtype} (straddle={plan['straddle']} cluster={plan['cluster']} grid={plan['grid']})",
             lambda: _ops.forward(x))
        step(f"straddling backward {shape} {dtype}", lambda: _ops.backward_impl(x, x))
        step(f"straddling online {shape} {dtype}", lambda: pysoftmax.online(x))
        step(f"straddling split {shape} {dtype}", lambda: _ops.forward(x, chunks=3))
        del x
    # Straddling rows a block holds (rows_block kStraddle, 16-bit by default): the automatic grid
    # and three blocks walking the rows, each row its own head.
    for shape in ((67, 4097), (5, 1033)):
        x = arr(shape, dtype)
        plan = _ops.plan(x.shape, dtype)
        step(f"block straddling {shape} {dtype} (family={plan['family']} straddle={plan['straddle']})",
             lambda: _ops.forward(x))
        step(f"block straddling walk {shape} {dtype}", lambda: _ops.forward(x, blocks=3))
        step(f"block straddling backward {shape} {dtype}", lambda: _ops.backward_impl(x, x, blocks=3))
        del x
    # Straddling rows groups of lanes hold (rows_warp kStraddle, the forward's 16-bit rows past the
    # tile): groups of 8, 16 and 32 lanes (two rows a group, dead rows in the last warp), the
    # automatic grid and one block walking the rows.
    for shape in ((13, 137), (67, 257), (99, 519)):
        x = arr(shape, dtype)
        plan = _ops.plan(x.shape, dtype)
        step(f"warp straddling {shape} {dtype} (family={plan['family']} group={plan['group']} straddle={plan['straddle']})",
             lambda: _ops.forward(x))
        step(f"warp straddling walk {shape} {dtype}", lambda: _ops.forward(x, blocks=1))
        del x
    masked_straddle_steps(dtype)
    # The reference algorithms' straddling rows (rows_passes kStraddle): groups of 8 and 16 lanes,
    # several steps, naive's block a row; dead rows in the last block, one block walking the rows.
    for shape in ((13, 99), (67, 1033), (5, 2049)):
        x = arr(shape, dtype)
        plan = _ops.plan(x.shape, dtype, algo="naive")
        step(f"passes straddling naive {shape} {dtype} (group={plan['group']} straddle={plan['straddle']})",
             lambda: pysoftmax.naive(x))
        step(f"passes straddling online {shape} {dtype}", lambda: _ops.forward(x, algo=_lib.ALGO_ONLINE, blocks=1))
        step(f"passes straddling naive_backward {shape} {dtype}", lambda: pysoftmax.naive_backward(x, x))
        del x

# naive's few long rows split across blocks (rows_passes kSplit, three launches): element-wise
# float32, straddling 16-bit, aligned vector rows; the automatic grid and 3 blocks walking the chunks.
for dtype, shape in (("float32", (3, 70001)), ("float16", (2, 100003)), ("float32", (5, 131072))):
    x = arr(shape, dtype)
    plan = _ops.plan(x.shape, dtype, algo="naive")
    step(f"naive split {shape} {dtype} (chunks={plan['chunks']} straddle={plan['straddle']})", lambda: pysoftmax.naive(x))
    step(f"naive split {shape} {dtype}, 3 blocks", lambda: _ops.forward(x, algo=_lib.ALGO_NAIVE, blocks=3))
    del x
