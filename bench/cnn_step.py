"""A ResNet's training step, end to end: eager, Inductor and ember on the same model.

Plain torchvision-style ResNet code (no torchvision): a 7x7/2 stem convolution, BatchNorm, ReLU and
3x3/2 max pooling, BasicBlocks (two 3x3 convolutions with BatchNorm, a 1x1 strided convolution
where the shape changes) in four stages of strides 1, 2, 2, 2, global average pooling, a Linear
head and cross entropy. ``--width 64 --blocks 2`` is ResNet-18. In training mode (BatchNorm on
the batch's statistics), each compiled variant's loss, every parameter's gradient and the
BatchNorm running statistics after the step are checked against the eager model (same weights,
same inputs) over batch sizes that change (ember's graphs compiled at each: none after the first
few), then a forward + backward step and an eval-mode forward under ``torch.no_grad()`` are timed
(CUDA events, medians of interleaved rounds on the GPU; wall time on the CPU), the kernels of a
step counted (CUDA) and the ops of ember's forward that run through ATen listed (the convolutions).

``--dtype bf16`` runs the model under ``torch.autocast(device, dtype=torch.bfloat16)`` with float32
weights, as mixed-precision training does (the reference is eager under the same autocast).
Defaults: ResNet-18 at batch 64, 224x224 on CUDA; batch 8, 64x64, width 16 on the CPU.

    PYTHONPATH=. python bench/cnn_step.py [--device cuda|cpu] [--dtype f32|bf16] [--channels-last]
                                          [--batch N] [--image 224] [--width 64] [--blocks 2]
                                          [--reps 20] [--variants eager,inductor,ember] [--check-sizes 5]
"""

from __future__ import annotations

import argparse
import contextlib
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench.common import interleaved_gpu_times, machine, median_times, rel_error, table


def conv_bn(cin: int, cout: int, k: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1, self.conv2 = conv_bn(cin, cout, 3, stride), conv_bn(cout, cout, 3, 1)
        self.down = conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv2(F.relu(self.conv1(x)))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    def __init__(self, width: int = 64, blocks: int = 2, classes: int = 1000):
        super().__init__()
        self.stem = conv_bn(3, width, 7, 2)
        layers, cin = [], width
        for i, stride in enumerate((1, 2, 2, 2)):
            cout = width * 2 ** i
            layers += [BasicBlock(cin if b == 0 else cout, cout, stride if b == 0 else 1) for b in range(blocks)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.stem(x)), 3, 2, padding=1)
        logits = self.fc(torch.flatten(F.adaptive_avg_pool2d(self.layers(x), 1), 1))
        return logits if targets is None else F.cross_entropy(logits.float(), targets)


def step(model: nn.Module, fn: Callable[..., torch.Tensor], x: torch.Tensor, y: torch.Tensor,
         amp: contextlib.AbstractContextManager[Any]) -> torch.Tensor:
    """zero_grad (set_to_none), forward with the loss, backward; no optimizer step (as gpt_step)."""
    model.zero_grad(set_to_none=True)
    with amp:
        loss = fn(x, y)
    loss.backward()
    return loss


def errors(model: nn.Module, loss: float, ref: nn.Module, loss_ref: float) -> tuple[float, float, float]:
    """Relative errors against ``ref``: (the loss's, the worst parameter gradient's, the worst
    BatchNorm buffer's after the step)."""
    grads = max(rel_error(p.grad, r.grad) for p, r in zip(model.parameters(), ref.parameters()))
    bufs = max(rel_error(b, r) for b, r in zip(model.buffers(), ref.buffers()))
    return abs(loss - loss_ref) / abs(loss_ref), grads, bufs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"], help="bf16: under torch.autocast")
    ap.add_argument("--channels-last", action="store_true", help="model and input in channels_last")
    ap.add_argument("--batch", type=int, default=None, help="images a batch (default 64 on cuda, 8 on cpu)")
    ap.add_argument("--image", type=int, default=None, help="image side (default 224 on cuda, 64 on cpu)")
    ap.add_argument("--width", type=int, default=None, help="first stage's channels (default 64 on cuda, 16 on cpu)")
    ap.add_argument("--blocks", type=int, default=2, help="BasicBlocks a stage (2: ResNet-18)")
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--check-sizes", type=int, default=5,
                    help="batch sizes the correctness check steps through (1: the full batch only; each new size "
                    "may cost Inductor a compile)")
    ap.add_argument("--top-kernels", type=int, default=0,
                    help="also print each variant's N costliest GPU kernels of a step")
    ap.add_argument("--variants", default="eager,inductor,ember",
                    help="from eager, inductor, ember; ember-<backend> picks ember's GPU backend (ember-cuda)")
    a = ap.parse_args()
    import ember

    dev, cuda = a.device, a.device == "cuda"
    batch, image = a.batch or (64 if cuda else 8), a.image or (224 if cuda else 64)
    width = a.width or (64 if cuda else 16)
    bf16 = a.dtype == "bf16"
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format

    def amp() -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(dev, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    def fresh() -> nn.Module:
        model = ResNet(width, a.blocks, a.classes).to(dev, memory_format=fmt)
        model.load_state_dict(init)
        return model.train()

    torch.manual_seed(0)
    init = {k: v.clone() for k, v in ResNet(width, a.blocks, a.classes).to(dev).state_dict().items()}
    ref = fresh()
    names = [n.strip() for n in a.variants.split(",") if n.strip()]
    models: dict[str, nn.Module] = {}
    fns: dict[str, Callable[..., torch.Tensor]] = {}
    for name in names:
        models[name] = fresh()
        if name == "eager":
            fns[name] = models[name]
        elif name == "inductor":
            fns[name] = torch.compile(models[name], dynamic=True)
        elif name.startswith("ember"):
            backend = name.partition("-")[2]
            fns[name] = ember.compile(models[name], options={"gpu_backend": backend} if backend else None)
        else:
            raise SystemExit(f"unknown variant {name!r}: eager, inductor, ember or ember-<backend>")

    def inputs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, 3, image, image, generator=g).to(dev).contiguous(memory_format=fmt)
        return x, torch.randint(0, a.classes, (n,), generator=g).to(dev)

    # correctness over changing batch sizes (each step from the initial weights and statistics).
    # bf16: eager under autocast is itself far from float32 on a small untrained ResNet (BatchNorm's
    # backward cancels), so a variant is checked against eager float32 too: no further from it than
    # 2x eager bf16's own distance (or 2e-2)
    tol = 2e-2 if bf16 else 1e-4
    sizes = list(dict.fromkeys(max(2, n) for n in (batch, batch - 1, batch // 2 + 1, batch - 2, batch)
                               [:max(1, a.check_sizes)]))
    rows, bad = [], []
    ref32 = fresh()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, n in enumerate(sizes):
            x, y = inputs(n, i)
            ref.load_state_dict(init)
            loss_ref = step(ref, ref, x, y, amp()).item()
            if bf16:
                ref32.load_state_dict(init)
                loss32 = step(ref32, ref32, x, y, contextlib.nullcontext()).item()
                limit = max(tol, 2 * max(errors(ref, loss_ref, ref32, loss32)))
            for name, fn in fns.items():
                models[name].load_state_dict(init)
                graphs = ember.stats().get("graphs_compiled", 0)
                start = time.perf_counter()
                loss = step(models[name], fn, x, y, amp()).item()
                first = (time.perf_counter() - start) * 1e3
                errs = errors(models[name], loss, ref, loss_ref)
                if bf16:
                    vs32 = max(errors(models[name], loss, ref32, loss32))
                    ok = vs32 <= limit
                    check = f"{vs32:.1e} {'<=' if ok else '>'} {limit:.1e}"
                else:
                    ok = max(errs) <= tol
                    check = f"{max(errs):.1e} {'<=' if ok else '>'} {tol:g}"
                if not ok:
                    bad.append(f"{name} at batch {n}: {check}")
                compiled = ember.stats().get("graphs_compiled", 0) - graphs
                rows.append((name, str(n), f"{loss:.5f}", *[f"{e:.1e}" for e in errs],
                             f"{'ok' if ok else 'WRONG'} ({check})", f"{first:.0f}",
                             str(compiled) if name.startswith("ember") else "-"))
        # the eval-mode forward (running statistics) against eager's, compiling its graphs too
        x, y = inputs(batch, 0)
        ref.eval()
        with torch.no_grad(), amp():
            logits_ref = ref(x)
            for name in fns:
                models[name].eval()
                err = rel_error(fns[name](x).float(), logits_ref.float())
                models[name].train()
                if err > tol:
                    bad.append(f"{name} eval forward: {err:.1e} > {tol:g}")
    where = f"{torch.cuda.get_device_name()}, torch {torch.__version__}" if cuda else machine()
    layout = ", channels_last" if a.channels_last else ""
    print(f"{where}, {a.dtype}{' (autocast)' * bf16}{layout}; ResNet width {width}, "
          f"{a.blocks} blocks a stage, batch {batch}, {image}x{image}")
    print(table(rows, ["variant", "batch", "loss", "loss rel err", "worst grad rel err", "BN stats rel err",
                       "check (bf16: worst vs eager f32)" if bf16 else "check (worst)", "step ms (first: compile)",
                       "ember graphs compiled"]))
    stats = ember.stats()
    print("ember:", {k: stats[k] for k in ("graphs_compiled", "graph_fallbacks", "build_failures")
                     if isinstance(stats.get(k), int)},
          "warnings:", sorted({str(w.message)[:160] for w in caught}))
    print("mismatches (training steps above; eval-mode logits against eager's, within "
          f"{tol:g}): " + ("; ".join(bad) or "none"))

    # speed at the full batch: a training step, then an eval-mode forward without autograd
    if cuda and hasattr(ember, "wait_for_kernels"):
        ember.wait_for_kernels()
    x, y = inputs(batch, 0)

    def timer(variants: dict[str, Callable[[], Any]]) -> dict[str, float]:  # ms a call
        if cuda:
            return interleaved_gpu_times(variants, rounds=5, rep_ms=50)
        return {k: s * 1e3 for k, s in median_times(variants, reps=a.reps, warmup=3).items()}

    t_train = timer({n: (lambda n=n: step(models[n], fns[n], x, y, amp())) for n in fns})

    def forward(n: str) -> None:
        with torch.no_grad(), amp():
            fns[n](x)

    for model in models.values():
        model.eval()
    t_infer = timer({n: (lambda n=n: forward(n)) for n in fns})
    for model in models.values():
        model.train()
    kernels: dict[str, tuple[int, int]] = {}
    if cuda:
        from bench.common import profiled_kernels
        for n in fns:
            k = profiled_kernels(lambda n=n: step(models[n], fns[n], x, y, amp()), n=3)
            kernels[n] = (round(sum(k.values())), len(k))
            if a.top_kernels:
                print(f"\n{n}: costliest kernels of a step, GPU µs")
                for name, us in sorted(k.items(), key=lambda kv: -kv[1])[:a.top_kernels]:
                    print(f"  {us:9.1f}  {name}")

    def vs(t: dict[str, float], n: str) -> str:
        return f"{t['inductor'] / t[n]:.2f}x" if "inductor" in t else "-"

    rows = [(n, f"{t_train[n]:.2f}", vs(t_train, n), f"{t_infer[n]:.2f}", vs(t_infer, n), str(kernels.get(n, "-")))
            for n in fns]
    how = "CUDA events, medians of 5 interleaved rounds" if cuda else f"wall time, medians of {a.reps} interleaved"
    print(f"\nbatch {batch}: ms a call ({how})")
    print(table(rows, ["variant", "fwd+bwd ms", "vs Inductor", "eval fwd ms (no_grad)", "vs Inductor",
                       "(GPU µs, distinct kernels) a step"]))

    # what ember's eval-mode forward leaves to ATen (explain clears Dynamo's caches: last)
    ember_names = [n for n in fns if n.startswith("ember")]
    if ember_names:
        backend = ember_names[0].partition("-")[2]
        model = models[ember_names[0]].eval()
        with torch.no_grad(), amp():
            report = ember.explain(lambda x: model(x), x, options={"gpu_backend": backend} if backend else None)
        calls: dict[str, int] = {}
        for f in report.fallbacks:
            calls[f] = calls.get(f, 0) + 1
        print(f"\n{ember_names[0]} eval forward: {len(report.kernels)} kernel(s), {len(report.fallbacks)} ATen "
              f"call(s): " + ", ".join(f"{op} x{c}" for op, c in sorted(calls.items())))


if __name__ == "__main__":
    main()
