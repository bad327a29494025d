# Sourced by the one-call GPU session scripts (bench/gpu_*session.sh): `part NAME SECONDS
# COMMAND...` runs COMMAND under a time limit, its output in $OUT/NAME.txt and its exit status
# in $OUT/parts.txt; a PARTS list (comma-separated names) runs only the parts it names.
# Sourcing it also makes $OUT (default /tmp/ember-session), points ember's kernel cache into it
# (cold unless EMBER_CACHE_DIR is set) and writes the GPU's name and clock to $OUT/gpu.txt.
OUT=${OUT:-/tmp/ember-session}
mkdir -p "$OUT"
export EMBER_CACHE_DIR=${EMBER_CACHE_DIR:-$OUT/cache-ignored}
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
run_part() {  # name, seconds, command...
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  echo "$name: exit $? after $((SECONDS - start)) s" | tee -a "$OUT/parts.txt"
}
part() {  # name, seconds, command...: skipped where PARTS is set and does not name it
  [[ -z "${PARTS:-}" || ",$PARTS," == *",$1,"* ]] && run_part "$@"
}
