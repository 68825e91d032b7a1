"""rows_warp's odd pack counts (hip/dispatch.cuh, kOddPacks) on the GPU against float64.

Where two, four or eight 16-byte packs a lane would leave part of a group's lanes idle, rows_warp
gives a lane three or five (float32 rows of 5 x 2^k packs take five, 16-bit ones three; the plain
float32 forward keeps its powers of two in full groups). The widths below sit on both sides of that
choice (powers of two and widths it does not help among them), in every dtype (float64 never takes
it), plain, masked with and without a causal limit, walking many rows in one block, and backward,
with outputs poisoned first; row counts leave the last group and block part full.
"""

import os

import pytest

from _util import DTYPES, assert_close, assert_grad_close, poisoned, ref_softmax, rng, rounded, to_device, to_host64

pytestmark = pytest.mark.gpu

try:
    import cupy
    import pysoftmax
    from pysoftmax import _ops
except ImportError:  # pragma: no cover
    pass

WIDTHS = [12, 24, 40, 48, 80, 96, 128, 160, 192, 200, 256, 320, 384, 640, 768, 1024, 1280]
ROWS = [7, 333, 4099]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", WIDTHS)
def test_forward(cols, dtype):
    g = rng()
    for rows in ROWS:
        x64 = rounded(g.standard_normal((rows, cols)) * 3, dtype)
        out = poisoned((rows, cols), dtype)
        y = pysoftmax.fused(to_device(x64, dtype), out=out)
        assert y is out
        assert_close(to_host64(y), ref_softmax(x64), dtype, f"{rows}x{cols} seed={g.seed}")


@pytest.mark.parametrize("mask_kind", ["bool, causal", "float32, causal", "bool"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", WIDTHS)
def test_masked(cols, dtype, mask_kind):
    """[2, Q, cols] with a padding mask broadcast over the queries, under a causal limit or not
    (a boolean mask alone has kernels of its own), Q = cols + 5 up to 700 queries, so that the
    last queries of the shorter rows keep the whole row; then the same rows walked by one block
    (rows_warp carries a row's query and mask offset from step to step)."""
    g = rng()
    q = min(cols + 5, 700)
    causal = mask_kind.endswith("causal")
    x64 = rounded(g.standard_normal((2, q, cols)) * 3, dtype)
    if mask_kind.startswith("bool"):
        m64 = g.random((2, 1, cols)) > 0.2
        mask = cupy.asarray(m64)
    else:
        m64 = rounded(g.standard_normal((2, 1, cols)), "float32")
        mask = to_device(m64, "float32")
    ref = ref_softmax(x64, 0.7, m64, causal=causal)
    x = to_device(x64, dtype)
    y = pysoftmax.fused(x, scale=0.7, mask=mask, causal=causal, out=poisoned(x64.shape, dtype))
    assert_close(to_host64(y), ref, dtype, f"{q}x{cols} {mask_kind} seed={g.seed}")
    y = _ops.forward(x, scale=0.7, mask=mask, causal=causal, blocks=1, out=poisoned(x64.shape, dtype))
    assert_close(to_host64(y), ref, dtype, f"{q}x{cols} {mask_kind}, one block, seed={g.seed}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", WIDTHS)
def test_backward(cols, dtype):
    g = rng()
    for rows in ROWS:
        y64 = rounded(ref_softmax(g.standard_normal((rows, cols)) * 3), dtype)
        dy64 = rounded(g.standard_normal((rows, cols)), dtype)
        out = poisoned((rows, cols), dtype)
        dx = pysoftmax.backward(to_device(y64, dtype), to_device(dy64, dtype), scale=0.5, out=out)
        assert dx is out
        assert_grad_close(to_host64(dx), y64, dy64, 0.5, dtype, f"{rows}x{cols} seed={g.seed}")


# (dtype, cols): (packs, group) of the plain forward and the backward, 4096 rows.
PLANS = {
    ("bfloat16", 24): (3, 1), ("bfloat16", 40): (3, 2), ("bfloat16", 48): (3, 2), ("bfloat16", 80): (3, 4),
    ("bfloat16", 96): (3, 4), ("bfloat16", 128): (2, 8), ("bfloat16", 160): (3, 8), ("bfloat16", 192): (3, 8),
    ("bfloat16", 200): (2, 16), ("bfloat16", 256): (2, 16), ("bfloat16", 320): (3, 16), ("bfloat16", 384): (3, 16),
    ("bfloat16", 640): (3, 32), ("bfloat16", 768): (3, 32), ("bfloat16", 1024): (4, 32),
    ("float16", 96): (3, 4), ("float16", 320): (3, 16),
    ("float32", 12): (3, 1), ("float32", 24): (3, 2), ("float32", 40): (5, 2), ("float32", 48): (3, 4),
    ("float32", 80): (5, 4), ("float32", 96): (3, 8), ("float32", 128): (2, 16), ("float32", 160): (5, 8),
    ("float32", 192): (3, 16), ("float32", 200): (2, 32), ("float32", 256): (2, 32), ("float32", 320): (5, 16),
    ("float32", 384): (3, 32), ("float32", 640): (5, 32), ("float32", 768): (8, 32), ("float32", 1024): (8, 32),
    ("float64", 24): (2, 8), ("float64", 48): (2, 16), ("float64", 160): (4, 32),
}
# The plain float32 forward keeps its powers of two in full groups (policy.cuh, odd_full_groups).
FORWARD = {("float32", 384): (4, 32), ("float32", 640): (8, 32)}


def exact_plans_or_skip():
    if os.environ.get("PYSOFTMAX_ODD_PACKS") is not None:
        pytest.skip("PYSOFTMAX_ODD_PACKS is set: the plans are the knob's, not the defaults")
    if cupy.cuda.runtime.is_hip:
        pytest.skip("the expected plans are NVIDIA's (AMD does not stage, so its read-ahead rows keep their packs)")


def test_plans():
    """The odd counts are taken where they leave fewer slots idle, forward and backward, and
    never by float64, element-wise rows, the masked 16-bit rows that read ahead unstaged, the
    wide lanes, or the plain float32 forward in full groups."""
    exact_plans_or_skip()
    for (dt, cols), want in PLANS.items():
        for direction in ("forward", "backward"):
            p = _ops.plan((4096, cols), dt, direction=direction)
            w = FORWARD.get((dt, cols), want) if direction == "forward" else want
            assert p["family"] == "warp" and (p["packs"], p["group"]) == w, (dt, cols, direction, p)
            if p["packs"] in (3, 5):
                assert p["rows_per_group"] == 1, p
    # Element-wise rows take the scalar table (asked for by family: this width is tiled by default).
    assert _ops.plan((4096, 96), "bfloat16", aligned=False, family="warp")["packs"] in (4, 8)
    assert _ops.plan((4096, 96), "bfloat16", aligned=False)["family"] == "tile"
    # Heads of `cols` queries (the causal limit's queries divide the rows): 4800 rows, or many.
    masked = lambda cols, dt="bfloat16", rows=4800: _ops.plan((rows, cols), dt, mask=True, causal_queries=cols)
    assert (masked(48)["packs"], masked(48)["group"]) == (2, 4)  # three would be read ahead unstaged
    assert (masked(96)["packs"], masked(96)["group"]) == (3, 4) and masked(96)["stage"] > 0  # staged
    assert (masked(40, "float32")["packs"], masked(40, "float32")["rows_per_group"]) == (5, 1)  # over two rows
    full = masked(384, "float32", rows=384 * 13)
    assert (full["packs"], full["group"]) == (3, 32), full  # masked: in full groups too
    wide = masked(96, rows=96 * 43690)
    assert (wide["packs"], wide["group"]) == (4, 4), wide  # the wide lanes keep their four


def test_knob_turns_them_off():
    """PYSOFTMAX_ODD_PACKS=0 plans the powers of two; "3" allows three but not five, and not
    over two-row plans."""
    exact_plans_or_skip()
    import subprocess
    import sys

    code = ("from pysoftmax import _ops; p = lambda c, d: _ops.plan((4096, c), d, direction='backward'); "
            "print(*[(p(c, d)['packs'], p(c, d)['group']) for c, d in ((48, 'bfloat16'), (40, 'float32'), (80, 'float32'))])")
    want = {"0": "(2, 4) (2, 8) (2, 16)", "3": "(3, 2) (2, 8) (2, 16)", "35r": "(3, 2) (5, 2) (5, 4)"}
    for knob, plans in want.items():
        env = dict(os.environ, PYSOFTMAX_ODD_PACKS=knob)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split("\n")[0] == plans, (knob, out.stdout)


# PYSOFTMAX_ODD_PACKS with "w": the plain 16-bit forward may give a lane five packs (40 values, past
# kRowRegisters; dispatch.cuh, kOddPastItems), in groups of 1-32 lanes and for rows of 129-160 packs
# that rows_block holds otherwise. Widths: five packs fill them (40-1280), leave lanes idle (1032,
# 1100) or do not hold the row (1288: rows_block, as without the knob); odd widths straddle
# (every other row starts off the pack boundary: 275 and 1287, whose bodies take five packs too).
# (cols): (family, packs, group).
PAST = {40: ("warp", 5, 1), 80: ("warp", 5, 2), 160: ("warp", 5, 4), 275: ("warp", 5, 8), 320: ("warp", 5, 8),
        640: ("warp", 5, 16), 1032: ("warp", 5, 32), 1100: ("warp", 5, 32), 1280: ("warp", 5, 32),
        1287: ("warp", 5, 32), 1288: ("block", 4, None)}
PAST_SCRIPT = r"""
import sys
sys.path.insert(0, sys.argv[1])
import numpy
import pysoftmax
from pysoftmax import _ops
from _util import assert_close, poisoned, ref_softmax, rng, rounded, to_device, to_host64
cols, dtype = int(sys.argv[2]), sys.argv[3]
p = _ops.plan((4096, cols), dtype)
print(p["family"], p["packs"], p.get("group"))
g = rng()
for rows in (7, 333, 4099):
    x64 = rounded(g.standard_normal((rows, cols)) * 3, dtype)
    y = pysoftmax.fused(to_device(x64, dtype), out=poisoned((rows, cols), dtype))
    assert_close(to_host64(y), ref_softmax(x64), dtype, f"{rows}x{cols} seed={g.seed}")
    y = _ops.forward(to_device(x64, dtype), blocks=1, out=poisoned((rows, cols), dtype))
    assert_close(to_host64(y), ref_softmax(x64), dtype, f"{rows}x{cols}, one block, seed={g.seed}")
"""


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("cols", sorted(PAST))
def test_past_registers_knob(cols, dtype):
    """Under PYSOFTMAX_ODD_PACKS=35rw (in a process of its own: the knob is read once a device) the
    plain 16-bit forward plans five packs a lane where they hold the row in fewer slots, and
    computes the rows against float64, many rows a grid and walked by one block."""
    exact_plans_or_skip()
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(os.path.abspath(pysoftmax.__file__)))
    env = dict(os.environ, PYSOFTMAX_ODD_PACKS="35rw")
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])  # this pysoftmax
    out = subprocess.run([sys.executable, "-c", PAST_SCRIPT, here, str(cols), dtype], env=env, capture_output=True,
                         text=True, timeout=300, cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    family, packs, group = out.stdout.split("\n")[0].split()
    want = PAST[cols]
    assert (family, int(packs)) == want[:2] and (want[2] is None or int(group) == want[2]), (cols, out.stdout)
    # Without the knob the five are never planned.
    assert _ops.plan((4096, cols), dtype)["packs"] != 5
