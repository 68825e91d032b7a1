"""The reference algorithms on rows that straddle, on the GPU: `online`, `naive` and
`naive_backward` of dense 16-bit rows whose width is not a multiple of the 16-byte pack, each row
at another offset inside it (rows_passes kStraddle).

Where every array of the call shares that offset (a contiguous array, in place or into a fresh
one), each row's body, cols - (pack - 1) columns from its first pack boundary, takes the plan an
aligned row of that length takes in rows_passes, in groups of at least pack - 1 lanes or the
block, and each column outside the body is one lane's (plan_passes_straddling in
hip/dispatch.cuh). PYSOFTMAX_STRADDLE_PASSES=0 keeps the element-wise plans:
test_passes_straddling_off runs the cases so, in a process of its own (the variable is read once
a device).

The cases sit on both sides of the rule's edges: below two packs, bodies of 7 and 8 lanes of 4
packs (shorter ones keep the element-wise plans: a group widened to 8 lanes for the outside
columns alone ran slower, and so did naive_backward's groups, of 2 packs a lane, on bodies that
short), groups of 16 and 32, a group's several steps (with L2 asked ahead), half a group over two
steps where one step would leave pack slots idle, naive's block a row over one and several
steps, online's widths that the stream takes, float32. They check the plan, every column against
float64 (the rows' largest values put in columns outside the body), that nothing outside the
output is written, every offset inside the pack, grids of one and three blocks walking every row,
the same bits from every grid, and the output over the input at its offset; and rows of whole
packs whose arrays all start off a pack boundary.
"""

import os

import numpy
import pytest

from _util import (assert_close, assert_grad_close, at_every_offset, dense_at, pack, pytest_in_process, ref_softmax,
                   rng, rounded, to_host64, written_outside)

pytestmark = pytest.mark.gpu

try:
    from pysoftmax import _lib, _ops
except ImportError:  # pragma: no cover
    pass

ON = os.environ.get("PYSOFTMAX_STRADDLE_PASSES", "1") != "0"
SCALE = 0.7

# (rows, cols, dtype, algorithm, group): the group of the straddling plan (0: the block a row), or
# None where the rows keep their plans (too short, streamed, or float32). Row counts leave the
# last block's groups partly dead.
CASES = [
    (300, 15, "bfloat16", "online", None),
    (300, 17, "bfloat16", "online", None),
    (257, 23, "float16", "naive", None),
    (301, 99, "bfloat16", "naive_backward", None),
    (300, 129, "float16", "online", None),
    (300, 231, "bfloat16", "online", None),
    (300, 233, "bfloat16", "online", 8),
    (257, 233, "float16", "naive", 8),
    (301, 183, "bfloat16", "naive_backward", None),
    (301, 231, "bfloat16", "naive_backward", None),
    (301, 233, "float16", "naive_backward", 8),
    (299, 257, "bfloat16", "naive_backward", 16),
    (300, 513, "bfloat16", "online", 16),
    (300, 769, "bfloat16", "online", 8),
    (300, 777, "float16", "online", 16),
    (300, 1001, "float16", "naive", 16),
    (300, 1031, "bfloat16", "online", None),
    (300, 1033, "bfloat16", "online", 16),
    (300, 1033, "bfloat16", "naive_backward", 32),
    (300, 2049, "bfloat16", "naive", 0),
    (64, 10001, "float16", "naive", 0),
    (300, 2049, "bfloat16", "online", None),
    (300, 2049, "float16", "naive_backward", None),
    (300, 99, "float32", "online", None),
    (300, 257, "float32", "naive_backward", None),
]


def direction_of(algo):
    return "backward" if algo == "naive_backward" else "forward"


def inputs(g, rows, cols, dtype, algo):
    x = g.standard_normal((rows, cols)) * 3
    x[::2, 0] = 12.0   # the row's largest value in its first column (in the head where there is one)
    x[1::3, -1] = 14.0  # or in its last (past the body)
    if algo != "naive_backward":
        return [rounded(x, dtype)]
    return [rounded(ref_softmax(x), dtype), rounded(g.standard_normal((rows, cols)), dtype)]


def call(algo, dev, out, **kw):
    if algo == "naive_backward":
        return _ops.backward_impl(dev[0], dev[1], algo=_lib.ALGO_NAIVE, out=out, scale=SCALE, **kw)
    code = _lib.ALGO_ONLINE if algo == "online" else _lib.ALGO_NAIVE
    return _ops.forward(dev[0], algo=code, out=out, scale=SCALE, **kw)


def check(algo, got, host, dtype, what):
    if algo == "naive_backward":
        assert_grad_close(to_host64(got), host[0], host[1], SCALE, dtype, what)
    else:
        assert_close(to_host64(got), ref_softmax(host[0], scale=SCALE), dtype, what)


@pytest.mark.parametrize("rows,cols,dtype,algo,group", CASES)
def test_passes_straddling(rows, cols, dtype, algo, group):
    plan = _ops.plan((rows, cols), dtype, direction=direction_of(algo), algo="naive" if algo == "naive_backward" else algo)
    if group is None or not ON:
        assert not (plan["family"] == "passes" and plan["straddle"]), plan
    else:
        assert plan["family"] == "passes" and plan["straddle"] == 1 and plan["pack"] == pack(dtype), plan
        assert plan["group"] == group, plan
    g = rng()
    host = inputs(g, rows, cols, dtype, algo)
    at_every_offset(host, dtype, lambda dev, out, **kw: call(algo, dev, out, **kw),
                    lambda got, what: check(algo, got, host, dtype, what),
                    f"{rows}x{cols} {dtype} {algo} {plan} seed={g.seed}")


@pytest.mark.parametrize("rows,cols,dtype,algo", [(300, 512, "bfloat16", "online"), (257, 256, "float16", "naive"),
                                                  (301, 1024, "bfloat16", "naive_backward")])
def test_passes_straddling_whole_packs_shifted(rows, cols, dtype, algo):
    """Rows of whole packs whose arrays all start off a pack boundary straddle too: each row's
    head is the same, and its body ends at the row's end (no columns after it)."""
    direction = direction_of(algo)
    plan = _ops.plan((rows, cols), dtype, direction=direction, algo="naive" if algo == "naive_backward" else algo,
                     aligned=False)
    if ON:
        assert plan["family"] == "passes" and plan["straddle"] == 1 and plan["pack"] == pack(dtype), plan
    else:
        assert not (plan["family"] == "passes" and plan["straddle"]), plan
    g = rng()
    host = inputs(g, rows, cols, dtype, algo)
    for offset in range(1, pack(dtype)):
        dev = [dense_at(a, dtype, offset)[1] for a in host]
        flat, out = dense_at(numpy.full((rows, cols), numpy.nan), dtype, offset, poison=True)
        what = f"{rows}x{cols} {dtype} {algo} offset={offset} {plan} seed={g.seed}"
        check(algo, call(algo, dev, out), host, dtype, what)
        n = written_outside(flat, offset, rows * cols)
        assert n == 0, f"{what}: {n} elements outside the array written"


def test_passes_straddling_off():
    """The cases with PYSOFTMAX_STRADDLE_PASSES=0 (every reference row element-wise, or streamed
    as before), in a process of their own."""
    if not ON:
        pytest.skip("this process is the one with the rule off")
    env = dict(os.environ, PYSOFTMAX_STRADDLE_PASSES="0")
    pytest_in_process(__file__, "test_passes_straddling and not straddling_off", env, len(CASES) + 3, timeout=600)
