"""Launching ember's matmul kernels (codegen/triton_matmul.py): tile sizes per shape bucket, the
TMA path when the operands allow it, a program per SM (or per tile, when there are fewer).

Launch configurations (H200, bf16, `bench/matmul_probe.py`, two runs; µs, and the first call's
compile in seconds; variants timed one after another, so compare them with each other, not with
cuBLAS: bench/RESULTS.md has those comparisons interleaved): for one matmul of 8192 x 4096 x 4096,
128 x 256 tiles with 8 warps, persistent, with the tile loop flattened into the K loop (Triton then
pipelines the next tile's loads under this one's epilogue) and 3 stages: 430-431 µs, compiled in
2.7-3.1 s (in the background, see below). Not flattened 433-440 µs (1.8 s); one tile per program
435-440 µs; 128 x 128 tiles 467-493 µs; pointer loads instead of TMA 5% slower. Two matmuls in one
kernel (silu(x @ Wg) * (x @ Wu), 11008 columns) need two accumulators: 128 x 128 tiles with 3
stages, persistent, not flattened, were the fastest (2127-2146 µs, compiled in 0.5 s; flattened
2709-2778; a 128 x 256 tile does not fit shared memory; 4 warps, 8730). Smaller problems take
smaller tiles, so that there are tiles enough for the SMs.

Compiling: a matmul kernel takes 0.5-3 s to compile, where the rest of a graph's kernels take a
fraction of a second. With the ``background_compile`` option (the default) it compiles in a
thread (Triton releases the GIL while it compiles: a busy main thread kept its full speed beside
a 4.4 s compile on the H200), and calls run through ATen until it is ready; an ATen call of the
group is cuBLAS's mm (float32 sums, ``out_dtype``) and the epilogue's eager ops. The thread also
loads the kernel and builds the launcher Triton makes for it (a C build, 0.2-0.3 s for a new
argument signature), which would otherwise stall the first launch on the calling thread.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections.abc import Callable
from typing import Any

import torch

from ..config import Config, log
from . import ptxas_packed_adds, stats
from . import triton_configs as tc
from .backend import fall_back

# (BM, BN, BK, warps, stages)
ONE_DOT = [(128, 256, 64, 8, 3), (128, 128, 64, 8, 4), (256, 128, 64, 8, 3), (64, 128, 64, 4, 4),
           (64, 64, 64, 4, 4)]
TWO_DOTS = [(128, 128, 64, 8, 3), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 64, 64, 4, 4)]
GROUP_M = 8
_allocator_lock = threading.Lock()
_allocator_set = False
# Background compiles (Triton releases the GIL while it compiles): a few at a time, and the
# ones not finished yet, for wait_for_kernels()
_compiler = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="ember-compile")
_pending: set[cf.Future] = set()
_pending_lock = threading.Lock()
FIRST_WAIT_S = 0.05  # a compile that finishes this soon (Triton's disk cache) is waited for
# Each a * b + c computed as written, two roundings, not contracted into one (Triton's default):
# eager computes the ops of a fused chain apart, so x * y - x * y is 0, and a float16 product
# rounded before the sum overflows as eager's does (float16 (x * 100 - x * 100).isnan() of
# x = 1000 was -inf, not NaN: fma(x, 100, -inf)). The CPU backend builds with
# -ffp-contract=off and the CUDA C++ one with --fmad=false for the same reason.
FP_FUSION = False


def wait_for_kernels(timeout: float | None = None) -> bool:
    """Block until every matmul kernel compiling in the background is ready (or has failed and
    fallen back); False if ``timeout`` seconds passed first."""
    with _pending_lock:
        jobs = list(_pending)
    done, not_done = cf.wait(jobs, timeout=timeout)
    return not not_done


def submit_compile(fn: Callable[[], Any]) -> cf.Future:
    """Run a compile on the background pool (matmul kernels, other Triton kernels' variants for
    new sizes); ``wait_for_kernels()`` waits for it."""
    job = _compiler.submit(fn)
    with _pending_lock:
        _pending.add(job)

    def forget(j: cf.Future) -> None:
        with _pending_lock:
            _pending.discard(j)

    job.add_done_callback(forget)
    return job


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def needs_int64_offsets(t: torch.Tensor) -> bool:
    """Can a kernel's offsets into ``t`` reach 2^31? Not only when it has that many elements:
    a strided view (``base[:, :2]`` of a wide base) has few elements but offsets up to its
    last element's, and a kernel given int32 offsets (BIG false) wraps them negative."""
    n = t.numel()
    if n >= 2**31:
        return True
    if n == 0 or t.is_contiguous():
        return False
    return sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride())) >= 2**31


def _config(c: tuple[int, int, int, int, int]) -> dict[str, Any]:
    bm, bn, bk, warps, stages = c
    return {"BM": bm, "BN": bn, "BK": bk, "num_warps": warps, "num_stages": stages}


def candidates(m: int, n: int, dots: int, sms: int, forced: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Configurations to try, best guess first: the largest tile that still gives every SM a
    tile (or the smallest, when even that does not)."""
    table = ONE_DOT if dots == 1 else TWO_DOTS
    fits = [c for c in table if _cdiv(m, c[0]) * _cdiv(n, c[1]) >= sms]
    order = fits + [c for c in table if c not in fits][::-1] if fits else table[::-1]
    configs = [_config(c) for c in order]
    if forced:
        configs = [{**c, **{k: v for k, v in forced.items() if k in c}} for c in configs[:1]]
    return configs


def _ensure_allocator() -> None:
    """Device-side TMA descriptors live in scratch memory Triton asks its allocator for."""
    global _allocator_set
    if _allocator_set:
        return
    with _allocator_lock:
        if not _allocator_set:
            import triton

            def alloc(size: int, alignment: int, stream: int | None) -> torch.Tensor:
                return torch.empty(size, dtype=torch.int8, device="cuda")

            triton.set_allocator(alloc)
            _allocator_set = True


def _split_packed_adds_after(compile_fn: Callable[..., Any], cache_dir: str) -> Callable[..., Any]:
    """``compile_fn`` (a JITFunction's Triton compile, per specialization) whose kernels are
    assembled again where their PTX has packed 16-bit adds, which ptxas gets wrong, before Triton
    loads them (ptxas_packed_adds.py; triton_backend.py does this for the other kernels)."""
    if getattr(compile_fn, "ember_split16", False):
        return compile_fn

    def compile_and_repair(*args: Any, **kwargs: Any) -> Any:
        kernel = compile_fn(*args, **kwargs)
        if ptxas_packed_adds.repair(kernel, cache_dir):
            log(1, f"{kernel.name}: assembled again with its packed 16-bit adds split (ptxas_packed_adds.py)")
        return kernel

    compile_and_repair.ember_split16 = True  # type: ignore[attr-defined]
    return compile_and_repair


class MatmulLauncher:
    """Launches one matmul kernel from the wrapper's (tensors..., sizes...) call."""

    def __init__(self, name: str, fn: Any, meta: dict[str, Any], source_hash: str, tuner: Any,
                 fallback: Callable[..., None] | None, forced: dict[str, Any] | None, tuning: str, cfg: Config):
        self.name, self.fn, self.meta = name, fn, meta
        self.n_params = len(meta["params"])
        args = ", ".join(meta["sizes"])
        self.extents = eval(f"lambda {args}: ({meta['m']}, {meta['n']}, {meta['k']})")  # noqa: S307 -- our own expressions
        tma = meta["tma"]
        self.index = {p: i for i, p in enumerate(meta["params"])}
        self.tma_checks = None if tma is None else [
            (self.index[o["param"]], o["bytes"],
             eval(f"lambda {args}: ({o['offset']}, {o['stride']})"))  # noqa: S307
            for o in tma]
        forced = dict(forced or {})
        if "only" in forced and forced.pop("only") not in name:
            forced = {}
        self.forced = forced
        self.key = f"{source_hash}:{name}"
        self.tuner, self.fallback, self.tuning, self.cfg = tuner, fallback, tuning, cfg
        self.failed = False
        self._configs: dict[tuple[int, ...], dict[str, Any]] = {}
        self._jobs: dict[tuple[int, ...], cf.Future] = {}  # shape buckets compiling in the background
        self.sms = tc.DEFAULT_SMS
        if hasattr(fn, "compile"):  # (an interpreted function compiles nothing)
            fn.compile = _split_packed_adds_after(fn.compile, cfg.cache_dir)

    def _tma(self, args: tuple[Any, ...], sizes: tuple[int, ...]) -> bool:
        if self.tma_checks is None or self.forced.get("TMA") is False:
            return False
        for i, itemsize, at in self.tma_checks:
            offset, stride = at(*sizes)
            # (a row stride of 0, a broadcast operand's, is no TMA row either: pointer loads)
            if (args[i].data_ptr() + offset * itemsize) % 16 or (stride * itemsize) % 16 or stride == 0:
                return False
        return True

    def __call__(self, *args: Any) -> None:
        if self.failed:
            self.fallback(*args)
            return
        sizes = args[self.n_params:]
        m, n, k = (int(x) for x in self.extents(*sizes))
        if m == 0 or n == 0:
            return  # no tile to store
        try:
            self._launch(args, m, n, k)
        except Exception as e:  # noqa: BLE001 -- a kernel Triton cannot compile falls back, once
            fall_back(self, f"Triton matmul kernel {self.name}", e, args)

    def _launch(self, args: tuple[Any, ...], m: int, n: int, k: int) -> None:
        tensors = args[:self.n_params]
        tma = self._tma(args, args[self.n_params:])
        big = any(needs_int64_offsets(t) for t in tensors)
        bucket = (m.bit_length(), n.bit_length(), k.bit_length(), tma, big)
        config = self._configs.get(bucket)
        if config is None:
            if tma:
                _ensure_allocator()
            device = tensors[0].device
            self.sms = tc.sm_count(device.index if device.type == "cuda" else None)
            configs = candidates(m, n, self.meta["dots"], self.sms, self.forced)
            if self._in_background(bucket, args, m, n, configs, tma, big):
                return  # (the call ran through ATen while the kernel compiles)
            if self.tuning == "full" and not self.forced:
                key = f"{self.key}:{tc.next_pow2(m)}x{tc.next_pow2(n)}x{tc.next_pow2(k)}:{tma}"
                config = self.tuner.pick(key, [{**c, "TMA": tma} for c in configs],
                                         lambda c: self._run(args, m, n, c, big), self.cfg)
            else:
                self._configs[bucket] = self._first(configs, tma, lambda c: self._run(args, m, n, c, big))
                return  # (it ran)
            self._configs[bucket] = config
        self._run(args, m, n, config, big)

    def _in_background(self, bucket: tuple[int, ...], args: tuple[Any, ...], m: int, n: int,
                       configs: list[dict[str, Any]], tma: bool, big: bool) -> bool:
        """Compile this shape bucket's kernel in a background thread, running calls through ATen
        (cuBLAS and eager epilogue ops: the same sums, rounded alike, in another order) until it
        is ready; True when this call ran that way. A matmul kernel takes 0.5-3 s to compile,
        where the rest of a graph's kernels take a fraction of that."""
        if not self._can_background(args):
            return False
        job = self._jobs.get(bucket)
        if job is None:
            device = args[0].device

            def compile_and_load(c: dict[str, Any]) -> None:
                kernel = self.fn.warmup(*args, grid=self._grid(m, n, c), **self._constexprs(c, big))
                # load it and make Triton's launcher here too: the launcher is a C build (0.2-0.3 s
                # for a new signature) that would otherwise stall the first launch after the
                # compile, on the calling thread (a warm start's first call, measured on an H200)
                init = getattr(kernel, "_init_handles", None)
                if init is not None:
                    with torch.cuda.device(device):
                        init()

            job = self._jobs[bucket] = submit_compile(lambda: self._first(configs, tma, compile_and_load))
            cf.wait([job], timeout=FIRST_WAIT_S)
        if not job.done():
            stats.bump("calls_while_compiling")
            self.fallback(*args)
            return True
        del self._jobs[bucket]
        self._configs[bucket] = job.result()  # (a compile error: raised, and __call__ falls back)
        return False

    def _can_background(self, args: tuple[Any, ...]) -> bool:
        cfg = self.cfg
        return (self.fallback is not None and cfg is not None and cfg.background_compile
                and self.tuning != "full" and not self.forced and args[0].device.type == "cuda")

    def _first(self, configs: list[dict[str, Any]], tma: bool,
               attempt: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
        """The first configuration that ``attempt`` (a launch, or a compile alone) gets through,
        TMA loads first; if no tile compiles with them (a layout the copy engine cannot take),
        pointer loads, for this shape bucket from now on."""
        error: Exception | None = None
        for use_tma in ([True, False] if tma else [False]):
            for c in configs:
                c = {**c, "TMA": use_tma}
                try:
                    attempt(c)
                except Exception as e:  # noqa: BLE001 -- too much shared memory for this tile: the next
                    log(1, f"{self.name}: matmul configuration {c} failed ({type(e).__name__}); trying the next",
                        self.cfg)
                    error = e
                    continue
                log(2, f"{self.name}: {c}", self.cfg)
                return c
        raise error if error is not None else RuntimeError(f"no launch configuration for {self.name}")

    def _grid(self, m: int, n: int, c: dict[str, Any]) -> tuple[int]:
        return (min(_cdiv(m, c["BM"]) * _cdiv(n, c["BN"]), self.forced.get("PROGRAMS", self.sms)),)

    def _constexprs(self, c: dict[str, Any], big: bool) -> dict[str, Any]:
        return dict(BIG=big, BM=c["BM"], BN=c["BN"], BK=c["BK"], GROUP_M=GROUP_M, TMA=c["TMA"],
                    FLATTEN=self.meta["dots"] == 1, num_warps=c["num_warps"], num_stages=c["num_stages"],
                    enable_fp_fusion=FP_FUSION)

    def _run(self, args: tuple[Any, ...], m: int, n: int, c: dict[str, Any], big: bool) -> None:
        self.fn[self._grid(m, n, c)](*args, **self._constexprs(c, big))
