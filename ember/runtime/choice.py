"""One graph compiled two ways, the faster one chosen by timing the user's own calls on the GPU.

A matmul whose epilogue ember fuses (the Hopper template, Triton's fused kernel) saves the
epilogue kernel's read of the product, but its products run behind cuBLAS's by a margin that
differs from machine to machine: gelu(x @ W + b) at 8192 x 4096 x 4096 was 1.12x Inductor on one
H200 and 0.89x on another, whose cuBLAS was faster (bench/RESULTS.md). No rule of shapes decides
that, so under ``matmul_epilogues='auto'`` the driver builds such a graph a second time with
cuBLAS computing the products (``'off'``: the epilogue a kernel of its own) and hands both to a
``TimedChoice``.

Each real call runs once, in one of the programs, taking turns: nothing is run twice, so a
graph that writes into its inputs or draws random numbers behaves as it would in either. CUDA
events around each call time it on the GPU (the host's clock for programs on the CPU: Triton
kernels interpreted in the tests). After ``WARMUP`` untimed calls and ``SAMPLES`` timed
ones of each program, the host waits once for the last event, and the program of the lower
median serves every later call of that size bucket (the bit lengths of the call's integer sizes,
so a graph over symbolic sizes chooses again for batches of another order of magnitude). Calls
while a kernel compiles in the background (it runs through ATen meanwhile), inside a CUDA-graph
capture, or under ``ember.cuda_graph``'s check run the first program untimed.

On a GPU the choices are kept on disk (``SavedChoices``, ``choices.json`` in the cache directory),
by the graph's fingerprint, the device, torch's and ember's versions and the size bucket: a later
process (or a compile after ``torch._dynamo.reset()``) serves a bucket chosen before at once,
without timing it again, and a warm start from torch's AOTAutograd cache builds the other
programs only where it must time them or a saved choice names them.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..config import Config, log
from . import capture, stats
from .program import CompiledProgram

WARMUP = 1   # calls of each program not timed (a first launch loads kernels, may tune them)
SAMPLES = 5  # timed calls of each program before choosing


class SavedChoices:
    """Choices kept in a JSON file (``key -> label``), read once per process, written whole:
    merged with what other processes wrote since, into a file of this process and thread,
    renamed over the old one (never half written). A file that does not read is no choices."""

    def __init__(self, path: Path):
        self.path = path
        self._choices: dict[str, str] | None = None
        self._lock = threading.Lock()

    def _read(self) -> dict[str, str]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}

    def get(self, key: str) -> str | None:
        with self._lock:
            if self._choices is None:
                self._choices = self._read()
            return self._choices.get(key)

    def put(self, key: str, label: str) -> None:
        with self._lock:
            self._choices = {**self._read(), **(self._choices or {}), key: label}
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
                tmp.write_text(json.dumps(self._choices, indent=0, sort_keys=True))
                tmp.replace(self.path)
            except OSError:
                pass  # (a cache directory that cannot be written: the choice lives in this process)


_saved: dict[Path, SavedChoices] = {}


def saved_choices(cache_dir: Path) -> SavedChoices:
    """The one ``SavedChoices`` of a cache directory in this process."""
    path = Path(cache_dir) / "choices.json"
    if path not in _saved:
        _saved[path] = SavedChoices(path)
    return _saved[path]


Program = CompiledProgram | Callable[[], CompiledProgram]


class TimedChoice:
    """Callable like a ``CompiledProgram`` (AOTAutograd's boxed convention): ``programs`` compute
    the same graph; the first serves calls until the timing has chosen. Programs after the first
    may be given as builders (no arguments, returning the program), called when a call first
    needs that program. With ``saved`` and ``key``, choices are read from and written to disk
    under ``key`` and the size bucket."""

    def __init__(self, name: str, programs: list[Program], cfg: Config, clock: CudaClock | HostClock,
                 ready: Callable[[], bool] = lambda: True, labels: list[str] | None = None,
                 saved: SavedChoices | None = None, key: str | None = None):
        self._boxed_call = True
        self.name = name
        self.programs = programs
        self.labels = labels or [p.name for p in programs]
        self.saved = saved if key is not None else None
        self.key = key
        # the graph's fingerprint (driver._fingerprint), which torch's AOTAutograd cache keeps
        # with the plans, so that a warm start finds the choices saved under it
        self.fingerprint: str | None = None
        self.cfg = cfg
        self.ready = ready
        # what the driver sets for torch's AOTAutograd cache: every program's (IR graph, schedule)
        self.plan: list[tuple[Any, Any]] | None = None
        self.host_sizes = programs[0].host_sizes
        self.opaque_sizes = programs[0].opaque_sizes
        self.chosen: dict[tuple[int, ...], int] = {}  # size bucket -> index of the program chosen
        self._timing: dict[tuple[int, ...], _Timing] = {}
        self._sizes: list[int] | None = None          # positions of the integer arguments
        self.clock = clock

    def _bucket(self, args: list[Any]) -> tuple[int, ...]:
        positions = self._sizes
        if positions is None:
            positions = self._sizes = [i for i, a in enumerate(args) if type(a) is int]
        return tuple(args[i].bit_length() for i in positions) if positions else ()

    def program(self, i: int) -> CompiledProgram:
        """Program ``i``, built now if it was given as a builder. One that fails to build (its
        kernels no longer load) is the first program from then on, with one warning: the
        user's call runs, and no choice of this graph is saved in this process."""
        p = self.programs[i]
        if not hasattr(p, "run"):  # (a builder)
            try:
                p = p()
            except Exception as e:  # noqa: BLE001 -- the first program computes the same graph
                warnings.warn(f"ember: {self.name}: {self.labels[i]} failed to build "
                              f"({type(e).__name__}: {e}); {self.labels[0]} serves its calls", RuntimeWarning,
                              stacklevel=2)
                p, self.saved = self.program(0), None
            self.programs[i] = p
        return p

    def run(self, args: list[Any]) -> Any:
        bucket = self._bucket(args)
        chosen = self.chosen.get(bucket)
        if chosen is None and self.saved is not None:
            chosen = self._saved_choice(bucket)
        if chosen is not None:
            return self.program(chosen).run(args)
        return self._timed_run(bucket, args)

    def _saved_key(self, bucket: tuple[int, ...]) -> str:
        return f"{self.key}|{','.join(map(str, bucket))}"

    def _saved_choice(self, bucket: tuple[int, ...]) -> int | None:
        label = self.saved.get(self._saved_key(bucket))
        if label not in self.labels:
            return None
        best = self.chosen[bucket] = self.labels.index(label)
        log(1, f"{self.name}: sizes {bucket or 'static'}: {label}, as chosen before (saved in "
               f"{self.saved.path})", self.cfg)
        return best

    def _timed_run(self, bucket: tuple[int, ...], args: list[Any]) -> Any:
        clock = self.clock
        if capture.active or clock.capturing() or not self.ready():
            return self.program(0).run(args)
        timing = self._timing.get(bucket)
        if timing is None:
            timing = self._timing[bucket] = _Timing(len(self.programs))
        i = timing.next_program()
        program = self.program(i)  # (built before the clock starts)
        start = clock.now()
        out = program.run(args)
        end = clock.now()
        if self.ready():  # (a launch that started a background compile ran through ATen: not counted)
            timing.add(i, start, end)
        if timing.complete():
            clock.wait(end)
            medians = [statistics.median(clock.ms(s, e) for s, e in events) for events in timing.events]
            best = min(range(len(medians)), key=medians.__getitem__)
            self.chosen[bucket] = best
            del self._timing[bucket]
            if self.saved is not None:
                self.saved.put(self._saved_key(bucket), self.labels[best])
            stats.bump("timed_choices")
            log(1, f"{self.name}: sizes {bucket or 'static'}: chose {self.labels[best]} ("
                + ", ".join(f"{label} {ms * 1e3:.1f} us" for label, ms in zip(self.labels, medians)) + ")",
                self.cfg)
        return out

    def __call__(self, *args: Any) -> Any:
        args_list = args[0] if len(args) == 1 and isinstance(args[0], list) else list(args)
        if capture.active:  # ember.cuda_graph's check records the program that runs
            return self.program(0)(args_list)
        return self.run(args_list)


class _Timing:
    """The events of one size bucket's timed calls, per program."""

    def __init__(self, n: int):
        self.calls = [0] * n
        self.events: list[list[tuple[Any, Any]]] = [[] for _ in range(n)]  # (start, end) of timed calls
        self._turn = 0

    def next_program(self) -> int:
        i = self._turn
        self._turn = (i + 1) % len(self.calls)
        return i

    def add(self, i: int, start: Any, end: Any) -> None:
        self.calls[i] += 1
        if self.calls[i] > WARMUP:
            self.events[i].append((start, end))

    def complete(self) -> bool:
        return all(len(e) >= SAMPLES for e in self.events)


class CudaClock:
    """Events recorded on the device's current stream: a call's GPU time, without waiting."""

    def __init__(self, device: int | None = None):
        self.device = device  # (None: the current device)

    def capturing(self) -> bool:
        return torch.cuda.is_current_stream_capturing()

    def now(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def wait(self, event: torch.cuda.Event) -> None:
        event.synchronize()

    def ms(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return start.elapsed_time(end)


class HostClock:
    """The host's clock, for programs whose calls have finished when they return (the CPU's)."""

    def capturing(self) -> bool:
        return False

    def now(self) -> float:
        return time.perf_counter()

    def wait(self, moment: float) -> None:
        pass

    def ms(self, start: float, end: float) -> float:
        return (end - start) * 1e3
