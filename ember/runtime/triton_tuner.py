"""Launch configurations chosen by timing, for the Triton backend (triton_backend.py).

A kernel's candidates (triton_configs.py) are each timed twice, in turn, and the fastest is kept
per (kernel source, shape bucket): in this process, and on disk next to the kernel cache
(``<cache_dir>/triton/tuning.json``), merged with what other processes saved meanwhile.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..config import Config, log

_tuning_lock = threading.Lock()


def interpreting() -> bool:
    from . import triton_helpers
    return triton_helpers.INTERPRET


class Tuner:
    """Remembers the best launch configuration per (kernel source, shape bucket)."""

    def __init__(self, path: Path):
        self.path = path
        self.best: dict[str, dict[str, Any]] = {}     # timed choices, saved in ``path``
        self.chosen: dict[str, dict[str, Any]] = {}   # every bucket's configuration in this process
        self.best = self._saved()

    def _saved(self) -> dict[str, dict[str, Any]]:
        """The choices in ``path``."""
        try:
            best = json.loads(self.path.read_text())
        except (OSError, ValueError):
            best = {}
        # valid JSON of another shape (a damaged or hand-edited file) is ignored as unreadable
        # JSON is: a list there failed every Triton kernel of the cache directory to ATen
        return {k: v for k, v in best.items() if isinstance(v, dict)} if isinstance(best, dict) else {}

    def pick(self, key: str, candidates: list[dict[str, Any]], run: Callable[[dict[str, Any]], None],
             cfg: Config | None = None) -> dict[str, Any]:
        """The fastest of ``candidates`` (each timed by running it), remembered under ``key``."""
        if key in self.best:
            self.chosen[key] = self.best[key]
            return self.best[key]
        if len(candidates) == 1 or interpreting() or not torch.cuda.is_available():
            choice = candidates[0]
        else:
            from triton.testing import do_bench
            samples: dict[int, list[float]] = {i: [] for i in range(len(candidates))}
            error: Exception | None = None
            # two rounds, candidates in turn: a GPU's clocks drift while it warms up, and the
            # choices of a pointwise kernel can be 1% apart
            for _ in range(2):
                for i, c in enumerate(candidates):
                    if i not in samples:
                        continue  # did not compile
                    try:
                        samples[i].append(do_bench(lambda c=c: run(c), warmup=3, rep=10, return_mode="median"))
                    except Exception as e:  # noqa: BLE001 -- a config that does not compile (too many registers) is skipped
                        del samples[i]
                        error = e
            timings = [(min(ms), candidates[i]) for i, ms in samples.items()]
            if not timings:
                raise RuntimeError(f"no launch configuration compiled; the last error: {error}") from error
            timings.sort(key=lambda t: t[0])
            choice = timings[0][1]
            log(1, f"tuned {key}: " + "; ".join(f"{ms * 1e3:.1f}us {c}" for ms, c in timings), cfg)
        with _tuning_lock:
            self.best[key] = self.chosen[key] = choice
            try:
                # with what other processes saved since this one read the file: each wrote its own
                # choices alone, and dropped the others' (timed for seconds per kernel)
                self.best = {**self._saved(), **self.best}
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # a name of this process and thread: one name for all (tuning.tmp) let two writers
                # interleave their bytes in it, and the file renamed in place was not JSON
                tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
                tmp.write_text(json.dumps(self.best))
                tmp.replace(self.path)
            except OSError:
                pass
        return choice


_tuners: dict[Path, Tuner] = {}


def tuner_for(cfg: Config) -> Tuner:
    """The tuner of ``cfg``'s cache directory (one per process)."""
    path = Path(cfg.cache_dir) / "triton" / "tuning.json"
    if path not in _tuners:
        _tuners[path] = Tuner(path)
    return _tuners[path]
