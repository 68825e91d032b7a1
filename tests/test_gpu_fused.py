"""fused (scale + mask + causal) and backward on the GPU against float64 references."""

import os

import numpy
import pytest

from _util import (BF16, DTYPES, assert_close, assert_grad_close, packed_clusters, poisoned, ref_softmax,
                   resident_blocks, rng, rounded)
from _util import to_device, to_host64

pytestmark = pytest.mark.gpu

try:
    import cupy
    import pysoftmax
    from pysoftmax import _lib, _ops
except ImportError:  # pragma: no cover
    pass

B, H, Q, K = 2, 3, 5, 67


def make_mask(g, shape, kind, dtype_for_add="float32"):
    if kind == "bool":
        m = g.random(shape) > 0.3
        return m, cupy.asarray(m)
    m = rounded(g.standard_normal(shape) * 2, kind)
    return m, to_device(m, kind)


MASK_SHAPES = {
    "padding [B,1,1,K]": (B, 1, 1, K),
    "[B,1,Q,K]": (B, 1, Q, K),
    "[Q,K]": (Q, K),
    "[K]": (K,),
    "[1]": (1,),
    "scalar": (),
    "full [B,H,Q,K]": (B, H, Q, K),
    "column [B,H,Q,1]": (B, H, Q, 1),
    "[H,1,K]": (H, 1, K),
}


@pytest.mark.parametrize("kind", ["bool", "float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("name", list(MASK_SHAPES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_mask_kinds_and_broadcasts(name, kind, dtype):
    g = rng()
    x64 = rounded(g.standard_normal((B, H, Q, K)) * 3, dtype)
    m_host, m = make_mask(g, MASK_SHAPES[name], kind)
    y = pysoftmax.fused(to_device(x64, dtype), scale=0.7, mask=m, out=poisoned(x64.shape, dtype))
    assert_close(to_host64(y), ref_softmax(x64, 0.7, m_host), dtype, f"{name} {kind} seed={g.seed}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [8, 67, 1024, 1500, 40000])
def test_mask_across_families(dtype, k):
    """The mask reaches every family: rows in registers (vector and scalar packs) and streamed."""
    g = rng()
    x64 = rounded(g.standard_normal((2, 2, 3, k)) * 3, dtype)
    pad = g.random((2, 1, 1, k)) > 0.5
    pad[1, ..., : k // 2] = False
    full = rounded(g.standard_normal((2, 1, 3, k)), "float32")
    for mask_host, mask in ((pad, cupy.asarray(pad)), (full, cupy.asarray(full, dtype=cupy.float32))):
        y = pysoftmax.fused(to_device(x64, dtype), mask=mask, out=poisoned(x64.shape, dtype))
        assert_close(to_host64(y), ref_softmax(x64, 1.0, mask_host), dtype, f"k={k} seed={g.seed}")


def test_mask_non_contiguous():
    g = rng()
    x64 = g.standard_normal((4, 64, 64))
    m = g.random((64, 64)) > 0.4
    mt = cupy.asarray(m).T  # mask columns are not unit-stride: read element by element
    y = pysoftmax.fused(cupy.asarray(x64), mask=mt, out=poisoned(x64.shape, "float64"))
    assert_close(cupy.asnumpy(y), ref_softmax(x64, 1.0, m.T), "float64", "transposed mask")
    madd = cupy.asarray(g.standard_normal((4, 1, 128)))[:, :, ::2]  # strided additive mask
    y = pysoftmax.fused(cupy.asarray(x64), mask=madd, out=poisoned(x64.shape, "float64"))
    assert_close(cupy.asnumpy(y), ref_softmax(x64, 1.0, cupy.asnumpy(madd)), "float64", "strided mask")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("q,k", [(7, 7), (64, 64), (5, 9), (9, 5), (1, 300), (300, 1), (33, 2000), (3, 40000)])
def test_causal(q, k, dtype):
    """Top-left aligned (torch is_causal): query i sees keys 0..i, for square and non-square."""
    g = rng()
    x64 = rounded(g.standard_normal((2, q, k)) * 3, dtype)
    y = to_host64(pysoftmax.fused(to_device(x64, dtype), causal=True, out=poisoned(x64.shape, dtype)))
    ref = ref_softmax(x64, 1.0, None, causal=True)
    assert_close(y, ref, dtype, f"causal {q}x{k} seed={g.seed}")
    upper = numpy.arange(k)[None, :] > numpy.arange(q)[:, None]
    assert numpy.all(y[:, upper] == 0), "keys after the query must get exactly zero"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunks", [1, 3])
def test_causal_stream_skips_steps_past_the_limit(chunks, dtype):
    """rows_stream in 64-thread blocks walks rows of 2600 in steps of 512-1024 columns; the steps
    that start at or past a row's causal limit (1..1200) are not computed, only written with zeros:
    in one launch, and with the row split in three chunks (some of them wholly past the limit)."""
    g = rng()
    q, k = 1200, 2600
    x64 = rounded(g.standard_normal((2, q, k)) * 3, dtype)
    pad = g.random((2, 1, k)) > 0.2
    y = _ops.forward(to_device(x64, dtype), scale=0.6, mask=cupy.asarray(pad), causal=True, family=3,
                     chunks=chunks, threads=64, out=poisoned(x64.shape, dtype))
    y = to_host64(y)
    assert_close(y, ref_softmax(x64, 0.6, pad, causal=True), dtype, f"chunks={chunks} seed={g.seed}")
    upper = numpy.arange(k)[None, :] > numpy.arange(q)[:, None]
    assert numpy.all(y[:, upper] == 0), "keys after the query must get exactly zero"


def test_causal_matches_torch_sdpa_convention():
    torch = pytest.importorskip("torch")
    g = rng()
    q, k = 4, 6
    x64 = g.standard_normal((q, k))
    keep = torch.ones(q, k, dtype=torch.bool).tril(diagonal=0).numpy()  # what SDPA's is_causal uses
    y = cupy.asnumpy(pysoftmax.fused(cupy.asarray(x64), causal=True))
    assert_close(y, ref_softmax(x64, 1.0, keep), "float64", "torch is_causal")


@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_with_padding_and_fully_masked_rows(dtype):
    g = rng()
    x64 = rounded(g.standard_normal((3, 2, 16, 16)) * 3, dtype)
    pad = numpy.ones((3, 1, 1, 16), bool)
    pad[1, ..., :4] = False  # rows 0..3 of batch 1 see nothing under causal: zeros
    pad[2] = False  # batch 2: everything masked
    y = to_host64(pysoftmax.fused(to_device(x64, dtype), scale=0.3, mask=cupy.asarray(pad), causal=True,
                                  out=poisoned(x64.shape, dtype)))
    ref = ref_softmax(x64, 0.3, pad, causal=True)
    assert numpy.all(y[2] == 0) and numpy.all(y[1, :, :4] == 0)
    assert_close(y, ref, dtype, f"seed={g.seed}")


# Steps of rows_warp's walking grid from which it carries rows forward (hip/forward.cu).
WALK_MIN_STEPS = 4


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("k", [32, 100])
@pytest.mark.parametrize("blocks", [1, 2])
def test_masked_rows_walk(blocks, k, dtype):
    """rows_warp carries a 16-bit row's causal query and mask offset from one step of its walking
    grid to the next (ForwardOp::Walk) where every warp takes WALK_MIN_STEPS steps or more: a grid
    capped at 1 or 2 blocks walks 555 rows in 5 steps or more, and the step (blocks x 64 rows for
    16-bit rows of 32, x 16 for rows of 100) wraps the query (Q = 37) and the mask's inner row
    dim at different rows. Masks of every row rank the walk takes (none, one dim, two) and one it
    leaves to the division (three), with and without the causal limit; rows of 32 (whole packs)
    and 100 (a pack the row's end cuts). float32, which does not walk, runs the same grids."""
    g = rng()
    b, h, q = 3, 5, 37
    x64 = rounded(g.standard_normal((b, h, q, k)) * 3, dtype)
    masks = {
        "none": None,
        "full [B,H,Q,K], one dim": g.random((b, h, q, k)) > 0.3,
        "padding [B,1,1,K], two dims": g.random((b, 1, 1, k)) > 0.3,
        "[Q,K], two dims": g.random((q, k)) > 0.3,
        "[B,1,Q,K], three dims": g.random((b, 1, q, k)) > 0.3,
    }
    for name, m in masks.items():
        for causal in (False, True):
            if m is None and not causal:
                continue
            plan = _ops.plan((b * h * q, k), dtype, causal_queries=q if causal else 0, mask=m is not None, blocks=blocks)
            per_step = plan["blocks"] * plan["threads"] // plan["group"] * plan["rows_per_group"]
            assert plan["family"] == "warp" and -(-b * h * q // per_step) >= WALK_MIN_STEPS, plan
            y = _ops.forward(to_device(x64, dtype), scale=0.7, mask=None if m is None else cupy.asarray(m),
                             causal=causal, blocks=blocks, out=poisoned(x64.shape, dtype))
            assert_close(to_host64(y), ref_softmax(x64, 0.7, m, causal=causal), dtype,
                         f"{name} causal={causal} blocks={blocks} seed={g.seed}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("k", [8, 20, 32, 60, 64, 100, 256])
@pytest.mark.parametrize("blocks", [1, 0])
def test_rows_read_ahead(blocks, k, dtype):
    """rows_warp reads 16-bit rows under a causal limit one step ahead (ForwardOp::kPipe): each
    step's logits and mask words are loaded in the step before and turned into values there. Rows
    whose ends cut a pack (20, 60, 100 columns, in rows padded to a multiple of 8 so that the
    packs stay vectors; the padding is NaN, so that a column read past the row's end shows) read
    that pack element by element, mask bytes included: more queries than keys, so that the last
    queries' limits reach the row's end. A mask whose rows are padded the same way is read a word
    a pack; one with a column stride of 2, or starting one byte in, byte by byte. Any nonzero byte
    of a boolean mask keeps its column (bytes of 2, 0x80 and 0xff, seen as bool). One block walks
    4 steps or more (the last one's rows partly dead); the full grid takes about one step a warp,
    with nothing left to read ahead."""
    g = rng()
    b, q = 12, max(37, k + 3)
    kp = -(-k // 8) * 8
    x64 = rounded(g.standard_normal((b, q, kp)) * 3, dtype)
    xd = to_device(numpy.where(numpy.arange(kp) < k, x64, numpy.nan), dtype)
    m_host = g.random((b, 1, 2 * kp + 1)) > 0.3
    m_dev = cupy.asarray(m_host)
    masks = {"none": None, "padded rows": (slice(0, kp), slice(0, k)), "column stride 2": (slice(0, 2 * k, 2),),
             "one byte in": (slice(1, k + 1),), "bytes 1, 2, 0x80, 0xff": (slice(0, kp), slice(0, k))}
    # The plan of the padded rows (that of kp contiguous columns: the same group and packs).
    plan = _ops.plan((b * q, kp), dtype, causal_queries=q, mask=True, blocks=blocks)
    assert plan["family"] == "warp" and plan["pack"] > 1 and plan["stage"] == 0, plan
    if blocks:
        per_step = plan["blocks"] * plan["threads"] // plan["group"] * plan["rows_per_group"]
        assert -(-b * q // per_step) >= WALK_MIN_STEPS, plan
    for name, cut in masks.items():
        m = md = None
        if cut is not None:
            m, md = m_host, m_dev
            for c in cut:
                m, md = m[:, :, c], md[:, :, c]
            if name == "padded rows":
                md = cupy.ascontiguousarray(m_dev[:, :, :kp])[:, :, :k]
            elif name.startswith("bytes"):
                raw = numpy.where(m_host[:, :, :kp], g.choice(numpy.array([1, 2, 0x80, 0xFF], numpy.uint8), (b, 1, kp)), 0)
                md = cupy.asarray(raw.astype(numpy.uint8)).view(cupy.bool_)[:, :, :k]
        out = poisoned(x64.shape, dtype)
        y = _ops.forward(xd[:, :, :k], scale=0.7, mask=md, causal=True, blocks=blocks, out=out[:, :, :k])
        assert_close(to_host64(y), ref_softmax(x64[:, :, :k], 0.7, m, causal=True), dtype,
                     f"{name} blocks={blocks} seed={g.seed}")
        assert numpy.all(numpy.isnan(to_host64(out)[:, :, k:])), "wrote past the row's end"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_kind", ["float16", "float32", "bool, scale < 0"])
@pytest.mark.parametrize("k", [8, 67, 1024, 1500, 40000])
def test_causal_with_additive_mask(k, mask_kind, dtype):
    """The additive loader under a causal limit (a float mask, or any mask with a scale that is not
    folded). More queries than keys (where they fit on chip), so that a warp's or block's rows mix
    rows the limit cuts with rows it leaves whole: the loaders drop their per-pack tests only where
    the whole warp's spans lie below the limit (with_reach), and both paths meet in one launch."""
    g = rng()
    q = k + 40 if k <= 1500 else 3
    x64 = rounded(g.standard_normal((2, q, k)) * 3, dtype)
    if mask_kind == "bool, scale < 0":
        scale, m_host = -0.6, g.random((2, 1, k)) > 0.3
        m = cupy.asarray(m_host)
    else:
        scale = 0.6
        m_host = rounded(g.standard_normal((2, 1, k)) * 2, mask_kind)
        m_host[:, :, g.random(k) > 0.7] = -numpy.inf  # padded keys
        m = to_device(m_host, mask_kind)
    y = pysoftmax.fused(to_device(x64, dtype), scale=scale, mask=m, causal=True, out=poisoned(x64.shape, dtype))
    y = to_host64(y)
    assert_close(y, ref_softmax(x64, scale, m_host, causal=True), dtype, f"q={q} k={k} {mask_kind} seed={g.seed}")
    upper = numpy.arange(k)[None, :] > numpy.arange(q)[:, None]
    assert numpy.all(y[:, upper] == 0), "keys after the query must get exactly zero"


def widened(a):
    """A 16-bit device array as float32 on the device (bfloat16 through its bits)."""
    if a.dtype == BF16:
        return (a.view(cupy.uint16).astype(cupy.uint32) << 16).view(cupy.float32)
    return a.astype(cupy.float32)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("s", [64, 128, 200, 512])
def test_wide_short_rows(s, dtype):
    """Boolean-masked 16-bit short rows take 4 packs a lane, staged, in groups of 4 lanes or more
    (hip/dispatch.cuh, kWideMinGroup) where every walking block takes two steps or more; fewer
    rows keep the tiny table's 2 packs, and so do rows that would leave a group of 2 lanes
    (S = 64) and platforms that do not stage (AMD). Both sides of the row count, [H,1,S,S] with a
    padding mask and causal limit: sampled rows (the first and last among them) against float64,
    and every row of the poisoned output summing to 1, or to 0 where nothing is kept."""
    g = rng()
    cupy.random.seed(g.seed)  # the inputs come from cupy's generator: the seed in messages reproduces them
    plan = lambda heads: _ops.plan((heads * s, s), dtype, causal_queries=s)
    if s == 64 or cupy.cuda.runtime.is_hip:
        big = plan(1 << 16)
        assert big["packs"] == 2 and (s != 64 or big["group"] == 4), big  # not 4 packs in 2 lanes, or unstaged
        sides = (256,)
    else:
        heads = 8
        while plan(heads)["packs"] != 4:
            heads *= 2
            assert heads * s * s <= 1 << 28, plan(heads)
        wide, tiny = plan(heads), plan(heads // 4)
        assert wide["family"] == "warp" and wide["group"] >= 4, wide
        assert wide["stage"] > 0, wide  # staged
        assert tiny["packs"] == 2 and tiny["group"] == 2 * wide["group"], (tiny, wide)
        sides = (heads // 4, heads)
    for heads in sides:
        shape = (heads, 1, s, s)
        x = cupy.random.standard_normal(shape, dtype=cupy.float32) * 3
        x = x.astype(cupy.float16) if dtype == "float16" else (x.view(cupy.uint32) >> 16).astype(cupy.uint16).view(BF16)
        pad = cupy.random.random((heads, 1, 1, s)) > 0.2
        pad[0, ..., : s // 2] = False  # the first rows of the first head keep nothing: zeros
        y = pysoftmax.fused(x, scale=0.3, mask=pad, causal=True, out=poisoned(shape, dtype))
        sums = widened(y).reshape(-1, s).sum(axis=1)
        kept = cupy.any(pad.reshape(heads, 1, 1, s) & cupy.tri(s, dtype=bool), axis=-1).reshape(-1)
        assert bool(cupy.all(cupy.abs(sums - kept) < 2e-2)), f"row sums, {heads} heads of S={s}"
        rows = numpy.unique(numpy.r_[0, g.integers(0, heads * s, 80), heads * s - 1])
        got = cupy.asnumpy(widened(y).reshape(-1, s)[cupy.asarray(rows)]).astype(numpy.float64)
        x64 = cupy.asnumpy(widened(x).reshape(-1, s)[cupy.asarray(rows)]).astype(numpy.float64)
        keep = cupy.asnumpy(pad.reshape(heads, s))[rows // s] & (numpy.arange(s)[None, :] <= (rows % s)[:, None])
        assert_close(got, ref_softmax(x64, 0.3, keep), dtype, f"{heads} heads of S={s}, seed={g.seed}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [0.37, -0.8, 0.0])
@pytest.mark.parametrize("k", [8, 67, 1024, 1500, 40000])
def test_scale_folded_and_not(k, scale, dtype):
    """A positive scale is folded into the exponent; zero and negative ones are applied on load by
    the general loader (hip/policy.cuh, MaskKind). Both, with every mask kind, in every family."""
    g = rng()
    x64 = rounded(g.standard_normal((2, 3, k)) * 3, dtype)
    pad = g.random((2, 1, k)) > 0.3
    pad[1, 0] = False  # a fully masked row: zeros, whatever the scale
    add = rounded(g.standard_normal((3, k)), "float32")
    for mask_host, mask, causal in ((None, None, False), (None, None, True), (pad, cupy.asarray(pad), True),
                                    (add, cupy.asarray(add, dtype=cupy.float32), False)):
        what = f"scale={scale} k={k} mask={None if mask is None else mask.dtype} causal={causal} seed={g.seed}"
        y = pysoftmax.fused(to_device(x64, dtype), scale=scale, mask=mask, causal=causal, out=poisoned(x64.shape, dtype))
        assert_close(to_host64(y), ref_softmax(x64, scale, mask_host, causal=causal), dtype, what)
    for algo in (_lib.ALGO_ONLINE, _lib.ALGO_NAIVE):  # the C API takes a scale for these too
        y = _ops.forward(to_device(x64, dtype), algo=algo, scale=scale, out=poisoned(x64.shape, dtype))
        assert_close(to_host64(y), ref_softmax(x64, scale), dtype, f"algo={algo} scale={scale} seed={g.seed}")


@pytest.mark.parametrize("scale, magnitude", [(3e38, 1e-37), (1e-39, 3.0)])
def test_scale_whose_exponent_factor_is_not_normal(scale, magnitude):
    """scale * log2(e) past float32's range, or below its normal numbers (flushed to 0 by a
    FAST_MATH build), cannot be folded: it is applied on load instead, masks and causal included."""
    g = rng()
    x64 = rounded(g.standard_normal((2, 4, 300)) * magnitude, "float32")
    pad = g.random((2, 1, 300)) > 0.3
    for mask_host, mask, causal in ((None, None, False), (pad, cupy.asarray(pad), True)):
        y = pysoftmax.fused(cupy.asarray(x64, dtype=cupy.float32), scale=scale, mask=mask, causal=causal,
                            out=poisoned(x64.shape, "float32"))
        assert_close(to_host64(y), ref_softmax(x64, scale, mask_host, causal=causal), "float32",
                     f"scale={scale} causal={causal} seed={g.seed}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_exponent_of_large_logits(dtype):
    """Rows in registers take exp2(x * k - round(m * k)) where |m * k| (m the row's max, k the
    scale times log2(e)) stays below 65536 (ForwardOp::exp_row), and exp2((x - m) * k) elsewhere,
    decided per warp. Logits near 4e4 (the fused multiply-add, where the rounding of m * k is
    largest) and near 6e4 (past the bound), in separate launches and mixed (in rows of 32, among
    one warp's rows); rows of 32 and 1000 (rows_warp) and 5000 (rows_block)."""
    g = rng()
    for cols in (32, 1000, 5000):
        for mix in ("below", "past", "mixed"):
            x64 = g.standard_normal((64, cols)) * 3
            x64 += {"below": 4e4, "past": 6e4, "mixed": numpy.where(numpy.arange(64)[:, None] % 3 == 0, 6e4, 4e4)}[mix]
            x64 = rounded(x64, dtype)
            y = pysoftmax.fused(to_device(x64, dtype), out=poisoned(x64.shape, dtype))
            assert_close(to_host64(y), ref_softmax(x64), dtype, f"{mix} cols={cols} seed={g.seed}")


def test_additive_mask_uses_minus_inf():
    """A -inf additive entry removes the key exactly; no -10000-style leakage."""
    x = cupy.asarray([[50.0, 0.0, 0.0]], dtype=cupy.float32)
    m = cupy.asarray([-numpy.inf, 0.0, 0.0], dtype=cupy.float32)
    y = cupy.asnumpy(pysoftmax.fused(x, mask=m))
    assert y[0, 0] == 0.0 and abs(y[0, 1] - 0.5) < 1e-7


# ----------------------------------------------------------------------------------------------
# Backward.


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("algo", ["backward", "naive_backward"])
@pytest.mark.parametrize("cols", [1, 3, 32, 33, 255, 256, 257, 1000, 1024, 1025, 4097, 16385, 32769, 65537])
def test_backward_closed_form(algo, cols, dtype):
    g = rng()
    rows = 21 if cols < 10000 else 3
    y64 = rounded(ref_softmax(g.standard_normal((rows, cols)) * 3), dtype)
    dy64 = rounded(g.standard_normal((rows, cols)), dtype)
    out = poisoned((rows, cols), dtype)
    dx = getattr(pysoftmax, algo)(to_device(y64, dtype), to_device(dy64, dtype), scale=0.5, out=out)
    assert dx is out
    assert_grad_close(to_host64(dx), y64, dy64, 0.5, dtype, f"{algo} {cols} seed={g.seed}")


@pytest.mark.parametrize("family", [1, 2, 3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_every_family(family, dtype):
    g = rng()
    for cols in (5, 96, 255):
        y64 = rounded(ref_softmax(g.standard_normal((13, cols))), dtype)
        dy64 = rounded(g.standard_normal((13, cols)), dtype)
        dx = _ops.backward_impl(to_device(y64, dtype), to_device(dy64, dtype), family=family,
                                out=poisoned((13, cols), dtype))
        assert_grad_close(to_host64(dx), y64, dy64, 1.0, dtype, f"family {family} {cols} seed={g.seed}")


@pytest.mark.parametrize("chunks", [2, 5, 33])
def test_backward_split_rows(chunks):
    g = rng()
    y64 = ref_softmax(g.standard_normal((3, 50000)))
    dy64 = g.standard_normal((3, 50000))
    dx = _ops.backward_impl(cupy.asarray(y64), cupy.asarray(dy64), family=3, chunks=chunks,
                            out=poisoned(y64.shape, "float64"))
    assert_grad_close(cupy.asnumpy(dx), y64, dy64, 1.0, "float64", f"chunks={chunks}")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("cols", [1000, 1001, 40000, 50152])
def test_backward_stream_resident(cols, dtype):
    """Backward rows_stream with y and dy resident in the stage (one read of each): rows of 1000
    on more rows than the grid has blocks (refills), 16-bit rows of 40000 in five steps (160 KiB,
    where the GPU allows it), float32 rows of 40000 (320 KiB) in a cluster of two blocks where the
    GPU has clusters (else streamed twice), and of 50152 (7 steps) in a cluster of four (three
    where four do not pack the GPU) whose last block holds one step of 1000 columns (the step a
    cluster reads before its barriers);
    rows of 1001, which straddle the pack boundary, held as rows of 1000 are. Each also on a grid
    of two blocks (or clusters) that walk every row."""
    g = rng()
    dev = cupy.cuda.Device()
    staged = not cupy.cuda.runtime.is_hip and int(dev.compute_capability) >= 80
    big = staged and dev.attributes["MaxSharedMemoryPerBlockOptin"] >= 200 << 10
    rows = 32 * dev.attributes["MultiProcessorCount"] + 76 if cols < 10000 else 700
    plan = _ops.plan((rows, cols), dtype, family="stream", direction="backward")
    assert plan["chunks"] == plan["cluster"], plan
    if cols in (1000, 1001):
        assert plan["resident"] == (1 if staged else 0) and plan["straddle"] == cols % 2, plan
    elif dtype == "float32":  # on an H200 two blocks of a cluster, 192 KiB each (four, 128 KiB)
        expect = resident_blocks(cols, 64 << 10, 8192)  # y and dy: 2 x 4 packs a thread a step
        assert (plan["resident"], plan["cluster"]) == (expect > 0, max(expect, 1)), (plan, expect)
    elif big and cols == 40000:
        assert plan["resident"] == 1 and plan["stage"] == 160 << 10, plan
    y64 = rounded(ref_softmax(g.standard_normal((rows, cols)) * 3), dtype)
    dy64 = rounded(g.standard_normal((rows, cols)), dtype)
    for blocks in (0, 2 * plan["cluster"]):  # the automatic grid, and one that walks every row
        dx = _ops.backward_impl(to_device(y64, dtype), to_device(dy64, dtype), scale=0.7, family=3, blocks=blocks,
                                out=poisoned((rows, cols), dtype))
        assert_grad_close(to_host64(dx), y64, dy64, 0.7, dtype, f"resident={plan['resident']} blocks={blocks} "
                          f"seed={g.seed}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("rows,cols", [(300, 1024), (300, 1032), (300, 1537), (300, 2500), (300, 8192), (300, 8200),
                                       (600, 8200), (600, 8193)])
def test_backward_block_packs(rows, cols, dtype):
    """The 16-bit backward's rows_block holds two packs a thread (policy.cuh, block_packs) while
    its block stays within 512 threads: rows of 1025-8192 columns, aligned or straddling (1537,
    2500). Rows of 1024 stay in rows_warp; longer ones (8200) take the stream where it holds them
    without sharing a row over the grid (600 rows on a GPU of 132 SMs), else rows_block of four
    packs a thread (300 rows there); odd rows of 8193 straddle in the stream."""
    if any(v in os.environ for v in ("PYSOFTMAX_BLOCK_PACKS", "PYSOFTMAX_STRADDLE", "PYSOFTMAX_STRADDLE_BLOCK")):
        pytest.skip("rows_block's packs or the straddling rules set by the environment")
    g = rng()
    plan = _ops.plan((rows, cols), dtype, direction="backward")
    if cols <= 1024:
        assert plan["family"] == "warp", plan
    elif cols <= 8192:
        assert (plan["family"], plan["packs"], plan["straddle"]) == ("block", 2, cols % 8 != 0), plan
        warp = cupy.cuda.Device().attributes["WarpSize"]
        lanes = -(-((cols - (7 if cols % 8 else 0)) // 8) // 2)  # the held body's packs, two a thread
        assert plan["threads"] == -(-lanes // warp) * warp, plan
    elif cols % 8 == 0:
        # The stream where it holds the row without sharing it over the grid, as plan_rows asks it.
        stream = _ops.plan((rows, cols), dtype, family="stream", direction="backward")
        held = stream["resident"] == 1 and stream["grid"] == 0 and stream["chunks"] == 1
        assert plan["family"] == ("stream" if held else "block"), (plan, stream)
        assert plan["family"] == "stream" or plan["packs"] == 4, plan
        if cupy.cuda.Device().attributes["MultiProcessorCount"] == 132 and not cupy.cuda.runtime.is_hip:
            assert plan["family"] == ("stream" if rows == 600 else "block"), plan
    else:
        assert plan["family"] == "stream" and plan["straddle"] == 1, plan
    y64 = rounded(ref_softmax(g.standard_normal((rows, cols)) * 3), dtype)
    dy64 = rounded(g.standard_normal((rows, cols)), dtype)
    dx = pysoftmax.backward(to_device(y64, dtype), to_device(dy64, dtype), scale=0.6, out=poisoned((rows, cols), dtype))
    assert_grad_close(to_host64(dx), y64, dy64, 0.6, dtype, f"{plan} seed={g.seed}")


@pytest.mark.parametrize("cols", [106496, 122880])
def test_backward_cluster_sizes_that_pack(cols):
    """float32 backward rows of 13 and 15 steps (8192 columns, 64 KiB of y and dy; 3 steps a block
    on an H200). A cluster size that packs the GPU (2, 4 or 8 there: packed_clusters) is taken
    where each of its blocks holds a chunk: 15 steps in 8 blocks of 2. 13 steps in 8 blocks of 2
    would leave the eighth empty, so they take the fewest blocks of any size that hold them, 5 of
    3. The plan against the tests' mirror (resident_blocks), and the gradient on both, the
    cluster walking its rows."""
    g = rng()
    dev = cupy.cuda.Device()
    rows = 4 * dev.attributes["MultiProcessorCount"] + 2  # enough rows for one chunk a block
    plan = _ops.plan((rows, cols), "float32", direction="backward")
    expect = resident_blocks(cols, 64 << 10, 8192)
    assert plan["cluster"] == max(expect, 1), (plan, expect)  # (no cluster: the grid or two reads)
    if expect > 1:
        assert plan["resident"] == 1 and plan["chunks"] == expect, plan
    h200 = packed_clusters() == 1 << 2 | 1 << 4 | 1 << 8 and dev.attributes["MaxSharedMemoryPerBlockOptin"] == 227 << 10
    if h200:  # 2, 4 and 8 pack; 3 steps a block
        assert plan["cluster"] == (8 if cols == 122880 else 5), plan
    y64 = rounded(ref_softmax(g.standard_normal((rows, cols)) * 3), "float32")
    dy64 = rounded(g.standard_normal((rows, cols)), "float32")
    dx = _ops.backward_impl(to_device(y64, "float32"), to_device(dy64, "float32"), scale=0.7,
                            out=poisoned((rows, cols), "float32"))
    assert_grad_close(to_host64(dx), y64, dy64, 0.7, "float32", f"cluster={plan['cluster']} seed={g.seed}")


@pytest.mark.parametrize("steps", [8, 9, 17])
def test_stream_resident_many_steps(steps):
    """A resident row commits its copies a group per step, and the first pass waits for its step's
    group by the count of later ones, up to 7 (wait_group takes an immediate). Rows of 8, 9 and 17
    steps reach and pass that count: 64-thread float32 blocks take 1024 columns a step (4 packs of
    4 a thread), the last step partial (1020 columns). One chunk a row, forced, so that few rows
    stay whole; a grid of two blocks refills its stages row after row. Forward and backward."""
    g = rng()
    rows, cols = 40, 1024 * steps - 4
    x64 = rounded(g.standard_normal((rows, cols)) * 3, "float32")
    y64 = rounded(ref_softmax(x64), "float32")
    dy64 = rounded(g.standard_normal((rows, cols)), "float32")
    for direction, step_bytes in (("forward", 4 << 10), ("backward", 8 << 10)):  # x; y and dy
        plan = _ops.plan((rows, cols), "float32", direction=direction, family="stream", threads=64, chunks=1)
        assert plan["resident"] == (resident_blocks(cols, step_bytes, 1024) == 1) and plan["cluster"] == 1, plan
        what = f"{direction} resident={plan['resident']} steps={steps} seed={g.seed}"
        if direction == "forward":
            y = _ops.forward(to_device(x64, "float32"), family=3, threads=64, chunks=1, blocks=2,
                             out=poisoned((rows, cols), "float32"))
            assert_close(to_host64(y), ref_softmax(x64), "float32", what)
        else:
            dx = _ops.backward_impl(to_device(y64, "float32"), to_device(dy64, "float32"), family=3, threads=64,
                                    chunks=1, blocks=2, out=poisoned((rows, cols), "float32"))
            assert_grad_close(to_host64(dx), y64, dy64, 1.0, "float32", what)


@pytest.mark.parametrize("causal", [False, True])
def test_backward_finite_differences(causal):
    """d/dx of sum(w * fused(x, scale, mask, causal)) by central differences in float64."""
    g = rng()
    q, k, scale = 4, 9, 0.8
    x = g.standard_normal((2, q, k))
    w = g.standard_normal((2, q, k))
    mask = g.random((2, 1, k)) > 0.3
    mask[1, 0, :] = False  # a fully masked batch: zero gradient
    f = lambda xx: float((cupy.asnumpy(pysoftmax.fused(cupy.asarray(xx), scale=scale, mask=cupy.asarray(mask),
                                                       causal=causal)) * w).sum())
    y = pysoftmax.fused(cupy.asarray(x), scale=scale, mask=cupy.asarray(mask), causal=causal)
    dx = cupy.asnumpy(pysoftmax.backward(y, cupy.asarray(w), scale=scale))
    num = numpy.zeros_like(x)
    eps = 1e-6
    for idx in numpy.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += eps
        xm[idx] -= eps
        num[idx] = (f(xp) - f(xm)) / (2 * eps)
    assert numpy.all(dx[1] == 0)
    assert numpy.abs(dx - num).max() <= 1e-7 * max(1.0, numpy.abs(num).max()), numpy.abs(dx - num).max()


@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_in_place(dtype):
    g = rng()
    for which in ("y", "dy"):
        y64 = rounded(ref_softmax(g.standard_normal((9, 3000))), dtype)
        dy64 = rounded(g.standard_normal((9, 3000)), dtype)
        y, dy = to_device(y64, dtype), to_device(dy64, dtype)
        out = y if which == "y" else dy
        dx = pysoftmax.backward(y, dy, out=out)
        assert dx is out
        assert_grad_close(to_host64(dx), y64, dy64, 1.0, dtype, f"out={which}")


def test_backward_strided_and_streams():
    g = rng()
    y64 = ref_softmax(g.standard_normal((64, 1000)))
    dy64 = g.standard_normal((64, 2000))
    s = cupy.cuda.Stream(non_blocking=True)
    out = poisoned(y64.shape, "float64")
    cupy.cuda.Device().synchronize()  # the poison is written on the default stream, the launch goes on s
    dx = pysoftmax.backward(cupy.asarray(y64), cupy.asarray(dy64)[:, ::2], stream=s, out=out)
    s.synchronize()
    assert_grad_close(cupy.asnumpy(dx), y64, dy64[:, ::2], 1.0, "float64", "strided dy")
    with pytest.raises(ValueError, match="dy"):
        pysoftmax.backward(cupy.asarray(y64), cupy.asarray(dy64))


def test_fast_path_keys_every_layout():
    """The CuPy fast path keeps one plan per (shapes, strides, dtypes, alignment, scale, causal):
    calls that alternate between layouts of the same x shape must each get their own plan. The
    masks below differ from call to call in shape, strides, dtype and alignment (one offset by an
    element), and x in alignment; each result is checked, twice round."""
    g = rng()
    x64 = rounded(g.standard_normal((2, 3, 24, 40)) * 3, "float16")
    x = to_device(x64, "float16")
    xoff_buf = to_device(numpy.concatenate([numpy.zeros(1), x64.ravel()]), "float16")
    x_unaligned = xoff_buf[1:].reshape(x64.shape)  # same values, 2 bytes off the 16-byte pack
    pad = g.random((2, 1, 1, 41)) > 0.3
    pad_dev = cupy.asarray(pad)
    bias = rounded(g.standard_normal((3, 24, 80)), "float32")
    bias_dev = cupy.asarray(bias, dtype=cupy.float32)
    wide = rounded(g.standard_normal((24, 41)), "float64")  # 8 packs of 8 bytes: the widest mask vector
    wide_dev = cupy.asarray(wide)
    masks = [
        ("none", None, None),
        ("float64", wide[:, :40], wide_dev[:, :40]),
        ("float64 one element in", wide[:, 1:], wide_dev[:, 1:]),
        ("padding", pad[..., :40], pad_dev[..., :40]),
        ("padding one byte in", pad[..., 1:], pad_dev[..., 1:]),
        ("strided float", bias[..., ::2], bias_dev[..., ::2]),
        ("float column", bias[..., :1], bias_dev[..., :1]),
    ]
    for _ in range(2):
        for xin in (x, x_unaligned):
            for scale, causal in ((1.0, False), (0.3, True)):
                for name, m_host, m in masks:
                    y = pysoftmax.fused(xin, scale=scale, mask=m, causal=causal)
                    ref = ref_softmax(x64, scale, m_host, causal)
                    assert_close(to_host64(y), ref, "float16", f"{name} scale={scale} causal={causal} seed={g.seed}")
                    out = poisoned(x64.shape, "float16")
                    assert pysoftmax.fused(xin, scale=scale, mask=m, causal=causal, out=out) is out
                    assert_close(to_host64(out), ref, "float16", f"out= {name} seed={g.seed}")


def test_fast_path_leaves_strided_overlaps_to_the_general_path():
    """An out= that partly overlaps a strided input is refused, not raced: a strided array's
    extent is not [ptr, ptr + nbytes), so only the general path, which reads the strides, judges it."""
    g = rng()
    base = cupy.asarray(g.standard_normal((16, 64)), dtype=cupy.float32)
    before = base.copy()
    with pytest.raises(ValueError, match="overlaps"):
        pysoftmax.fused(base[0:8, :32], out=base[4:12, :32])  # out's row i is x's row i + 4
    with pytest.raises(ValueError, match="overlaps"):
        pysoftmax.fused(base[15:7:-1], out=base[4:12])  # rows 8..11 in both, x walked backwards
    with pytest.raises(ValueError, match="overlaps"):
        pysoftmax.backward(base[0:8, :32], base[8:16, :32], out=base[4:12, :32])
    assert bool(cupy.all(base == before)), "a refused call wrote its output"
