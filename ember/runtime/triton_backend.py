"""The Triton backend: write a graph's kernels as one Python module, import it, launch and tune.

Each kernel gets a ``Launcher``: it evaluates the kernel's extents from its size arguments, picks
a launch configuration (block sizes, warps) for that shape bucket, and launches on PyTorch's current
stream. Configurations come from ``triton_configs``: by default one per (kernel, power-of-two shape
bucket), chosen from the shape (``triton_tuning="heuristic"``), except that large pointwise kernels
time three; with ``triton_tuning="full"`` every candidate is compiled and timed once. Timed choices
are remembered on disk next to the kernel cache.
Triton compiles a kernel at its first launch; if no configuration compiles, the launcher warns once
and runs the group through ATen from then on. Compiled kernels are launched through the CUDA driver
(``triton_direct``), not through the C launcher Triton would build for each new signature.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ..codegen import cuda_matmul as cuda_matmul_source
from ..codegen import triton as tr
from ..codegen.triton_alu import RenderError
from ..codegen.triton_loops import ROW_GROUP
from ..config import Config, log
from ..schedule.kernel_ir import Kernel
from . import cache_dirs, cuda_matmul, ptxas_packed_adds, stats, triton_tuner
from . import triton_configs as tc
from .backend import Backend, BuildError, BuiltKernels, fall_back
from .triton_direct import DirectLauncher, direct_launcher
from .triton_matmul import FP_FUSION, MatmulLauncher, needs_int64_offsets, submit_compile
from .triton_tuner import Tuner, tuner_for


class IndexAssert(RuntimeError):
    """An index check's device-side assert, under Triton's interpreter: raised as the GPU's
    assert surfaces in eager (a RuntimeError), not taken for a kernel that fails to launch."""


@contextlib.contextmanager
def interpreted_asserts(on: bool) -> Iterator[None]:
    """Triton's interpreter (the CPU test run) with the device-side asserts of a kernel that
    checks its indices: its builder's options are global, and its launch takes no debug flag."""
    if not on:
        yield
        return
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    before = builder.options
    builder.options = dataclasses.replace(before, debug=True, sanitize_overflow=False)
    try:
        yield
    except interpreter.InterpreterError as e:
        if isinstance(e.__cause__, AssertionError) and "index out of bounds" in str(e.__cause__):
            raise IndexAssert(f"device-side assert triggered: {e.__cause__}") from None
        raise
    finally:
        builder.options = before


class Launcher:
    """Launches one generated Triton kernel from the wrapper's (tensors..., sizes...) call."""

    def __init__(self, name: str, fn: Any, meta: dict[str, Any], source_hash: str, tuner: Tuner,
                 fallback: Callable[..., None] | None, forced: dict[str, Any] | None = None,
                 hints: tc.KernelHints | None = None, tuning: str = "heuristic", cfg: Config | None = None):
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
        forced = dict(forced or {})
        if "only" in forced and forced.pop("only") not in name:
            forced = {}  # forced on the kernels whose name contains forced["only"] alone
        self.forced = forced
        # (a full reduction splits over programs where it combines their partials)
        splittable = bool(meta.get("split_rows")) or (self.kind == "full" and bool(meta.get("multi_program")))
        self.hints = dataclasses.replace(hints or tc.KernelHints(), splittable=splittable)
        self.tuning = tuning
        self.cfg = cfg
        self.device_index: int | None = None
        self._launches: dict[tuple[int, int, bool], Callable[..., None]] = {}
        self._workspace: dict[tuple[torch.device, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._compiled_once = False  # the first kernel compiles on the calling thread
        self._timing = False         # (timing runs must run the kernel itself)
        self._bad: set[str] = set()  # configurations that failed to compile in the background
        self._stubs: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}

    def _may_compile_later(self, device: torch.device) -> bool:
        """Compile a new specialization (sizes of another alignment, a new shape bucket's
        configuration) in a background thread, running this call through ATen meanwhile? Not
        for a kernel's first compile, not while timing or capturing a CUDA graph, and not for a
        kernel that reads a ragged total on the device: ``ember.cuda_graph`` runs it on buffers
        of more rows than the total (its capacity), which ATen would read whole (an index out of
        bounds, a device assert)."""
        cfg = self.cfg
        return (self._compiled_once and not self._timing and self.fallback is not None and cfg is not None
                and cfg.background_compile and device.type == "cuda" and not self.meta.get("device_sizes")
                and not torch.cuda.is_current_stream_capturing())

    def _stub(self, t: Any) -> Any:
        """A tiny tensor Triton specializes as it would ``t`` (dtype, 16-byte alignment), so a
        background compile holds no activation alive."""
        if not isinstance(t, torch.Tensor):
            return t
        base = self._stubs.get((t.dtype, t.device))
        if base is None:
            base = self._stubs[(t.dtype, t.device)] = torch.empty(32, dtype=t.dtype, device=t.device)
        return base if t.data_ptr() % 16 == 0 else base[1:]

    def _compiled_later(self, job: Any, spec: tuple[Any, ...], compiled: dict, pending: dict, failed: set,
                        config: dict[str, Any], bucket_key: tuple[int, int, bool]) -> None:
        try:
            compiled[spec] = job.result()
        except Exception as e:  # noqa: BLE001 -- compiled on the calling thread next time, where it
            # falls back as any kernel that fails to build; a configuration that never compiled is
            # dropped, so the bucket is prepared again with the next one
            log(1, f"{self.name}: background compile of {config} failed ({type(e).__name__}: {e})", self.cfg)
            failed.add(spec)
            if not compiled:
                self._bad.add(repr(sorted(config.items())))
                self._launches.pop(bucket_key, None)
        pending.pop(spec, None)

    def candidates(self, outer: int, inner: int) -> list[dict[str, Any]]:
        return tc.candidates(self.kind, outer, inner, self.hints, self.tuning, tc.sm_count(self.device_index),
                             self.forced)

    def workspace(self, device: torch.device, stream: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Partials and the finished-programs counter of many-program reductions. One per stream:
        launches on two streams at once must not count each other's programs."""
        key = (device, stream)
        if key not in self._workspace:
            n = max(1, self.meta["n_reductions"]) * 1024  # a partial per reduction and program
            self._workspace[key] = (torch.empty(n, dtype=torch.float64, device=device),
                                    torch.zeros(1, dtype=torch.int32, device=device))
        return self._workspace[key]

    def __call__(self, *args: Any) -> None:
        if self.failed:
            self.fallback(*args)
            return
        sizes = args[self.n_params:]
        outer, inner = int(self.outer(*sizes)), int(self.inner(*sizes))
        if outer == 0 and not (self.meta.get("chunks") or self.meta.get("row_reductions")) or (
                self.kind in ("pointwise", "tiles") and inner == 0):
            return  # (with no rows, a chunked kernel still zeroes its partials, a reduction over
            # the rows still stores its neutral result)
        # The steady state is one dict lookup: the shape bucket's launch (config, grid, workspace)
        # is prepared, and tuned, the first time the bucket is seen. (A program runs on one
        # device: Dynamo compiles another for tensors on another.)
        key = _bucket(outer, inner)
        launch = self._launches.get(key)
        try:
            if launch is None:
                launch, ran = self._prepare(args, outer, inner)
                self._launches[key] = launch
                if ran:
                    return
            launch(args, outer, inner)
        except IndexAssert:
            raise
        except Exception as e:  # noqa: BLE001 -- a kernel Triton cannot compile falls back, once
            fall_back(self, f"Triton kernel {self.name}", e, args)

    def _prepare(self, args: tuple[Any, ...], outer: int, inner: int) -> tuple[Callable[..., None], bool]:
        """The launch for this shape bucket, and whether preparing it already ran this call."""
        tensors = args[:self.n_params]
        device = tensors[0].device if tensors else torch.device("cuda")
        self.device_index = device.index if device.type == "cuda" else None
        fn, kind, multi, n = self.fn, self.kind, self.meta["multi_program"], self.n_params
        aligned = self.meta.get("aligned", False)
        align_names = (*self.meta["sizes"], "OUTER", "INNER")
        interpreting = triton_tuner.interpreting()
        lanes = self.meta.get("lanes", 1)
        parts = self.meta.get("parts")
        bucket_key = _bucket(outer, inner)  # (every launch made here serves this bucket)

        def launch_with(c: dict[str, Any]) -> Callable[..., None]:
            xblock, rblock, warps, persistent = c["XBLOCK"], c["RBLOCK"], tc.fitted_warps(c), c["PERSISTENT"]
            stages = c.get("num_stages", 1)
            split = c.get("SPLIT", 1) if kind == "rows" and self.hints.splittable and not persistent else 1
            compiled: dict[tuple[Any, ...], Any] = {}
            pending: dict[tuple[Any, ...], Any] = {}  # specializations compiling in the background
            failed: set[tuple[Any, ...]] = set()      # ... and those that failed there (compiled here)
            quotients: dict[tuple[int, ...], tuple[Any, ...]] = {}  # (aligns, sizes, outer, inner) by sizes
            wide_by_sizes: dict[tuple[Any, ...], bool] = {}  # _wide of the tensors by the sizes
            last_spec: list[Any] = [None]  # (pointers, sizes and launch facts, specialization)
            buffers: dict[int, tuple[torch.Tensor, torch.Tensor, int, int]] = {}  # per stream

            def scratch(stream: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
                """The stream's workspace and counters, with their addresses."""
                rows = self.meta.get("row_reductions", 0)
                if split == 1 and not rows:
                    ws, counts = self.workspace(device, stream)
                    buffers[stream] = (ws, counts, ws.data_ptr(), counts.data_ptr())
                    return buffers[stream]
                # sized for any row count of this shape bucket; each launch leaves its counts at
                # zero for the next
                most = tc.next_pow2(outer)
                programs = triton_cdiv(most, xblock)  # row blocks
                floats = counts = 0
                if split > 1:  # every row's partials from each slice, a count per row block
                    floats += max(1, self.meta["n_reductions"]) * split * most
                    counts += programs
                if rows:  # then a share per row block of every reduction over the rows, a
                    # partial per group of row blocks, a counter of all, then one per group
                    groups = triton_cdiv(programs, ROW_GROUP)
                    floats += rows * (programs + groups)
                    counts += 1 + 32 * groups
                ws, counter = (torch.empty(floats, dtype=torch.float64, device=device),
                               torch.zeros(counts, dtype=torch.int32, device=device))
                buffers[stream] = (ws, counter, ws.data_ptr(), counter.data_ptr())
                return buffers[stream]

            def launch(args: tuple[Any, ...], outer: int, inner: int) -> None:
                given = args
                pointers = list(map(_data_ptr, args[:n]))
                # int32 offsets unless some tensor's offsets reach past them: the same answer for
                # the same sizes (Dynamo guards the layouts of a program's tensors, which its sizes
                # fix), asked once (208 tensors of an Adam step's combo: ~25 us of every launch)
                wide = wide_by_sizes.get(args[n:])
                if wide is None:
                    if len(wide_by_sizes) > 1024:
                        wide_by_sizes.clear()
                    wide = wide_by_sizes[args[n:]] = _wide(args[:n])
                big = outer * inner >= 2**31 or wide
                if kind == "full":
                    nprog = min(triton_cdiv(inner, rblock), 1024) if multi else 1
                    grid = (max(nprog, 1),)
                elif self.meta.get("chunks"):  # a program per run of rows
                    nprog, grid = 1, (self.meta["chunks"],)
                elif kind == "tiles":  # a program per (row tile, column tile), row-major
                    nprog, grid = 1, (triton_cdiv(outer, xblock) * triton_cdiv(inner, rblock),)
                elif parts:  # a combo: every part's programs (codegen/triton_combos.py)
                    nprog, grid = 1, (sum(triton_cdiv(size, xblock) * part_lanes for size, part_lanes in parts),)
                else:
                    nprog = split
                    blocks = triton_cdiv(outer, xblock)
                    # (a pointwise kernel in lanes: each lane's blocks, codegen/triton_lanes.py)
                    grid = (blocks, split) if split > 1 else (max(1, blocks * lanes),)
                nblock = tc.next_pow2(nprog)
                aligns: tuple[int, ...] = ()
                if aligned:  # symbolic sizes as quotients by their power-of-two divisors
                    values = (*args[n:], outer, inner)
                    found = quotients.get(values)
                    if found is None:  # (computing them: 3.5 us of Python on the CPU machine)
                        if len(quotients) > 1024:
                            quotients.clear()
                        aligns = tuple(_align(v) for v in values)
                        q = tuple(v if a == 1 else v // a for v, a in zip(values, aligns))
                        found = quotients[values] = (aligns, q[:-2], q[-2], q[-1])
                    aligns, sizes, outer, inner = found
                    args = args[:n] + sizes
                # Triton compiles per specialization (16-byte aligned pointers, ints that are 1 or
                # multiples of 16); once a specialization is compiled, launch it directly and skip
                # Triton's per-call argument binding.
                # (the last call's, where its addresses and sizes were these: an optimizer step's
                # tensors stay where they are, and 208 of them took 6 us to specialize again)
                facts = (args[n:], outer, inner, big, nblock, aligns)
                last = last_spec[0]
                if last is not None and last[1] == facts and last[0] == pointers:
                    spec = last[2]
                else:
                    spec = _specialization(pointers, args[n:], outer, inner) + (big, nblock) + aligns
                    last_spec[0] = (pointers, facts, spec)
                kernel = compiled.get(spec)
                stream = 0 if interpreting else _stream(device.index)
                ws_, counter_, ws_at, counter_at = buffers.get(stream) or scratch(stream)
                if kernel is None:
                    constexprs = dict(BIG=big, XBLOCK=xblock, RBLOCK=rblock, PERSISTENT=persistent,
                                      NPROG_BLOCK=nblock, num_warps=warps, num_stages=stages,
                                      enable_fp_fusion=FP_FUSION)
                    constexprs.update((f"ALIGN_{name}", a) for name, a in zip(align_names, aligns))
                    if self.meta.get("index_asserts"):
                        # Triton keeps device-side asserts only in its debug mode; without the
                        # integer overflow checks that mode adds (ember's integers wrap, as eager's)
                        constexprs.update(debug=True, sanitize_overflow=False)
                    if interpreting:  # the interpreter runs the Python function itself
                        with interpreted_asserts(bool(self.meta.get("index_asserts"))):
                            fn[grid](*args, outer, inner, ws_, counter_, **constexprs)
                        return
                    const = (big, xblock, rblock, persistent, nblock, *aligns)
                    if spec not in failed and self._may_compile_later(device):
                        if spec not in pending:
                            stubs = (*(self._stub(t) for t in args[:n]), *args[n:], outer, inner, ws_, counter_)

                            def build(stubs=stubs, grid=grid, constexprs=constexprs, const=const) -> Any:
                                with torch.cuda.device(device):  # (the thread's current device)
                                    return _runner(fn.run(*stubs, grid=grid, warmup=True, **constexprs), device, const,
                                                   self.cfg.cache_dir)

                            pending[spec] = submit_compile(build)
                            pending[spec].add_done_callback(
                                lambda job, spec=spec: self._compiled_later(job, spec, compiled, pending, failed,
                                                                            c, bucket_key))
                        stats.bump("calls_while_compiling")
                        self.fallback(*given)
                        return
                    binary = fn.run(*args, outer, inner, ws_, counter_, grid=grid, warmup=True, **constexprs)
                    kernel = compiled[spec] = _runner(binary, device, const, self.cfg.cache_dir)
                    self._compiled_once = True
                if type(kernel) is DirectLauncher:  # (the addresses taken above, not again there)
                    kernel.launch_addresses(grid[0], split, stream, (*pointers, *args[n:], outer, inner, ws_at,
                                                                     counter_at))
                else:
                    kernel(grid[0], split, stream, (*args, outer, inner, ws_, counter_))

            return launch

        bucket = f"{self.key}:{tc.next_pow2(outer)}x{tc.next_pow2(inner)}"
        if self.forced:
            bucket += f":{sorted(self.forced.items())}"
        configs = self.candidates(outer, inner)
        timed = tc.timed(kind, outer, self.hints, self.tuning, self.forced) and bucket not in self.tuner.best
        if self.tuning != "full":  # the choices of large pointwise kernels are timed on a GPU only
            timed = timed and device.type == "cuda" and not interpreting
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            timed = False  # the timing runs would be captured too
        saved: list[tuple[torch.Tensor, torch.Tensor]] = []
        if timed:
            # timing runs the kernel again and again on this call's tensors; an output written
            # over an input (the input died here) gives that input back afterwards, so this
            # call's own launch still reads it
            try:
                saved = [(t, t.clone()) for t in _sharing(tensors)]
            except torch.OutOfMemoryError:
                timed = False
        if timed:
            launches: dict[str, Callable[..., None]] = {}  # (timed: the launch alone, not its set-up)

            def run(c: dict[str, Any]) -> None:
                key = repr(sorted(c.items()))
                if key not in launches:
                    launches[key] = launch_with(c)
                launches[key](args, outer, inner)

            chosen: dict[str, Any] | None = None
            self._timing = True
            try:
                chosen = self.tuner.pick(bucket, configs, run, self.cfg)
            except Exception as e:  # noqa: BLE001 -- timing is an optimization (do_bench's 256 MB
                # buffer may not fit beside a large model): untimed, as below
                log(1, f"{self.name}: timing its launch configurations failed ({type(e).__name__}: {e}); "
                       "taking the first that compiles", self.cfg)
            finally:
                self._timing = False
                for t, copy in saved:
                    t.copy_(copy)
            if chosen is not None:
                return launch_with(chosen), False
        # One configuration, no timing runs: this call's launch compiles it. A configuration
        # tuned earlier (timed, same cache) wins; the next one is tried only if one does not
        # compile (a compile error is raised before anything runs).
        stored = self.tuner.best.get(bucket)
        error: Exception | None = None
        for c in [c for c in ([stored] if stored else []) + configs if repr(sorted(c.items())) not in self._bad]:
            launch = launch_with(c)
            try:
                launch(args, outer, inner)
            except Exception as e:  # noqa: BLE001 -- too many registers or too much shared memory
                log(1, f"{self.name}: launch configuration {c} failed ({type(e).__name__}); trying the next",
                    self.cfg)
                error = e
                continue
            fitted = {**c, "num_warps": tc.fitted_warps(c)}  # (as launched)
            log(2, f"{self.name} {bucket.rsplit(':', 1)[-1]}: {fitted}", self.cfg)
            self.tuner.chosen[bucket] = c
            return launch, True
        raise error if error is not None else RuntimeError(f"no launch configuration for {self.name}")


def _sharing(tensors: tuple[Any, ...]) -> list[torch.Tensor]:
    """A launch's tensors that share memory with another of them (an output written over an
    input)."""
    by_storage: dict[int, list[torch.Tensor]] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.numel():
            by_storage.setdefault(t.untyped_storage().data_ptr(), []).append(t)
    return [t for group in by_storage.values() if len(group) > 1 for t in group]


def _runner(binary: Any, device: torch.device, constexprs: tuple[Any, ...], cache_dir: Path) -> Callable[..., None]:
    """``launch(grid_x, grid_y, stream, args)`` of a compiled kernel: through the CUDA driver
    (triton_direct.py: no launcher to build), else through Triton's launcher. First its cubin
    is assembled again where its PTX has packed 16-bit adds, which ptxas gets wrong
    (ptxas_packed_adds.py)."""
    if ptxas_packed_adds.repair(binary, cache_dir):
        log(1, f"{binary.name}: assembled again with its packed 16-bit adds split (ptxas_packed_adds.py)")
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        direct = direct_launcher(binary, index)
    except Exception as e:  # noqa: BLE001 -- Triton's launcher still works
        log(1, f"{binary.name}: launching through Triton's launcher ({type(e).__name__}: {e})")
        direct = None
    if direct is not None:
        return direct

    def through_triton(grid_x: int, grid_y: int, stream: int, args: tuple[Any, ...]) -> None:
        binary.run(grid_x, grid_y, 1, stream, binary.function, binary.packed_metadata, None, None, None, *args,
                   *constexprs)

    return through_triton


def _bucket(outer: int, inner: int) -> tuple[int, int, bool]:
    """A launch's shape bucket. Buckets end at powers of two, as the configurations' blocks do:
    sizes 257..512 share persistent blocks of 512; 512 and 515 do not (bit_length() would put
    them together, and rows of 515 after rows of 512 ran in 512-wide blocks)."""
    return (outer - 1).bit_length(), (inner - 1).bit_length(), outer * inner >= 2**31


def _align(v: int | float) -> int:
    """The power of two up to 16 a size argument is launched divided by (codegen's
    ``aligned_sizes``); 1 for sizes of 2^31 or more, whose quotient Triton might type as int32,
    and for floats (x.item() of a float tensor)."""
    if isinstance(v, float):
        return 1
    if v == 0:
        return 16
    return min(v & -v, 16) if v < 2**31 else 1


_data_ptr = torch.Tensor.data_ptr


def _wide(tensors: tuple[torch.Tensor, ...]) -> bool:
    """Can a kernel's offsets into any of ``tensors`` reach 2^31 (``needs_int64_offsets``)?
    Contiguous tensors of fewer elements cannot: one test each, in one loop (a launch asks once
    per sizes)."""
    for t in tensors:
        if (not t.is_contiguous() or t.numel() >= 2**31) and needs_int64_offsets(t):
            return True
    return False


def _specialization(pointers: list[int], sizes: tuple[Any, ...], outer: int, inner: int) -> tuple[Any, ...]:
    """What Triton specializes a compiled kernel on: pointer alignment and small-int facts."""
    key: list[Any] = [p & 15 for p in pointers]
    for v in sizes:  # (a float, x.item() of a float tensor, is specialized on nothing)
        key.append("f" if isinstance(v, float) else 1 if v == 1 else 16 if v & 15 == 0 else 0)
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
        if cuda_matmul.on_hopper(kernel):
            return cuda_matmul_source.render_kernel(kernel)
        try:
            return tr.render_kernel(kernel)
        except RenderError as e:
            return f"# {kernel.name}: not expressible in Triton ({e}); runs through ATen"

    def render_module(self, kernels: list[Kernel]) -> str:
        hopper = [k for k in kernels if cuda_matmul.on_hopper(k)]
        triton = [k for k in kernels if k not in hopper]
        return "\n".join(([tr.render_module(triton)] if triton else [])
                         + ([cuda_matmul_source.render_module(hopper)] if hopper else []))

    def build_module(self, kernels: list[Kernel], cfg: Config, fallbacks: dict[str, Callable[..., None]] | None = None
                     ) -> BuiltKernels:
        hopper = [k for k in kernels if cuda_matmul.on_hopper(k)]
        if not hopper:
            return self._build_triton(kernels, cfg, fallbacks)
        # one-matmul kernels on a Hopper GPU: the ping-pong CUDA kernel (runtime/cuda_matmul.py)
        try:
            built = cuda_matmul.build(hopper, cfg, fallbacks)
        except BuildError as e:
            stats.bump("build_failures")
            warnings.warn(f"ember: Hopper matmul kernels {', '.join(k.name for k in hopper)} failed to build; "
                          f"Triton renders them instead.\n{str(e)[-1500:]}", RuntimeWarning, stacklevel=3)
            hopper, built = [], BuiltKernels()
        rest = [k for k in kernels if k not in hopper]
        return built.merge(self._build_triton(rest, cfg, fallbacks)) if rest else built

    def _build_triton(self, kernels: list[Kernel], cfg: Config, fallbacks: dict[str, Callable[..., None]] | None
                      ) -> BuiltKernels:
        # the same kernel objects again (a graph the driver planned before): reuse the source
        ident = tuple(id(k) for k in kernels)
        rendered = _rendered.get(ident)
        if rendered is None:
            try:
                sources = [tr.render_kernel(k) for k in kernels]  # (Triton only: Hopper kernels were taken out)
                source = tr.render_module(kernels, sources)
            except RenderError as e:
                raise BuildError(str(e)) from None
            # the kernels ride along so that their ids stay theirs while the entry lives
            rendered = _rendered[ident] = (list(kernels), source, [tc.hints_of(k) for k in kernels], sources)
            while len(_rendered) > 256:
                _rendered.popitem(last=False)
        _, source, hints, sources = rendered
        digest = hashlib.sha256(source.encode()).hexdigest()[:32]
        path = Path(cfg.cache_dir) / "triton" / f"k{digest}.py"
        # the file is named by its source's hash: one that differs (cut short, damaged) is written again
        cached = _holds(path, source)
        if not cached:  # (a temporary directory of this process where cache_dir cannot be written)
            path = cache_dirs.writable_part(cfg.cache_dir, "triton") / path.name
            cached = _holds(path, source)
        if not cached:
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # (processes at once)
            tmp.write_text(source)
            tmp.replace(path)
        try:
            module = _import(path)
        except Exception as e:  # noqa: BLE001 -- a module that does not import is a build failure
            raise BuildError(f"{type(e).__name__}: {e}") from None
        stats.bump("cache_hits" if cached else "kernels_built", len(kernels))
        log(1, f"{'loaded' if cached else 'wrote'} {len(kernels)} Triton kernel(s): {path}", cfg)
        tuner = tuner_for(cfg)
        functions: dict[str, Callable[..., None]] = {}
        for k, h in zip(kernels, hints):
            fn, meta, fallback = getattr(module, k.name), module.LAUNCH[k.name], (fallbacks or {}).get(k.name)
            if meta["kind"] == "matmul":
                functions[k.name] = MatmulLauncher(k.name, fn, meta, digest, tuner, fallback, cfg.triton_launch,
                                                   cfg.triton_tuning, cfg)
            else:
                functions[k.name] = Launcher(k.name, fn, meta, digest, tuner, fallback, cfg.triton_launch, h,
                                             cfg.triton_tuning, cfg)
        return BuiltKernels(functions, module_source=source, keepalive=[module],
                            sources={k.name: s for k, s in zip(kernels, sources)})


def _holds(path: Path, source: str) -> bool:
    try:
        return path.read_text() == source
    except (OSError, UnicodeDecodeError):
        return False


_rendered: OrderedDict[tuple[int, ...], tuple[list[Kernel], str, list[tc.KernelHints], list[str]]] = OrderedDict()



class _SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """Compiles the module from its source, never from (or to) __pycache__: the source is checked
    against the kernels (``_holds``), its bytecode was not, and a damaged .pyc beside it failed
    the import in every later process (EOFError), sending its kernels to ATen."""

    def get_code(self, fullname: str) -> Any:
        return self.source_to_code(self.get_data(self.path), self.path)


def _import(path: Path) -> Any:
    name = f"ember_triton_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path, loader=_SourceOnlyLoader(name, str(path)))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # Triton looks kernels' globals up through their module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]  # (not served half-imported to the next build)
        raise
    return module
