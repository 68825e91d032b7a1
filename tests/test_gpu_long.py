"""Long rows on the GPU: rows_stream over a cooperative grid (hip/dispatch.cuh, plan_grid), against
float64 references with poisoned outputs.

On an H200 (227 KiB of stage a block, clusters of up to 8) a float32 forward row holds 7 steps of
8192 columns a block, so a cluster holds rows up to 458752 columns and rows past that go to a
group of the grid's blocks; the grid holds rows whole up to 132 x 7 steps (7.5M columns), and
past that each block streams the rest of its chunk twice. Backward steps (y and dy) are twice the
bytes: a cluster holds 196608 columns, the grid 3.2M. 16-bit steps are 16384 columns. The shapes
below sit on both sides of those lengths. Masked rows, and rows whose arrays start at different
offsets inside the pack, are never staged, so they take the two-launch split instead; odd lengths
whose arrays share their offsets straddle (rows_stream kStraddle). Both are checked here.

Rows that are streamed from global memory (naive_backward's, and the stream with one chunk
requested) keep several steps in flight through a ring of steps' slots (`held` in a plan). The
forward's ring walks a pass, never more than a chunk's steps; the backward's 512-thread blocks
carry theirs on from pass to pass and row to row (`carry` in a plan), never more than a block's
steps, and so do its narrower float32 and float64 blocks on rows of one step. test_stream_ring
covers chunks shorter than the ring, as long and longer, one launch and two, grids capped at a few
blocks; test_stream_ring_across_rows more rows than the grid has blocks.
"""

import os

import numpy
import pytest

from _util import (NEAR_LARGEST, assert_close, assert_grad_close, poisoned, pytest_in_process, ref_softmax, rng,
                   rounded, to_device, to_host64)

pytestmark = pytest.mark.gpu

try:
    import cupy
    import pysoftmax
    from pysoftmax import _ops
except ImportError:  # pragma: no cover
    pass


def grid_capable():
    """Whether plan_grid can run here: staged rows (NVIDIA sm_80+) and cooperative launches."""
    if cupy.cuda.runtime.is_hip:
        return False
    dev = cupy.cuda.Device()
    return int(dev.compute_capability) >= 80 and dev.attributes["CooperativeLaunch"] == 1


def grid_plan(rows, cols, dtype, direction):
    """The plan of a shape that a test needs on the cooperative grid, or a skip saying why not."""
    if not grid_capable():
        pytest.skip("no cooperative grid of staged rows here")
    plan = _ops.plan((rows, cols), dtype, direction=direction)
    if not plan["grid"]:
        pytest.skip(f"this GPU plans {rows} x {cols} {dtype} {direction} off the grid: {plan}")
    return plan


def clusters():
    return not cupy.cuda.runtime.is_hip and int(cupy.cuda.Device().compute_capability) >= 90


# (rows, cols, dtype, direction): past a cluster by one pack, a cluster's most, held whole by the
# grid, past the grid's capacity (streamed in part), 1/2/3/7/100+ rows.
CASES = [
    (3, 458752, "float32", "forward"),        # a cluster of 8 holds it (the grid takes it: 3 rows)
    (3, 458756, "float32", "forward"),        # one pack more: the grid
    (1, 1048576, "float32", "forward"),
    (2, 1048580, "float32", "forward"),
    (7, 2097152 + 12, "float32", "forward"),
    (130, 131072 * 4 + 4, "float32", "forward"),
    (1, 8388608 + 4, "float32", "forward"),   # past the grid's capacity: streamed in part
    (2, 8000004, "float32", "forward"),
    (3, 196608, "float32", "backward"),       # a cluster of 8
    (3, 196612, "float32", "backward"),       # the grid
    (1, 4194308, "float32", "backward"),      # streamed in part
    (101, 300004, "float32", "backward"),     # the grid holds its chunks whole (kGridReread)
    (16, 1048576, "float32", "backward"),     # the grid (lagged where forced: one-step chunks)
    (9, 2097152, "bfloat16", "backward"),     # lagged by default (a group walks 9 rows, two steps a chunk)
    (40, 300004, "bfloat16", "backward"),
    (3, 917504, "float16", "forward"),        # a cluster of 8
    (3, 917512, "float16", "forward"),        # the grid
    (1, 16777216, "bfloat16", "forward"),     # streamed in part
    (8, 4194304, "float32", "forward"),       # a group walks 4 rows or more unlagged: its partials'
    (8, 8388608, "bfloat16", "forward"),      # two sets and its counter reused
    (2, 1048584, "bfloat16", "backward"),
    (7, 2000008, "float16", "backward"),
    (2, 600000, "float64", "forward"),
    (2, 600000, "float64", "backward"),
]


@pytest.mark.parametrize("rows,cols,dtype,direction", CASES)
def test_long_rows(rows, cols, dtype, direction):
    g = rng()
    plan = _ops.plan((rows, cols), dtype, direction=direction)
    wide = dtype == "float32"  # columns a step and steps a block's stage holds, on an H200
    step, fit = {("forward", True): (8192, 7), ("forward", False): (16384, 7), ("backward", True): (8192, 3),
                 ("backward", False): (8192, 7)}[direction, wide]
    cluster_cols = 8 * fit * step
    if dtype != "float64" and grid_capable() and clusters() and cols > cluster_cols:
        assert plan["grid"] == 1, plan  # (shorter rows take it too where they are few: split for want of rows)
    if plan["grid"]:
        assert plan["resident"] == 1 and plan["blocks"] % plan["chunks"] == 0 and plan["workspace"] > 0, plan
    what = f"{direction} {rows}x{cols} {dtype} {plan} seed={g.seed}"
    if direction == "forward":
        x64 = rounded(g.standard_normal((rows, cols)) * 3, dtype)
        y = pysoftmax.fused(to_device(x64, dtype), out=poisoned((rows, cols), dtype))
        assert_close(to_host64(y), ref_softmax(x64), dtype, what)
    else:
        y64 = rounded(ref_softmax(g.standard_normal((rows, cols)) * 3), dtype)
        dy64 = rounded(g.standard_normal((rows, cols)), dtype)
        dx = _ops.backward_impl(to_device(y64, dtype), to_device(dy64, dtype), scale=0.7,
                                out=poisoned((rows, cols), dtype))
        assert_grad_close(to_host64(dx), y64, dy64, 0.7, dtype, what)


def test_grid_holds_chunks_whole_where_rows_are_many():
    """plan_grid's cost of a streamed step (kGridReread, a whole step): where a group walks many
    rows, it takes more, shorter chunks that its blocks hold whole rather than fewer that stream
    part of each (docs/TUNING.md, "plan_grid"); a row alone still streams."""
    if not grid_capable() or not clusters():
        pytest.skip("no cooperative grid of staged rows, or no clusters, here")
    if "PYSOFTMAX_GRID_REREAD" in os.environ or "PYSOFTMAX_GRID_BLOCKS" in os.environ:
        pytest.skip("plan_grid's cost or blocks an SM set by the environment")
    if cupy.cuda.Device().attributes["MultiProcessorCount"] != 132:
        pytest.skip("the plans below are an H200's (132 SMs)")
    step = 8192  # backward's columns a step, every dtype but float64, on an H200
    for shape, dtype in [((256, 1048576), "float32"), ((256, 1048576), "bfloat16"), ((101, 300004), "float32"),
                         ((4096, 262144), "float32"), ((40, 300004), "bfloat16")]:
        plan = _ops.plan(shape, dtype, direction="backward")
        assert plan["grid"] == 1 and plan["held"] == -(-plan["chunk_cols"] // step), (shape, dtype, plan)
    plan = _ops.plan((1, 4194308), "float32", direction="backward")
    assert plan["grid"] == 1 and plan["held"] < -(-plan["chunk_cols"] // step), plan


# Straddling rows (hip/families.cuh, rows_stream kStraddle): odd lengths, whose rows start at every
# offset inside the 16-byte pack, in vector packs over each row's aligned body. (rows, cols, dtype,
# direction, algo): a row of 2^24 + 1 (one row: no stride), many rows a cluster holds, rows the
# grid holds and streams, a vocabulary of 32001, float64, online's stream, and naive_backward's
# (16-bit only: its wider rows stay element-wise, test_gpu_forward.py's plan thresholds).
STRADDLING = [
    (1, 16777217, "float32", "forward", "fused"),
    (130, 131071, "float32", "forward", "fused"),
    (3, 458753, "float16", "forward", "fused"),
    (2, 1048577, "bfloat16", "forward", "fused"),
    (65, 32001, "bfloat16", "forward", "fused"),
    (5, 100003, "float64", "forward", "fused"),
    (9, 65537, "float32", "forward", "online"),
    (2, 1048577, "float16", "forward", "online"),
    (7, 196613, "float32", "backward", "fused"),
    (3, 1048581, "bfloat16", "backward", "fused"),
    (65, 32001, "float16", "backward", "fused"),
    (5, 100003, "float64", "backward", "fused"),
    (9, 65537, "bfloat16", "backward", "naive"),
]
ALGOS = {"fused": 0, "online": 1, "naive": 2}


def long_inputs(g, rows, cols, dtype, direction):
    """Random logits (forward) or a softmax output and a gradient (backward), float64 and rounded.
    (A float16 row of 16M holds values near 6e-8, float16's smallest subnormal: float32 there.)"""
    if direction == "forward":
        return (rounded(g.standard_normal((rows, cols)) * 3, dtype),)
    return rounded(ref_softmax(g.standard_normal((rows, cols)) * 3), dtype), rounded(g.standard_normal((rows, cols)), dtype)


def check_long(direction, algo, host, dev, out, dtype, what, **kw):
    """Runs the op on `dev` into `out` and checks it against float64 (host)."""
    if direction == "forward":
        y = _ops.forward(dev[0], algo=ALGOS[algo], out=out, **kw)
        assert_close(to_host64(y), ref_softmax(host[0]), dtype, what)
    else:
        dx = _ops.backward_impl(dev[0], dev[1], algo=ALGOS[algo], scale=0.7, out=out, **kw)
        assert_grad_close(to_host64(dx), host[0], host[1], 0.7, dtype, what)


@pytest.mark.parametrize("rows,cols,dtype,direction,algo", STRADDLING)
def test_straddling_rows(rows, cols, dtype, direction, algo):
    """Odd lengths in a contiguous array (row r starts r x cols elements in, at every offset in the
    pack) straddle where their element-wise plan streams: the plan is the stream of the bodies,
    pack - 1 columns shorter, and every column, the head before each body and the rest after it,
    is written with the right value."""
    g = rng()
    plan = _ops.plan((rows, cols), dtype, direction=direction, algo=algo)
    assert plan["family"] == "stream" and plan["straddle"] == 1 and plan["pack"] > 1, plan
    host = long_inputs(g, rows, cols, dtype, direction)
    dev = [to_device(a, dtype) for a in host]
    check_long(direction, algo, host, dev, poisoned((rows, cols), dtype), dtype,
               f"{direction} {algo} {rows}x{cols} {dtype} {plan} seed={g.seed}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_straddling_views_split_and_repeatable(dtype, direction):
    """Straddling rows of views one element into wider rows (every array at the same offset), with
    the poison around them kept: the automatic plan, the plan split into chunks over two launches,
    a grid capped at one group or cluster that walks every row, the stream forced, and the same
    bits twice; the forward in place too."""
    g = rng()
    rows, cols = 5, 70001
    pack = 16 // (4 if dtype == "float32" else 2)
    host = long_inputs(g, rows, cols, dtype, direction)
    width = cols + 2 * pack
    views = [to_device(numpy.pad(a, ((0, 0), (1, width - cols - 1))), dtype)[:, 1:1 + cols] for a in host]
    what = f"{direction} {dtype} {rows}x{cols}"
    first = None
    for kw in (dict(), dict(chunks=3), dict(blocks=1), dict(family=3), dict()):
        out_buf = poisoned((rows, width), dtype)
        out = out_buf[:, 1:1 + cols]
        check_long(direction, "fused", host, views, out, dtype, f"{kw} {what} seed={g.seed}", **kw)
        rest = to_host64(out_buf)
        assert numpy.isnan(rest[:, 0]).all() and numpy.isnan(rest[:, 1 + cols:]).all(), f"{kw}: written outside"
        bits = cupy.ascontiguousarray(out).view(cupy.uint16)
        if first is None:
            first = bits
        elif not kw:
            assert bool((bits == first).all()), "repeated calls differ"
    if direction == "forward":  # in place: out is x
        x = cupy.array(views[0])
        assert pysoftmax.fused(x, out=x) is x
        assert_close(to_host64(x), ref_softmax(host[0]), dtype, f"in place {what} seed={g.seed}")


def test_straddling_offsets_that_differ_stay_element_wise():
    """Arrays at different offsets inside the pack cannot share one shift: element-wise, right.
    The fast path keys its plans on each array's offset: a view one element in with a fresh
    (aligned) output, then the same values contiguous (straddling), alternately, each right."""
    g = rng()
    rows, cols = 3, 70001
    x64 = rounded(g.standard_normal((rows, cols)) * 3, "float32")
    buf = to_device(numpy.pad(x64, ((0, 0), (1, 7))), "float32")
    x = buf[:, 1:1 + cols]
    contiguous = to_device(x64, "float32")
    assert _ops.plan((rows, cols), "float32", aligned="mixed")["straddle"] == 0
    y = pysoftmax.fused(x, out=poisoned((rows, cols), "float32"))  # a fresh output: aligned, x is not
    assert_close(to_host64(y), ref_softmax(x64), "float32", f"seed={g.seed}")
    for _ in range(2):
        for xin in (x, contiguous):
            assert_close(to_host64(pysoftmax.fused(xin)), ref_softmax(x64), "float32", f"fast path seed={g.seed}")


def test_long_rows_masked_and_causal():
    """A boolean padding mask, a float mask and a causal limit on rows of 600000 (never staged)."""
    g = rng()
    q, k = 3, 600000
    x64 = rounded(g.standard_normal((q, k)) * 3, "float32")
    keep = g.random((1, k)) > 0.2
    bias = rounded(g.standard_normal((1, k)), "float32")
    y = pysoftmax.fused(to_device(x64, "float32"), scale=0.5, mask=cupy.asarray(keep), causal=True,
                        out=poisoned((q, k), "float32"))
    assert_close(to_host64(y), ref_softmax(x64, 0.5, keep, causal=True), "float32", f"pad + causal seed={g.seed}")
    y = pysoftmax.fused(to_device(x64, "float32"), mask=to_device(bias, "float32"), out=poisoned((q, k), "float32"))
    assert_close(to_host64(y), ref_softmax(x64, 1.0, bias), "float32", f"float mask seed={g.seed}")


# Edge values on long rows: the partials of chunks, blocks and cluster ranks merged across a row
# (the grid's exchange, lagged or not, the cluster's, the split stream's) meet statistics that
# are -inf (chunks with nothing kept), NaN and +inf. (rows, cols, dtype): a cluster's row or the
# grid's on an H100 or H200, the grid's (lagged where PYSOFTMAX_GRID_LAG=1), straddling odd rows,
# and float64's counters.
EDGE = [(6, 458752, "float32"), (6, 2097152, "bfloat16"), (6, 1048580, "float16"), (6, 300003, "bfloat16"),
        (6, 600000, "float64")]


@pytest.mark.parametrize("algo", ["fused", "online"])
@pytest.mark.parametrize("rows,cols,dtype", EDGE)
def test_long_rows_edge_values(rows, cols, dtype, algo):
    """Row 0: -inf but for its last quarter (the first chunks hold -inf only); 1: -inf throughout
    (zeros); 2: one NaN in the last column (NaN throughout); 3: one +inf in the middle (NaN
    throughout, inf - inf); 4: logits of either sign near the dtype's largest; 5: logits from
    -largest / 2 to 1% below it, the maximum in the last column. Rows 0, 4 and 5 against float64."""
    g = rng()
    big = NEAR_LARGEST[dtype]
    x64 = g.standard_normal((rows, cols)) * 3
    x64[0, : 3 * cols // 4] = -numpy.inf
    x64[1] = -numpy.inf
    x64[2, -1] = numpy.nan
    x64[3, cols // 2] = numpy.inf
    x64[4] = g.uniform(-1, 1, cols) * big
    x64[5] = -big / 2 * (1 + 0.01 * g.uniform(0, 1, cols))  # a spread every dtype resolves there
    x64[5, -1] = -big / 2
    x64 = rounded(x64, dtype)
    plan = _ops.plan((rows, cols), dtype, algo=algo)
    what = f"{algo} {rows}x{cols} {dtype} {plan} seed={g.seed}"
    # Poisoned with a number: NaN would pass rows 2 and 3 unwritten.
    y = to_host64(_ops.forward(to_device(x64, dtype), algo=ALGOS[algo], out=poisoned((rows, cols), dtype, 123.0)))
    assert (y[1] == 0).all(), f"a row of -inf: zeros ({what})"
    assert numpy.isnan(y[2]).all(), f"a NaN gives NaN throughout ({what})"
    assert numpy.isnan(y[3]).all(), f"a +inf gives NaN throughout ({what})"
    keep = [0, 4, 5]
    assert_close(y[keep], ref_softmax(x64[keep]), dtype, what)


@pytest.mark.parametrize("blocks", [0, 1])
def test_grid_capped_and_repeatable(blocks):
    """A requested grid cap keeps whole groups (one group here, which then walks every row), and
    repeated calls give the same bits: the groups merge their partials in one order."""
    g = rng()
    rows, cols = 9, 1048576
    plan = _ops.plan((rows, cols), "float32", blocks=blocks)
    if plan["grid"] and blocks:
        assert plan["blocks"] == plan["chunks"], plan
    x64 = rounded(g.standard_normal((rows, cols)) * 3, "float32")
    x = to_device(x64, "float32")
    y1 = _ops.forward(x, blocks=blocks, out=poisoned((rows, cols), "float32"))
    y2 = _ops.forward(x, blocks=blocks, out=poisoned((rows, cols), "float32"))
    assert_close(to_host64(y1), ref_softmax(x64), "float32", f"{plan} seed={g.seed}")
    assert bool((y1.view(cupy.uint32) == y2.view(cupy.uint32)).all()), "repeated calls differ"
    dy64 = rounded(g.standard_normal((rows, cols)), "float32")
    y64 = to_host64(y1)
    dx1 = _ops.backward_impl(y1, to_device(dy64, "float32"), blocks=blocks)
    dx2 = _ops.backward_impl(y1, to_device(dy64, "float32"), blocks=blocks)
    assert_grad_close(to_host64(dx1), y64, dy64, 1.0, "float32", f"backward seed={g.seed}")
    assert bool((dx1.view(cupy.uint32) == dx2.view(cupy.uint32)).all()), "repeated backward calls differ"


def test_grid_on_two_streams_at_once():
    """Cooperative launches on two streams at once, forward on one and backward on the other, many
    times over: neither waits forever on the other's blocks, and both stay right."""
    g = rng()
    rows, cols = 3, 2097152
    x64 = rounded(g.standard_normal((rows, cols)) * 3, "float32")
    y64 = rounded(ref_softmax(g.standard_normal((rows, cols)) * 3), "float32")
    dy64 = rounded(g.standard_normal((rows, cols)), "float32")
    x, y, dy = (to_device(a, "float32") for a in (x64, y64, dy64))
    outs = [poisoned((rows, cols), "float32") for _ in range(2)]
    a, b = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.Device().synchronize()
    for _ in range(20):
        pysoftmax.fused(x, out=outs[0], stream=a)
        _ops.backward_impl(y, dy, out=outs[1], stream=b)
    a.synchronize()
    b.synchronize()
    assert_close(to_host64(outs[0]), ref_softmax(x64), "float32", f"forward seed={g.seed}")
    assert_grad_close(to_host64(outs[1]), y64, dy64, 1.0, "float32", f"backward seed={g.seed}")


# Lagged grid plans (rows_stream kShareLagged, Plan::lag): a block holds two rows' chunks and meets
# a row's barrier one row late. (rows, cols, dtype, direction), each planned lagged on an H100 or
# H200 (132 SMs, 227 KiB a block) where PYSOFTMAX_GRID_LAG=1 prefers lagged plans: one row (no
# row to lag behind), as many rows as groups, and more (a group walking 2-101 rows, its partials'
# four sets, and in float64 its counters', each reused many times), a step a chunk, two and three.
LAGGED = [
    (1, 1048576, "float32", "forward"),
    (2, 1048580, "float32", "backward"),
    (3, 2097152, "bfloat16", "forward"),
    (7, 600004, "float32", "backward"),
    (101, 300004, "float32", "forward"),
    (130, 524292, "bfloat16", "backward"),
    (40, 300004, "float16", "forward"),
    (9, 1048576, "float64", "forward"),
    (101, 300004, "float64", "backward"),
]
LAG_FORCED = os.environ.get("PYSOFTMAX_GRID_LAG") == "1"


@pytest.mark.skipif(not LAG_FORCED, reason="run by test_grid_lagged_every_path, in a process with PYSOFTMAX_GRID_LAG=1")
@pytest.mark.parametrize("rows,cols,dtype,direction", LAGGED)
def test_grid_lagged_rows(rows, cols, dtype, direction):
    plan = _ops.plan((rows, cols), dtype, direction=direction)
    dev = cupy.cuda.Device()
    if grid_capable() and clusters() and dev.attributes["MultiProcessorCount"] == 132:
        assert plan["grid"] == 1 and plan["lag"] == 1, plan
    g = rng()
    host = long_inputs(g, rows, cols, dtype, direction)
    dev_in = tuple(to_device(a, dtype) for a in host)
    outs = [poisoned((rows, cols), dtype) for _ in range(2)]
    for out in outs:  # twice: the same bits, as the groups merge their partials in one order
        check_long(direction, "fused", host, dev_in, out, dtype, f"{direction} {rows}x{cols} {dtype} {plan} seed={g.seed}")
    assert bool(cupy.array_equal(outs[0].view(cupy.uint8), outs[1].view(cupy.uint8))), "repeated calls differ"


# Grid plans whose workspace comes filled with words a peer would take for published partials:
# every byte 0xff (a counter past every target; a forward tag of parity 1, round 0's), and words
# whose high half is 1 (a backward tag of round 0, beside 1.0f; counters alternating 0x3f800000
# and 1), as a caller's pool hands back memory a previous call or another op wrote. The launcher
# clears what the kernel reads first, so the rows come out right and the same twice. Unlagged and
# lagged plans (on an H100 or H200 the bfloat16 backward walking 9 rows lags, the float32 forward
# at 8 x 4194304 does not), float64's counters too.
POISONS = {"ones": (0xFFFFFFFF, 0xFFFFFFFF), "round0": (0x3F800000, 0x00000001)}


@pytest.mark.parametrize("poison", sorted(POISONS))
@pytest.mark.parametrize("rows,cols,dtype,direction", [
    (9, 2097152, "bfloat16", "backward"),
    (8, 4194304, "float32", "forward"),
    (101, 300004, "float32", "forward"),
    (1, 16777216, "bfloat16", "forward"),
    (9, 1048576, "float64", "forward"),
    (2, 600000, "float64", "backward"),
])
def test_grid_workspace_poisoned(monkeypatch, rows, cols, dtype, direction, poison):
    plan = grid_plan(rows, cols, dtype, direction)
    real = _ops._workspace
    filled = []

    def poisoned_workspace(problem, dir_):
        ws = real(problem, dir_)
        assert ws is not None and ws.nbytes % 8 == 0, ws
        halves = ws.view(numpy.uint32).reshape(-1, 2)
        halves[:, 0], halves[:, 1] = POISONS[poison]
        filled.append(ws.nbytes)
        return ws

    monkeypatch.setattr(_ops, "_workspace", poisoned_workspace)
    g = rng()
    host = long_inputs(g, rows, cols, dtype, direction)
    dev_in = tuple(to_device(a, dtype) for a in host)
    outs = [poisoned((rows, cols), dtype) for _ in range(2)]
    for out in outs:
        # stream= takes the general path, which sizes the workspace through _ops._workspace (the
        # fast path allocates its own, which the patch would not reach).
        check_long(direction, "fused", host, dev_in, out, dtype, f"{direction} {rows}x{cols} {dtype} {poison} {plan} seed={g.seed}",
                   stream=cupy.cuda.get_current_stream())
    assert filled == [plan["workspace"]] * 2, filled
    assert bool(cupy.array_equal(outs[0].view(cupy.uint8), outs[1].view(cupy.uint8))), "repeated calls differ"


@pytest.mark.parametrize("rows,cols", [(336, 100000), (200, 200003)])
def test_grid_lagged_chunks_of_two_steps(rows, cols):
    """bfloat16 forward rows whose lagged plan the model took in chunks of one step before
    kGridLagMinSteps (an H100 or H200: 7 and 13 chunks a row): lagged in chunks of two steps or
    more (or not lagged), and right."""
    if "PYSOFTMAX_GRID_LAG" in os.environ:
        pytest.skip("this process runs under a set lag rule")
    plan = _ops.plan((rows, cols), "bfloat16")
    if grid_capable() and cupy.cuda.Device().attributes["MultiProcessorCount"] == 132:
        assert plan["lag"] == 0 or plan["held"] >= 2, plan
    g = rng()
    host = long_inputs(g, rows, cols, "bfloat16", "forward")
    dev_in = tuple(to_device(a, "bfloat16") for a in host)
    check_long("forward", "fused", host, dev_in, poisoned((rows, cols), "bfloat16"), "bfloat16",
               f"{rows}x{cols} {plan} seed={g.seed}")


def test_grid_lagged_every_path():
    """The grid's tests, the straddling rows' and LAGGED in a process with PYSOFTMAX_GRID_LAG=1
    (read once a device), where every grid row that two chunks a block hold whole takes a lagged
    plan: capped grids (one group walking every row), repeated calls, two streams at once, offsets
    past 2^31 elements."""
    if LAG_FORCED or "PYSOFTMAX_GRID_LAG" in os.environ:
        pytest.skip("this process runs under a set lag rule")
    if not grid_capable():
        pytest.skip("no cooperative grid of staged rows here")
    env = dict(os.environ, PYSOFTMAX_GRID_LAG="1")
    # test_long_rows* takes the masked rows and the edge values too
    want = len(LAGGED) + len(CASES) + 1 + 2 + 1 + len(STRADDLING) + 1 + 2 * len(EDGE)
    pytest_in_process(__file__, "lagged_rows or test_long_rows or grid_capped or two_streams or straddling_rows or 2_to_the_31",
                      env, want)


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("fault", ["short", "unaligned"])
def test_grid_workspace_checked(monkeypatch, direction, fault):
    """A grid plan's workspace is checked before anything is launched: one byte short, or not
    8-byte aligned (its partials are 8-byte words, GridTag), is an error that says so, and the
    output is left as it was."""
    rows, cols = 3, 1048576
    plan = grid_plan(rows, cols, "float32", direction)
    real = _ops._workspace
    kept = []

    def broken(problem, dir_):
        ws = real(problem, dir_)
        assert ws is not None and problem.workspace_bytes == plan["workspace"]
        if fault == "short":
            problem.workspace_bytes -= 1
        else:
            wider = cupy.empty(problem.workspace_bytes + 16, dtype=numpy.uint8)
            kept.append(wider)
            problem.workspace = wider.data.ptr + 4
        return ws

    monkeypatch.setattr(_ops, "_workspace", broken)
    g = rng()
    host = long_inputs(g, rows, cols, "float32", direction)
    dev_in = tuple(to_device(a, "float32") for a in host)
    out = poisoned((rows, cols), "float32", 7.0)
    stream = cupy.cuda.get_current_stream()
    want = "needs a workspace" if fault == "short" else "8-byte aligned"
    with pytest.raises(pysoftmax.SoftmaxError, match=want):
        if direction == "forward":
            _ops.forward(dev_in[0], out=out, stream=stream)
        else:
            _ops.backward_impl(*dev_in, out=out, stream=stream)
    assert bool((out == 7.0).all()), "the output was written"


def test_grid_past_2_to_the_31_elements():
    """2049 rows of 2^20 float32 columns (2^31 + 2^20 elements, 8 GiB): row offsets past 2^31
    elements. Rows at the start, the middle and the end against float64, forward and backward.
    (float32: softmax values of rows of 2^20 are float16 subnormals.)"""
    rows, cols = 2049, 1 << 20
    x = cupy.random.standard_normal((rows, cols), dtype=cupy.float32) * 3
    y = pysoftmax.fused(x, out=cupy.full((rows, cols), numpy.nan, cupy.float32))
    pick = [0, 1, rows // 2, rows - 2, rows - 1]
    x64 = cupy.asnumpy(x[pick]).astype(numpy.float64)
    assert_close(cupy.asnumpy(y[pick]).astype(numpy.float64), ref_softmax(x64), "float32", "forward")
    del x
    dy = cupy.random.standard_normal((rows, cols), dtype=cupy.float32)
    dx = _ops.backward_impl(y, dy, out=cupy.full((rows, cols), numpy.nan, cupy.float32))
    assert_grad_close(cupy.asnumpy(dx[pick]).astype(numpy.float64), cupy.asnumpy(y[pick]).astype(numpy.float64),
                      cupy.asnumpy(dy[pick]).astype(numpy.float64), 1.0, "float32", "backward")


# The 16-bit streams' folded exponent (ForwardOp::kFoldExp): one FFMA an element where |ref * k| <
# kFoldBound (256), the subtract past it. Logits near the bound, a row's maximum on either side of
# it and its steps' maxima on both (a ramp along the row), in the stream's modes (one block a row,
# a cluster, the grid, lagged or not) and online's (naive's third pass keeps the subtract; online
# and naive take no scale, so their scaled case lies past the bound). -220: a negative maximum
# whose steps subtract while the output's bias, ref * k + log2 s, folds. Checked element by
# element within one ulp of the output type, tighter than the row error. This catches a wrong
# fold (a sign, a missing log2 s), not a bound set too high: the fold's rounding near 256 (a factor
# within 2e-5 of 1) is far below an ulp.
FOLD = [(64, 50000, "fused"), (3, 300000, "fused"), (9, 1048576, "fused"), (2, 4194304, "fused"),
        (300, 4096, "online"), (64, 50000, "online"), (300, 4096, "naive"), (64, 50000, "naive")]


@pytest.mark.parametrize("rows,cols,algo", FOLD)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("top,scale", [(170.0, 1.0), (185.0, 1.0), (-170.0, 1.0), (-220.0, 1.0), (175.0, 0.25)])
def test_folded_exponent_bound(rows, cols, algo, dtype, top, scale):
    g = rng()
    ramp = numpy.linspace(-40.0, 0.0, cols)[None, :] * numpy.sign(top) / scale
    # Rows' maxima spread over +-12 / scale around top, so that some rows fold and some do not.
    x64 = rounded(top / scale + g.standard_normal((rows, 1)) * 6 / scale + ramp + g.standard_normal((rows, cols)),
                  dtype)
    out = poisoned((rows, cols), dtype)
    y = _ops.forward(to_device(x64, dtype), algo=ALGOS[algo], scale=scale, out=out) if algo == "fused" else \
        _ops.forward(to_device(x64, dtype), algo=ALGOS[algo], out=out)
    ref = ref_softmax(x64, scale=scale if algo == "fused" else 1.0)
    got = to_host64(y)
    bits = {"float16": 10, "bfloat16": 7}[dtype]
    tiny = {"float16": 2.0**-24, "bfloat16": 2.0**-126}[dtype]
    ulp = numpy.maximum(2.0 ** (numpy.floor(numpy.log2(numpy.maximum(ref, tiny))) - bits), tiny)
    worst = float(numpy.max(numpy.abs(got - ref) / ulp))
    assert worst <= 1.0, f"{algo} {rows}x{cols} {dtype} top={top} scale={scale} seed={g.seed}: {worst:.2f} ulp"


# The fold is taken where it applies, and PYSOFTMAX_EXP_FOLD=0 (read once a device) turns it off:
# the same float16 logits in two processes, one with it and one without, give outputs that differ
# somewhere (the two roundings part by a few float32 ulps at most, which moves a float16 output by
# an ulp at a small share of the elements), each within an ulp of the other, where the fold
# applies (the stream, one block a row and the grid; online), and bitwise alike where it does not
# (naive's third pass; logits past the bound). The fold's families: rows_stream, rows_tile and
# online's rows_passes (rows_block and rows_warp exponentiate by exp_row, which it leaves alone).
FOLD_FAMILIES = ("stream", "tile", "passes")
FOLD_SCRIPT = """
import sys, numpy, cupy, pysoftmax
rows, cols, algo, top, seed, path = sys.argv[1:]
g = numpy.random.default_rng(int(seed))
x = (float(top) + g.standard_normal((int(rows), int(cols))) * 3).astype(numpy.float16)
y = getattr(pysoftmax, algo)(cupy.asarray(x))
numpy.save(path, cupy.asnumpy(y))
"""


@pytest.mark.parametrize("rows,cols,algo,top,folds", [
    (64, 50000, "fused", 0.0, True), (3, 300000, "fused", 0.0, True), (300, 4096, "online", 0.0, True),
    (300, 4096, "naive", 0.0, False), (64, 50000, "fused", 200.0, False)])
def test_folded_exponent_taken(tmp_path, rows, cols, algo, top, folds):
    import subprocess
    import sys

    plan = _ops.plan((rows, cols), "float16", algo=algo)
    assert plan["family"] in FOLD_FAMILIES, plan
    seed = int(rng().seed)
    root = os.path.dirname(os.path.dirname(os.path.abspath(pysoftmax.__file__)))
    outs = []
    for fold in ("1", "0"):
        path = str(tmp_path / f"y{fold}.npy")
        env = dict(os.environ, PYSOFTMAX_EXP_FOLD=fold)
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])  # this pysoftmax
        done = subprocess.run([sys.executable, "-c", FOLD_SCRIPT, str(rows), str(cols), algo, str(top), str(seed), path],
                              env=env, capture_output=True, text=True, timeout=300, cwd=root)
        assert done.returncode == 0, done.stderr[-2000:]
        outs.append(numpy.load(path))
    a, b = outs
    what = f"{algo} {rows}x{cols} top={top} seed={seed} {plan}"
    assert not numpy.isnan(a).any() and not numpy.isnan(b).any(), what
    apart = int(numpy.count_nonzero(a != b))
    if folds:
        assert apart > 0, f"{what}: the fold changed no output"
        ulps = numpy.abs(a.view(numpy.int16).astype(numpy.int32) - b.view(numpy.int16).astype(numpy.int32))
        assert int(ulps.max()) <= 1, f"{what}: outputs {int(ulps.max())} ulps apart"
    else:
        assert apart == 0, f"{what}: {apart} outputs differ where nothing folds"


# Rows streamed twice through the ring (rows_stream, not resident): (dtype, direction, algo, chunks)
# with steps of 8192 columns (float32 and 16-bit backward, float32 forward: a 512-thread block's
# step). Rows of 1-9 steps, the last one partial, against rings of 1-4 steps. The forward's ring
# walks a pass (no more slots than a chunk's steps); the backward's is carried (rows_stream kCarry)
# along a block's passes and rows or chunks (no more slots than a block of the automatic grid has
# steps: two passes a row in one launch, one in each of the split's), so chunks shorter than the
# ring, as long and longer. naive_backward splits rows of two steps or more over two launches (3
# rows in chunks of a step, 300 in two chunks); the fused cases ask for one chunk, one launch. A
# grid capped at 7 blocks gives every block many rows or chunks to carry the ring across.
RING = [("bfloat16", "backward", "naive", 0), ("float32", "backward", "naive", 0),
        ("float32", "forward", "fused", 1), ("float32", "backward", "fused", 1)]


def carries(direction):
    """Whether a backward stream of 512-thread blocks carries its ring here (policy.cuh's
    stream_carry: the backward's rows; PYSOFTMAX_CARRY=0 turns it off). Narrower blocks carry it
    on rows of one step in float32 and float64 (stream_carry_narrow_registers)."""
    return direction == "backward" and os.environ.get("PYSOFTMAX_CARRY") != "0"


@pytest.mark.parametrize("dtype,direction,algo,chunks", RING)
@pytest.mark.parametrize("steps", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("rows,blocks", [(3, 0), (300, 0), (300, 7)])
def test_stream_ring(dtype, direction, algo, chunks, steps, rows, blocks):
    g = rng()
    cols = steps * 8192 - 24
    kw = dict(chunks=chunks) if chunks else {}
    if blocks:
        kw["blocks"] = blocks
    plan = _ops.plan((rows, cols), dtype, direction=direction, algo=algo, **kw)
    what = f"{direction} {algo} {rows}x{cols} {dtype} {plan} seed={g.seed}"
    streamed = plan["family"] == "stream" and not plan["resident"]
    # Rows no family holds otherwise (naive_backward's groups take one step, one block's stage a
    # fused row of up to 3 backward or 7 forward float32 steps on an H200)
    optin = 0 if cupy.cuda.runtime.is_hip else cupy.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"]
    must_stream = (algo == "naive" and steps > 1) or 0 < optin <= 227 << 10 and (direction == "backward" and steps > 3 or steps > 7)
    assert streamed or not must_stream, what
    if streamed and grid_capable():  # staged: the ring's slots are the stage
        carried = carries(direction) and plan["threads"] == 512
        assert plan["carry"] == int(carried), what
        free = _ops.plan((rows, cols), dtype, direction=direction, algo=algo, **dict(kw, blocks=0))
        chunk_steps = -(-plan["chunk_cols"] // 8192)
        walked = chunk_steps
        if carried:  # a grid cap keeps the automatic grid's ring
            walked *= -(-rows * plan["chunks"] // free["blocks"]) * (2 if plan["chunks"] == 1 else 1)
        deep = optin >= 160 << 10 and plan["threads"] == 512
        assert min(2 if deep else 1, walked) <= plan["held"] <= min(8, walked), what
        assert plan["held"] == free["held"] and plan["stage"] % plan["held"] == 0, what
        assert not blocks or plan["blocks"] == blocks, what
    host = long_inputs(g, rows, cols, dtype, direction)
    dev = [to_device(a, dtype) for a in host]
    check_long(direction, algo, host, dev, poisoned((rows, cols), dtype), dtype, what, **kw)


# (dtype, cols): rows of one and three 512-thread steps, and float32 and float64 rows of one step of
# narrower blocks (float32 5000 columns: 320 threads, 1536: 96; float64 2500: 320), which carry their
# ring through the one-step walk
# (policy.cuh, stream_carry_narrow_registers); 16-bit narrower blocks do not carry it.
ACROSS = [("bfloat16", 8168), ("bfloat16", 24552), ("float32", 8168), ("float32", 24552), ("float32", 5000),
          ("float32", 1536), ("float64", 2500), ("bfloat16", 5000)]


@pytest.mark.parametrize("dtype,cols", ACROSS)
def test_stream_ring_across_rows(dtype, cols):
    """More rows than the automatic grid has blocks (32 an SM), so that every block walks several:
    the carried ring holds steps of its row's second pass and of its next row in flight (on an
    H200, 4 steps' slots for 16-bit rows of one 512-thread step). naive_backward; 97 distinct rows
    repeated: each against float64, and every repeat the same bits as the row it repeats."""
    g = rng()
    base = 97
    rows = 3 * 32 * cupy.cuda.Device().attributes["MultiProcessorCount"] + 5
    plan = _ops.plan((rows, cols), dtype, direction="backward", algo="naive")
    what = f"naive_backward {rows}x{cols} {dtype} {plan} seed={g.seed}"
    assert plan["family"] == "stream" and not plan["resident"] and plan["blocks"] < rows, what
    if grid_capable() and carries("backward"):
        narrow_carries = dtype in ("float32", "float64") and plan["chunks"] == 1
        assert plan["carry"] == int(plan["threads"] == 512 or narrow_carries), what
    if grid_capable() and plan["carry"]:
        # two steps' slots where a block's shared memory holds them (an H100/H200's 227 KiB)
        optin = cupy.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"]
        if optin >= 160 << 10 and os.environ.get("PYSOFTMAX_STREAM_DEPTH") in (None, ""):
            assert plan["held"] >= 2, what
    y64, dy64 = long_inputs(g, base, cols, dtype, "backward")
    reps = -(-rows // base)
    word = {"bfloat16": cupy.uint16, "float32": cupy.uint32, "float64": cupy.uint64}[dtype]
    nan = {"bfloat16": 0x7FC0, "float32": 0x7FC00000, "float64": 0x7FF8000000000000}[dtype]

    def repeated(a64):
        a = to_device(a64, dtype)
        return cupy.ascontiguousarray(cupy.tile(a.view(word), (reps, 1))[:rows]).view(a.dtype)

    y, dy = repeated(y64), repeated(dy64)
    out = cupy.full((rows, cols), nan, word).view(y.dtype)
    dx = _ops.backward_impl(y, dy, algo=ALGOS["naive"], scale=0.7, out=out)
    assert_grad_close(to_host64(dx[:base]), y64, dy64, 0.7, dtype, what)
    bits = dx.view(word)
    assert bool((bits[base:] == cupy.tile(bits[:base], (reps - 1, 1))[:rows - base]).all()), what


# naive's few long rows (hip/dispatch.cuh, split_passes; rows_passes kSplit): at most half as many
# rows as SMs, each split into chunks of whole block steps, a block a chunk in each of three
# launches (max, sum of exponentials about the row's max, normalise), through a statistic a chunk
# of workspace.
# (rows, cols, dtype, kw): a row of 2^24 + 1 read element by element (float32), a 16-bit row of
# 2^24, odd 16-bit rows (straddling bodies; the columns outside them chunk 0's), odd float32 rows,
# float64, a scale that does not fold (the additive kind's kernels), a chunk count asked for.
SPLIT = [
    (1, 16777217, "float32", {}),
    (1, 1 << 24, "bfloat16", {}),
    (2, 1048577, "float16", {}),
    (3, 1000003, "float32", {}),
    (7, 262147, "float64", {}),
    (5, 300000, "float32", {"scale": -0.5}),
    (4, 100000, "bfloat16", {"chunks": 3}),
]


def sms():
    return cupy.cuda.Device().attributes["MultiProcessorCount"]


@pytest.mark.parametrize("rows,cols,dtype,kw", SPLIT)
def test_naive_split_rows(rows, cols, dtype, kw):
    """naive over rows split across blocks: each row against float64 in a poisoned output (every
    chunk written, the columns outside a straddling body once: each row's first and last columns
    hold its largest values, which would swamp the sum were they counted by every chunk), and the
    same bits twice, from a grid of 3 blocks walking the chunks, and in place: the partials are
    merged in one order."""
    g = rng()
    chunks = kw.get("chunks", 0)
    scale = kw.get("scale", 1.0)
    if scale == 1.0:  # plan() plans the folded scale's kernels, not the additive kind's
        plan = _ops.plan((rows, cols), dtype, algo="naive", chunks=chunks)
        assert plan["family"] == "passes" and plan["passes"] == 3 and plan["group"] == 0 and plan["chunks"] > 1, plan
        assert plan["workspace"] == rows * plan["chunks"] * 2 * (8 if dtype == "float64" else 4), plan
        if chunks:
            assert plan["chunks"] == chunks, plan
    x64 = g.standard_normal((rows, cols)) * 3
    x64[:, 0] = x64[:, -1] = 10.0 / scale
    x64 = rounded(x64, dtype)
    x = to_device(x64, dtype)
    what = f"naive {rows}x{cols} {dtype} {kw} seed={g.seed}"
    naive = ALGOS["naive"]
    y1 = _ops.forward(x, algo=naive, scale=scale, chunks=chunks, out=poisoned((rows, cols), dtype))
    ref = ref_softmax(x64, scale)
    assert_close(to_host64(y1), ref, dtype, what)
    words = cupy.uint64 if dtype == "float64" else cupy.uint32 if dtype == "float32" else cupy.uint16
    y2 = _ops.forward(x, algo=naive, scale=scale, chunks=chunks, out=poisoned((rows, cols), dtype))
    assert bool((y1.view(words) == y2.view(words)).all()), f"{what}: repeated calls differ"
    y3 = _ops.forward(x, algo=naive, scale=scale, chunks=chunks, blocks=3, out=poisoned((rows, cols), dtype))
    assert bool((y1.view(words) == y3.view(words)).all()), f"{what}: 3 blocks walking the chunks differ"
    y4 = _ops.forward(x, algo=naive, scale=scale, chunks=chunks, out=x)
    assert y4 is x and bool((y1.view(words) == y4.view(words)).all()), f"{what}: in place differs"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_naive_split_at_the_sm_count(dtype):
    """Automatic splits only where the rows are at most half the SMs: half is split and right,
    one row more keeps a block a row. Rows whose chunks hold -inf only, rows that are
    -inf throughout (zeros, as every algorithm returns), and rows whose max sits in a column
    outside a straddling body, in a view one element into wider rows with the poison around it
    kept."""
    g = rng()
    n = sms()
    cols = 70001
    assert _ops.plan((n // 2 + 1, cols), dtype, algo="naive")["chunks"] == 1
    rows = n // 2
    plan = _ops.plan((rows, cols), dtype, algo="naive", aligned=False)
    assert plan["chunks"] > 1, plan
    x64 = g.standard_normal((rows, cols)) * 3
    x64[1, : 3 * cols // 4] = -numpy.inf  # the first chunk, or chunks, -inf only
    x64[2] = -numpy.inf
    x64[3, 0] = x64[4, -1] = 40.0  # 16-bit: columns outside the straddling bodies (rows 3, 4 start 4 and 5 elements past a pack)
    x64 = rounded(x64, dtype)
    width = cols + 16
    x = to_device(numpy.pad(x64, ((0, 0), (1, width - cols - 1))), dtype)[:, 1:1 + cols]
    out_buf = poisoned((rows, width), dtype)
    y = _ops.forward(x, algo=ALGOS["naive"], out=out_buf[:, 1:1 + cols])
    got = to_host64(y)
    assert (got[2] == 0).all(), "a row of -inf: zeros"
    keep = numpy.arange(rows) != 2
    assert_close(got[keep], ref_softmax(x64[keep]), dtype, f"{plan} seed={g.seed}")
    rest = to_host64(out_buf)
    assert numpy.isnan(rest[:, 0]).all() and numpy.isnan(rest[:, 1 + cols:]).all(), "written outside"
