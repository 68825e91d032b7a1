"""The benchmark gate (pysoftmax/_gate.py) on the CPU: a deterministic clock makes every round of
a dummy benchmark take exactly 1 ms, and synthetic baselines are that run rescaled. Against a
baseline 20% faster the gate must fail; against one 3% faster it must pass; a benchmark the
baseline lacks runs uncompared; a baseline from another GPU model must be refused before anything
runs."""

import json
import os
import textwrap

import pytest

from pysoftmax import _gate

GPU = "Test GPU 9000"


@pytest.fixture
def suite(tmp_path, monkeypatch):
    """A one-benchmark suite timed by a fake clock that advances 1 ms per reading."""
    (tmp_path / "fakeclock.py").write_text(textwrap.dedent("""
        t = [0.0]
        def tick():
            t[0] += 1e-3
            return t[0]
    """))
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "test_dummy.py").write_text(textwrap.dedent("""
        def test_kernel(benchmark):
            benchmark.pedantic(lambda: None, rounds=5, iterations=1)

        def test_torch(benchmark):
            benchmark.pedantic(lambda: None, rounds=5, iterations=1)
    """))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return str(bench)


def _baseline(tmp_path, suite, factor, gpu=GPU, only=None):
    """Save a run, then scale its times by `factor` (0.8 = the baseline was 20% faster); `only`
    limits the rescaling to benchmarks whose name contains it."""
    path = tmp_path / f"baseline-{factor}-{gpu.replace(' ', '_')}.json"
    assert _gate.save(str(path), suite=suite, timer="--benchmark-timer=fakeclock.tick") == 0
    data = json.loads(path.read_text())
    assert _gate.scale_times(data, factor, only or "") > 0
    data["machine_info"]["gpu"] = {"name": gpu}
    path.write_text(json.dumps(data))
    return str(path)


def _compare(baseline, suite):
    return _gate.compare(baseline, GPU, suite=suite, threshold=_gate.THRESHOLD, timer="--benchmark-timer=fakeclock.tick")


def test_twenty_percent_slower_fails(tmp_path, suite, capfd):
    baseline = _baseline(tmp_path, suite, 1 / 1.2)
    capfd.readouterr()
    assert _compare(baseline, suite) != 0
    out = capfd.readouterr()
    assert "Performance has regressed" in out.out + out.err
    assert "test_kernel" in out.out + out.err


def test_three_percent_slower_passes(tmp_path, suite, capfd):
    baseline = _baseline(tmp_path, suite, 1 / 1.03)
    capfd.readouterr()
    assert _compare(baseline, suite) == 0
    out = capfd.readouterr()
    assert "regressed" not in out.out + out.err


def test_peer_regression_does_not_fail_the_gate(tmp_path, suite, capfd):
    """A reference (torch, CuPy) 20% slower than its baseline is not pysoftmax's regression."""
    baseline = _baseline(tmp_path, suite, 1 / 1.2, only="torch")
    capfd.readouterr()
    assert _compare(baseline, suite) == 0
    out = capfd.readouterr()
    assert "regressed" not in out.out + out.err
    assert "test_kernel" in out.out + out.err  # the gated benchmark did run and compare


def test_a_callers_selection_keeps_the_peers_out(tmp_path, suite, capfd):
    """A -k of the caller's (`gate -- -k ...`) narrows the gated benchmarks; it does not replace
    the gate's own selection, so a peer 20% slower still does not fail it."""
    baseline = _baseline(tmp_path, suite, 1 / 1.2, only="torch")
    capfd.readouterr()
    assert _gate.compare(baseline, GPU, suite=suite, extra=("-k", "not compiled"),
                         timer="--benchmark-timer=fakeclock.tick") == 0
    text = "".join(capfd.readouterr())
    assert "regressed" not in text and "test_kernel" in text and "1 passed" in text
    assert _gate.fold_selection("not torch", ["-k", "a or b", "-x", "-kc", "-k=d", "-k", ""]) == \
        ("(not torch) and (a or b) and (c) and (d)", ["-x"])


def test_a_benchmark_new_since_the_baseline_runs_uncompared(tmp_path, suite, capfd):
    """A benchmark id the baseline lacks (a shape or peer added since it was saved) runs and is
    listed, but is not compared: pytest-benchmark checks only the ids both runs hold."""
    baseline = _baseline(tmp_path, suite, 1 / 1.03)
    with open(os.path.join(suite, "test_dummy.py"), "a") as f:
        f.write(textwrap.dedent("""
            def test_new_kernel(benchmark):
                benchmark.pedantic(lambda: None, rounds=5, iterations=1)
        """))
    capfd.readouterr()
    assert _compare(baseline, suite) == 0
    out = capfd.readouterr()
    text = out.out + out.err
    assert "regressed" not in text
    assert "test_new_kernel" in text and "2 passed" in text
    assert "test_kernel (NOW)" in text and "test_new_kernel (NOW)" not in text  # (NOW): compared


def test_other_gpu_model_is_refused(tmp_path, suite):
    baseline = _baseline(tmp_path, suite, 1.0, gpu="NVIDIA A100-SXM4-80GB")
    with pytest.raises(_gate.GateError, match="refusing to compare.*A100.*Test GPU 9000"):
        _compare(baseline, suite)


def test_missing_baseline_says_how_to_make_one(tmp_path, suite):
    with pytest.raises(_gate.GateError, match="make baseline"):
        _compare(str(tmp_path / "nope.json"), suite)


def test_slug():
    assert _gate.slug("NVIDIA H200") == "nvidia-h200"
    assert os.path.basename(_gate.baseline_path("NVIDIA H200")) == "nvidia-h200.json"
