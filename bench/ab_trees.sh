#!/usr/bin/env bash
# A command run under two ember trees in turn, ROUNDS times (A, B, A, B, ...), so that a host
# whose speed drifts hits both alike. OLD is a directory holding an `ember` package (e.g. from
# `git archive <rev> ember | tar -x -C OLD`), carried to the device machine in an ignored path.
#     bash bench/ab_trees.sh OLD ROUNDS command args...      (run from the repository root)
set -uo pipefail
old=$1 rounds=$2
shift 2
for round in $(seq "$rounds"); do
  for tree in "$old" .; do
    echo "=== round $round, tree $tree ($(cat "$tree/REV" 2>/dev/null || echo working tree))"
    # (the repository root after the tree: the bench scripts import bench.common; the tree's
    # ember comes first)
    PYTHONPATH="$tree:.:${EXTRA_PYTHONPATH:-}" "$@"
  done
done
