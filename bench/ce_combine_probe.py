"""What the cross-entropy forward kernel's loss costs on top of its rows: the kernel as ember
renders it, then with parts of its reduction over all rows changed (timing only: some variants
give wrong losses on purpose), and under a few launch configurations. One device call.

    PYTHONPATH=. python bench/ce_combine_probe.py
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_fusion import copy_bandwidth, kernel_times  # noqa: E402

import ember  # noqa: E402
from ember.codegen import triton as tr  # noqa: E402


def variant(name: str) -> Callable[[], None]:
    """Patch the renderer for one variant; returns the undo."""
    renderer = tr.TritonKernelRenderer
    emit, combine = renderer.emit, renderer._combine_rows

    def undo() -> None:
        renderer.emit, renderer._combine_rows = emit, combine

    if name == "shares only":  # each program stores its share; nobody combines them
        def shares_only(self: tr.TritonKernelRenderer) -> None:
            for i, v in enumerate(self.k.row_reductions):
                src = self.name(v.srcs[0])
                self.emit(f"tl.store(WORKSPACE + {i} * tl.num_programs(0) + tl.program_id(0) + tl.arange(0, 1), "
                          f"tl.sum(tl.where(xmask, {src}, 0), 0).to(tl.float64))")
        renderer._combine_rows = shares_only
    elif name == "release only":  # the counters' atomics without acquire
        renderer.emit = lambda self, line: emit(self, line.replace("sem='acq_rel'", "sem='release'"))
    elif name == "relaxed":
        renderer.emit = lambda self, line: emit(self, line.replace("sem='acq_rel'", "sem='relaxed'"))
    elif name == "max only":  # the online update keeps the max and drops the exp-sum
        renderer.emit = lambda self, line: None if " * tl.exp(row_max" in line else emit(self, line)
    elif name == "sum, no exp":  # the sum of the raw chunk, no exp and no rescale
        def sum_only(self: tr.TritonKernelRenderer, line: str) -> None:
            if " * tl.exp(row_max" in line:
                acc = line.split(" = ")[0].strip()
                line = f"{acc} = {acc} + tl.sum(tl.where(xmask & rmask, v1, 0.0), 1)[:, None]"
            emit(self, line)
        renderer.emit = sum_only
    elif name == "no row max store":
        renderer.emit = lambda self, line: None if line.startswith("tl.store(buf0 + (o0)") else emit(self, line)
    return undo


def main() -> None:
    from triton.testing import do_bench
    os.environ.setdefault("EMBER_CACHE_DIR", "/tmp/ember-ce-probe")
    torch.manual_seed(0)
    x = torch.randn(8192, 32000, device="cuda", dtype=torch.bfloat16)
    t = torch.randint(0, 32000, (8192,), device="cuda")
    ref = F.cross_entropy(x.double(), t)
    bw = copy_bandwidth()
    print(f"# {torch.cuda.get_device_name()}, copy {bw / 1e9:.0f} GB/s")
    runs: list[tuple[str, dict | None, str]] = [
        ("as rendered", None, ""), ("shares only", None, "shares only"), ("release only", None, "release only"),
        ("relaxed", None, "relaxed"), ("no row max store", None, "no row max store"),
        ("max only", None, "max only"), ("sum, no exp", None, "sum, no exp"),
        ("2,1024,2,3", dict(XBLOCK=2, RBLOCK=1024, num_warps=2, num_stages=3, PERSISTENT=False), ""),
        ("1,2048,2,3", dict(XBLOCK=1, RBLOCK=2048, num_warps=2, num_stages=3, PERSISTENT=False), ""),
        ("1,1024,1,4", dict(XBLOCK=1, RBLOCK=1024, num_warps=1, num_stages=4, PERSISTENT=False), ""),
        ("1,2048,1,3", dict(XBLOCK=1, RBLOCK=2048, num_warps=1, num_stages=3, PERSISTENT=False), ""),
        ("1,512,1,4", dict(XBLOCK=1, RBLOCK=512, num_warps=1, num_stages=4, PERSISTENT=False), ""),
    ]
    # what reading the logits costs with no softmax at all: ATen's row max and row sum
    for label, read in (("torch.amax(x, -1)", lambda: torch.amax(x, -1)), ("x.sum(-1)", lambda: x.sum(-1))):
        ms = do_bench(read, warmup=25, rep=200, return_mode="median")
        print(f"{label:>18}: {ms * 1e3:7.1f} us {100 * x.numel() * 2 / (ms * 1e-3) / bw:4.0f}% of copy  "
              f"{kernel_times(read, ())}", flush=True)
    for label, launch, patch in runs:
        undo = variant(patch)
        try:
            torch._dynamo.reset()
            # no AOTAutograd cache: every variant renders its kernels again
            options = {"aot_cache": False, **({"triton_launch": launch} if launch else {})}
            fn = ember.compile(lambda a, b: F.cross_entropy(a, b), options=options)
            out = fn(x, t)
            err = abs(out.double().item() - ref.item()) / abs(ref.item())
            ms = do_bench(lambda fn=fn: fn(x, t), warmup=25, rep=200, return_mode="median")
            print(f"{label:>18}: {ms * 1e3:7.1f} us {100 * x.numel() * 2 / (ms * 1e-3) / bw:4.0f}% of copy "
                  f"err {err:.1e}  {kernel_times(fn, (x, t))}", flush=True)
        finally:
            undo()


if __name__ == "__main__":
    main()
