"""rows_tile on the GPU: dense rows of a width that is not a multiple of the 16-byte pack.

Each row of such an array starts at another offset inside the pack, so the register families
would read it element by element. Where every array is dense and shares its offset inside the
pack, rows_tile copies tiles of consecutive rows into shared memory as the aligned packs that
cover them, works each row from there, and writes each tile back as aligned packs
(hip/families.cuh; plan_tile in hip/dispatch.cuh). Rows from a width on (policy.cuh) straddle:
each row's body, from its first pack boundary, is worked as vector packs of the copy and the
pack - 1 columns outside it one a lane; narrower rows go element by element. By default the
tile takes the plain forward's 16-bit rows of 16 to 128 columns (straddling from 112) and float32
rows of 16 to 99, and the backward's 16-bit rows of up to 134 (straddling from 112).
PYSOFTMAX_TILE_COLS widens that to every dtype and width (straddling from two packs), and
PYSOFTMAX_TILE_VEC=0 keeps every row element-wise: test_tile_every_path_widened runs both in
subprocesses to reach the kernel's other paths. The grid is capped at the blocks the kernel runs
at once; PYSOFTMAX_TILE_FIT=0 leaves it at the blocks the shared memory holds:
test_tile_rows_unfitted_grid runs the default cases so.

Element-wise lanes of a row that one step of their group holds work only the slots of the step
that hold its columns, in eighths of it (PYSOFTMAX_TILE_TRIM=0: the whole step).

The tests check the plan, every column's value against float64, that nothing outside the
arrays is written (outputs inside poisoned buffers), the partial packs at a tile's two ends at
every offset inside the pack, and the tiles' walk when fewer blocks than tiles run.
"""

import os
import subprocess
import sys

import numpy
import pytest

from _util import (assert_close, assert_grad_close, at_every_offset, dense_at, np_dtype, pack, poisoned, ref_softmax,
                   rng, rounded, to_device, to_host64, written_outside)

pytestmark = pytest.mark.gpu

try:
    import cupy
    import pysoftmax
    from pysoftmax import _ops
except ImportError:  # pragma: no cover
    pass


def assert_kept(flat, offset, size, what):
    n = written_outside(flat, offset, size)
    assert n == 0, f"{what}: {n} elements outside the array written"


WIDENED = os.environ.get("PYSOFTMAX_TILE_COLS") == "1000000"
ELEMENT_WISE = os.environ.get("PYSOFTMAX_TILE_VEC") == "0"
# The default rule's widths from which rows straddle (policy.cuh, tile_vec_cols), by direction
# and element size; absent: never.
VEC_FROM = {("forward", 2): 112, ("backward", 2): 112}


def tiles():
    """Whether the library plans rows_tile here: it stages with cp.async (NVIDIA); elsewhere the
    same rows keep their element-wise plans, and the tests still check every value."""
    return not cupy.cuda.runtime.is_hip


def straddles(cols, dtype, direction):
    """Whether the plan works rows of this width in vector packs over their bodies."""
    size = np_dtype(dtype).itemsize
    if ELEMENT_WISE or cols < 2 * pack(dtype):
        return False
    return WIDENED or cols >= VEC_FROM.get((direction, size), 1 << 62)


def lane_slots(cols, group, dtype, direction):
    """The slots an element-wise lane works a step (plan_tile, tile_slots): where one step of its
    group holds the row, the fewest eighths of the step (at least half) that hold its columns,
    and more than them where the row's last lanes hold one fewer (no lane alone takes the
    storer's test-free path); else, or with PYSOFTMAX_TILE_TRIM=0, the whole step (32 values a lane,
    halved for the backward's pairs and again for float64)."""
    step = 32 // (2 if direction == "backward" else 1) // (2 if np_dtype(dtype).itemsize == 8 else 1)
    needed = -(-cols // group) + (1 if cols % group else 0) if group else step + 1
    if os.environ.get("PYSOFTMAX_TILE_TRIM") == "0" or needed > step:
        return step
    return max(step // 2, -(-needed * 8 // step) * step // 8)


def run(dev, out, **kw):
    return _ops.backward_impl(dev[0], dev[1], out=out, **kw)


def grads(g, rows, cols, dtype):
    return rounded(ref_softmax(g.standard_normal((rows, cols)) * 3), dtype), rounded(g.standard_normal((rows, cols)), dtype)


def check_case(rows, cols, dtype, direction, group):
    """The plan is rows_tile (of `group` lanes, when given), straddling or not as the rule says;
    every column is right and nothing outside the output is written, with the arrays at the
    pack's boundary and one element past it."""
    g = rng()
    plan = _ops.plan((rows, cols), dtype, direction=direction)
    if tiles():
        vec = straddles(cols, dtype, direction)
        assert plan["family"] == "tile" and plan["tile"] >= 1 and plan["stage"] > 0, plan
        assert plan["straddle"] == int(vec) and plan["pack"] == (pack(dtype) if vec else 1), plan
        assert group is None or plan["group"] == group, plan
        assert vec or plan["packs"] == lane_slots(cols, plan["group"], dtype, direction), plan
    else:
        assert plan["family"] != "tile", plan
    if direction == "backward":
        host = grads(g, rows, cols, dtype)
    else:
        host = [rounded(g.standard_normal((rows, cols)) * 3, dtype)]
    for offset in (0, 1):
        dev = [dense_at(a, dtype, offset)[1] for a in host]
        flat, out = dense_at(numpy.full((rows, cols), numpy.nan), dtype, offset, poison=True)
        what = f"{rows}x{cols} {dtype} {direction} offset={offset} {plan} seed={g.seed}"
        if direction == "backward":
            assert_grad_close(to_host64(run(dev, out, scale=0.7)), host[0], host[1], 0.7, dtype, what)
        else:
            assert_close(to_host64(pysoftmax.fused(dev[0], out=out, scale=0.7)), ref_softmax(host[0], scale=0.7), dtype, what)
        assert_kept(flat, offset, rows * cols, what)


# (rows, cols, dtype, direction, group): widths below a pack, one row, each side of the width
# from which rows straddle, the rule's last widths (the forward's 127, the backward's 134; past
# them test_tile_not_taken), and row counts that leave the last tile partial. Rows a group takes
# in two steps are WIDE_CASES'.
CASES = [
    (1000, 1, "float16", "backward", 1),
    (999, 3, "bfloat16", "backward", 1),
    (4099, 33, "float16", "backward", 4),
    (3001, 99, "bfloat16", "backward", 8),
    (2050, 111, "bfloat16", "backward", 8),
    (1, 127, "float16", "backward", 8),
    (2050, 127, "bfloat16", "backward", 8),
    (701, 131, "float16", "backward", 8),
    (1500, 134, "bfloat16", "backward", 8),
    (3001, 17, "bfloat16", "forward", 1),
    (4099, 33, "bfloat16", "forward", 2),
    (3001, 99, "float16", "forward", 4),
    (2001, 111, "bfloat16", "forward", 4),
    (2050, 127, "bfloat16", "forward", 8),
    (1, 113, "float16", "forward", 8),
    (4099, 33, "float32", "forward", 2),
    (1201, 99, "float32", "forward", 4),
]


@pytest.mark.parametrize("rows,cols,dtype,direction,group", CASES)
def test_tile_rows(rows, cols, dtype, direction, group):
    check_case(rows, cols, dtype, direction, group)


# Every element-wise width of the default rule, each side of every count of slots a lane trims
# its step to (the forward's 16-bit rows of 16-111 columns and float32 of 16-99, the backward's
# 16-bit rows of 1-111).
SLOT_WIDTHS = [("bfloat16", "forward", range(16, 112)), ("float32", "forward", range(16, 100)),
               ("float16", "backward", range(1, 112))]


@pytest.mark.parametrize("dtype,direction,widths", SLOT_WIDTHS, ids=lambda v: v if isinstance(v, str) else "")
def test_tile_lane_slots_every_width(dtype, direction, widths):
    """Each odd width (not a whole number of packs) that the rule tiles element by element."""
    for cols in widths:
        if cols % pack(dtype):
            check_case(133, cols, dtype, direction, None)


# Tiles enough for grids past what the kernels run at once on an H200 (the element-wise forward
# fits two blocks an SM against plan_tile's four: 313 tiles; the straddling backward two against
# six: 625), where the cap on the grid takes effect (and test_tile_rows_unfitted_grid lifts it).
MANY_TILES = [(120000, 33, "bfloat16", "forward", 2), (20000, 131, "bfloat16", "backward", 8)]


@pytest.mark.parametrize("rows,cols,dtype,direction,group", MANY_TILES)
def test_tile_rows_many_tiles(rows, cols, dtype, direction, group):
    check_case(rows, cols, dtype, direction, group)


# With PYSOFTMAX_TILE_COLS=1000000 (test_tile_every_path_widened, once straddling, once
# element-wise): a group's several steps, the block a row (rows too wide for a group each in the
# stage), float32 and float64, and widths between the powers of two of the pack.
WIDE_CASES = [
    (777, 1001, "bfloat16", "backward"),
    (130, 4097, "float16", "backward"),
    (61, 5001, "bfloat16", "backward"),
    (3001, 99, "float32", "backward"),
    (2050, 257, "float32", "backward"),
    (517, 77, "float64", "backward"),
    (300, 2049, "float32", "backward"),
    (777, 1001, "bfloat16", "forward"),
    (61, 10001, "float16", "forward"),
    (2050, 257, "float32", "forward"),
    (517, 77, "float64", "forward"),
    (300, 4097, "float32", "forward"),
]


@pytest.mark.skipif(not WIDENED, reason="run by test_tile_every_path_widened, in a process with PYSOFTMAX_TILE_COLS")
@pytest.mark.parametrize("rows,cols,dtype,direction", WIDE_CASES)
def test_tile_rows_widened(rows, cols, dtype, direction):
    check_case(rows, cols, dtype, direction, None)


@pytest.mark.parametrize("vec", ["1", "0"])
def test_tile_every_path_widened(vec):
    """The kernel's paths that the default rule does not plan, in a process whose rule takes
    every dtype and width (the variables are read once a device), straddling and element-wise."""
    if WIDENED:
        pytest.skip("this process is the widened one")
    env = dict(os.environ, PYSOFTMAX_TILE_COLS="1000000", PYSOFTMAX_TILE_VEC=vec)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", "widened"],
                          env=env, capture_output=True, text=True, timeout=600)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    assert done.returncode == 0 and f"{len(WIDE_CASES)} passed" in summary, done.stdout[-4000:] + done.stderr[-2000:]


def test_tile_rows_unfitted_grid():
    """The default cases with PYSOFTMAX_TILE_FIT=0 (the tile's grid left at the blocks the shared
    memory holds, past those the kernel's registers let run at once where MANY_TILES reach it: a
    last wave of blocks that walk their tiles after the others), in a process of their own."""
    if WIDENED or os.environ.get("PYSOFTMAX_TILE_FIT"):
        pytest.skip("this process runs under another rule")
    env = dict(os.environ, PYSOFTMAX_TILE_FIT="0")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                           "test_tile_rows and not widened and not unfitted"], env=env, capture_output=True, text=True,
                          timeout=600)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    assert done.returncode == 0 and f"{len(CASES) + len(MANY_TILES)} passed" in summary, \
        done.stdout[-4000:] + done.stderr[-2000:]


@pytest.mark.parametrize("dtype,cols,direction", [("bfloat16", 99, "backward"), ("float16", 127, "backward"),
                                                ("float16", 99, "forward"), ("bfloat16", 127, "forward")])
def test_tile_every_offset_walk_and_repeatable(dtype, cols, direction):
    """Every offset inside the pack (a tile's first and last packs partial in every way), grids of
    one and of three blocks walking all tiles through both buffers, the same bits from every grid,
    and the output written over an input at its offset (dx over dy, y over x); element-wise and
    straddling rows."""
    g = rng()
    rows = 1203
    if direction == "backward":
        host = grads(g, rows, cols, dtype)
        call = lambda dev, out, **kw: run(dev, out, **kw)
        check = lambda got, what: assert_grad_close(to_host64(got), host[0], host[1], 1.0, dtype, what)
    else:
        host = [rounded(g.standard_normal((rows, cols)) * 3, dtype)]
        call = lambda dev, out, **kw: _ops.forward(dev[0], out=out, **kw)
        check = lambda got, what: assert_close(to_host64(got), ref_softmax(host[0]), dtype, what)
    at_every_offset(host, dtype, call, check, f"{dtype} {cols} {direction} seed={g.seed}")


def test_tile_not_taken():
    """Arrays at different offsets inside the pack, rows with gaps between them, a requested
    family, whole-pack widths, the widths past the rule, the float32 backward, float64 and
    masked rows keep their plans (unless the rule is widened)."""
    plan = lambda cols, dt="bfloat16", direction="backward", **kw: _ops.plan((4096, cols), dt, direction=direction, **kw)["family"]
    for direction in ("backward", "forward"):
        assert plan(99, direction=direction, aligned="mixed") == "warp"
        assert plan(99, direction=direction, family="warp") == "warp"
        assert plan(96, direction=direction) == "warp"
        assert plan(99, "float64", direction) == "warp" or WIDENED
    assert plan(99, mask=True, direction="forward") == "warp"
    assert plan(99, causal_queries=4096, direction="forward") == "warp"
    if not WIDENED:
        assert plan(99, "float32") == "warp" and plan(135) in ("warp", "block") and plan(601) in ("warp", "block")
        assert plan(15, direction="forward") == "warp" and plan(129, direction="forward") == "warp"
        assert plan(9, "float32", direction="forward") == "warp" and plan(101, "float32", direction="forward") == "warp"
    if tiles():
        assert plan(129) == "tile" and plan(99, direction="forward") == "tile"
    g = rng()
    rows, cols = 300, 99
    host = grads(g, rows, cols + 1, "bfloat16")
    y, dy = (to_device(a, "bfloat16")[:, :cols] for a in host)  # a gap of one element after each row
    out = poisoned((rows, cols), "bfloat16")
    y64, dy64 = host[0][:, :cols], host[1][:, :cols]
    assert_grad_close(to_host64(pysoftmax.backward(y, dy, out=out)), y64, dy64, 1.0, "bfloat16", "rows with gaps")
    x = to_device(host[1], "bfloat16")[:, :cols]
    out = poisoned((rows, cols), "bfloat16")
    assert_close(to_host64(pysoftmax.fused(x, out=out)), ref_softmax(host[1][:, :cols]), "bfloat16", "forward rows with gaps")
