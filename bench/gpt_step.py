"""A small GPT's training step, end to end: eager, Inductor and ember on the same model.

Plain PyTorch attention (q @ k^T, a causal mask, softmax, @ v), LayerNorm and a gelu MLP: what
a user writes before reaching for a fused attention kernel. Checks the loss and every
gradient against a float32 copy of the model, with sequence lengths that change every step (no
recompiles after the first few), then times a forward + backward step and a forward alone
(CUDA events, medians of interleaved rounds) and counts the kernels of a step.

``--model llama`` runs a Llama-style model instead: rotary positions, grouped-query attention through
``F.scaled_dot_product_attention`` (ATen's fused attention kernels), RMSNorm and a SwiGLU MLP.

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


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(width)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, -1)
    return torch.cat([-b, a], -1)


class LlamaBlock(nn.Module):
    """Rotary positions, grouped-query attention through F.scaled_dot_product_attention (its
    flash or memory-efficient kernel, run through ATen), RMSNorm and a SwiGLU MLP, no biases."""

    def __init__(self, width: int, heads: int, kv_heads: int):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, width // heads
        self.n1, self.n2 = RMSNorm(width), RMSNorm(width)
        self.q = nn.Linear(width, width, bias=False)
        self.kv = nn.Linear(width, 2 * kv_heads * self.hd, bias=False)
        self.o = nn.Linear(width, width, bias=False)
        hidden = 8 * width // 3 // 64 * 64
        self.gate, self.up = nn.Linear(width, hidden, bias=False), nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.n1(x)
        q = self.q(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        k, v = (z.view(b, t, self.kv_heads, self.hd).transpose(1, 2) for z in self.kv(h).chunk(2, -1))
        cos, sin = cos[:t].to(x.dtype), sin[:t].to(x.dtype)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, d))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, vocab: int, width: int, heads: int, layers: int, max_len: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(LlamaBlock(width, heads, max(1, heads // 3)) for _ in range(layers))
        self.norm, self.head = RMSNorm(width), nn.Linear(width, vocab, bias=False)
        hd = width // heads
        freq = torch.outer(torch.arange(max_len).float(), 1.0 / 10000 ** (torch.arange(0, hd, 2).float() / hd))
        self.register_buffer("cos", torch.cat([freq, freq], -1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat([freq, freq], -1).sin(), persistent=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-1)


MODELS = {"gpt": GPT, "llama": Llama}


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
    ap.add_argument("--model", default="gpt", choices=sorted(MODELS),
                    help="gpt: attention written out, LayerNorm, gelu; llama: rotary positions, grouped-query "
                    "F.scaled_dot_product_attention, RMSNorm, SwiGLU")
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
    model_class = MODELS[a.model]
    ref = model_class(a.vocab, a.width, a.heads, a.layers, a.seq).to(dev)
    models = {"eager": model_class(a.vocab, a.width, a.heads, a.layers, a.seq).to(dev, dtype)}
    models["eager"].load_state_dict(ref.state_dict())
    fns = {"eager": models["eager"]}
    models["Inductor"] = model_class(a.vocab, a.width, a.heads, a.layers, a.seq).to(dev, dtype)
    models["Inductor"].load_state_dict(ref.state_dict())
    fns["Inductor"] = torch.compile(models["Inductor"], dynamic=True)
    # (on a CPU every ember variant is the C++ backend: one of them, named so)
    for backend in a.backends.split(",") if torch.device(dev).type == "cuda" else ["cpp"]:
        name = f"ember-{backend}"
        models[name] = model_class(a.vocab, a.width, a.heads, a.layers, a.seq).to(dev, dtype)
        models[name].load_state_dict(ref.state_dict())
        fns[name] = ember.compile(models[name], options={"gpu_backend": backend} if backend != "cpp" else None)

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
          f"{a.model}, {a.layers} layers of width {a.width}, batch {a.batch}")
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
