"""A decoder's KV-cache update, compiled: eager vs Inductor vs ember.

One decoding step of a static cache, as Hugging Face's ``StaticCache.update`` writes it:
``k_cache.index_copy_(2, positions, k)`` and the same for v, for a (batch, heads, length, dim)
cache, followed by a read of the updated cache (attention scores of the new query against it,
``q @ k_cache.transpose(-1, -2)``). The new token's keys and values are a few KB; the caches are
hundreds of MB. A compiled step that copies the whole cache in and out costs milliseconds where
the write itself costs microseconds. Correctness first (caches and scores against eager after a
step at each of three positions), then the step timed at a fixed position (CUDA events on the
GPU, wall time on the CPU; medians of interleaved runs). ``--write slice`` writes the new entries
as a slice at a Python int position instead (``k_cache[:, :, t:t + 1] = k``), which Dynamo traces
as a slice_scatter copied into the cache.

    PYTHONPATH=. python bench/cache_update.py [--device cuda|cpu] [--batch 8] [--heads 32]
                                              [--length 4096] [--dim 128] [--dtype bf16]
                                              [--write index_copy|slice]
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable
from typing import Any

import torch

from bench.common import interleaved_gpu_times, machine, median_times, rel_error, table

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def step(k_cache: torch.Tensor, v_cache: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
         positions: torch.Tensor) -> torch.Tensor:
    k_cache.index_copy_(2, positions, k)
    v_cache.index_copy_(2, positions, v)
    return q @ k_cache.transpose(-1, -2)


def slice_step(k_cache: torch.Tensor, v_cache: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               position: int) -> torch.Tensor:
    k_cache[:, :, position:position + 1] = k
    v_cache[:, :, position:position + 1] = v
    return q @ k_cache.transpose(-1, -2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=None, help="default 8 on CUDA, 1 on the CPU")
    parser.add_argument("--heads", type=int, default=None, help="default 32 on CUDA, 8 on the CPU")
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--variants", default="eager,inductor,ember")
    parser.add_argument("--write", choices=["index_copy", "slice"], default="index_copy")
    args = parser.parse_args()
    args.batch = args.batch or (8 if args.device == "cuda" else 1)
    args.heads = args.heads or (32 if args.device == "cuda" else 8)
    warnings.filterwarnings("ignore", message=".*TF32.*")
    import ember

    dtype, device = DTYPES[args.dtype], args.device
    shape = (args.batch, args.heads, args.length, args.dim)
    print(f"# KV-cache step ({args.write}), caches {shape} {args.dtype} on {device}; {machine()}")
    step_fn = step if args.write == "index_copy" else slice_step
    at = (lambda p: torch.tensor([p], device=device)) if args.write == "index_copy" else (lambda p: p)
    g = torch.Generator().manual_seed(0)
    new = lambda *s: torch.randn(*s, generator=g).to(device, dtype)  # noqa: E731
    k_cache0, v_cache0 = new(*shape), new(*shape)
    token = (args.batch, args.heads, 1, args.dim)
    q, k, v = new(*token), new(*token), new(*token)

    compiled: dict[str, Callable[..., Any]] = {"eager": step_fn, "inductor": torch.compile(step_fn),
                                                "ember": ember.compile(step_fn)}
    rows, calls = [], {}
    for name in args.variants.split(","):
        fn = compiled[name]
        caches, ref_caches = (k_cache0.clone(), v_cache0.clone()), (k_cache0.clone(), v_cache0.clone())
        worst = 0.0
        for pos in (0, args.length // 2, args.length - 1):
            positions = at(pos)
            out = fn(*caches, q, k, v, positions)
            ref = step_fn(*ref_caches, q, k, v, positions)
            worst = max(worst, rel_error([out, *caches], [ref, *ref_caches]))
        positions = at(args.length // 3)
        calls[name] = lambda fn=fn, caches=caches, positions=positions: fn(*caches, q, k, v, positions)
        rows.append([name, f"{worst:.1e}"])
    if device == "cuda":
        times = {n: t * 1e3 for n, t in interleaved_gpu_times(calls).items()}
    else:
        times = {n: t * 1e6 for n, t in median_times(calls, reps=args.reps).items()}
    for row in rows:
        row += [f"{times[row[0]]:.1f}", f"{times['eager'] / times[row[0]]:.2f}x" if "eager" in times else ""]
    cache_mb = 2 * k_cache0.numel() * k_cache0.element_size() / 2**20
    print(f"(the two caches: {cache_mb:.0f} MB)")
    print(table(rows, ["variant", "rel. error (3 positions)", "µs / step", "vs eager"]))


if __name__ == "__main__":
    main()
