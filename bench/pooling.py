"""Max and average pooling: eager vs Inductor vs ember (the window reduction fused with its input)
vs ember with the pooling left to ATen (how ember ran it before), forward and training step.

CNN shapes: a ResNet stem's relu + 3x3/2 max pooling, a VGG block's 2x2 max pooling, contiguous
and channels_last; a DenseNet transition's 2x2 average pooling and a padded 3x3/2 average pooling
(count_include_pad=False). Each case: correctness of the values (max pooling: exact, with the
indices), and of the input's gradient against eager in float64, kernels and ATen calls per compile,
then medians of interleaved rounds (CUDA events on the GPU, wall time on the CPU). One device call:

    python bench/pooling.py [--device cuda|cpu] [--backends triton,cuda] [--batch N] [--only TEXT]
                            [--padded-on-cpu] [--gathered-max-backward]

``--padded-on-cpu`` decomposes padded windows and the backwards of overlapping windows (gather
form) on CPU tensors too, as on GPUs (frontend/pool_decomps.py keeps them with ATen there).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import interleaved_gpu_times, machine, median_times, rel_error, table  # noqa: E402

import ember  # noqa: E402
from ember.frontend.decompositions import decomposition_table  # noqa: E402
from ember.frontend.pool_decomps import pool_decompositions  # noqa: E402


def stem(x: torch.Tensor) -> torch.Tensor:
    return F.max_pool2d(torch.relu(x), 3, 2, 1)


def block(x: torch.Tensor) -> torch.Tensor:
    return F.max_pool2d(x, 2)


def transition(x: torch.Tensor) -> torch.Tensor:
    return F.avg_pool2d(torch.relu(x), 2)


def padded_average(x: torch.Tensor) -> torch.Tensor:
    return F.avg_pool2d(x, 3, 2, 1, count_include_pad=False)


def cases(batch: int, device: str) -> dict[str, tuple[Callable[..., torch.Tensor], torch.Tensor]]:
    g = torch.Generator().manual_seed(0)

    def x_of(shape: tuple[int, ...], dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
        x = torch.randn(shape, generator=g).to(device=device, dtype=dtype)
        return x.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)

    return {
        f"relu + pool 3x3/2, {batch}x64x112x112 f32": (stem, x_of((batch, 64, 112, 112), torch.float32, False)),
        f"relu + pool 3x3/2, {batch}x64x112x112 bf16 NHWC": (stem, x_of((batch, 64, 112, 112), torch.bfloat16, True)),
        f"pool 2x2, {batch}x128x56x56 f32": (block, x_of((batch, 128, 56, 56), torch.float32, False)),
        f"relu + avg 2x2, {batch}x128x56x56 f32": (transition, x_of((batch, 128, 56, 56), torch.float32, False)),
        f"relu + avg 2x2, {batch}x128x56x56 bf16 NHWC": (transition, x_of((batch, 128, 56, 56), torch.bfloat16, True)),
        f"avg 3x3/2 pad 1, {batch}x64x112x112 f32": (padded_average, x_of((batch, 64, 112, 112), torch.float32, False)),
    }


def _aten_pooling(fn: Callable[..., Any], options: dict[str, Any], x: torch.Tensor,
                  seed: torch.Tensor) -> Callable[..., Any]:
    """ember with max pooling left to ATen: compiled (forward and training graphs) with the
    table's pooling entries removed, and torch's AOTAutograd cache off, whose keys do not see the
    table. (A function of its own, so Dynamo's cache holds none of the fused compiles for it.)"""
    table = decomposition_table()
    compiled = ember.compile(lambda x: fn(x), options=options)
    saved = {op: table.pop(op) for op in pool_decompositions() if op in table}
    try:
        with torch._functorch.config.patch(enable_autograd_cache=False):
            compiled(x)
            _step(compiled, x, seed)
    finally:
        table.update(saved)
    return compiled


def _step(fn: Callable[..., torch.Tensor], x: torch.Tensor, seed: torch.Tensor) -> list[torch.Tensor]:
    x = x.detach().requires_grad_()
    out = fn(x)
    (grad,) = torch.autograd.grad(out, x, seed)
    return [out, grad]


def _pool_args(fn: Callable[..., Any]) -> tuple[int, ...]:
    return (3, 2, 1) if fn is stem else (2,)


def _case(name: str, fn: Callable[..., torch.Tensor], x: torch.Tensor, device: str, backends: list[str],
          timer: Callable[[dict[str, Callable[[], Any]]], dict[str, float]]) -> list[tuple[str, ...]]:
    seed = torch.randn(fn(x).shape, generator=torch.Generator().manual_seed(1)).to(device, x.dtype)
    ref_values = fn(x)
    ref_indices = F.max_pool2d_with_indices(torch.relu(x) if fn is stem else x, *_pool_args(fn))[1] \
        if fn in (stem, block) else None
    ref_grad = _step(fn, x.double(), seed.double())
    compiled: dict[str, Callable[..., Any]] = {"eager": fn, "inductor": torch.compile(fn, dynamic=False)}
    notes = []
    for b in backends:
        options = {"gpu_backend": b} if device == "cuda" else {}
        report = ember.Report()
        compiled[b] = ember.compile(fn, options=options, report=report)
        values = compiled[b](x)
        err = rel_error(_step(compiled[b], x, seed), ref_grad)
        ok = err <= (2e-2 if x.dtype == torch.bfloat16 else 1e-5)
        if ref_indices is not None:  # (max pooling: eager's values and indices exactly)
            with_indices = ember.compile(lambda x: F.max_pool2d_with_indices(
                torch.relu(x) if fn is stem else x, *_pool_args(fn)), options=options)
            ok = ok and torch.equal(values, ref_values) and torch.equal(with_indices(x)[1], ref_indices)
        else:  # (a sum's rounding may differ in the last place)
            ok = ok and rel_error(values, ref_values) <= (1e-2 if x.dtype == torch.bfloat16 else 1e-6)
        forward_kernels = [k for g in report.graphs if g.kind == "inference" for k in g.kernels]
        notes.append(f"{b}: {'ok' if ok else 'WRONG'} (grad err {err:.1e}), {len(forward_kernels)} forward kernel(s)"
                     + (f", ATen: {', '.join(sorted(set(report.fallbacks)))}" if report.fallbacks else ""))
        compiled[f"{b}, ATen pool"] = _aten_pooling(fn, options, x, seed)
    forward = timer({k: (lambda f=f: f(x)) for k, f in compiled.items()})
    training = timer({k: (lambda f=f: _step(f, x, seed)) for k, f in compiled.items()})
    rows = []
    for label, ms in (("fwd", forward), ("fwd+bwd", training)):
        rows.append((f"{name} {label}", *[f"{ms[k] * 1e3:.1f}" for k in compiled],
                     *[f"{ms['inductor'] / ms[b]:.2f}x" for b in backends],
                     *[f"{ms[f'{b}, ATen pool'] / ms[b]:.2f}x" for b in backends],
                     "; ".join(notes) if label == "fwd" else ""))
    torch._dynamo.reset()
    return rows


def run(device: str, backends: list[str], batch: int, only: str = "") -> str:
    timer = (lambda v: interleaved_gpu_times(v, rounds=3, rep_ms=20)) if device == "cuda" else (
        lambda v: {k: s * 1e3 for k, s in median_times(v, reps=20).items()})
    rows = [row for name, (fn, x) in cases(batch, device).items() if only in name
            for row in _case(name, fn, x, device, backends, timer)]
    alone = backwards_alone(device, backends, batch, timer)
    columns = [h for b in backends for h in (f"ember-{b} µs", f"ember-{b}, ATen pool µs")]
    header = ["case", "eager µs", "Inductor µs", *columns, *[f"{b} vs Inductor" for b in backends],
              *[f"{b} vs ATen pool" for b in backends], "checks"]
    return table(rows, header) + "\n\n" + alone


def backwards_alone(device: str, backends: list[str], batch: int,
                    timer: Callable[[dict[str, Callable[[], Any]]], dict[str, float]]) -> str:
    """The backwards of overlapping windows alone (3x3/2, padding 1, 64x112x112): ATen's kernel
    (eager) against ember's gather form, a pointwise kernel over the input (ATen's kernel too on
    CPU tensors unless --padded-on-cpu)."""
    aten = torch.ops.aten
    rows = []
    for channels_last in (False, True):
        x = torch.randn(batch, 64, 112, 112, device=device)
        x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
        _, index = F.max_pool2d_with_indices(x, 3, 2, 1)
        grad = torch.randn_like(index, dtype=x.dtype)  # (laid out as the pooling's result)
        ops = {"max": lambda g, x, i: aten.max_pool2d_with_indices_backward(g, x, [3, 3], [2, 2], [1, 1], [1, 1],
                                                                            False, i),
               "avg, count_include_pad=False": lambda g, x, i: aten.avg_pool2d_backward(
                   g, x, [3, 3], [2, 2], [1, 1], False, False, None)}
        for name, op in ops.items():
            fns: dict[str, Callable[..., Any]] = {"eager": op}
            notes = []
            for b in backends:
                report = ember.Report()
                fns[b] = ember.compile(op, options={"gpu_backend": b} if device == "cuda" else {}, report=report)
                got, want = fns[b](grad, x, index), op(grad, x, index)
                differ = f"differs: max |diff| / max |eager| {((got - want).abs().max() / want.abs().max()).item():.1e}"
                same = torch.equal(got, want)
                notes.append(f"{b}: {'bit-exact' if same else differ}, {len(report.kernels)} kernel(s)"
                             + (f", ATen: {', '.join(sorted(set(report.fallbacks)))}" if report.fallbacks else ""))
            ms = timer({k: (lambda f=f, args=(grad, x, index): f(*args)) for k, f in fns.items()})
            rows.append((f"{name} 3x3/2 pad 1 bwd, {batch}x64x112x112 f32{' NHWC' if channels_last else ''}",
                         *[f"{ms[k] * 1e3:.1f}" for k in fns], *[f"{ms['eager'] / ms[b]:.2f}x" for b in backends],
                         "; ".join(notes)))
            torch._dynamo.reset()
    return table(rows, ["backward alone", "ATen µs", *[f"ember-{b} µs" for b in backends],
                        *[f"{b} vs ATen" for b in backends], "checks"])


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backends", default="triton,cuda", help="GPU backends to time (cpu: one ember column)")
    p.add_argument("--batch", type=int, default=None, help="images a batch (default 64 on cuda, 4 on cpu)")
    p.add_argument("--only", default="", help="the cases whose names hold this text")
    p.add_argument("--padded-on-cpu", action="store_true", help="padded windows and overlapping backwards "
                   "decomposed on CPU tensors too")
    p.add_argument("--gathered-max-backward", action="store_true", help="overlapping max pooling backwards "
                   "gathered (ember keeps ATen's kernel by default: frontend/pool_decomps.py)")
    a = p.parse_args()
    from ember.frontend import pool_decomps
    pool_decomps.PADDED_ON_CPU |= a.padded_on_cpu
    pool_decomps.GATHERED_MAX_BACKWARD |= a.gathered_max_backward
    backends = [b for b in a.backends.split(",") if b] if a.device == "cuda" else ["cpp"]
    batch = a.batch or (64 if a.device == "cuda" else 4)
    where = f"{torch.cuda.get_device_name()}, torch {torch.__version__}" if a.device == "cuda" else machine()
    print(f"# pooling on {where}, batch {batch}" + (", padded windows decomposed on the CPU" * a.padded_on_cpu))
    print(run(a.device, backends, batch, a.only))
    return 0


if __name__ == "__main__":
    sys.exit(main())
