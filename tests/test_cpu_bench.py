"""The bench's shape sets, its command line, its table and its compiled peer, and the suite's
peers as the gate sees them, on the CPU (no GPU, CuPy or torch needed).

The shape sets are checked for what they promise: every sweep and long shape 64 MiB or
more in 16-bit, the sweep's widths, the suite's shapes drawn from the bench's sets so that the gate
and the bench agree. The suite's benchmark ids are built by the suite module itself (imported from
benchmarks/, where the checkout has it).
"""

import importlib.util
import math
import os
import re
import subprocess
import sys
import types

import pytest

from pysoftmax import __main__ as cli
from pysoftmax import _bench, _gate

ELEMENTS_64MIB_16BIT = (64 << 20) // 2
EXPECTED_PACKED = [48, 80, 96, 160, 200, 320, 384, 640, 768, 1536, 2500, 5000, 12288, 24576]
EXPECTED_ODD = [33, 99, 257, 1001, 2049, 4097, 10001, 32001, 100003]
EXPECTED_ATTENTION = [(512, 16, 64), (128, 16, 256), (64, 16, 257), (32, 16, 512)]
# pysoftmax's own algorithms in the suite: everything else it names is a peer.
OURS = {"fused", "fused_masked", "online", "naive", "backward", "naive_backward"}
SUITE_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                          "test_softmax_bench.py")


@pytest.mark.parametrize("name", ["sweep", "long"])
def test_every_sweep_and_long_shape_is_64mib_in_16bit(name):
    for shape in _bench.SHAPE_SETS[name]:
        assert math.prod(shape) >= ELEMENTS_64MIB_16BIT, shape


def test_the_suites_added_shapes_are_64mib_in_16bit():
    added = _bench.SUITE_SHAPES[len(_bench.PERF_SHAPES):]
    assert len(added) >= 9
    for shape in added:
        assert math.prod(shape) >= ELEMENTS_64MIB_16BIT, shape


def test_the_sweep_holds_the_expected_widths():
    assert _bench.SWEEP_WIDTHS == EXPECTED_PACKED + EXPECTED_ODD
    assert [cols for _, cols in _bench.SWEEP_SHAPES] == _bench.SWEEP_WIDTHS
    for cols in EXPECTED_PACKED:
        assert cols % 4 == 0 and cols & (cols - 1), cols  # whole 16-byte packs of float32, not 2^k
    assert all(cols % 2 for cols in EXPECTED_ODD)


def test_sweep_rows_are_the_fewest_that_hold_32mi_elements():
    for rows, cols in _bench.SWEEP_SHAPES:
        assert rows * cols >= 32 << 20 > (rows - 1) * cols, (rows, cols)


def test_long_shapes_cover_long_odd_rows_and_few_rows():
    cols = [c for _, c in _bench.LONG_SHAPES]
    rows = [r for r, _ in _bench.LONG_SHAPES]
    assert min(cols) >= 65536
    assert any(c % 2 for c in cols) and any(c & (c - 1) == 0 for c in cols)
    assert 1 in rows and max(rows) == 4096


def test_attention_shapes_hold_the_small_blocks():
    for b, h, s in EXPECTED_ATTENTION:
        assert (b, h, s) in _bench.ATTENTION_SHAPES
        assert b * h * s * s >= ELEMENTS_64MIB_16BIT, (b, h, s)
    assert any(s % 2 for _, _, s in _bench.ATTENTION_SHAPES)
    assert _bench.ATTENTION_SHAPES[:4] == [(8, 32, 1024), (2, 16, 4096), (1, 8, 8192), (64, 16, 128)]


def test_suite_shapes_come_from_the_bench_sets():
    suite = _bench.SUITE_SHAPES
    assert suite[:len(_bench.PERF_SHAPES)] == _bench.PERF_SHAPES
    assert len(set(suite)) == len(suite)
    assert set(suite) <= set(_bench.SHAPE_SETS["all"])
    added = suite[len(_bench.PERF_SHAPES):]
    assert sum(s in _bench.SWEEP_SHAPES for s in added) >= 6
    assert sum(s in _bench.LONG_SHAPES for s in added) >= 3
    assert len(set(_bench.SHAPE_SETS["all"])) == len(_bench.SHAPE_SETS["all"])


def _bench_args(monkeypatch, *argv):
    seen = []
    monkeypatch.setattr(cli, "bench", lambda args: seen.append(args) or 0)
    assert cli.main(["bench", *argv]) == 0
    return seen[0]


@pytest.mark.parametrize("name", ["perf", "sweep", "long", "suite"])
def test_bench_shapes_takes_a_named_set(monkeypatch, name):
    assert _bench_args(monkeypatch, "--shapes", name).shapes == _bench.SHAPE_SETS[name]


def test_bench_shapes_all_mixed_and_explicit(monkeypatch):
    assert _bench_args(monkeypatch, "--shapes", "all").shapes == _bench.SHAPE_SETS["all"]
    mixed = _bench_args(monkeypatch, "--shapes", "long,4096x8192,1024X65536").shapes
    assert mixed == _bench.LONG_SHAPES + [(4096, 8192)]  # each shape once, in order
    args = _bench_args(monkeypatch, "--shapes", "4096x8192,256x2048", "--dtypes", "float16", "--no-attention")
    assert (args.shapes, args.dtypes, args.no_attention) == ([(4096, 8192), (256, 2048)], ["float16"], True)
    assert _bench_args(monkeypatch).shapes is None  # run() then times PERF_SHAPES


@pytest.mark.parametrize("bad", ["wide", "4096", "1x2x3", "ax8"])
def test_bench_shapes_refuses_what_it_cannot_read(monkeypatch, capsys, bad):
    monkeypatch.setattr(cli, "bench", lambda args: 0)
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--shapes", bad])
    assert e.value.code == 2
    assert "perf|sweep|long|suite|all or ROWSxCOLS" in capsys.readouterr().err


def _suite():
    if not os.path.exists(SUITE_FILE):
        pytest.skip(f"the benchmark suite is not here ({SUITE_FILE}): run from a checkout")
    spec = importlib.util.spec_from_file_location("_pysoftmax_suite", SUITE_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_suites_peers_are_peers_to_the_gate():
    suite = _suite()
    names = set(suite.FORWARD) | set(suite.BACKWARD)
    assert {"torch", "torch_compile", "torch_compile_masked", "cupy"} <= names
    for name in names:
        assert _gate.is_peer(name) == (name not in OURS), name
    ids = [p.id for p in suite._cases()]
    assert len(ids) == len(set(ids))
    for param in suite._cases():
        algo = param.values[1]
        assert _gate.is_peer(f"test_softmax[{param.id}]") == (algo not in OURS), param.id


def test_the_gates_selection_is_pysoftmaxs_benchmarks_only():
    """pytest's own -k matching, as the gate runs it, over the suite's ids: the peers are left out."""
    _suite()
    repo = os.path.dirname(os.path.dirname(SUITE_FILE))
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "benchmarks", "--collect-only",
                          "-q", _gate.TIMER, "-k", _gate.GATED], cwd=repo, capture_output=True, text=True)
    kept = [line.rsplit("-", 1)[1].rstrip("]") for line in out.stdout.splitlines() if "::test_softmax[" in line]
    assert out.returncode == 0, out.stdout + out.stderr
    assert set(kept) == OURS
    assert len(kept) == len(_bench.SUITE_SHAPES) * 3 * len(OURS)


def test_the_suite_runs_suite_shapes_with_every_algorithm():
    suite = _suite()
    ids = {p.id for p in suite._cases()}
    per_shape = len(suite.DTYPES) * (len(suite.FORWARD) + len(suite.BACKWARD))
    assert len(ids) == len(_bench.SUITE_SHAPES) * per_shape
    assert "fwd-2048x131071-float16-torch_compile_masked" in ids
    assert "bwd-349526x96-bfloat16-torch_compile" in ids


class _FakeTorch:
    """Just what compile_peer touches: _dynamo.reset, compile, cuda.synchronize."""

    def __init__(self, fail=None):
        self.calls = []
        self.fail = fail
        self._dynamo = types.SimpleNamespace(reset=lambda: self.calls.append("reset"))
        self.cuda = types.SimpleNamespace(synchronize=lambda: self.calls.append("sync"))

    def compile(self, fn, **options):
        self.calls.append(("compile", options))

        def compiled(*args):
            if self.fail:
                raise self.fail
            self.calls.append(("call", args))
            return fn(*args)

        return compiled


def test_compile_peer_resets_compiles_static_full_graph_and_runs_once():
    torch = _FakeTorch()
    compiled = _bench.compile_peer(torch, lambda a, b: a + b, 1, 2)
    assert torch.calls == ["reset", ("compile", {"dynamic": False, "fullgraph": True}), ("call", (1, 2)), "sync"]
    assert compiled(3, 4) == 7


def test_a_peer_that_does_not_compile_is_unavailable_with_the_reason():
    torch = _FakeTorch(fail=RuntimeError("Cannot find a working triton installation.\nmore"))
    with pytest.raises(_bench.PeerUnavailable, match="torch.compile failed: RuntimeError: Cannot find a working triton"):
        _bench.compile_peer(torch, lambda x: x, 1)


def test_table_x_best_is_over_the_fastest_torch_peer():
    row = lambda algo, gbs, case="fwd": dict(case=case, shape=[96, 349526], dtype="float16", algo=algo, ms=1.0,
                                             gbs=gbs)
    report = {"device": "test", "copy_gbs": 4000.0, "results": [
        row("fused", 3600.0), row("torch", 3000.0), row("torch_compile", 3300.0), row("cupy", 1200.0),
        row("fused", 3600.0, "fwd+mask+causal"), row("torch composed", 900.0, "fwd+mask+causal"),
        dict(case="fwd+mask+causal", shape=[96, 349526], dtype="float16", algo="torch_compile",
             error="torch.compile failed: RuntimeError: no triton"),
    ]}
    header, fwd, masked = _bench.table(report).splitlines()[1:]
    names = re.sub(r"\b(fused|max|x) (ms|err|torch|best|cupy)\b", r"\1_\2", header).split()  # one word a column
    fwd, masked = dict(zip(names, fwd.split())), dict(zip(names, masked.split()))
    assert (fwd["t.compile"], fwd["x_torch"], fwd["x_best"], fwd["x_cupy"]) == ("3300", "1.20x", "1.09x", "3.00x")
    assert (masked["composed"], masked["t.compile"], masked["x_best"]) == ("900", "-", "4.00x")


def test_bench_devices_flag(monkeypatch):
    """`bench --devices` asks for the multi-device section, on the shapes and dtypes given."""
    args = _bench_args(monkeypatch, "--devices", "--shapes", "4096x8192", "--dtypes", "bfloat16")
    assert args.devices and args.shapes == [(4096, 8192)] and args.dtypes == ["bfloat16"]
    assert not _bench_args(monkeypatch).devices


def test_multibench_table_lines_up_alone_and_together():
    """The multi-device table: a line per case, each device alone (GB/s, % of its copy), each
    device's GB/s while all run, the aggregate and its share of the sum of the ceilings."""
    from pysoftmax import _multibench

    report = {"devices": {"0": "GPU A", "1": "GPU B"}, "copy_gbs": {"0": 4000.0, "1": 4200.0}, "results": [
        dict(mode="alone", direction="fwd", shape=[16384, 16384], dtype="float32", device=0, ms=1.0, gbs=3800.0,
             pct_copy=95.0),
        dict(mode="alone", direction="fwd", shape=[16384, 16384], dtype="float32", device=1, ms=1.0, gbs=3990.0,
             pct_copy=95.0),
        dict(mode="together", direction="fwd", shape=[16384, 16384], dtype="float32", calls=100, wall_s=0.1,
             gbs_each={"0": 3700.0, "1": 3900.0}, gbs_total=7544.0, pct_of_ceilings=92.0),
    ]}
    lines = _multibench.table(report).splitlines()
    assert lines[0] == "devices: 0: GPU A (copy 4000 GB/s), 1: GPU B (copy 4200 GB/s)"
    assert len(lines) == 3 and "alone 0" in lines[1] and "together 1" in lines[1]
    row = lines[2].split()
    assert row[:3] == ["fwd", "16384x16384", "float32"]
    assert row[3:7] == ["3800", "95.0%", "3990", "95.0%"] and row[7:9] == ["3700", "3900"]
    assert row[9:] == ["7544", "92.0%"]


def test_multibench_defaults_are_large_shapes():
    """The default shapes are 1 GiB in float32: a call is long beside its host cost, so that one
    thread (sharing the interpreter lock) keeps each device busy."""
    from pysoftmax import _multibench

    assert all(math.prod(s) * 4 == 1 << 30 for s in _multibench.DEFAULT_SHAPES)
