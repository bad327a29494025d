"""A small GPT's training step, end to end: eager, Inductor and ember on the same model.

Plain PyTorch attention (q @ k^T, a causal mask, softmax, @ v), LayerNorm and a gelu MLP: what
a user writes before reaching for a fused attention kernel. Checks the loss and every
gradient against a float32 copy of the model, with sequence lengths that change every step (no
recompiles after the first few), then times a forward + backward step and a forward alone
(CUDA events, medians of interleaved rounds) and counts the kernels of a step.

    PYTHONPATH=. python bench/gpt_step.py [--device cuda] [--dtype bf16] [--layers 2] [--width 768]
"""

from __future__ import annotations

import argparse
import math
import re
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from bench.common import median_times, table


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        p = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + self.proj((p @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, width: int, heads: int, layers: int, max_len: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(max_len, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-1)


def step(model: nn.Module, fn, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    for p in model.parameters():
        p.grad = None
    loss = fn(idx, targets)
    loss.backward()
    return loss


def worst_error(model: nn.Module, ref: nn.Module) -> float:
    worst = 0.0
    for p, r in zip(model.parameters(), ref.parameters()):
        worst = max(worst, ((p.grad.double() - r.grad.double()).norm() / (r.grad.double().norm() + 1e-30)).item())
    return worst


def trace_kernels(run, pattern: str) -> None:
    """Print each CUDA kernel of one ``run()`` whose name matches ``pattern`` with its device µs, the
    op that launched it (and that op's callers) and the Python lines of the stack in ember or here."""
    from torch.profiler import ProfilerActivity, profile
    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                 with_stack=True) as prof:
        run()
        torch.cuda.synchronize()
    for e in prof.events():
        for k in getattr(e, "kernels", ()):
            if not re.search(pattern, k.name):
                continue
            chain, up = [], e
            while up is not None and len(chain) < 6:
                chain.append(f"{up.name}{list(up.input_shapes) if up.input_shapes else ''}")
                up = up.cpu_parent
            frames = [f for f in (e.stack or []) if "ember" in f or "gpt_step" in f or "torch/_" in f][:10]
            print(f"  {k.name[:60]} {k.duration:.1f} µs\n    ops: {' <- '.join(chain)}")
            for f in frames:
                print(f"    {f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--backends", default="triton", help="ember GPU backends to time, e.g. triton,cuda")
    ap.add_argument("--profile", type=int, default=0, help="print each variant's N costliest kernels of a step")
    ap.add_argument("--host-profile", type=int, default=0, help="print the N functions with the most host time "
                    "over 20 steps of each ember variant (cProfile)")
    ap.add_argument("--trace", default="", help="for kernels whose name matches this regex, print the op and the "
                    "Python lines that launched them (ember variants)")
    a = ap.parse_args()
    import ember

    dev, dtype = a.device, {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    torch.manual_seed(0)
    ref = GPT(a.vocab, a.width, a.heads, a.layers, a.seq).to(dev)
    models = {"eager": GPT(a.vocab, a.width, a.heads, a.layers, a.seq).to(dev, dtype)}
    models["eager"].load_state_dict(ref.state_dict())
    fns = {"eager": models["eager"]}
    models["Inductor"] = GPT(a.vocab, a.width, a.heads, a.layers, a.seq).to(dev, dtype)
    models["Inductor"].load_state_dict(ref.state_dict())
    fns["Inductor"] = torch.compile(models["Inductor"], dynamic=True)
    for backend in a.backends.split(","):
        name = f"ember-{backend}"
        models[name] = GPT(a.vocab, a.width, a.heads, a.layers, a.seq).to(dev, dtype)
        models[name].load_state_dict(ref.state_dict())
        fns[name] = ember.compile(models[name], options={"gpu_backend": backend})

    # correctness over changing sequence lengths, then compiles and fallbacks
    rows = []
    lengths = [min(t, a.seq) for t in (a.seq // 4 + 1, a.seq // 2, 37, a.seq, a.seq // 2 + 3, 129)]
    stats0 = ember.stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t in lengths:
            idx = torch.randint(0, a.vocab, (a.batch, t), device=dev)
            tgt = torch.randint(0, a.vocab, (a.batch, t), device=dev)
            tgt[0, :3] = -1
            loss_ref = step(ref, ref, idx, tgt).item()
            for name, fn in fns.items():
                start = time.perf_counter()
                loss = step(models[name], fn, idx, tgt).item()
                first = (time.perf_counter() - start) * 1e3
                rows.append((name, str(t), f"{loss:.5f}", f"{abs(loss - loss_ref) / abs(loss_ref):.1e}",
                             f"{worst_error(models[name], ref):.1e}", f"{first:.0f}"))
    print(f"{torch.cuda.get_device_name() if dev == 'cuda' else dev}, torch {torch.__version__}, {a.dtype}, "
          f"{a.layers} layers of width {a.width}, batch {a.batch}")
    print(table(rows, ["variant", "T", "loss", "loss rel err", "worst grad rel err", "step ms (first: compile)"]))
    stats = ember.stats()
    print("ember:", {k: stats[k] - stats0.get(k, 0) for k in ("graphs_compiled", "graph_fallbacks", "build_failures")
                     if isinstance(stats.get(k), int)},
          "warnings:", sorted({str(w.message)[:160] for w in caught}))

    # speed at the full length
    idx = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    tgt = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)

    def sync(f):
        def run():
            f()
            if dev == "cuda":
                torch.cuda.synchronize()
        return run

    train = {n: sync(lambda n=n: step(models[n], fns[n], idx, tgt)) for n in fns}
    infer = {}
    for n in fns:
        def forward(n=n):
            with torch.no_grad():
                fns[n](idx, tgt)
        infer[n] = sync(forward)
    t_train = median_times(train, reps=a.reps, warmup=3)
    t_infer = median_times(infer, reps=a.reps, warmup=3)
    kernels = {}
    if dev == "cuda":
        from bench.common import profiled_kernels
        for n in fns:
            k = profiled_kernels(lambda n=n: step(models[n], fns[n], idx, tgt), n=3)
            kernels[n] = (round(sum(k.values())), len(k))
            if a.profile:
                top = sorted(k.items(), key=lambda kv: -kv[1])[:a.profile]
                print(f"{n}: the costliest kernels of a step (µs)")
                print(table([(name, f"{us:.1f}") for name, us in top], ["kernel", "µs"]))
        if a.trace:
            for n in fns:
                if n.startswith("ember"):
                    print(f"{n}: where the kernels matching {a.trace!r} come from")
                    trace_kernels(lambda n=n: step(models[n], fns[n], idx, tgt), a.trace)
    if a.host_profile:
        import cProfile
        import pstats
        for n in fns:
            if n.startswith("ember") or n == "Inductor":
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(20):
                    step(models[n], fns[n], idx, tgt)
                prof.disable()
                if dev == "cuda":
                    torch.cuda.synchronize()
                print(f"{n}: host time of 20 steps by function (cProfile)")
                pstats.Stats(prof).sort_stats("tottime").print_stats(a.host_profile)
    base_train, base_infer = t_train["Inductor"], t_infer["Inductor"]
    rows = [(n, f"{t_train[n] * 1e3:.2f}", f"{base_train / t_train[n]:.2f}x", f"{t_infer[n] * 1e3:.2f}",
             f"{base_infer / t_infer[n]:.2f}x", str(kernels.get(n, "-"))) for n in fns]
    print(f"T = {a.seq}: median ms over {a.reps} interleaved steps")
    print(table(rows, ["variant", "fwd+bwd ms", "vs Inductor", "fwd ms", "vs Inductor",
                       "(GPU µs, distinct kernels) a step"]))


if __name__ == "__main__":
    main()
