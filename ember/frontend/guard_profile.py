"""Dynamo's guard-latency measurement, left out for the frames ember compiles.

After Dynamo builds a frame's guards it checks them once (kept: a guard that fails on the frame
it came from is a Dynamo bug) and then times one more check after evicting the CPU caches, by
writing a large buffer, only to log the latency in its compile metrics (``guard_latency_us``).
That eviction costs 18-26 ms per compiled frame, a third of a warm start (bench/warm_start.py),
for a number nothing acts on. ember's backend records the compile it serves, and for that compile
the measurement reports 0 µs; every other compile (Inductor's, another backend's) measures as
before. ``options={"profile_guards": True}`` keeps the measurement for ember's frames too.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch

# context: the CompileContext of the compile ember's backend last served on this thread (a new
# object per compile; compile ids alone repeat after torch._dynamo.reset())
_state = threading.local()
_measure: Callable[..., float] | None = None  # Dynamo's own profile_guard_manager, once installed
_install_lock = threading.Lock()


def _current_compile() -> Any:
    return torch._guards.CompileContext.try_get()


def _install() -> bool:
    """Put the filter in front of ``torch._dynamo.guards.profile_guard_manager``, once; False
    where this torch has no such function (nothing to skip)."""
    global _measure
    with _install_lock:
        if _measure is not None:
            return True
        import torch._dynamo.guards as guards
        original = getattr(guards, "profile_guard_manager", None)
        if original is None or not callable(original):
            return False

        @functools.wraps(original)
        def profile_unless_ember(*args: Any, **kwargs: Any) -> float:
            served, _state.context = getattr(_state, "context", None), None
            if served is not None and served is _current_compile():
                return 0.0
            return _measure(*args, **kwargs)

        _measure = original
        guards.profile_guard_manager = profile_unless_ember
        return True


def without_guard_profiling(backend: Callable[..., Any]) -> Callable[..., Any]:
    """``backend``, marking each compile it serves so that Dynamo skips timing its guards."""
    if not _install():
        return backend

    def marked(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        compiled = backend(gm, example_inputs)
        # after the backend: a compile that raises keeps nothing of ember's
        _state.context = _current_compile()
        return compiled

    marked.__name__ = getattr(backend, "__name__", "ember")
    return marked
