#!/usr/bin/env bash
# Sweep Triton launch configurations over bench/launch_sweep.py's scan cases, one device call:
#   bash bench/scan_sweep.sh [case ...]
# (XBLOCK,RBLOCK,warps[,stages[,persistent]]: see launch_sweep.py)
set -u
cases=${*:-cumsum_bf16 cumsum_f32 cumsum_long cumsum_short cumsum_1000 logcumsumexp_f32 cumprod_f32}
configs="1,4096,8,1,1;1,4096,4,1,1;1,4096,16,1,1;1,1024,4;1,2048,4;1,2048,8;1,512,2;1,1024,2;1,256,1;2,1024,4;4,512,4;4,1024,8;8,256,4;16,64,4;32,64,4;64,64,8"
for c in $cases; do
  python3 bench/launch_sweep.py --case "$c" --configs "$configs" --no-inductor
done
