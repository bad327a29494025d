"""Differential fuzzer: random small PyTorch programs, ember.compile against eager.

Each program is a random DAG of 2-8 ops over 1-3 input tensors (plus weights/targets some ops
ask for), emitted as Python source, exec'd, run eagerly and through ``ember.compile``, and
compared (same dtype first; where that differs, ember must not be clearly worse than eager
against a float64 eager run). Failures leave a self-contained reproducer in ``--out``.

On this CPU machine::

    python bench/fuzz.py --device cpu --backend cpp --seconds 600 --workers 1 --seed 1
    python bench/fuzz.py --device cpu --backend triton --seconds 300 --workers 1 --seed 2  # interpreted
    python bench/fuzz.py --device cpu --backend cpp --seconds 300 --workers 1 --seed 3 --train
    python bench/fuzz.py --device cpu --backend cpp --seconds 300 --workers 1 --seed 4 --dynamic
    python bench/fuzz.py --device cpu --backend cpp --seconds 600 --workers 1 --seed 5 --ragged [--dynamic]
    python bench/fuzz.py --device cpu --backend cpp --seconds 600 --workers 1 --seed 6 --favour int  # integer ops

On the GPU machine (one process per worker, all sharing the GPU)::

    python bench/fuzz.py --device cuda --backend triton --seconds 1800 --workers 12 --seed 1 \\
        --dtypes fp32,bf16,fp16 --out build/fuzz-triton
    python bench/fuzz.py --device cuda --backend cuda --seconds 1800 --workers 12 --seed 1 --train

Findings: mismatch, ember-raised (eager did not), raise-parity (eager raised, ember did not or
raised another type), fallback (an "ember..." warning), crash (worker died), hang; and upstream,
left out of the pass rate: ember raised where eager did not, but
``torch.compile(backend="aot_eager")`` raises too (Dynamo or AOTAutograd refused the program), or
on a GPU ember's result differs from eager's but matches eager's on the CPU (eager's CUDA kernel
is the odd one out), or it matches eager's on contiguous copies of the inputs (eager's result
depended on their strides), or eager's own CUDA kernels broke the process's CUDA context (a
device-side assert: the worker restarts). ``--ragged``: programs over an ``ember.ragged.Ragged`` (fuzz_ragged.py);
with --dynamic also recompile (a compile where the README promises none).
"""

from __future__ import annotations

import argparse
import inspect
import logging
import multiprocessing as mp
import os
import queue
import random
import re
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from fuzz_programs import Generator, Program, make_inputs  # (bench/ is on sys.path: python bench/fuzz.py)
from torch._dynamo.utils import counters

# (rtol, atol as a fraction of the output's largest finite magnitude) by output dtype
TOLS = {torch.float32: (1e-4, 1e-5), torch.float16: (4e-3, 1e-3), torch.bfloat16: (3e-2, 8e-3),
        torch.float64: (1e-9, 1e-10)}


def run_program(fn, inputs: list, upstream_seed: int | None) -> dict:
    """Run fn on inputs: outputs, the inputs' final values and (when upstream_seed is not None
    and an output is floating) the inputs' gradients for a seeded random upstream gradient."""
    outs = fn(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    grads = None
    if upstream_seed is not None:
        g = torch.Generator().manual_seed(upstream_seed)
        loss = None
        for o in outs:
            if isinstance(o, torch.Tensor) and o.requires_grad:
                up = torch.randn(o.shape, generator=g, dtype=torch.float32).to(o.device, torch.float64)
                term = (o.to(torch.float64) * up).sum()
                loss = term if loss is None else loss + term
        leaves = [i for i in inputs if isinstance(i, torch.Tensor) and i.requires_grad]
        if loss is not None and leaves:
            gs = torch.autograd.grad(loss, leaves, allow_unused=True)
            grads = [None if x is None else x.detach().clone() for x in gs]
    return {"outs": [o.detach().clone() if isinstance(o, torch.Tensor) else o for o in outs],
            "inputs": [i.detach().clone() for i in inputs], "grads": grads}


# ---------------------------------------------------------------- comparison

def _finite_max(t: torch.Tensor) -> float:
    f = t[torch.isfinite(t)]
    return float(f.abs().max()) if f.numel() else 1.0


def compare_tensor(e: Any, g: Any, ref: Any, disc: bool, low: torch.dtype = torch.float32,
                   floor: float = 0.0) -> str | None:
    """None where ember's ``e`` agrees with eager's ``g``; else why not. ``ref``: a callable giving
    the float64 eager value (computed only when needed). ``floor``: the least magnitude the
    absolute tolerance scales with (a gradient that cancels to ~0 carries its terms' rounding)."""
    if not isinstance(g, torch.Tensor) or not isinstance(e, torch.Tensor):
        return None if type(e) is type(g) and (e == g or e != e) else f"non-tensor {e!r} vs {g!r}"
    if e.shape != g.shape or e.dtype != g.dtype:
        return f"shape/dtype: ember {tuple(e.shape)} {e.dtype} vs eager {tuple(g.shape)} {g.dtype}"
    if e.numel() == 0:
        return None
    allowance = max(2, e.numel() // 50) if disc else 0
    if not g.is_floating_point():
        bad = int((e != g).sum())
        if bad == 0 or bad <= allowance:
            return None
        r = ref()
        if r is not None and r.shape == e.shape and bool((e.to(r.dtype) == r).all()):
            return None
        return f"{bad}/{e.numel()} integer elements differ"
    rtol, atol = (max(a, b) for a, b in zip(TOLS.get(g.dtype, (1e-4, 1e-5)), TOLS[low]))
    e64, g64 = e.double(), g.double()
    scale = max(_finite_max(g64), floor)
    tol = atol * scale + rtol * g64.abs()
    same_special = (e64 == g64) | (torch.isnan(e64) & torch.isnan(g64))
    finite = torch.isfinite(e64) & torch.isfinite(g64)
    close = torch.where(finite, (e64 - g64).abs() <= tol, same_special)
    if bool(close.all()):
        return None
    r = ref()
    if r is None or r.shape != e.shape:  # (an explicit float16 cast beside a float64 LayerNorm weight)
        r = ref(nocast=True)
    if r is None or r.shape != e.shape:
        return f"{int((~close).sum())}/{e.numel()} differ (no float64 reference); max |diff| " \
               f"{float((e64 - g64)[finite].abs().max()) if finite.any() else 'nan'}"
    ok = close
    for rv in (r, ref(nocast=True)):  # (ember may keep more precision than an explicit downcast)
        if rv is None or rv.shape != e.shape:
            continue
        r64 = rv.to(g.dtype).double()  # (the reference as the output dtype holds it: overflow as inf)
        rr = rv.double()
        ok_special = (e64 == r64) | (torch.isnan(e64) & torch.isnan(r64)) | same_special | (
            torch.isfinite(e64) & ~torch.isfinite(g64))  # (eager overflowed where ember did not)
        fin = torch.isfinite(e64) & torch.isfinite(g64) & torch.isfinite(rr)
        tol_r = atol * scale + rtol * rr.abs()
        ok = ok | torch.where(fin, (e64 - rr).abs() <= 4 * (g64 - rr).abs() + tol_r, ok_special)
    bad = int((~ok).sum())
    if low != torch.float32:  # (rounding-order noise in half precision hits a stray element)
        allowance = max(allowance, 2 + e.numel() // 2000)
    if bad <= allowance:
        return None
    rr = r.double()
    fin = torch.isfinite(e64) & torch.isfinite(g64) & torch.isfinite(rr)
    if bool((ok | fin).all()) and bool(fin.any()) and float((e64 - rr)[fin].abs().max()) <= float(
            (g64 - rr)[fin].abs().max()):
        return None  # (cancellation noise: ember's worst element no further from float64 than eager's)
    i = int((~ok).reshape(-1).nonzero()[0])
    fin = torch.isfinite(e64) & torch.isfinite(g64)
    return (f"{bad}/{e.numel()} differ; first at flat {i}: ember {float(e64.reshape(-1)[i])} eager "
            f"{float(g64.reshape(-1)[i])} float64 {float(rr.reshape(-1)[i])}; max|diff| "
            f"{float((e64 - g64)[fin].abs().max()) if fin.any() else 'n/a'} (scale {scale:.3g})")


def compare_runs(em: dict, ea: dict, ref: Any, disc: bool, low: torch.dtype) -> str | None:
    """Compare every output, every input's final value and every gradient."""
    for part in ("outs", "inputs", "grads"):
        es, gs = em[part], ea[part]
        if (es is None) != (gs is None) or (es is not None and len(es) != len(gs)):
            return f"{part}: ember {None if es is None else len(es)} vs eager {None if gs is None else len(gs)}"
        floor = 0.1 * max([_finite_max(g.double()) for g in gs or [] if isinstance(g, torch.Tensor)
                           and g.is_floating_point() and g.numel()] or [0.0])
        if part == "grads":  # (the upstream gradient is ~N(0, 1): a gradient that cancels to 0, as
            # a softmax's summed over its row, keeps its unit terms' rounding: about a tenth of an ulp)
            floor = max(floor, 1e-3 if low == torch.float32 else 0.1)
        for i, (e, g) in enumerate(zip(es or [], gs or [])):
            if (e is None) != (g is None):
                zeros = e if g is None else g
                if part == "grads" and isinstance(zeros, torch.Tensor) and not bool(zeros.any()):
                    # (an input no output depends on: zeros where eager says None, as torch.compile's
                    # graphs give when a graph break leaves its path an intermediate output)
                    continue
                return f"{part}[{i}]: ember {e is None and 'None'} vs eager {g is None and 'None'}"
            if e is None:
                continue
            why = compare_tensor(e, g, lambda nocast=False, p=part, j=i: _ref_part(ref(nocast), p, j), disc, low,
                                 floor)
            if why:
                return f"{part}[{i}]: {why}"
    return None


def _ref_part(r: dict | None, part: str, i: int) -> Any:
    if r is None or r.get(part) is None or i >= len(r[part]):
        return None
    return r[part][i]


# ---------------------------------------------------------------- running one program

def widen(xs: list) -> list:
    """The inputs as float64 (the reference run), those sharing memory still sharing it."""
    storages: dict[int, torch.Tensor] = {}
    out = []
    for x in xs:
        if not x.is_floating_point():
            out.append(x)
            continue
        key = x.untyped_storage().data_ptr()
        if key not in storages:
            whole = x.untyped_storage().nbytes() // x.element_size()
            storages[key] = x.detach().as_strided((whole,), (1,), 0).double()
        wide = storages[key].as_strided(x.shape, x.stride(), x.storage_offset())
        out.append(wide.requires_grad_(x.requires_grad))
    return out


def _kind(prog: Program) -> tuple[Any, Any, Any]:
    """make_inputs, run_program and widen for the program's kind of inputs (fuzz_ragged's own)."""
    return (getattr(prog, "make_inputs", make_inputs), getattr(prog, "run_program", run_program),
            getattr(prog, "widen", widen))


def _leads(prog: Program, args: argparse.Namespace) -> list[int | None]:
    """The calls' leading dims (--dynamic: a second one), or a ragged program's batches."""
    if hasattr(prog, "leads"):
        return prog.leads(args.dynamic)
    return [None, random.Random(prog.seed).choice([2, 5, 9, 31, 66])] if args.dynamic else [None]


def _compile_dynamic(prog: Program, args: argparse.Namespace) -> bool | None:
    return getattr(prog, "compile_dynamic", True if args.dynamic else None)


def _exec_fn(source: str) -> Any:
    scope: dict[str, Any] = {"torch": torch, "F": F}
    exec(compile(source, "<fuzz program>", "exec"), scope)
    return scope["fn"]


def reference_run(source: str, fn: Any, inputs: list, up: int | None, run_program: Any = run_program,
                  nocast: bool = False) -> dict | None:
    """Eager on float64 inputs, or None where that raises; ``nocast``: with the program's float
    casts made float64 and float64 the default dtype (an integer times 0.5 is float64 then, as
    the float64 weights beside it: a mixed-dtype norm would refuse a float32 one)."""
    try:
        if not nocast:
            return run_program(fn, inputs, up)
        for half in ("torch.bfloat16", "torch.float16", "torch.float32"):
            source = source.replace(half, "torch.float64")
        wide = _exec_fn(source.replace(".float()", ".double()"))
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            return run_program(wide, inputs, up)
        finally:
            torch.set_default_dtype(default)
    except Exception:  # noqa: BLE001 -- no reference: the judge says so
        return None


def check_program(prog: Program, args: argparse.Namespace, options: dict) -> list[tuple[str, str]]:
    """Run one program eagerly and through ember; the findings as (kind, message) pairs."""
    import ember
    findings: list[tuple[str, str]] = []
    fn = _exec_fn(prog.source)
    up = prog.seed + 1 if args.train else None
    compiled = ember.compile(_exec_fn(prog.source), options=options, dynamic=_compile_dynamic(prog, args))
    make_inputs, run_program, widen = _kind(prog)
    leadings = _leads(prog, args)
    seen: dict[int | None, int] = {}  # frames Dynamo compiled, by the end of each call
    start_frames = counters["frames"]["ok"]
    for lead in leadings:
        def inputs(dtype64: bool = False, lead: int | None = lead) -> list:
            xs = make_inputs(prog.specs, args.device, args.train, lead)
            return widen(xs) if dtype64 else xs
        if lead is not None and args.device != "cpu":
            # (CUDA eager's index errors are device-side asserts, which end the process: a program
            # not generic in its leading dim is found on the CPU first)
            try:
                run_program(fn, make_inputs(prog.specs, "cpu", args.train, lead), up)
            except Exception:  # noqa: BLE001
                findings.append(("note-dyn-skip", "eager refused the second shape"))
                continue
        where = f" ({'batch' if hasattr(prog, 'leads') else 'leading dim'} {lead})" if lead is not None else ""
        try:
            eager, eager_err = run_program(fn, inputs(), up), None
            if args.device != "cpu":
                torch.cuda.synchronize()  # (eager's asynchronous CUDA errors surface as eager's, not ember's)
        except Exception as err:  # noqa: BLE001
            eager, eager_err = None, err
        if eager_err is not None and broken_context(eager_err, args.device):
            # (eager's CUDA binary_cross_entropy asserts on a NaN probability, its embedding backward
            # of width 0 reads out of bounds: every later CUDA call fails, ember's and aot_eager's)
            first = str(eager_err).splitlines()[0] if str(eager_err) else ""
            findings.append(("upstream", f"eager's own CUDA kernels failed, ending the process's CUDA context: "
                             f"{type(eager_err).__name__}: {first[:200]}{where}"))
            break
        if lead is not None and eager_err is not None:
            findings.append(("note-dyn-skip", "eager refused the second shape"))
            continue  # (the program is not generic in its leading dim)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                got, got_err = run_program(compiled, inputs(), up), None
                if args.device != "cpu":
                    torch.cuda.synchronize()  # (and ember's are ember's, not the next program's)
            except Exception as err:  # noqa: BLE001
                got, got_err = None, err
        traced = False  # (torch's trace failed, and ember ran the function eagerly)
        for w in caught:
            if str(w.message).startswith("ember"):
                # (an upstream fault ember steps around: AOTAutograd's views of merged inputs)
                kind = "upstream" if "AOTAutograd rebuilds wrongly" in str(w.message) else "fallback"
                findings.append((kind, str(w.message).splitlines()[0][:300]))
                traced |= "torch could not trace" in str(w.message)
        if traced and _aot_eager_raises(prog, args, up, leadings[:leadings.index(lead) + 1], Exception):
            # (F.mse_loss's backward over no elements divides by 0 under aot_eager too)
            findings = [("upstream", m) if k == "fallback" and "torch could not trace" in m else (k, m)
                        for k, m in findings]
            break  # (the check reset Dynamo, as below)
        if got_err is None and hasattr(prog, "allowed_compiles"):  # (ragged: count recompiles)
            seen[lead] = counters["frames"]["ok"] - start_frames
            allowed = prog.allowed_compiles(lead, seen)
            if allowed is not None and (n := seen[lead] - seen[None]) > allowed:
                findings.append(("recompile", f"{n} compiles after the first call by call {lead} "
                                 f"({prog.describe(lead)}); the README allows {allowed}"))
        if eager_err is not None:
            if got_err is None:
                message = f"eager raised {type(eager_err).__name__}: {str(eager_err)[:200]}; ember did not{where}"
                if not _aot_eager_raises(prog, args, up, leadings[:leadings.index(lead) + 1], type(eager_err)):
                    # (torch.compile drops the op whose check raised, unused: dead code)
                    findings.append(("upstream", message + " (nor does aot_eager)"))
                    break  # (the check reset Dynamo, as below)
                findings.append(("raise-parity", message))
            elif type(got_err) is not type(eager_err):
                findings.append(("raise-parity", f"eager raised {type(eager_err).__name__}, ember "
                                 f"{type(got_err).__name__}: {str(got_err)[:300]}{where}"))
            continue
        if got_err is not None:
            tb = "".join(traceback.format_exception_only(type(got_err), got_err))
            done_leads = leadings[:leadings.index(lead) + 1]
            # (after a broken CUDA context aot_eager fails too, whatever it would have done)
            upstream = not broken_context(got_err, args.device) and _aot_eager_raises(
                prog, args, up, done_leads, type(got_err))
            findings.append(("upstream" if upstream else "ember-raised", f"{tb.strip()[:400]}{where}"))
            if upstream:
                break  # (the check reset Dynamo: a later shape would compile afresh, not reuse the graph)
            continue
        cache: dict[str, Any] = {}

        def ref(nocast: bool = False, inputs=inputs, cache=cache) -> dict | None:
            if nocast not in cache:
                cache[nocast] = reference_run(prog.source, fn, inputs(True), up, run_program, nocast)
            return cache[nocast]
        why = compare_runs(got, eager, ref, prog.disc, prog.low)
        if why and args.device != "cpu" and _agrees_with_cpu_eager(prog, args, fn, got, up, lead):
            findings.append(("upstream", f"eager's GPU kernels disagree with its CPU ones, which ember "
                             f"matches: {why}{where}"))
        elif why and _agrees_with_contiguous_eager(prog, args, fn, got, up, lead):
            findings.append(("upstream", f"eager's result depends on its inputs' strides; ember matches it "
                             f"on contiguous copies: {why}{where}"))
        elif why:
            findings.append(("mismatch", why + where))
    return findings


def _agrees_with_cpu_eager(prog: Program, args: argparse.Namespace, fn: Any, got: dict, up: int | None,
                           lead: int | None) -> bool:
    """Does ember's GPU result match eager on the CPU (same inputs, judged the same way)? Then
    eager's CUDA kernel is the odd one out: torch 2.11's avg_pool2d backward of a channels-last
    input with padding (pytorch/pytorch#188344) gave every padded window's gradient to the wrong
    elements, and its float64 run, on the GPU too, agreed with it."""
    return _agrees_with_eager_on(prog, args, fn, got, up, lead, "cpu", lambda xs: xs)


def _agrees_with_contiguous_eager(prog: Program, args: argparse.Namespace, fn: Any, got: dict,
                                  up: int | None, lead: int | None) -> bool:
    """Does ember's result match eager's on contiguous copies of the same inputs? Then eager's
    result depended on its inputs' strides: torch's CPU batch_norm backward (2.11 and 2.13) reads
    a strided weight's memory as if it were contiguous, and its float64 run, from inputs of the
    same strides, agreed with it. Programs whose inputs share memory keep their layout."""
    if any(s["kind"] == "alias" for s in prog.specs) or hasattr(prog, "leads"):
        return False

    def contiguous(xs: list) -> list:
        return [x.detach().contiguous().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x
                for x in xs]
    return _agrees_with_eager_on(prog, args, fn, got, up, lead, args.device, contiguous)


def _agrees_with_eager_on(prog: Program, args: argparse.Namespace, fn: Any, got: dict, up: int | None,
                          lead: int | None, device: str, relayout: Any) -> bool:
    """Does ember's result ``got`` match eager's on ``device``, from the inputs ``relayout``
    makes (judged the same way, against a float64 run from those inputs)?"""
    make_inputs, run_program, widen = _kind(prog)
    cache: dict[bool, Any] = {}

    def ref(nocast: bool = False) -> dict | None:
        if nocast not in cache:
            xs = widen(relayout(make_inputs(prog.specs, device, args.train, lead)))
            cache[nocast] = reference_run(prog.source, fn, xs, up, run_program, nocast)
        return cache[nocast]
    try:
        other = run_program(fn, relayout(make_inputs(prog.specs, device, args.train, lead)), up)
    except Exception:  # noqa: BLE001 -- no other run to side with
        return False
    moved = {part: None if ts is None else [t.to(device) if isinstance(t, torch.Tensor) else t for t in ts]
             for part, ts in got.items()}
    return compare_runs(moved, other, ref, prog.disc, prog.low) is None


def _aot_eager_raises(prog: Program, args: argparse.Namespace, up: int | None, leads: list[int | None],
                      kind: type) -> bool:
    """Does ``torch.compile(backend="aot_eager")`` raise ``kind`` on the same calls? Then Dynamo
    or AOTAutograd refused the program before ember saw it (torch 2.11's fake ``split`` of an
    empty dim), which no backend can change: an upstream finding, not ember's."""
    torch._dynamo.reset()
    make_inputs, run_program, _ = _kind(prog)
    try:
        compiled = torch.compile(_exec_fn(prog.source), backend="aot_eager", dynamic=_compile_dynamic(prog, args))
        for lead in leads:
            run_program(compiled, make_inputs(prog.specs, args.device, args.train, lead), up)
    except Exception as err:  # noqa: BLE001
        return isinstance(err, kind) or kind.__name__ in str(err)  # (Dynamo wraps what fake tensors raise)
    finally:
        torch._dynamo.reset()
    return False


REPRO = '''"""ember fuzz reproducer: {kind}: {msg}"""
import os
{env}import math
import torch
import torch.nn.functional as F
import ember

DEVICE = {device!r}
OPTIONS = {options!r}
SPECS = {specs!r}
TRAIN = {train!r}
LEADING = {leading!r}  # --dynamic: the second call's leading dim


{make_inputs}

{run_program}

{widen}

{source}

compiled = ember.compile(fn, options=OPTIONS, dynamic={dynamic!r})
up = {up!r}
for lead in LEADING:
    eager = run_program(fn, make_inputs(SPECS, DEVICE, TRAIN, lead), up)
    got = run_program(compiled, make_inputs(SPECS, DEVICE, TRAIN, lead), up)
    ref = run_program(fn, widen(make_inputs(SPECS, DEVICE, TRAIN, lead)), up)
    for part in ("outs", "inputs", "grads"):
        for i, (e, g, r) in enumerate(zip(got[part] or [], eager[part] or [], ref[part] or [])):
            if e is None or g is None:
                continue
            print(part, i, "ember", e.dtype, tuple(e.shape), "eager", g.dtype, tuple(g.shape))
            if e.shape == g.shape:
                d = (e.double() - g.double()).abs()
                print("   max |ember-eager|", d.nan_to_num(float("inf")).max().item() if d.numel() else 0,
                      " max |eager-f64|", (g.double() - r.double()).abs().max().item() if g.numel() else 0,
                      " max |ember-f64|", (e.double() - r.double()).abs().max().item() if e.numel() else 0)
                print("   eager", g.flatten()[:8].tolist(), "\\n   ember", e.flatten()[:8].tolist())
'''


def write_repro(prog: Program, args: argparse.Namespace, options: dict, kind: str, msg: str, path: Path) -> None:
    """A self-contained script that rebuilds the program's inputs and prints eager vs ember."""
    env = ""
    if args.device == "cpu" and args.backend == "triton":
        env = 'os.environ.setdefault("TRITON_INTERPRET", "1")\n'
    if hasattr(prog, "leads"):
        from fuzz_ragged import repro_source
        path.write_text(repro_source(prog, args, options, kind, msg, env))
        return
    leading = _leads(prog, args)
    path.write_text(REPRO.format(kind=kind, msg=msg.replace('"""', "'''").replace("\\", "/")[:500], env=env,
                                 device=args.device, options=options, specs=prog.specs, train=args.train,
                                 leading=leading, make_inputs=inspect.getsource(make_inputs),
                                 run_program=inspect.getsource(run_program), widen=inspect.getsource(widen),
                                 source=prog.source,
                                 dynamic=True if args.dynamic else None, up=prog.seed + 1 if args.train else None))


# ---------------------------------------------------------------- workers and the parent

def backend_options(device: str, backend: str) -> dict:
    """ember options for --device/--backend."""
    if device == "cuda":
        return {"gpu_backend": backend}
    return {"target": "triton"} if backend == "triton" else {}


def worker(index: int, args: argparse.Namespace, start: int, results: Any) -> None:
    """Generate and check programs until the deadline, reporting each to ``results``."""
    import torch._dynamo
    warnings.filterwarnings("ignore")  # (eager's own warnings; ember's are caught per program)
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)  # (graph breaks: to_padded's max_length)
    torch.set_num_threads(1)  # (W workers share the cores; on cuda only the host side runs here)
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, 1_000_000)
    options = backend_options(args.device, args.backend)
    stream = random.Random(args.seed * 1000 + index)
    seeds = [stream.randrange(2**40) for _ in range(start)]
    out = Path(args.out)
    dtypes = args.dtypes.split(",")
    gen = Generator
    if args.ragged:
        from fuzz_ragged import RaggedGenerator as gen
    while time.time() < args.deadline:
        seed = stream.randrange(2**40)
        seeds.append(seed)
        try:
            maker = gen(seed, args.device, args.backend, dtypes, args.train, args.dynamic)
            maker.favour = frozenset(filter(None, args.favour.split(",")))
            prog = maker.build()
        except Exception:  # noqa: BLE001 -- a fuzzer bug: report, carry on
            results.put((index, seed, [("generator", traceback.format_exc()[-600:])], None))
            continue
        (out / f"current-{index}.py").write_text(f"# seed {seed}\nSPECS = {prog.specs!r}\n{prog.source}")
        torch._dynamo.reset()
        try:
            findings = check_program(prog, args, options)
        except Exception:  # noqa: BLE001
            findings = [("harness", traceback.format_exc()[-800:])]
        paths = []
        for kind, msg in {k: m for k, m in reversed(findings)}.items():  # (one per kind: the first)
            if kind not in ("harness", "note-dyn-skip"):
                p = out / f"{kind}-{seed}.py"
                write_repro(prog, args, options, kind, msg, p)
                paths.append(str(p))
        results.put((index, seed, findings, paths))
        if args.device == "cuda" and any(_CUDA_BROKEN.search(m) for _, m in findings):
            results.close()
            results.join_thread()  # (the result reaches the parent first)
            # (a broken CUDA context fails every later program: the parent starts a fresh worker)
            os._exit(BROKEN_CONTEXT_EXIT)


BROKEN_CONTEXT_EXIT = 3  # a worker's exit status after a finding that broke its CUDA context
_CUDA_BROKEN = re.compile(r"illegal memory access|device-side assert|CUDA error|misaligned address|"
                          r"unspecified launch failure|an illegal instruction|the process's CUDA context")


def broken_context(err: BaseException, device: str) -> bool:
    """Did ``err`` end this process's CUDA context (a device-side assert, an illegal address)? Every
    later CUDA call then fails, whoever makes it, so no later result can be compared."""
    return device != "cpu" and bool(_CUDA_BROKEN.search(f"{type(err).__name__}: {err}"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--backend", choices=["cpp", "triton", "cuda"], default=None)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtypes", default="fp32,bf16,fp16")
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--dynamic", action="store_true")
    ap.add_argument("--ragged", action="store_true", help="programs over a ragged.Ragged (fuzz_ragged.py)")
    ap.add_argument("--favour", default="", help="op families drawn 8x as often, e.g. int,bool,more "
                    "(fuzz_programs.Generator's op_<family> methods)")
    ap.add_argument("--out", default="build/fuzz")
    ap.add_argument("--hang-seconds", type=float, default=None,
                    help="one program's limit (default 300, 900 interpreted)")
    args = ap.parse_args()
    args.backend = args.backend or ("cpp" if args.device == "cpu" else "triton")
    if (args.device, args.backend) in (("cpu", "cuda"), ("cuda", "cpp")):
        ap.error(f"--backend {args.backend} does not run on --device {args.device}")
    if args.device == "cpu" and args.backend == "triton":
        os.environ["TRITON_INTERPRET"] = "1"  # (the spawned workers inherit it before importing torch)
        if "bf16" in args.dtypes.split(","):  # (the interpreter's float32->bfloat16 cast truncates)
            print("note: bf16 left out: Triton's interpreter rounds float32->bfloat16 toward zero")
            args.dtypes = ",".join(d for d in args.dtypes.split(",") if d != "bf16") or "fp32"
    os.environ.setdefault("EMBER_CACHE_DIR", tempfile.mkdtemp(prefix="ember-fuzz-cache-"))
    hang = args.hang_seconds or (900 if args.backend == "triton" and args.device == "cpu" else 300)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    args.deadline = time.time() + args.seconds
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    counts = {"programs": 0, "passed": 0, "mismatch": 0, "ember-raised": 0, "raise-parity": 0,
              "fallback": 0, "crash": 0, "hang": 0, "harness": 0, "generator": 0,
              "dyn-skipped": 0, "upstream": 0, "recompile": 0}
    done = [0] * args.workers
    last = [time.time()] * args.workers
    procs: list[Any] = [None] * args.workers

    def start(i: int) -> None:
        procs[i] = ctx.Process(target=worker, args=(i, args, done[i], results), daemon=True)
        procs[i].start()
        last[i] = time.time()

    def died(i: int, kind: str, why: str) -> None:
        counts[kind] += 1
        counts["programs"] += 1
        done[i] += 1
        cur = Path(args.out) / f"current-{i}.py"
        keep = Path(args.out) / f"{kind}-{args.seed}-w{i}-{done[i]}.py"
        if cur.exists():
            keep.write_text(f"# {kind}: {why}\n" + cur.read_text())
        print(f"[w{i}] {kind.upper()}: {why}; program kept in {keep}", flush=True)

    for i in range(args.workers):
        start(i)
    while True:
        try:
            i, seed, findings, paths = results.get(timeout=1.0)
            done[i] += 1
            last[i] = time.time()
            counts["programs"] += 1
            notes = [f for f in findings if f[0].startswith("note")]
            findings = [f for f in findings if not f[0].startswith("note")]
            counts["dyn-skipped"] += len(notes)
            kinds = sorted({k for k, _ in findings})
            if not findings:
                counts["passed"] += 1
            for k in kinds:
                counts[k] += 1
            for k, msg in findings[:3]:
                print(f"[w{i}] seed {seed} {k}: {msg.splitlines()[0] if k not in ('harness', 'generator') else msg}"
                      f"{'  -> ' + paths[0] if paths else ''}", flush=True)
            continue
        except queue.Empty:
            pass
        now = time.time()
        for i, p in enumerate(procs):
            if p is None:
                continue
            if not p.is_alive():
                if p.exitcode == BROKEN_CONTEXT_EXIT:  # (its program's finding is counted already)
                    print(f"[w{i}] restarted: its CUDA context broke (the finding above)", flush=True)
                    procs[i] = None
                    if now < args.deadline:
                        start(i)
                elif p.exitcode != 0:
                    died(i, "crash", f"worker exit code {p.exitcode}")
                    procs[i] = None
                    if now < args.deadline:
                        start(i)
                else:
                    procs[i] = None
            elif now - last[i] > hang:
                p.kill()
                p.join()
                died(i, "hang", f"no result for {hang:.0f} s")
                procs[i] = None
                if now < args.deadline:
                    start(i)
        if all(p is None for p in procs) and results.empty():
            break
    ok = counts["passed"]
    print("\n" + "=" * 60)
    print(f"ember fuzz: device={args.device} backend={args.backend} train={args.train} dynamic={args.dynamic} "
          f"ragged={args.ragged} "
          f"seed={args.seed} workers={args.workers} seconds={args.seconds:.0f}")
    for k, v in counts.items():
        print(f"  {k:<14}{v:>8}")
    judged = counts["programs"] - counts["upstream"]  # (torch.compile itself refused those)
    print(f"  pass rate     {100.0 * ok / max(1, judged):7.1f}%   (reproducers in {args.out})")


if __name__ == "__main__":
    main()
