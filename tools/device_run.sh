#!/usr/bin/env bash
# One device call: build, tests, sanitizer, benchmark. Logs under $OUT; a short table last.
# Usage (on the GPU machine): bash tools/device_run.sh [pytest args...]
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
( time make -j16 lib ) > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "build ok"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q --maxfail=25 -p no:cacheprovider "$@" > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$?"; tail -5 "$OUT/pytest.log"
fi
if [ "${SANITIZE:-0}" = 1 ]; then
  timeout 200 python3 tools/sanitize.py > "$OUT/sanitize.log" 2>&1; echo "sanitize rc=$?"; tail -5 "$OUT/sanitize.log"
fi
if [ -n "${BENCH:-}" ]; then
  timeout ${BENCH_TIMEOUT:-240} python3 -m pysoftmax bench $BENCH --json "$OUT/bench.json" > "$OUT/bench.txt" 2> "$OUT/bench.err"
  echo "bench rc=$?"; tail -3 "$OUT/bench.err"; cat "$OUT/bench.txt"
fi
