#!/usr/bin/env bash
# One device call that fuzzes ember's GPU backends against eager (bench/fuzz.py) and runs the GPU
# tests of the session's changes. The two backends fuzz at once, FUZZ_WORKERS processes each
# (default 7 each: 14 of the host's 16 cores), for FUZZ_SECONDS; findings land in
# $OUT/fuzz.tgz (fuzz-<backend>/) as reproducers, each run's table in $OUT/fuzz_<backend>.txt.
# FUZZ_FLAGS adds flags (--train, --dynamic).
# Each part's output goes to $OUT/<part>.txt; PARTS=a,b runs only those. Tests need expecttest
# (carry .whl/):
#     python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#     PYTHONPATH=/tmp/site:$PWD bash bench/gpu_fuzz_session.sh
set -uo pipefail
source "$(dirname "$0")/session_parts.sh"  # $OUT, a fresh kernel cache, the GPU; part NAME SECONDS COMMAND...
SECONDS_EACH=${FUZZ_SECONDS:-300}
WORKERS=${FUZZ_WORKERS:-7}
if [[ -n "${TESTS:-}" ]]; then
  part tests ${TESTS_LIMIT:-150} env EMBER_TEST_DEVICE=cuda python -m pytest -q -p no:logging -p no:cacheprovider \
    -n 8 -rfE --tb=short $TESTS
fi
if [[ -z "${PARTS:-}" || ",$PARTS," == *",fuzz,"* ]]; then
  for backend in triton cuda; do
    timeout $((SECONDS_EACH + 240)) python bench/fuzz.py --device cuda --backend $backend --seconds "$SECONDS_EACH" \
      --workers "$WORKERS" --seed "${FUZZ_SEED:-1}" --hang-seconds 120 --out "$OUT/fuzz-$backend" ${FUZZ_FLAGS:-} \
      > "$OUT/fuzz_$backend.txt" 2>&1 &
  done
  wait
  echo "fuzz: done" | tee -a "$OUT/parts.txt"
  # (the device tool brings back a few files: the reproducers in one archive)
  (cd "$OUT" && tar czf fuzz.tgz fuzz-triton fuzz-cuda && rm -rf fuzz-triton fuzz-cuda)
fi
rm -rf "$OUT/cache-ignored"
