"""Questions about memory-bound kernels, one device call.

* lse: what does cross-entropy's forward (bf16 8192 x 32000, 524 MB read once) cost beyond
  reading its logits? ember's kernel (with ``--mutations`` of its source: timing only) beside
  hand-written row logsumexps: per chunk or per lane, loading a chunk ahead, a speculative max,
  with and without the loss's gather and sum.
* read: how fast can anything read those bytes? Hand-written Triton sums (per row as ember's
  kernel walks them, flat blocks, a persistent grid, eviction hints) and ATen's sums.
* pointwise: which launch configuration is fastest for large pointwise kernels (relu(x) + y + 1
  and gelu in fp32, bias + gelu in bf16)? ember's kernel under several (XBLOCK, num_warps), and
  as it chooses by default, interleaved with Inductor's.

    PYTHONPATH=. python bench/bandwidth_probe.py [--parts lse,read,pointwise] [--mutations "as rendered,tl.exp"]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import interleaved_gpu_times, profiled_kernels  # noqa: E402
from gpu_fusion import copy_bandwidth  # noqa: E402

import ember  # noqa: E402


@triton.jit
def row_sum(x, out, N, BLOCK: tl.constexpr, EVICT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        if EVICT:
            v = tl.load(x + row * N + cols, cols < N, other=0, eviction_policy="evict_first")
        else:
            v = tl.load(x + row * N + cols, cols < N, other=0)
        acc += v.to(tl.float32)
    tl.store(out + row, tl.sum(acc, 0))


@triton.jit
def flat_sum(x, out, numel, BLOCK: tl.constexpr, EVICT: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if EVICT:
        v = tl.load(x + offs, offs < numel, other=0, eviction_policy="evict_first")
    else:
        v = tl.load(x + offs, offs < numel, other=0)
    tl.store(out + tl.program_id(0), tl.sum(v.to(tl.float32), 0))


@triton.jit
def persistent_sum(x, out, numel, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    acc = tl.zeros([BLOCK], tl.float32)
    step = tl.num_programs(0).to(tl.int64) * BLOCK * UNROLL
    for start in range(tl.program_id(0).to(tl.int64) * BLOCK * UNROLL, numel, step):
        for u in tl.static_range(UNROLL):
            offs = start + u * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(x + offs, offs < numel, other=0).to(tl.float32)
    tl.store(out + tl.program_id(0), tl.sum(acc, 0))


@triton.jit
def chunk(base, start, cols, N, nxt, BLOCK: tl.constexpr, PREFETCH: tl.constexpr):
    """The row's chunk at ``start`` in float32, and what the next call takes as ``nxt``: with
    PREFETCH, the chunk was loaded one step ahead and the next one's load goes out now."""
    if PREFETCH:
        cur = nxt.to(tl.float32)
        nxt = tl.load(base + start + BLOCK + cols, start + BLOCK + cols < N, other=float("-inf"))
    else:
        cur = tl.load(base + start + cols, start + cols < N, other=float("-inf")).to(tl.float32)
    return cur, nxt


@triton.jit
def online_lse(x, targets, out, row_max, N, BLOCK: tl.constexpr, PREFETCH: tl.constexpr, PER_LANE: tl.constexpr,
               LOSS: tl.constexpr):
    """Each row's logsumexp in one pass, as cross-entropy's forward takes it: an online max and
    sum of exp, updated per chunk with a reduction across the lanes (PER_LANE=False), or kept per
    lane and reduced once at the end (two exps per element). PREFETCH loads the next chunk before
    reducing this one, so its load is in flight while the lanes reduce. LOSS: what ember's kernel
    also does, the target's logit, the row max stored, the loss summed over rows (an atomic)."""
    row = tl.program_id(0)
    base = x + row.to(tl.int64) * N
    cols = tl.arange(0, BLOCK)
    if PER_LANE:
        m = tl.full([BLOCK], float("-inf"), tl.float32)
        s = tl.zeros([BLOCK], tl.float32)
    else:
        m = tl.full([1], float("-inf"), tl.float32)
        s = tl.zeros([1], tl.float32)
    nxt = tl.load(base + cols, cols < N, other=float("-inf"))
    for start in range(0, N, BLOCK):
        cur, nxt = chunk(base, start, cols, N, nxt, BLOCK, PREFETCH)
        if PER_LANE:
            m_new = tl.maximum(m, cur)
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            s = s * tl.exp(m - m_use) + tl.exp(cur - m_use)
        else:
            m_new = tl.maximum(m, tl.max(cur, 0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(cur - m_new), 0)
        m = m_new
    if PER_LANE:
        mx = tl.max(m, 0)
        lse = mx + tl.log(tl.sum(tl.where(m == float("-inf"), 0.0, s * tl.exp(m - mx)), 0))
    else:
        mx = m
        lse = m + tl.log(s)
    if LOSS:
        t = tl.load(targets + row)
        picked = tl.load(base + t).to(tl.float32)
        tl.store(row_max + row + tl.arange(0, 1), mx + tl.zeros([1], tl.float32))
        tl.atomic_add(out + tl.arange(0, 1), (lse - picked) + tl.zeros([1], tl.float32))
    else:
        tl.store(out + row + tl.arange(0, 1), lse + tl.zeros([1], tl.float32))


@triton.jit
def speculative_lse(x, out, N, BLOCK: tl.constexpr, PREFETCH: tl.constexpr, SLACK: tl.constexpr):
    """Online logsumexp whose exps do not wait for the chunk's max: each chunk's exp(x - ref) is
    summed against a reference ``ref`` from earlier chunks while the lanes reduce the chunk's
    max alongside; only when a max outgrows ref by SLACK (the first chunk, and rarely after) is
    the chunk summed again against a new reference. The sum stays exact (terms are at most
    e^SLACK), and the row max is still the true max."""
    base = x + tl.program_id(0).to(tl.int64) * N
    cols = tl.arange(0, BLOCK)
    row_max = tl.full([1], float("-inf"), tl.float32)
    ref = tl.full([1], -1e30, tl.float32)  # finite: exp(x - ref) of an all -inf chunk is 0, not nan
    s = tl.zeros([1], tl.float32)
    nxt = tl.load(base + cols, cols < N, other=float("-inf"))
    for start in range(0, N, BLOCK):
        cur, nxt = chunk(base, start, cols, N, nxt, BLOCK, PREFETCH)
        part = tl.sum(tl.exp(cur - ref), 0)
        row_max = tl.maximum(row_max, tl.max(cur, 0))
        if tl.max(row_max > ref + SLACK, 0):
            new_ref = row_max
            s = s * tl.exp(ref - new_ref)
            part = tl.sum(tl.exp(cur - new_ref), 0)
            ref = new_ref
        s = s + part
    tl.store(out + tl.program_id(0) + tl.arange(0, 1), ref + tl.log(s))


@triton.jit
def online_lse_2d(x, out, OUTER, N, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    """``online_lse`` (per chunk, no prefetch, no loss) written as ember renders row kernels: a
    [XBLOCK, RBLOCK] tile, int32 offsets from row and column indices, a row mask and a column
    mask, reductions along axis 1 kept as [XBLOCK, 1]."""
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < OUTER
    row_max = tl.full([XBLOCK, 1], float("-inf"), tl.float32)
    row_sum = tl.full([XBLOCK, 1], 0, tl.float32)
    for roffset in range(0, N, RBLOCK):
        rindex = roffset + tl.arange(0, RBLOCK)[None, :]
        rmask = rindex < N
        v = tl.load(x + (rindex + N * xindex), xmask & rmask, other=0).to(tl.float32)
        chunk = tl.where(xmask & rmask, v, float("-inf"))
        m_new = tl.maximum(row_max, tl.max(chunk, 1)[:, None])
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        row_sum = row_sum * tl.exp(row_max - m_use) + tl.sum(tl.exp(chunk - m_use), 1)[:, None]
        row_max = m_new
    tl.store(out + xindex, row_max + tl.log(row_sum), xmask)


def mutate(name: str) -> Callable[[], None]:
    """Patch ember's Triton renderer for one variant of the CE forward kernel (timing only: some
    give wrong results on purpose); returns the undo."""
    from ember.codegen import triton as tr
    renderer = tr.TritonKernelRenderer
    emit, combine = renderer.emit, renderer._combine_rows

    def undo() -> None:
        renderer.emit, renderer._combine_rows = emit, combine

    wanted = {"tl.exp", "no m_use", "no chunk mask", "no target gather"} if name == "all four" else {name}
    if name == "no combine":  # the loss's sum over rows left out: each program stores nothing of it
        renderer._combine_rows = lambda self: None

    def patched(self, line: str) -> None:
        if "plain max" in wanted and line.startswith("m_new = eh.maximum("):  # no NaN propagation
            line = line.replace("eh.maximum(", "tl.maximum(", 1).replace("tl.reduce(chunk, 1, eh.maximum)",
                                                                       "tl.max(chunk, 1)")
        if "relaxed" in wanted:  # the group counters' atomics without acquire or release
            line = line.replace("sem='acq_rel'", "sem='relaxed'")
        if "no row max store" in wanted and line.startswith("tl.store(buf0 + (o0)"):
            return
        if "tl.exp" in wanted:
            line = line.replace("eh.exp_ftz(", "tl.exp(")
        if "no m_use" in wanted and line.startswith("m_use = "):
            line = "m_use = m_new"
        if "no chunk mask" in wanted and line.startswith("chunk = tl.where("):
            line = "chunk = " + line.split(", ")[-2]
        if "no target gather" in wanted and " = tl.load(arg0_1 + ((v" in line:
            line = line.split(" = ")[0] + " = tl.zeros([XBLOCK, 1], tl.float32)"
        emit(self, line)

    renderer.emit = patched
    return undo


def lse_part(bw: float, mutations: tuple[str, ...], rows: int = 8192, cols: int = 32000) -> None:
    from triton.testing import do_bench
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    targets = torch.randint(0, cols, (rows,), device="cuda")
    ref = torch.logsumexp(x.float(), -1)
    loss_ref = torch.nn.functional.cross_entropy(x.float(), targets, reduction="sum")
    out = torch.empty(rows, device="cuda")
    maxes = torch.empty(rows, device="cuda")
    nbytes = x.numel() * 2
    print("\n| row logsumexp, bf16 8192 x 32000 | call us | % of copy | kernel us | rel err |")
    print("|---|---|---|---|---|")
    variants = {}
    torch._dynamo.config.recompile_limit = 64
    for mutation in mutations:
        undo = mutate(mutation)
        try:
            torch._dynamo.reset()
            ce = ember.compile(torch.nn.functional.cross_entropy, options={"aot_cache": False})
            ce(x, targets)
        finally:
            undo()
        variants[f"ember's CE forward, {mutation}"] = (lambda ce=ce: ce(x, targets), None)
    # the same kernel source, launched by Triton's own launcher instead of ember's
    source = ember.explain(torch.nn.functional.cross_entropy, x, targets, target="triton").kernels[0]
    path = Path(os.environ["EMBER_CACHE_DIR"]) / "ce_source_probe.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("import triton\nimport triton.language as tl\nfrom ember.runtime import triton_helpers as eh\n"
                    + source.source)
    spec = importlib.util.spec_from_file_location("ce_source_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernel = getattr(module, source.name)
    groups = rows // 64
    mean_loss = torch.empty((), device="cuda", dtype=torch.bfloat16)
    shares = torch.empty(2 * (rows + groups), device="cuda", dtype=torch.float64)
    counters = torch.zeros(1 + 32 * groups, device="cuda", dtype=torch.int32)

    def by_triton() -> None:
        kernel[(rows,)](x, targets, maxes, mean_loss, rows, cols, shares, counters, BIG=False, XBLOCK=1,
                        RBLOCK=1024, PERSISTENT=False, NPROG_BLOCK=1, num_warps=1, num_stages=3)

    by_triton()
    torch.testing.assert_close(mean_loss.float(), torch.nn.functional.cross_entropy(x.float(), targets),
                               rtol=2e-2, atol=0)
    variants["ember's CE kernel source, Triton's launcher"] = (by_triton, None)
    variants["row_sum 1024/1w (reads only)"] = (
        lambda: row_sum[(rows,)](x, out, cols, BLOCK=1024, EVICT=False, num_warps=1), None)
    for block, warps in ((1024, 1), (2048, 2), (4096, 4)):
        for prefetch, per_lane, loss in ((False, False, False), (True, False, False), (True, True, False),
                                         (False, False, True), (True, False, True)):
            name = (f"{block}/{warps}w{' prefetch' if prefetch else ''}{' per-lane' if per_lane else ''}"
                    f"{' +loss' if loss else ''}")

            def fn(b=block, w=warps, p=prefetch, q=per_lane, lo=loss) -> None:
                if lo:
                    out.zero_()
                online_lse[(rows,)](x, targets, out, maxes, cols, BLOCK=b, PREFETCH=p, PER_LANE=q, LOSS=lo,
                                    num_warps=w)

            variants[name] = (fn, loss)
    variants["1024/1w in ember's 2-D form"] = (
        lambda: online_lse_2d[(rows,)](x, out, rows, cols, XBLOCK=1, RBLOCK=1024, num_warps=1), False)
    for block, warps in ((1024, 1), (2048, 2)):
        for prefetch in (False, True):
            for slack in (8.0, 32.0):
                variants[f"{block}/{warps}w speculative, slack {slack:g}{' prefetch' if prefetch else ''}"] = (
                    lambda b=block, w=warps, p=prefetch, sl=slack: speculative_lse[(rows,)](
                        x, out, cols, BLOCK=b, PREFETCH=p, SLACK=sl, num_warps=w), False)
    for name, (fn, loss) in variants.items():
        try:
            fn()
            err = float("nan") if loss is None else (
                abs(out[0].item() - loss_ref.item()) / abs(loss_ref.item()) if loss
                else ((out - ref).abs().max() / ref.abs().max()).item())
            ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
            kernels = {k: v for k, v in profiled_kernels(fn).items() if "zero" not in k and "fill" not in k}
            print(f"| {name} | {ms * 1e3:.1f} | {100 * nbytes / (ms * 1e-3) / bw:.1f} | "
                  f"{sum(kernels.values()):.1f} | {err:.1e} |", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"| {name} | failed: {type(e).__name__}: {str(e)[:150]} |", flush=True)


def read_part(bw: float) -> None:
    from triton.testing import do_bench
    x = torch.randn(8192, 32000, device="cuda", dtype=torch.bfloat16)
    nbytes = x.numel() * 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.empty(x.numel() // 256 + 1, device="cuda")
    runs = {
        "ATen x.sum(-1)": lambda: x.sum(-1),
        "ATen x.sum()": lambda: x.sum(),
    }
    for block, warps in ((1024, 1), (1024, 2), (2048, 2), (2048, 4), (4096, 4), (8192, 8)):
        for evict in (False, True):
            runs[f"row_sum {block}/{warps}w{' evict_first' if evict else ''}"] = (
                lambda b=block, w=warps, e=evict: row_sum[(8192,)](x, out, 32000, BLOCK=b, EVICT=e, num_warps=w))
    for block, warps in ((2048, 4), (4096, 4), (8192, 8), (16384, 8), (32768, 16)):
        for evict in (False, True):
            runs[f"flat_sum {block}/{warps}w{' evict_first' if evict else ''}"] = (
                lambda b=block, w=warps, e=evict: flat_sum[(triton.cdiv(x.numel(), b),)](
                    x, out, x.numel(), BLOCK=b, EVICT=e, num_warps=w))
    for per_sm, block, warps, unroll in ((4, 2048, 4, 2), (8, 2048, 4, 2), (16, 1024, 2, 4), (8, 4096, 8, 2),
                                         (32, 1024, 1, 2), (32, 1024, 1, 4)):
        runs[f"persistent {per_sm}/SM {block}/{warps}w x{unroll}"] = (
            lambda p=per_sm, b=block, w=warps, u=unroll: persistent_sum[(p * sms,)](
                x, out, x.numel(), BLOCK=b, UNROLL=u, num_warps=w))
    print("| read of 524 MB | us | % of copy |")
    print("|---|---|---|")
    for name, fn in runs.items():
        try:
            fn()
            ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
            print(f"| {name} | {ms * 1e3:.1f} | {100 * nbytes / (ms * 1e-3) / bw:.1f} |", flush=True)
        except Exception as e:  # noqa: BLE001 -- a probe: report and go on
            print(f"| {name} | failed: {type(e).__name__}: {str(e)[:150]} |", flush=True)


def relu_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) + y + 1


def bias_gelu(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The gelu linear layer's epilogue: what runs after cuBLAS's product."""
    return torch.nn.functional.gelu(x + b)


POINTWISE = {  # name: (function, inputs, bytes moved, launch configurations (XBLOCK, num_warps))
    "relu_add fp32 64M": (relu_add, lambda: (torch.randn(64 << 20, device="cuda"),
                                             torch.randn(64 << 20, device="cuda")), 3 * 4 * (64 << 20),
                          ((512, 4), (512, 8), (1024, 4))),
    "gelu fp32 64M": (torch.nn.functional.gelu, lambda: (torch.randn(64 << 20, device="cuda"),), 2 * 4 * (64 << 20),
                      ((512, 4), (512, 8), (1024, 4))),
    "bias + gelu bf16 8192x4096": (bias_gelu, lambda: (torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16),
                                                       torch.randn(4096, device="cuda", dtype=torch.bfloat16)),
                                   2 * 2 * 8192 * 4096,
                                   ((1024, 4), (1024, 8), (2048, 4))),
}


def pointwise_part(bw: float) -> None:
    """ember's pointwise kernel under several launch configurations, interleaved with Inductor's."""
    for case, (fn, make, nbytes, configs) in POINTWISE.items():
        args = make()
        ref = fn(*args)
        variants = {"Inductor": torch.compile(fn)}
        for xblock, warps in ((None, None), *configs):
            torch._dynamo.reset()
            options: dict = {"aot_cache": False}
            if xblock is not None:
                options["triton_launch"] = dict(XBLOCK=xblock, RBLOCK=1, num_warps=warps)
            compiled = ember.compile(fn, options=options)
            torch.testing.assert_close(compiled(*args), ref, atol=2e-2, rtol=2e-2)
            variants["ember default" if xblock is None else f"ember {xblock}/{warps}w"] = compiled
        torch.testing.assert_close(variants["Inductor"](*args), ref, atol=2e-2, rtol=2e-2)
        times = interleaved_gpu_times({k: (lambda f=f, a=args: f(*a)) for k, f in variants.items()}, rounds=7)
        base = times["Inductor"]
        print(f"\n| {case} | us | % of copy | vs Inductor | kernel us (profiler, back to back) |")
        print("|---|---|---|---|---|")
        for name, ms in times.items():
            kernel = sum(profiled_kernels(lambda f=variants[name], a=args: f(*a)).values())
            print(f"| {name} | {ms * 1e3:.1f} | {100 * nbytes / (ms * 1e-3) / bw:.1f} | {base / ms:.3f}x | "
                  f"{kernel:.1f} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--parts", default="lse,read,pointwise")
    p.add_argument("--mutations", default="as rendered,tl.exp,no m_use,no chunk mask,no target gather,all four,"
                                          "no combine,relaxed,no row max store")
    args = p.parse_args()
    os.environ.setdefault("EMBER_CACHE_DIR", "/tmp/ember-bandwidth-probe")
    bw = copy_bandwidth()
    print(f"# {torch.cuda.get_device_name()}, copy {bw / 1e9:.0f} GB/s, torch {torch.__version__}, "
          f"Triton {triton.__version__}")
    if "lse" in args.parts:
        lse_part(bw, tuple(args.mutations.split(",")))
    if "read" in args.parts:
        read_part(bw)
    if "pointwise" in args.parts:
        pointwise_part(bw)


if __name__ == "__main__":
    main()
