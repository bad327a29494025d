"""Does software-pipelining a row kernel's loop help? Triton pipelines a loop's loads (cp.async
into shared memory, ``num_stages`` iterations in flight) only when the loop is a
``tl.range(..., num_stages=S)``: the kernel-wide ``num_stages`` pipelines loads feeding a ``dot``
and nothing else. ember's row loops are plain ``range``s, so each iteration's loads wait for the
previous one's reductions. This probe renders the loops as ``tl.range`` with S stages and times
cross-entropy's forward (bf16 8192 x 32000, issue 3's case) and the ragged suite's segment mean
(issue 5's pooling) under a few launch configurations. One device call.

    PYTHONPATH=. python bench/loop_stages_probe.py [--cases ce,pool]
"""

from __future__ import annotations

import argparse
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


def pipelined(stages: int | None) -> Callable[[], None]:
    """Render every ``for roffset in range(...)`` as ``tl.range(..., num_stages=stages)``."""
    renderer = tr.TritonKernelRenderer
    emit = renderer.emit

    def undo() -> None:
        renderer.emit = emit

    if stages is not None:
        def emit_pipelined(self: tr.TritonKernelRenderer, line: str) -> None:
            if line.startswith("for roffset in range(") and line.rstrip().endswith("):"):
                head, _, comment = line.partition("#")
                args = head.strip()[len("for roffset in range("):-2]
                line = f"for roffset in tl.range({args}, num_stages={stages}):" + (f"  #{comment}" if comment else "")
            emit(self, line)
        renderer.emit = emit_pipelined
    return undo


def sweep(title: str, fn: Callable, args: tuple, nbytes: int, error: Callable, configs: list,
          stages_list: list[int | None], bw: float) -> None:
    """Compile ``fn`` under every (stages, launch configuration) and time it: the call
    (do_bench) and its kernels (profiler), the kernels' bandwidth against the copy's."""
    from triton.testing import do_bench
    print(f"\n{title}\n| stages | config (XBLOCK, RBLOCK, warps) | call us | kernels at % of copy | kernels |")
    print("|---|---|---|---|---|")
    for stages in stages_list:
        for cfg in configs:
            undo = pipelined(stages)
            try:
                torch._dynamo.reset()
                options: dict = {"aot_cache": False}
                if cfg is not None:
                    options["triton_launch"] = dict(XBLOCK=cfg[0], RBLOCK=cfg[1], num_warps=cfg[2], num_stages=1,
                                                    PERSISTENT=False)
                compiled = ember.compile(fn, options=options)
                with torch.no_grad():
                    err = error(compiled(*args))
                    ms = do_bench(lambda c=compiled: c(*args), warmup=25, rep=200, return_mode="median")
                    kt = kernel_times(compiled, args).split("\n")[0]
                us = sum(float(part.rsplit(" ", 1)[-1].rstrip("us")) for part in kt.split("; ")) if kt else 0.0
                print(f"| {stages} | {cfg or 'chosen'} | {ms * 1e3:.1f} | {100 * nbytes / (us * 1e-6) / bw:.0f} | "
                      f"{kt} (err {err:.0e}) |", flush=True)
            except Exception as e:  # noqa: BLE001 -- a probe: report and go on
                print(f"| {stages} | {cfg} | failed: {type(e).__name__}: {str(e)[:200]} |", flush=True)
            finally:
                undo()


def ce(bw: float, stages_list: list[int | None]) -> None:
    torch.manual_seed(0)
    x = torch.randn(8192, 32000, device="cuda", dtype=torch.bfloat16)
    t = torch.randint(0, 32000, (8192,), device="cuda")
    ref = F.cross_entropy(x.double(), t).item()
    configs = [None, (1, 1024, 1), (1, 2048, 1), (1, 2048, 2), (1, 4096, 4), (2, 1024, 2), (1, 4096, 2)]
    sweep("cross-entropy forward, bf16 8192 x 32000", lambda a, b: F.cross_entropy(a, b), (x, t), x.numel() * 2,
          lambda out: abs(out.double().item() - ref) / abs(ref), configs, stages_list, bw)


def pool(bw: float, stages_list: list[int | None]) -> None:
    import ragged_suite as suite
    case = suite.make_case("pool", suite.GPU_SIZES, torch.device("cuda"), torch.bfloat16)
    (r,) = case.ragged_args
    configs = [None, (128, 16, 4), (64, 32, 4), (128, 32, 4), (64, 64, 4), (256, 16, 4), (128, 16, 2)]
    sweep(f"pooling: {r.values.shape[0]} tokens x {r.values.shape[1]}", suite.pool_ragged, (r,),
          r.values.numel() * 2, lambda out: (out.double() - case.ref_out).abs().max().item(), configs, stages_list, bw)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="ce,pool")
    p.add_argument("--stages", default="none,2,3,4")
    args = p.parse_args()
    os.environ.setdefault("EMBER_CACHE_DIR", "/tmp/ember-loop-stages")
    stages = [None if s == "none" else int(s) for s in args.stages.split(",")]
    bw = copy_bandwidth()
    print(f"# {torch.cuda.get_device_name()}, copy {bw / 1e9:.0f} GB/s, torch {torch.__version__}")
    if "ce" in args.cases:
        ce(bw, stages)
    if "pool" in args.cases:
        pool(bw, stages)


if __name__ == "__main__":
    main()
