"""The Triton backend: write a graph's kernels as one Python module, import it, launch and tune.

Each kernel gets a ``Launcher``: it evaluates the kernel's extents from its size arguments, picks
a launch configuration (block sizes, warps) for that shape bucket, and launches on PyTorch's current
stream. Configurations are tuned once per (kernel, power-of-two shape bucket) by timing a few
candidates, and remembered on disk next to the kernel cache. Triton compiles a kernel at its first
launch; if that fails, the launcher warns once and runs the group through ATen from then on.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..codegen import triton as tr
from ..config import Config, log
from ..schedule.kernel_ir import Kernel
from . import stats
from .backend import Backend, BuildError, BuiltKernels

MAX_PERSISTENT = 32768   # widest row kept whole in registers (elements)
_tuning_lock = threading.Lock()


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _interpreting() -> bool:
    from . import triton_helpers
    return triton_helpers.INTERPRET


class Tuner:
    """Remembers the best launch configuration per (kernel source, shape bucket)."""

    def __init__(self, path: Path):
        self.path = path
        self.best: dict[str, dict[str, Any]] = {}
        try:
            self.best = json.loads(path.read_text())
        except (OSError, ValueError):
            self.best = {}

    def pick(self, key: str, candidates: list[dict[str, Any]], run: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        if key in self.best:
            return self.best[key]
        if len(candidates) == 1 or _interpreting() or not torch.cuda.is_available():
            choice = candidates[0]
        else:
            from triton.testing import do_bench
            timings = []
            error: Exception | None = None
            for c in candidates:
                try:
                    timings.append((do_bench(lambda c=c: run(c), warmup=3, rep=10, return_mode="median"), c))
                except Exception as e:  # noqa: BLE001 -- a config that does not compile (too many registers) is skipped
                    error = e
            if not timings:
                raise RuntimeError(f"no launch configuration compiled; the last error: {error}") from error
            timings.sort(key=lambda t: t[0])
            choice = timings[0][1]
            log(1, f"tuned {key}: " + "; ".join(f"{ms * 1e3:.1f}us {c}" for ms, c in timings[:6]))
        with _tuning_lock:
            self.best[key] = choice
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps(self.best))
                tmp.replace(self.path)
            except OSError:
                pass
        return choice


class Launcher:
    """Launches one generated Triton kernel from the wrapper's (tensors..., sizes...) call."""

    def __init__(self, name: str, fn: Any, meta: dict[str, Any], source_hash: str, tuner: Tuner,
                 fallback: Callable[..., None] | None, forced: dict[str, Any] | None = None):
        self.name = name
        self.fn = fn
        self.meta = meta
        self.kind = meta["kind"]
        self.n_params = len(meta["params"])
        args = ", ".join(meta["sizes"])
        self.outer = eval(f"lambda {args}: {meta['outer']}")  # noqa: S307 -- our own generated expression
        self.inner = eval(f"lambda {args}: {meta['inner']}")  # noqa: S307
        self.key = f"{source_hash}:{name}"
        self.tuner = tuner
        self.fallback = fallback
        self.failed = False
        self.forced = forced or {}
        self._launches: dict[tuple[int, int, bool], Callable[..., None]] = {}
        self._workspace: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def candidates(self, outer: int, inner: int) -> list[dict[str, Any]]:
        found = self._candidates(outer, inner)
        if not self.forced:
            return found
        matching = [c for c in found if all(c.get(k) == v for k, v in self.forced.items())]
        return matching or [{**found[0], **self.forced}]

    def _candidates(self, outer: int, inner: int) -> list[dict[str, Any]]:
        if self.kind == "pointwise":
            return [dict(XBLOCK=b, RBLOCK=1, num_warps=w, PERSISTENT=False)
                    for b, w in ((1024, 4), (2048, 8), (4096, 8), (512, 4))]
        if self.kind == "full":
            return [dict(XBLOCK=1, RBLOCK=b, num_warps=w, PERSISTENT=False)
                    for b, w in ((2048, 8), (1024, 4), (4096, 8), (512, 4))]
        out = []
        if inner <= MAX_PERSISTENT:
            rblock = _next_pow2(max(inner, 1))
            for x in (1, 2, 4, 8, 16, 32, 64):
                tile = x * rblock
                if tile > MAX_PERSISTENT or x > _next_pow2(outer):
                    continue
                warps = 4 if tile <= 2048 else 8 if tile <= 8192 else 16 if tile <= 16384 else 32
                out.append(dict(XBLOCK=x, RBLOCK=rblock, num_warps=warps, PERSISTENT=True))
                if warps < 32 and tile >= 4096:
                    out.append(dict(XBLOCK=x, RBLOCK=rblock, num_warps=warps * 2, PERSISTENT=True))
        # column reductions (the reduced dim is not the contiguous one, e.g. a bias gradient):
        # several columns per program so each row's loads fill whole 32-byte sectors, and enough
        # programs left to fill the GPU
        for x, rblock, warps in ((16, 256, 4), (16, 512, 8), (32, 256, 8), (64, 64, 4), (128, 32, 8)):
            if outer >= x:
                out.append(dict(XBLOCK=x, RBLOCK=rblock, num_warps=warps, PERSISTENT=False, num_stages=2))
        # one-warp programs reduce with shuffles only, no barriers: long rows are latency-bound
        for x, rblock, warps, stages in ((1, 2048, 8, 1), (1, 4096, 16, 1), (1, 1024, 4, 1), (1, 2048, 8, 3),
                                         (1, 1024, 4, 3), (2, 1024, 8, 2), (4, 512, 8, 2), (1, 1024, 1, 3),
                                         (1, 2048, 2, 3), (1, 512, 1, 2), (2, 512, 2, 3)):
            if rblock < 2 * _next_pow2(max(inner, 1)) and x <= _next_pow2(outer):
                out.append(dict(XBLOCK=x, RBLOCK=rblock, num_warps=warps, PERSISTENT=False, num_stages=stages))
        return out or [dict(XBLOCK=1, RBLOCK=1024, num_warps=4, PERSISTENT=False)]

    def workspace(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._workspace:
            n = max(1, self.meta["n_reductions"]) * 2 * 1024
            self._workspace[device] = (torch.empty(n, dtype=torch.float64, device=device),
                                       torch.zeros(1, dtype=torch.int32, device=device))
        return self._workspace[device]

    def __call__(self, *args: Any) -> None:
        if self.failed:
            self.fallback(*args)
            return
        sizes = args[self.n_params:]
        outer, inner = int(self.outer(*sizes)), int(self.inner(*sizes))
        if outer == 0 or (self.kind == "pointwise" and inner == 0):
            return
        # The steady state is one dict lookup: the shape bucket's launch (config, grid, workspace)
        # is prepared, and tuned, the first time the bucket is seen.
        key = (outer.bit_length(), inner.bit_length(), outer * inner >= 2**31)
        launch = self._launches.get(key)
        try:
            if launch is None:
                launch = self._launches[key] = self._prepare(args, outer, inner)
            launch(args, outer, inner)
        except Exception as e:  # noqa: BLE001 -- a kernel Triton cannot compile falls back, once
            if self.fallback is None:
                raise
            self.failed = True
            stats.bump("build_failures")
            warnings.warn(f"ember: Triton kernel {self.name} failed to compile or launch ({type(e).__name__}: "
                          f"{str(e)[-1500:]}); its ops run through ATen instead.", RuntimeWarning, stacklevel=2)
            self.fallback(*args)

    def _prepare(self, args: tuple[Any, ...], outer: int, inner: int) -> Callable[..., None]:
        tensors = args[:self.n_params]
        device = tensors[0].device if tensors else torch.device("cuda")
        ws, counter = self.workspace(device)
        fn, kind, multi, n = self.fn, self.kind, self.meta["multi_program"], self.n_params

        def launch_with(c: dict[str, Any]) -> Callable[..., None]:
            xblock, rblock, warps, persistent = c["XBLOCK"], c["RBLOCK"], c["num_warps"], c["PERSISTENT"]
            stages = c.get("num_stages", 1)
            compiled: dict[tuple[Any, ...], Any] = {}

            def launch(args: tuple[Any, ...], outer: int, inner: int) -> None:
                # int32 offsets unless some tensor is too large for them
                big = outer * inner >= 2**31
                if not big:
                    for t in args[:n]:
                        if t.numel() >= 2**31:
                            big = True
                            break
                if kind == "full":
                    nprog = min(triton_cdiv(inner, rblock), 1024) if multi else 1
                    grid = (max(nprog, 1),)
                else:
                    nprog, grid = 1, (triton_cdiv(outer, xblock),)
                nblock = _next_pow2(nprog)
                # Triton compiles per specialization (16-byte aligned pointers, ints that are 1 or
                # multiples of 16); once a specialization is compiled, launch it directly and skip
                # Triton's per-call argument binding.
                spec = _specialization(args, n, outer, inner) + (big, nblock)
                kernel = compiled.get(spec)
                if kernel is None:
                    compiled[spec] = fn[grid](*args, outer, inner, ws, counter, BIG=big, XBLOCK=xblock,
                                              RBLOCK=rblock, PERSISTENT=persistent, NPROG_BLOCK=nblock,
                                              num_warps=warps, num_stages=stages)
                    return
                kernel.run(grid[0], 1, 1, _stream(args[0].device.index if n else None), kernel.function,
                           kernel.packed_metadata, None, None, None, *args, outer, inner, ws, counter, big,
                           xblock, rblock, persistent, nblock)

            return launch

        bucket = f"{self.key}:{_next_pow2(outer)}x{_next_pow2(inner)}"
        if self.forced:
            bucket += f":{sorted(self.forced.items())}"
        chosen = self.tuner.pick(bucket, self.candidates(outer, inner),
                                 lambda c: launch_with(c)(args, outer, inner))
        return launch_with(chosen)


def _specialization(args: tuple[Any, ...], n_tensors: int, outer: int, inner: int) -> tuple[Any, ...]:
    """What Triton specializes a compiled kernel on: pointer alignment and small-int facts."""
    key = [t.data_ptr() & 15 for t in args[:n_tensors]]
    for v in args[n_tensors:]:
        key.append(1 if v == 1 else 16 if v & 15 == 0 else 0)
    key.append(1 if outer == 1 else 16 if outer & 15 == 0 else 0)
    key.append(1 if inner == 1 else 16 if inner & 15 == 0 else 0)
    return tuple(key)


def _stream(device_index: int | None) -> int:
    # the raw handle of PyTorch's current stream, without building a Stream object per launch
    return torch._C._cuda_getCurrentRawStream(torch.cuda.current_device() if device_index is None else device_index)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


class TritonBackend(Backend):
    name = "triton"
    pass_tensors = True

    def render(self, kernel: Kernel) -> str:
        try:
            return tr.render_kernel(kernel)
        except tr.RenderError as e:
            return f"# {kernel.name}: not expressible in Triton ({e}); runs through ATen"

    def render_module(self, kernels: list[Kernel]) -> str:
        return tr.render_module(kernels)

    def build_module(self, kernels: list[Kernel], cfg: Config, fallbacks: dict[str, Callable[..., None]] | None = None
                     ) -> BuiltKernels:
        try:
            source = self.render_module(kernels)
        except tr.RenderError as e:
            raise BuildError(str(e)) from None
        digest = hashlib.sha256(source.encode()).hexdigest()[:32]
        path = Path(cfg.cache_dir) / "triton" / f"k{digest}.py"
        cached = path.exists()
        if not cached:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(source)
            tmp.replace(path)
        try:
            module = _import(path)
        except Exception as e:  # noqa: BLE001 -- a module that does not import is a build failure
            raise BuildError(f"{type(e).__name__}: {e}") from None
        stats.bump("cache_hits" if cached else "kernels_built", len(kernels))
        log(1, f"{'loaded' if cached else 'wrote'} {len(kernels)} Triton kernel(s): {path}", cfg)
        tuner = _tuner(cfg)
        functions = {k.name: Launcher(k.name, getattr(module, k.name), module.LAUNCH[k.name], digest, tuner,
                                      (fallbacks or {}).get(k.name), cfg.triton_launch) for k in kernels}
        return BuiltKernels(functions, module_source=source, keepalive=[module])


_tuners: dict[Path, Tuner] = {}


def _tuner(cfg: Config) -> Tuner:
    path = Path(cfg.cache_dir) / "triton" / "tuning.json"
    if path not in _tuners:
        _tuners[path] = Tuner(path)
    return _tuners[path]


def _import(path: Path) -> Any:
    name = f"ember_triton_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # Triton looks kernels' globals up through their module
    spec.loader.exec_module(module)
    return module
