"""Process-wide counters behind ``ember.stats()``."""

from __future__ import annotations

import threading
from collections import Counter

_lock = threading.Lock()
_counts: Counter[str] = Counter()

KEYS = (
    "graphs_compiled",    # ATen graphs ember compiled (forward, backward and inference graphs)
    "kernels_generated",  # fused kernels rendered
    "kernels_built",      # kernels this process compiled with the system compiler
    "cache_hits",         # kernels loaded from the on-disk cache instead
    "fallbacks",          # ops run as ATen calls inside compiled programs
    "build_failures",     # kernel groups that failed to build and ran through ATen instead
    "graph_fallbacks",    # whole graphs ember could not compile (they ran through ATen)
    "grads_in_forward",   # training graphs whose loss gradient is computed in the forward
    "calls_while_compiling",  # kernel calls run through ATen while their kernel compiled in the background
    "matmuls_through_aten",   # Hopper matmul calls whose operands TMA cannot read (ran through ATen)
    "timed_choices",      # graphs (per size bucket) that chose between fused matmuls and cuBLAS by timing
    "calls_on_shared_inputs",  # calls run eagerly: inputs newly meeting one the graph writes (input_sharing.py)
)


def bump(key: str, n: int = 1) -> None:
    with _lock:
        _counts[key] += n


def add_time(key: str, seconds: float) -> None:
    with _lock:
        _counts[key] += seconds


def snapshot() -> dict[str, float]:
    with _lock:
        out = {k: _counts.get(k, 0) for k in KEYS}
        out["compile_seconds"] = round(_counts.get("compile_seconds", 0.0), 4)
        return out


def reset() -> None:
    with _lock:
        _counts.clear()
