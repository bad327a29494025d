#!/usr/bin/env bash
# One device call for a session's GPU checks: the fusion suite's forward (with cold and warm
# compile times), warm starts stage by stage, the cross-entropy probe, and the ragged suite.
# Each part's output goes to $OUT/<part>.txt.
#     PYTHONPATH=. bash bench/gpu_session.sh
set -uo pipefail
source "$(dirname "$0")/session_parts.sh"  # $OUT, a fresh kernel cache, the GPU; part NAME SECONDS COMMAND...
part fusion 200 python bench/gpu_fusion.py --backends triton
part warm_start 200 python bench/warm_start.py --device cuda --reps 3
part ce_probe 120 python bench/ce_combine_probe.py
part ragged_suite 150 python bench/ragged_suite.py --device cuda --variants padded-inductor,ragged-ember,ragged-embergraph
rm -rf "$OUT/cache-ignored"
