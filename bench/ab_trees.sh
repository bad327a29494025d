#!/usr/bin/env bash
# A command run under two ember trees in turn, ROUNDS times (A, B, A, B, ...), so that a host
# whose speed drifts hits both alike. OLD is a directory holding the `ember` and `bench` folders
# of a revision (`git archive <rev> ember bench | tar -x -C OLD`), carried to the device machine
# in an ignored path. The bench scripts put their own repository root first on sys.path, so a
# script argument `bench/...` runs as OLD's copy under OLD (PYTHONPATH alone would load the
# working tree's ember).
#     bash bench/ab_trees.sh OLD ROUNDS command args...      (run from the repository root)
set -uo pipefail
old=$1 rounds=$2
shift 2
for round in $(seq "$rounds"); do
  for tree in "$old" .; do
    echo "=== round $round, tree $tree ($(cat "$tree/REV" 2>/dev/null || echo working tree))"
    args=()
    for a in "$@"; do
      if [[ "$tree" != "." && "$a" == bench/* ]]; then args+=("$tree/$a"); else args+=("$a"); fi
    done
    PYTHONPATH="$tree:.:${EXTRA_PYTHONPATH:-}" "${args[@]}"
  done
done
