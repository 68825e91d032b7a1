"""rows_tile on the GPU: dense rows of a width that is not a multiple of the 16-byte pack.

Each row of such an array starts at another offset inside the pack, so the register families
would read it element by element. Where every array is dense and shares its offset inside the
pack, rows_tile copies tiles of consecutive rows into shared memory as the aligned packs that
cover them, works each row from there, and writes each tile back as aligned packs
(hip/families.cuh; plan_tile in hip/dispatch.cuh). By default it takes the fused backward's
16-bit rows of up to 128 columns; PYSOFTMAX_TILE_COLS widens that to every dtype, which
test_tile_every_path_widened runs in a subprocess to reach the kernel's other paths (several
steps a group, the block a row, float32 and float64).

The tests check the plan, every column's value against float64, that nothing outside the
arrays is written (outputs inside poisoned buffers), the partial packs at a tile's two ends at
every offset inside the pack, and the tiles' walk when fewer blocks than tiles run.
"""

import os
import subprocess
import sys

import numpy
import pytest

from _util import assert_grad_close, np_dtype, poisoned, ref_softmax, rng, rounded, to_device, to_host64

pytestmark = pytest.mark.gpu

try:
    import cupy
    import pysoftmax
    from pysoftmax import _ops
except ImportError:  # pragma: no cover
    pass


def pack(dtype):
    return 16 // np_dtype(dtype).itemsize


def dense_at(host64, dtype, offset, poison=False):
    """A dense device array of host64's shape that starts `offset` elements into a flat buffer
    (a pack of poison, or of random values, on each side), and the buffer."""
    rows, cols = host64.shape
    size = rows * cols + 2 * pack(dtype)
    flat64 = numpy.full(size, numpy.nan) if poison else numpy.random.default_rng(1).standard_normal(size)
    flat64[offset:offset + rows * cols] = host64.reshape(-1)
    flat = to_device(flat64, dtype)
    return flat, flat[offset:offset + rows * cols].reshape(rows, cols)


def assert_kept(flat, offset, size, what):
    host = to_host64(flat)
    outside = numpy.concatenate([host[:offset], host[offset + size:]])
    assert numpy.isnan(outside).all(), f"{what}: {int((~numpy.isnan(outside)).sum())} elements outside the array written"


WIDENED = os.environ.get("PYSOFTMAX_TILE_COLS") == "1000000"


def tiles():
    """Whether the library plans rows_tile here: it stages with cp.async (NVIDIA); elsewhere the
    same rows keep their element-wise plans, and the tests still check every value."""
    return not cupy.cuda.runtime.is_hip


def run(dev, out, **kw):
    return _ops.backward_impl(dev[0], dev[1], out=out, **kw)


def grads(g, rows, cols, dtype):
    return rounded(ref_softmax(g.standard_normal((rows, cols)) * 3), dtype), rounded(g.standard_normal((rows, cols)), dtype)


def check_case(rows, cols, dtype, group):
    """The plan is rows_tile (of `group` lanes, when given); every column is right and nothing
    outside the output is written, with the arrays at the pack's boundary and one element past it."""
    g = rng()
    plan = _ops.plan((rows, cols), dtype, direction="backward")
    if tiles():
        assert plan["family"] == "tile" and plan["tile"] >= 1 and plan["stage"] > 0, plan
        assert group is None or plan["group"] == group, plan
    else:
        assert plan["family"] != "tile", plan
    host = grads(g, rows, cols, dtype)
    for offset in (0, 1):
        dev = [dense_at(a, dtype, offset)[1] for a in host]
        flat, out = dense_at(numpy.full((rows, cols), numpy.nan), dtype, offset, poison=True)
        what = f"{rows}x{cols} {dtype} offset={offset} {plan} seed={g.seed}"
        assert_grad_close(to_host64(run(dev, out, scale=0.7)), host[0], host[1], 0.7, dtype, what)
        assert_kept(flat, offset, rows * cols, what)


# (rows, cols, dtype, group): widths below a pack, one row, the rule's last width, and row
# counts that leave the last tile partial.
CASES = [
    (1000, 1, "float16", 1),
    (999, 3, "bfloat16", 1),
    (4099, 33, "float16", 4),
    (3001, 99, "bfloat16", 8),
    (1, 127, "float16", 8),
    (2050, 127, "bfloat16", 8),
]


@pytest.mark.parametrize("rows,cols,dtype,group", CASES)
def test_tile_rows(rows, cols, dtype, group):
    check_case(rows, cols, dtype, group)


# With PYSOFTMAX_TILE_COLS=1000000 (test_tile_every_path_widened): a group's several steps (1001
# 16-bit columns: 63 lanes of 16), the block a row (rows too wide for a group each in the
# stage), float32 and float64, and a width between the powers of two of the pack.
WIDE_CASES = [
    (777, 1001, "bfloat16", 32),
    (130, 4097, "float16", 0),
    (61, 5001, "bfloat16", 0),
    (3001, 99, "float32", 8),
    (2050, 257, "float32", 32),
    (517, 77, "float64", 16),
    (300, 2049, "float32", 0),
]


@pytest.mark.skipif(not WIDENED, reason="run by test_tile_every_path_widened, in a process with PYSOFTMAX_TILE_COLS")
@pytest.mark.parametrize("rows,cols,dtype,group", WIDE_CASES)
def test_tile_rows_widened(rows, cols, dtype, group):
    check_case(rows, cols, dtype, group)


def test_tile_every_path_widened():
    """The kernel's paths that the default rule does not plan, in a process whose rule takes
    every dtype and width (the variable is read once a device)."""
    if WIDENED:
        pytest.skip("this process is the widened one")
    env = dict(os.environ, PYSOFTMAX_TILE_COLS="1000000")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", "widened"],
                          env=env, capture_output=True, text=True, timeout=600)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    assert done.returncode == 0 and f"{len(WIDE_CASES)} passed" in summary, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_tile_every_offset_walk_and_repeatable(dtype):
    """Every offset inside the pack (a tile's first and last packs partial in every way), grids of
    one and of three blocks walking all tiles through both buffers, the same bits twice, and dx
    written over dy."""
    g = rng()
    rows, cols = 1203, 99
    host = grads(g, rows, cols, dtype)
    for offset in range(pack(dtype)):
        dev = [dense_at(a, dtype, offset)[1] for a in host]
        first = None
        for kw in (dict(), dict(blocks=1), dict(blocks=3), dict()):
            flat, out = dense_at(numpy.full((rows, cols), numpy.nan), dtype, offset, poison=True)
            what = f"{dtype} offset={offset} {kw} seed={g.seed}"
            got = run(dev, out, **kw)
            assert_grad_close(to_host64(got), host[0], host[1], 1.0, dtype, what)
            assert_kept(flat, offset, rows * cols, what)
            bits = to_host64(got)
            if first is None:
                first = bits
            else:
                numpy.testing.assert_array_equal(bits, first, err_msg=what)
        dy = dev[1].copy()
        assert_grad_close(to_host64(run([dev[0], dy], dy)), host[0], host[1], 1.0, dtype, f"in place {what}")


def test_tile_not_taken():
    """Arrays at different offsets inside the pack, rows with gaps between them, a requested
    family, whole-pack widths, wider rows, float32 and the forward keep their plans (unless the
    rule is widened)."""
    plan = lambda cols, dt="bfloat16", **kw: _ops.plan((4096, cols), dt, direction="backward", **kw)["family"]
    assert plan(99, aligned="mixed") == "warp"
    assert plan(99, family="warp") == "warp"
    assert plan(96) == "warp"
    if not WIDENED:
        assert plan(129) == "warp" and plan(99, "float32") == "warp"
    assert _ops.plan((4096, 99), "bfloat16")["family"] == "warp"
    g = rng()
    rows, cols = 300, 99
    host = grads(g, rows, cols + 1, "bfloat16")
    y, dy = (to_device(a, "bfloat16")[:, :cols] for a in host)  # a gap of one element after each row
    out = poisoned((rows, cols), "bfloat16")
    y64, dy64 = host[0][:, :cols], host[1][:, :cols]
    assert_grad_close(to_host64(pysoftmax.backward(y, dy, out=out)), y64, dy64, 1.0, "bfloat16", "rows with gaps")
