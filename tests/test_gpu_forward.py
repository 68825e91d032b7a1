"""Forward softmax on the GPU against a float64 NumPy reference.

Shapes cross every dispatch threshold of hip/dispatch.cuh (rows_warp tiny/medium tables,
rows_block, rows_stream with and without a split), in every dtype, with outputs poisoned first.
"""

import os

import numpy
import pytest

from _util import DTYPES, TOL, assert_close, assert_grad_close, poisoned, ref_softmax, resident_blocks, rng, rounded
from _util import NEAR_LARGEST, row_error
from _util import to_device, to_host64

pytestmark = pytest.mark.gpu

try:
    import cupy
    import pysoftmax
    from pysoftmax import _lib, _ops
except ImportError:  # pragma: no cover
    pass

ALGOS = ["naive", "online", "fused"]
# Column counts on both sides of every threshold (in elements, for 2/4/8-byte types, vector and
# scalar packs): tiny-table groups 8..256, warp table 512/1024, block up to 16384/32768, stream.
COLS = [1, 2, 3, 4, 5, 8, 9, 31, 32, 33, 64, 127, 128, 129, 255, 256, 257, 511, 512, 513, 1000, 1023, 1024,
        1025, 2047, 2048, 4097, 8192, 16383, 16384, 16385, 32767, 32768, 32769, 65537]


def run(algo, x, **kw):
    return getattr(pysoftmax, algo)(x, **kw)


def check_forward(algo, rows, cols, dtype, g, spread=3.0, **kw):
    x64 = rounded(g.standard_normal((rows, cols)) * spread, dtype)
    x = to_device(x64, dtype)
    out = poisoned((rows, cols), dtype)
    y = run(algo, x, out=out, **kw)
    assert y is out
    return assert_close(to_host64(y), ref_softmax(x64), dtype, f"{algo} {rows}x{cols} seed={g.seed}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", COLS)
def test_fused_threshold_grid(cols, dtype):
    rows = 37 if cols <= 4097 else 5
    check_forward("fused", rows, cols, dtype, rng())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("algo", ["naive", "online"])
@pytest.mark.parametrize("cols", [1, 31, 32, 33, 1000, 1024, 1025, 4097, 65537])
def test_reference_algorithms(algo, cols, dtype):
    check_forward(algo, 9, cols, dtype, rng())


# rows_passes' group widths (dispatch.cuh, plan_passes): in groups a lane takes at most 64 bytes (4
# vector packs: 16 float32, 32 16-bit, 8 float64 columns; 8 elements of an unaligned row), in groups
# of up to 32 lanes, one step, or up to the op's passes_steps (3; 2 for the float32 forward) for
# ragged vector rows (16-bit and float32 rows whose lanes are not a multiple of the warp). online
# takes them where the stream's block would leave lanes idle (fewer than 32 of its 4-pack or
# 16-element lanes, or a ragged row) and for 16-bit rows up to a group's step; naive everywhere
# (longer rows a block a row). Columns on both sides of each width, widths where the fill rule takes
# a narrower group over more steps (160, 320, 384, 640, 768; not the float32 forward, whose groups
# take at most two steps), both sides of the ragged rows' two and three steps (float32 1008-1040,
# 16-bit 3072) and of naive's four idle group lanes (float32 960: 60 group lanes, in groups; 976:
# 61, a block; 16-bit 2944 and 2976 alike at three steps).
# 16-bit rows of an odd width whose bodies, cols - 7 columns, hold 8 lanes or more straddle
# (plan_passes_straddling): the bodies take an aligned row's plan in groups of at least 8 lanes;
# 16-bit vector rows (and bodies) that one step of a group holds with pack slots idle take half
# the group over two steps (200, 248, 777, 1000, 1016; 256 and 1024 fill theirs); online's bodies
# that fill one step of a whole group (1025-1031 columns) take the straddling stream. Element-wise
# float32 rows of up to 1024 columns take groups whatever their lanes (kPassesElementCols: 1023 in
# groups, 1025 not).
PASSES_COLS = [1, 3, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 119, 121, 160, 200, 231, 233, 248, 255, 256, 257,
               320, 384, 511, 512, 513, 640, 768, 775, 777, 960, 976, 1000, 1008, 1016, 1023, 1024, 1025, 1031, 1033,
               1040, 1280, 1472, 1488, 1520, 1536, 1552, 2049, 2944, 2976, 3040, 3072, 3104, 5000]


def most_steps(item, vec, backward=False):
    """The most steps of a group plan_passes gives a row by the fill rule or as a ragged row: the
    op's passes_steps for vector rows (hip/policy.cuh: 2 for the float32 forward, else 3), 3 for
    element-wise rows (kPassesElementSteps), or PYSOFTMAX_PASSES_STEPS' where it is set above 0."""
    forced = int(os.environ.get("PYSOFTMAX_PASSES_STEPS", "0") or 0)
    return forced if forced > 0 else 2 if item == 4 and vec and not backward else 3


def filled_group(lanes, steps, floor=1, halve=None, most=3):
    """plan_passes' group for rows of `lanes` lanes' worth taking up to `steps` steps: the power of
    two holding them (at least `floor`, at most 32), then the fill rule: a narrower group (down to
    4 lanes, or PYSOFTMAX_PASSES_FILL's, and `floor`; up to `most` steps or `steps`) where its
    lane-steps are fewer. Ties keep the wider group, but where `halve` = (packs, packs a lane) of a
    16-bit vector row that one step of the group holds with pack slots idle: half the group
    (PYSOFTMAX_PASSES_HALVE=0: off)."""
    group = min(max(1 << max(0, (lanes - 1).bit_length()), floor), 32)
    narrowest = int(os.environ.get("PYSOFTMAX_PASSES_FILL", "4") or 0)
    halving = halve is not None and os.environ.get("PYSOFTMAX_PASSES_HALVE", "1") != "0"
    best, g = group * -(-lanes // group), group // 2
    while narrowest > 0 and g >= max(narrowest, floor) and -(-lanes // g) <= max(steps, most):
        used = g * -(-lanes // g)
        ties = halving and used == best and lanes <= group and halve[0] < group * halve[1]
        if used < best or ties:
            best, group = used, g
        g //= 2
    return group


def group_reach(lanes, vec, item, steps, block=False, most=3):
    """The most steps of a 32-lane group plan_passes gives a row: `steps`, or `most` (most_steps)
    for a ragged row (vector packs of a 16-bit or float32 row, lanes not a multiple of 32; for
    naive's block a row, at least 4 idle)."""
    idle = -lanes % 32
    ragged = vec and item <= 4 and idle > 0 and (not block or idle >= 4)
    return max(steps, most) if ragged else steps


def ahead_of(lanes, group, item, vec):
    """The steps rows_passes' first sweep asks of L2 ahead: PYSOFTMAX_PASSES_AHEAD's (1) for a 16-bit
    vector row of more than one step of its group, else none."""
    return int(os.environ.get("PYSOFTMAX_PASSES_AHEAD", "1")) if item == 2 and vec and group and lanes > group else 0


def straddles_passes(cols, item):
    """Whether a contiguous row of `cols` takes rows_passes' straddling plan: 16-bit, an odd
    width (not whole packs), two packs or more, a body (cols - 7) of at least 8 lanes of 4 packs
    (225 columns; naive_backward's too, though its lanes take 2), the rule on
    (PYSOFTMAX_STRADDLE_PASSES)."""
    on = os.environ.get("PYSOFTMAX_STRADDLE_PASSES", "1") != "0" and os.environ.get("PYSOFTMAX_STRADDLE", "1") != "0"
    lanes = -(-(-(-(cols - 7) // 8)) // 4)
    return on and item == 2 and cols * item % 16 != 0 and cols >= 16 and lanes >= 8


def element_rows_taken(cols, item, vec):
    """Whether plan_passes takes a row in groups by its columns alone: element-wise float32 rows of
    up to 1024 columns (kPassesElementCols)."""
    return not vec and item == 4 and cols <= 1024


def passes_plan(algo, cols, dtype):
    """(family, group, ahead) that hip/forward.cu's plan should give an unmasked row of `cols`
    (NVIDIA sm_80+). online's straddling bodies that take a whole group of 32 lanes in one step
    (1025-1031 columns; 777-1024 with PYSOFTMAX_PASSES_HALVE=0) take the straddling stream instead."""
    item = numpy.dtype("float16" if dtype == "bfloat16" else dtype).itemsize
    straddle = straddles_passes(cols, item)
    if straddle:  # the body's plan, in vector packs
        cols -= 16 // item - 1
    floor = 8 if straddle else 1
    vec = straddle or cols * item % 16 == 0
    pack = 16 // item if vec else 1
    packs = -(-cols // pack)
    per_lane = min(32 // (pack * (2 if item == 8 else 1)), 8, 64 // (pack * item))
    lanes = -(-packs // per_lane)
    halve = (packs, per_lane) if item == 2 and vec else None
    most = most_steps(item, vec)
    taken = element_rows_taken(cols, item, vec)
    if algo == "naive":
        reach = group_reach(lanes, vec, item, 1, block=True, most=most)
        group = filled_group(lanes, 1, floor, halve, most) if lanes <= 32 * reach or taken else 0
        return "passes", group, ahead_of(lanes, group, item, vec)
    reach = group_reach(lanes, vec, item, 1, most=most)
    group = filled_group(lanes, 1, floor, halve, most) if lanes <= 32 * reach or taken else 0
    stream_lanes = -(-packs // (4 if vec else 16))
    grouped = (lanes <= 32 * reach or taken) and (
        item == 2 or stream_lanes < 32 or (vec and item <= 4 and stream_lanes % 32 != 0) or taken)
    if straddle and group == 32 and lanes <= 32:  # a body of one whole group's step: the straddling stream
        grouped = False
    return ("passes", group, ahead_of(lanes, group, item, vec)) if grouped else ("stream", None, 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("algo", ["online", "naive"])
@pytest.mark.parametrize("cols", PASSES_COLS)
def test_reference_algorithms_in_groups(algo, cols, dtype):
    """online and naive on short rows, several rows a block in groups of lanes: 777 rows, so that
    the last warp's groups are partly past the end (dead rows ride along)."""
    g = rng()
    plan = _ops.plan((777, cols), dtype, algo=algo)
    if async_copy():
        family, group, ahead = passes_plan(algo, cols, dtype)
        assert plan["family"] == family, (plan, family, group)
        if family == "passes":
            assert plan["group"] == group and plan["passes"] == (3 if algo == "naive" else 2), (plan, group)
            assert plan["ahead"] == ahead, (plan, ahead)
    check_forward(algo, 777, cols, dtype, g)
    check_forward(algo, 3, cols, dtype, g)


def naive_backward_plan(cols, dtype):
    """(family, group, ahead) that hip/backward.cu's plan should give naive_backward on rows of
    `cols`: groups of lanes up to two steps of a full group for vector rows (three for ragged
    ones), one for element-wise ones, and as many as element-wise float32 rows of up to 1024
    columns need (NVIDIA sm_80+)."""
    item = numpy.dtype("float16" if dtype == "bfloat16" else dtype).itemsize
    straddle = straddles_passes(cols, item)
    if straddle:  # the body's plan, in vector packs
        cols -= 16 // item - 1
    vec = straddle or cols * item % 16 == 0
    pack = 16 // item if vec else 1
    per_lane = max(1, min(32 // (pack * 2 * (2 if item == 8 else 1)), 8, 64 // (pack * item)))
    packs = -(-cols // pack)
    lanes = -(-packs // per_lane)
    steps = 2 if pack > 1 else 1
    most = most_steps(item, vec, backward=True)
    if lanes > 32 * group_reach(lanes, vec, item, steps, most=most) and not element_rows_taken(cols, item, vec):
        return "stream", None, 0
    group = filled_group(lanes, steps, 8 if straddle else 1, (packs, per_lane) if item == 2 and vec else None, most)
    return "passes", group, ahead_of(lanes, group, item, vec)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [1, 7, 16, 17, 100, 119, 121, 160, 255, 256, 257, 320, 384, 512, 513, 768, 1023, 1024, 1025,
                                  1280, 1520, 1536, 1552, 2048, 3000, 3040, 3072, 3104])
def test_naive_backward_in_groups(cols, dtype):
    """naive_backward on short rows in groups of lanes, up to two steps of a full group, or three
    of a narrower one by the fill rule or for ragged rows, and element-wise float32 rows of up to
    1024 columns (longer rows: the stream)."""
    g = rng()
    rows = 777
    y64 = rounded(ref_softmax(g.standard_normal((rows, cols)) * 3), dtype)
    dy64 = rounded(g.standard_normal((rows, cols)), dtype)
    dx = pysoftmax.naive_backward(to_device(y64, dtype), to_device(dy64, dtype), scale=0.7,
                                  out=poisoned((rows, cols), dtype))
    plan = _ops.plan((rows, cols), dtype, algo="naive", direction="backward")
    if async_copy():
        family, group, ahead = naive_backward_plan(cols, dtype)
        assert plan["family"] == family and (group is None or plan["group"] == group), (plan, family, group)
        assert family != "passes" or plan["ahead"] == ahead, (plan, ahead)
    assert_grad_close(to_host64(dx), y64, dy64, 0.7, dtype, f"{plan} seed={g.seed}")


@pytest.mark.parametrize("cols", [33, 256, 1000])
def test_online_short_rows_with_masks(cols):
    """online on short rows with an additive float mask, and (scale <= 0, which is never folded)
    a boolean mask under a causal limit: masked kinds keep the stream (rows_passes takes
    unmasked rows only)."""
    g = rng()
    q, heads = 40, 5
    x64 = rounded(g.standard_normal((heads, q, cols)) * 3, "float32")
    bias = rounded(g.standard_normal((1, 1, cols)), "float32")
    assert _ops.plan((heads * q, cols), "float32", algo="online", mask=True)["family"] == "stream"
    y = _ops.forward(to_device(x64, "float32"), algo=_lib.ALGO_ONLINE, mask=to_device(bias, "float32"),
                     out=poisoned(x64.shape, "float32"))
    assert_close(to_host64(y), ref_softmax(x64, 1.0, bias), "float32", f"float mask seed={g.seed}")
    keep = g.random((heads, 1, cols)) > 0.3
    y = _ops.forward(to_device(x64, "float32"), algo=_lib.ALGO_ONLINE, scale=-0.5, mask=cupy.asarray(keep),
                     causal=True, out=poisoned(x64.shape, "float32"))
    assert_close(to_host64(y), ref_softmax(x64, -0.5, keep, causal=True), "float32", f"bool + causal seed={g.seed}")


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_long_rows(algo, dtype):
    # 1 << 20 columns: far past on-chip capacity; online/fused split few rows across blocks.
    check_forward(algo, 3, 1 << 20, dtype, rng())


@pytest.mark.parametrize("algo", ALGOS)
def test_irregular_shape(algo):
    for dtype in DTYPES:
        check_forward(algo, 1823, 781, dtype, rng())


@pytest.mark.parametrize("rows,cols", [(1, 32), (1_000_000, 1), (1_000_000, 32), (100_000, 33), (3, 12345)])
@pytest.mark.parametrize("algo", ALGOS)
def test_row_counts(algo, rows, cols):
    check_forward(algo, rows, cols, "float32", rng())


@pytest.mark.parametrize("family", ["warp", "block", "stream"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [1, 7, 64, 255, 256])
def test_every_family_on_the_same_rows(family, dtype, cols):
    """Forcing each family on shapes they can all hold (vector and scalar packs, every dtype):
    they must agree with the reference."""
    g = rng()
    x64 = rounded(g.standard_normal((19, cols)) * 4, dtype)
    out = poisoned((19, cols), dtype)
    fam = {"warp": 1, "block": 2, "stream": 3}[family]
    y = _ops.forward(to_device(x64, dtype), out=out, family=fam)
    assert_close(to_host64(y), ref_softmax(x64), dtype, f"{family} {cols} seed={g.seed}")


@pytest.mark.parametrize("chunks", [2, 3, 7, 64])
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_stream_split_rows(chunks, dtype):
    """rows_stream split into chunks (two launches and a workspace), forced on small shapes."""
    g = rng()
    x64 = rounded(g.standard_normal((5, 40000)) * 5, dtype)
    y = _ops.forward(to_device(x64, dtype), out=poisoned((5, 40000), dtype), family=3, chunks=chunks)
    assert_close(to_host64(y), ref_softmax(x64), dtype, f"chunks={chunks} seed={g.seed}")


def async_copy():
    """Whether the library stages rows through cp.async here (NVIDIA, compute capability 8.0+):
    only then can rows_stream keep a row resident."""
    return not cupy.cuda.runtime.is_hip and int(cupy.cuda.Device().compute_capability) >= 80


def big_stage():
    """Whether a block may take 200 KiB of shared memory or more (H100/H200: 227 KiB; A100 163,
    sm_86/sm_89 99): the 128 KiB resident rows below need it."""
    return async_copy() and cupy.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"] >= 200 << 10


def sms():
    return cupy.cuda.Device().attributes["MultiProcessorCount"]


@pytest.mark.parametrize("cols,dtype", [(c, d) for c in (1000, 1001) for d in DTYPES]
                         + [(20000, "float32"), (20000, "float16")])
def test_stream_resident(cols, dtype):
    """rows_stream with the whole row kept in its stage and read there twice: more rows than the
    grid has blocks (each block refills its stage with its next row while it writes the current
    one), rows of one step and of several (the last one partial), and odd widths beside them,
    whose rows straddle the pack boundary: their aligned bodies are held the same way."""
    g = rng()
    rows = 32 * sms() + 76  # more than the grid's 32 blocks an SM (the stage at most 96 KiB)
    plan = _ops.plan((rows, cols), dtype, family="stream")
    assert plan["chunks"] == 1
    aligned = cols * numpy.dtype(dtype if dtype != "bfloat16" else "float16").itemsize % 16 == 0
    assert plan["straddle"] == (0 if aligned else 1), plan
    assert plan["resident"] == (1 if async_copy() else 0), plan
    x64 = rounded(g.standard_normal((rows, cols)) * 3, dtype)
    y = _ops.forward(to_device(x64, dtype), out=poisoned((rows, cols), dtype), family=3)
    assert_close(to_host64(y), ref_softmax(x64), dtype, f"resident={plan['resident']} seed={g.seed}")


@pytest.mark.parametrize("cols,dtype,blocks", [(70000, "float32", 0), (70000, "float32", 4), (150000, "float16", 2),
                                               (140000, "float32", 0)])
def test_stream_cluster(cols, dtype, blocks):
    """Rows longer than a block's stage (280-560 KiB), split over a cluster of 2 or 4 blocks that
    each keep their chunk resident and merge their statistics through each other's shared memory:
    with the automatic grid, and with grids of one or two clusters that walk every row (refilling
    their stages as they go; on an H200 2, 2 and 4 blocks, 4 packing the GPU where 3 do not).
    Where the GPU has no clusters, or a cluster's stages cannot hold the row, the same rows are
    streamed twice."""
    g = rng()
    rows = 4 * sms() + 2  # enough rows that the stream's 512-thread blocks need no split of their own
    plan = _ops.plan((rows, cols), dtype, blocks=blocks)
    pack = 4 if dtype == "float32" else 8
    expect = resident_blocks(cols, 32 << 10, 512 * pack * 4)  # 4 packs a thread a step, 16 bytes each
    assert expect != 1, "rows meant to be too long for one block"
    assert plan["family"] == "stream" and plan["cluster"] == max(expect, 1), plan
    assert plan["resident"] == (expect > 1) and plan["chunks"] == max(expect, 1) and plan["workspace"] == 0, plan
    if blocks:
        assert plan["blocks"] == blocks, plan
    assert _ops.plan((rows, cols), dtype, aligned="mixed")["cluster"] == 1  # element-wise rows are never staged
    straddling = _ops.plan((rows, cols), dtype, aligned=False, blocks=blocks)  # bodies one pack shorter
    assert straddling["straddle"] == 1 and straddling["cluster"] == plan["cluster"], straddling
    x64 = rounded(g.standard_normal((rows, cols)) * 3, dtype)
    y = _ops.forward(to_device(x64, dtype), out=poisoned((rows, cols), dtype), blocks=blocks)
    assert_close(to_host64(y), ref_softmax(x64), dtype, f"cluster={plan['cluster']} seed={g.seed}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_block_to_resident_stream(dtype):
    """Automatic dispatch on both sides of the switch from rows_block to the resident stream (many
    rows): a row that 512 threads hold in 4 packs each, and one that needs more packs a thread
    (float32: 8 packs, which spill at the forward's 64-register cap) or a wider block (16-bit:
    4 packs is its most)."""
    g = rng()
    per = 512 * 4 * (4 if dtype == "float32" else 8)
    for cols in (per, per + 16):
        rows = 4 * sms() + 8  # enough that the stream's 512-thread blocks need no split (stage <= 64 KiB)
        fam = _ops.plan((rows, cols), dtype)["family"]
        assert fam == ("block" if cols == per or not async_copy() else "stream"), (cols, fam)
        x64 = rounded(g.standard_normal((rows, cols)) * 3, dtype)
        y = pysoftmax.fused(to_device(x64, dtype), out=poisoned((rows, cols), dtype))
        assert_close(to_host64(y), ref_softmax(x64), dtype, f"{fam} {cols} seed={g.seed}")


def test_register_grid():
    """rows_warp and rows_block launch a block for every set of rows where the op asks for it
    (unmasked forward, float32 backward, the 16-bit backward's rows_block, rows_block with a
    boolean mask and no causal limit) in blocks of up to 256 threads; otherwise at most 32 blocks
    an SM walk the rows. A full grid stops short of 2^31 threads, and its blocks walk the rows
    left."""
    cap = 32 * sms()
    rows = 1 << 20
    per_block = lambda p: p["threads"] // p["group"] * p["rows_per_group"]
    warp = _ops.plan((rows, 128), "float32")
    assert warp["family"] == "warp" and warp["blocks"] == rows // per_block(warp) > cap, warp
    bwd32 = _ops.plan((rows, 128), "float32", direction="backward")
    assert bwd32["blocks"] == rows // per_block(bwd32), bwd32
    bwd16 = _ops.plan((rows, 128), "float16", direction="backward")
    assert bwd16["family"] == "warp" and bwd16["blocks"] == cap, bwd16
    bwd16_block = _ops.plan((rows, 2048), "bfloat16", direction="backward")
    assert bwd16_block["family"] == "block" and bwd16_block["blocks"] == rows, bwd16_block
    block = _ops.plan((rows, 2048), "float32")
    assert block["family"] == "block" and block["threads"] <= 256 and block["blocks"] == rows, block
    wide = _ops.plan((rows, 16384), "float16")  # 512 threads a row
    assert wide["family"] == "block" and wide["threads"] == 512 and wide["blocks"] == cap, wide
    for dt in ("float16", "float32"):
        pad = _ops.plan((rows, 4096), dt, mask=True)
        assert pad["family"] == "block" and pad["blocks"] == rows, pad
        causal = _ops.plan((rows, 4096), dt, mask=True, causal_queries=4096)
        assert causal["family"] == "block" and causal["blocks"] == cap, causal
        short = _ops.plan((rows, 128), dt, mask=True)  # rows_warp with a mask walks its rows
        assert short["family"] == "warp" and short["blocks"] == cap, short
    huge = _ops.plan((1 << 40, 32), "float32")
    assert huge["blocks"] == (2**31 - 1) // huge["threads"], huge
    # The rows left past such a grid are walked by its blocks (each staging its next rows while it
    # works on the current ones): the same kernels under a small grid cap, in every family that
    # launches a full grid, forward and float32 backward.
    g = rng()
    for rows, cols in ((5000, 48), (3000, 1000), (700, 2048)):  # rows_warp tiny, medium; rows_block
        x64 = rounded(g.standard_normal((rows, cols)) * 3, "float32")
        fam = _ops.plan((rows, cols), "float32", blocks=7)["family"]
        y = _ops.forward(to_device(x64, "float32"), out=poisoned((rows, cols), "float32"), blocks=7)
        assert_close(to_host64(y), ref_softmax(x64), "float32", f"{fam} {cols} blocks=7 seed={g.seed}")
        y64 = rounded(ref_softmax(x64), "float32")
        dy64 = rounded(g.standard_normal((rows, cols)), "float32")
        dx = _ops.backward_impl(to_device(y64, "float32"), to_device(dy64, "float32"),
                                out=poisoned((rows, cols), "float32"), blocks=7)
        assert_grad_close(to_host64(dx), y64, dy64, 1.0, "float32", f"backward {fam} {cols} blocks=7 seed={g.seed}")
    # rows_block with a padding mask (a full grid) walking its rows, with some rows fully masked.
    for dt in ("float16", "float32"):
        x64 = rounded(g.standard_normal((4, 175, 2048)) * 3, dt)
        keep = g.random((4, 1, 2048)) > 0.3
        keep[2] = False
        fam = _ops.plan((700, 2048), dt, mask=True, blocks=7)["family"]
        y = _ops.forward(to_device(x64, dt), scale=0.7, mask=cupy.asarray(keep), out=poisoned(x64.shape, dt), blocks=7)
        assert_close(to_host64(y), ref_softmax(x64, 0.7, keep), dt, f"{fam} mask blocks=7 seed={g.seed}")


def test_tiny_rows_per_group():
    """The tiny table's groups hold one row where Op::kTinyOneRowMaxGroup asks for it (unmasked
    float32 of any group width, unmasked 16-bit below kMaxGroup lanes), else the two that fit
    kRowRegisters; both sides run against float64, the last group of two rows half full."""
    plan = lambda cols, dt, **kw: _ops.plan((4096, cols), dt, **kw)
    cases = {("float32", 32): 1, ("float32", 256): 1, ("float16", 32): 1, ("bfloat16", 256): 1,
             ("float16", 512): 2, ("float64", 64): 2}
    for (dt, cols), want in cases.items():
        p = plan(cols, dt)
        assert p["family"] == "warp" and p["packs"] == 2 and p["rows_per_group"] == want, (dt, cols, p)
    assert plan(128, "float32", mask=True)["rows_per_group"] == 2
    assert plan(128, "float32", direction="backward")["rows_per_group"] == 2
    g = rng()
    for dt, cols in cases:
        check_forward("fused", 4095, cols, dt, g)


def test_plan_crosses_thresholds():
    """The dispatcher's families change where hip/dispatch.cuh says they do."""
    fam = lambda cols, dt="float32", **kw: _ops.plan((64, cols), dt, **kw)["family"]
    assert fam(256) == "warp" and fam(1024) == "warp" and fam(1025) == "block"
    assert fam(32768) == "block" and fam(32769) == "stream"
    assert fam(1024, "float16") == "warp" and fam(1025, "float16") == "block"
    assert fam(512, "float64") == "warp" and fam(513, "float64") == "block"
    assert fam(16384, "float64") == "block" and fam(16385, "float64") == "stream"
    assert fam(512, aligned=False) == "warp" and fam(513, aligned=False) == "block"
    assert fam(16384, aligned=False) == "block" and fam(16385, aligned=False) == "stream"
    assert _ops.plan((64, 1000), "float32")["pack"] == 4
    assert _ops.plan((64, 1000), "float32", aligned=False)["pack"] == 1
    # Rows that the element-wise plan streams straddle where every array shares its offset, in the
    # stream of their bodies; 16-bit rows that it holds in registers, in rows_block.
    for dt, cols, pack in (("float32", 16385, 4), ("bfloat16", 16385, 8), ("float64", 8193, 2)):
        below = _ops.plan((64, cols - 1), dt, aligned=False)
        held = dt == "bfloat16"
        assert below["straddle"] == held and below["pack"] == (pack if held else 1) and below["family"] == "block", below
        above = _ops.plan((64, cols), dt, aligned=False)
        assert above["straddle"] == 1 and above["pack"] == pack and above["family"] == "stream", above
        assert _ops.plan((64, cols), dt, aligned="mixed")["straddle"] == 0
        assert _ops.plan((64, cols), dt, aligned=False, family="stream")["straddle"] == 1
        naive = _ops.plan((64, cols), dt, aligned=False, direction="backward", algo="naive")
        assert naive["straddle"] == (dt == "bfloat16"), naive  # two reads off chip: 16-bit rows straddle
    assert _ops.plan((1, 1 << 24), "float32")["chunks"] > 1  # one long row is split
    many = _ops.plan((4096, 1 << 18), "float32")  # many long rows: no split into two launches
    assert many["chunks"] == many["cluster"] and many["workspace"] == 0, many
    assert _ops.plan((1, 1 << 24), "float32", algo="online")["family"] == "stream"
    naive = _ops.plan((64, 10), "float32", algo="naive")
    assert naive["family"] == "passes" and naive["passes"] == 3 and naive["group"] == 2, naive  # 8 elements a lane
    # Many rows too long for a block of kBlockMaxAutoThreads: the stream, with the row resident,
    # where the platform stages (fewer rows split into chunks and stay in one wide block).
    for dt in ("float32", "float16"):  # stages of 128 and 64 KiB
        wide = _ops.plan((8192, 32768), dt)
        assert wide["family"] == ("stream" if wide["resident"] else "block"), wide
        if big_stage() or (dt == "float16" and async_copy()):
            assert wide["resident"] == 1, wide
        assert fam(32768, dt) == "block"
        assert _ops.plan((8192, 32768), dt, threads=1024)["family"] == "block"  # a requested block size
    assert _ops.plan((8192, 16384), "float16")["family"] == "block"
    # A resident row in half the block width where more of the SM's shared memory is then used.
    if big_stage():
        assert _ops.plan((8192, 32768), "float16")["threads"] == 256  # three 64 KiB stages an SM, not two
        assert _ops.plan((8192, 32768), "float32")["threads"] == 512  # one 128 KiB stage an SM either way
    if async_copy():
        fp32 = _ops.plan((8192, 16384), "float32")  # rows_block would take 8 packs a thread
        assert fp32["family"] == "stream" and fp32["threads"] == 512, fp32  # half the width: 16-bit rows only
    # A row resident in one block only while its stage fits the block's shared memory (16-bit
    # backward: 32 KiB a step of 512 threads, 8192 columns; 4 steps fit 227 KiB, 8 fit no GPU's),
    # then in a cluster of blocks where the GPU has clusters, else streamed twice.
    bwd = lambda cols, **kw: _ops.plan((8192, cols), "float16", direction="backward", **kw)
    if big_stage():
        assert bwd(32768)["resident"] == 1 and bwd(32768)["stage"] == 128 << 10 and bwd(32768)["cluster"] == 1
    longer, expect = bwd(65536), resident_blocks(65536, 32 << 10, 8192)
    assert longer["family"] == "stream" and longer["resident"] == (expect > 0), (longer, expect)
    # The 8 steps of a row split over the cluster's blocks, or streamed through a ring of steps' slots.
    steps = -(-8 // expect) if expect else longer["held"]
    assert longer["cluster"] == max(expect, 1) and longer["stage"] == steps * (32 << 10), (longer, expect)
    assert expect or 1 <= longer["held"] <= 4, longer
    assert bwd(1000, algo="naive")["resident"] == 0  # the reference reads global memory twice


# ----------------------------------------------------------------------------------------------
# Edge values.


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("cols", [1, 5, 200, 3000, 40000])
def test_edge_values(algo, dtype, cols):
    """-inf entries, an all -inf row (zeros), a NaN row (NaN), a +inf row (NaN), huge logits."""
    g = rng()
    big = NEAR_LARGEST[dtype]
    x64 = rounded(g.standard_normal((6, cols)) * 3, dtype)
    x64[0, ::2] = -numpy.inf
    x64[1, :] = -numpy.inf
    x64[2, cols // 2] = numpy.nan
    x64[3, cols // 3] = numpy.inf
    x64[4, :] = rounded(g.uniform(-1, 1, cols) * big, dtype)
    x64[5, :] = rounded(g.uniform(-1, 1, cols) - big / 2, dtype)
    y = to_host64(run(algo, to_device(x64, dtype), out=poisoned(x64.shape, dtype, 123.0)))
    ref = ref_softmax(x64)
    assert numpy.all(y[1] == 0), "an all -inf row must give zeros"
    assert numpy.all(numpy.isnan(y[2])), "a NaN in a row gives NaN in that row"
    assert numpy.all(numpy.isnan(y[3])), "a +inf logit gives NaN (inf - inf), as torch and NumPy do"
    for r in (0, 4, 5):
        assert row_error(y[r], ref[r]) <= TOL[dtype], f"row {r} seed={g.seed}"


@pytest.mark.parametrize("algo", ALGOS)
def test_empty_and_scalar(algo):
    for shape in [(0,), (0, 5), (5, 0), (3, 0, 7), ()]:
        x = cupy.ones(shape, dtype=cupy.float32)
        y = run(algo, x)
        assert y.shape == shape and y.dtype == x.dtype
        if shape == ():
            assert float(y) == 1.0


@pytest.mark.parametrize("algo", ALGOS)
def test_one_column(algo):
    x = cupy.asarray([[3.0], [-numpy.inf], [numpy.nan], [1e30]], dtype=cupy.float32)
    y = cupy.asnumpy(run(algo, x)).ravel()
    assert y[0] == 1.0 and y[1] == 0.0 and numpy.isnan(y[2]) and y[3] == 1.0


# ----------------------------------------------------------------------------------------------
# Layouts, out=, axis=, streams, devices, interop.


@pytest.mark.parametrize("algo", ALGOS)
def test_strided_inputs(algo):
    g = rng()
    base64 = g.standard_normal((64, 2 * 781 + 3)) * 3
    base = cupy.asarray(base64)
    views = {
        "sliced columns": (base[:, :781], base64[:, :781]),  # row stride > cols, unaligned rows
        "every other row": (base[::2, :512], base64[::2, :512]),
        "every other column": (base[:, ::2], base64[:, ::2]),  # last axis not unit-stride: copied
        "transposed": (base[:40, :64].T, base64[:40, :64].T),
        "negative row stride": (base[::-1, :100], base64[::-1, :100]),
        "3-d non-collapsible": (base[:, :600].reshape(8, 8, 600)[:, ::2], base64[:, :600].reshape(8, 8, 600)[:, ::2]),
    }
    for name, (x, x64) in views.items():
        before = cupy.asnumpy(base)
        y = run(algo, x)
        assert y.shape == x.shape
        assert_close(cupy.asnumpy(y), ref_softmax(x64), "float64", f"{algo} {name} seed={g.seed}")
        assert numpy.array_equal(cupy.asnumpy(base), before), f"{name}: the input was modified"


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_out_is_x(algo, dtype):
    g = rng()
    for cols in (100, 5000, 70000):
        x64 = rounded(g.standard_normal((7, cols)) * 3, dtype)
        x = to_device(x64, dtype)
        y = run(algo, x, out=x)
        assert y is x
        assert_close(to_host64(x), ref_softmax(x64), dtype, f"in place {cols} seed={g.seed}")


def test_out_strided_and_errors():
    g = rng()
    x64 = g.standard_normal((16, 300))
    x = cupy.asarray(x64)
    big = cupy.full((16, 600), 7.0)
    out = big[:, ::2]  # not unit-stride: written through a temporary
    y = pysoftmax.fused(x, out=out)
    assert y.data.ptr == out.data.ptr
    assert_close(cupy.asnumpy(big[:, ::2]), ref_softmax(x64), "float64", "strided out")
    assert numpy.all(cupy.asnumpy(big[:, 1::2]) == 7.0), "elements between the out columns were touched"
    with pytest.raises(ValueError, match="out"):
        pysoftmax.fused(x, out=cupy.empty((16, 301)))
    with pytest.raises(TypeError, match="out"):
        pysoftmax.fused(x, out=cupy.empty((16, 300), dtype=cupy.float32))
    with pytest.raises(ValueError, match="overlaps"):
        whole = cupy.asarray(g.standard_normal((17, 300)))
        pysoftmax.fused(whole[1:], out=whole[:-1])


@pytest.mark.parametrize("algo", ["naive", "online"])
def test_axis(algo):
    g = rng()
    x64 = g.standard_normal((6, 50, 7)) * 2
    for axis in (0, 1, -2, 2, -1):
        y = run(algo, cupy.asarray(x64), axis=axis)
        ref = numpy.moveaxis(ref_softmax(numpy.moveaxis(x64, axis, -1)), -1, axis)
        assert_close(cupy.asnumpy(y), ref, "float64", f"axis={axis}")
    out = cupy.full(x64.shape, numpy.nan)
    y = run(algo, cupy.asarray(x64), axis=0, out=out)
    assert y is out
    assert_close(cupy.asnumpy(out), numpy.moveaxis(ref_softmax(numpy.moveaxis(x64, 0, -1)), -1, 0), "float64", "out")


@pytest.mark.parametrize("algo", ALGOS)
def test_non_default_stream(algo):
    g = rng()
    x64 = g.standard_normal((4096, 1000)).astype(numpy.float32)
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        x = cupy.asarray(x64)
    y = run(algo, x, stream=s)
    s.synchronize()
    assert_close(cupy.asnumpy(y), ref_softmax(x64), "float32", "stream=")
    with s:  # the current stream, entered by the caller
        y2 = run(algo, x)
    s.synchronize()
    assert_close(cupy.asnumpy(y2), ref_softmax(x64), "float32", "with stream")
    y3 = run(algo, x, stream=s.ptr)  # a raw pointer
    s.synchronize()
    assert_close(cupy.asnumpy(y3), ref_softmax(x64), "float32", "stream pointer")


def test_cuda_array_interface_input():
    class Wrapped:
        def __init__(self, a):
            self.a = a
            self.__cuda_array_interface__ = a.__cuda_array_interface__

    g = rng()
    x64 = g.standard_normal((33, 129))
    x = cupy.asarray(x64, dtype=cupy.float32)
    y = pysoftmax.fused(Wrapped(x))
    assert isinstance(y, cupy.ndarray)
    assert_close(cupy.asnumpy(y), ref_softmax(x.get()), "float32", "CAI")
    before = x.copy()
    pysoftmax.fused(Wrapped(x), out=x)  # in place through the interface: no copy was made
    assert_close(cupy.asnumpy(x), ref_softmax(before.get()), "float32", "CAI in place")


def test_torch_interop():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    g = rng()
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        t = torch.from_numpy(g.standard_normal((64, 333))).to("cuda", dt)
        y = pysoftmax.fused(t, scale=0.5)
        ref = torch.softmax(t.double() * 0.5, -1).cpu().numpy()
        name = str(dt).split(".")[-1]
        assert_close(to_host64(y), ref, name, f"torch {name}")
        assert torch.from_dlpack(y).dtype == dt


def test_jax_interop():
    jax = pytest.importorskip("jax")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("jax has no GPU device")
    import jax.numpy as jnp

    g = rng()
    x64 = g.standard_normal((16, 100)).astype(numpy.float32)
    y = pysoftmax.online(jnp.asarray(x64))
    assert_close(cupy.asnumpy(y), ref_softmax(x64), "float32", "jax")
