"""GPU check of writes at indices (index_put / index_add / scatter_add, atomics) and of segment
kernels (ember.ragged's per-row reductions, jagged softmax) on both GPU backends: results and
gradients against eager, the kernels each case compiles to, and the ragged GIoU loss's training
step timed against padded Inductor. One device call:

    python bench/gpu_scatter.py [--backends triton,cuda]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ember  # noqa: E402
from ember import ragged  # noqa: E402
from ember.ragged.segment import segment_mean, segment_sum  # noqa: E402
from ember.workloads.giou import make_batch, padded_giou_loss, ragged_giou_loss  # noqa: E402


def _cases(device: str) -> dict[str, tuple]:
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    def idx(high, n):
        return torch.randint(0, high, (n,), generator=g).to(device)

    return {
        "index_put acc f32": (lambda x, i, j, v: x.index_put((i, j), v * 2 + 1, accumulate=True),
                              (rand(512, 64), idx(512, 100_000), idx(64, 100_000), rand(100_000))),
        "index_put acc bf16": (lambda x, i, v: x.index_put((i,), v.sigmoid(), accumulate=True),
                               (rand(300, 128, dtype=torch.bfloat16), idx(300, 5000),
                                rand(5000, 128, dtype=torch.bfloat16))),
        "index_put acc i64": (lambda x, i, v: x.index_put((i,), v * 3, accumulate=True),
                              (torch.zeros(100, dtype=torch.int64, device=device), idx(100, 10_000),
                               idx(50, 10_000))),
        "index_put store": (lambda x, i, v: x.index_put((i,), v.exp()),
                            (rand(1000, 8), torch.randperm(1000, generator=g)[:300].to(device), rand(300, 8))),
        "index_add dim1": (lambda x, i, s: x.index_add(1, i, s, alpha=2), (rand(64, 40), idx(40, 200), rand(64, 200))),
        "scatter_add": (lambda x, i, s: x.scatter_add(1, i, s.tanh()),
                        (rand(128, 50), torch.randint(0, 50, (128, 70), generator=g).to(device), rand(128, 80))),
        "segment_sum bf16": (segment_sum, (ragged.from_list([rand(int(n), 96, dtype=torch.bfloat16)
                                                             for n in torch.randint(0, 40, (64,), generator=g)]),)),
        "segment_mean": (segment_mean, (ragged.from_list([rand(int(n), 96) for n in torch.randint(1, 40, (64,),
                                                                                                    generator=g)]),)),
        # rows far longer than a block's tile, and empty ones; features and none
        "segment_max long": (ragged.segment_max, (_long_rows(rand, g, (768,), torch.bfloat16),)),
        "segment_sum long f32": (segment_sum, (_long_rows(rand, g, (), torch.float32),)),
        "jagged_softmax long": (lambda r: ragged.jagged_softmax(r).values, (_long_rows(rand, g, (), torch.bfloat16),)),
    }


def _long_rows(rand, g, feature, dtype) -> ragged.Ragged:
    lengths = [0, 1, 5000, 0, 3, 700, 129, 64] + torch.randint(0, 300, (56,), generator=g).tolist()
    return ragged.from_list([rand(int(n), *feature, dtype=dtype) for n in lengths])


def check_gradients(backend: str, device: str) -> list[tuple[str, bool, int, str]]:
    """Training through segment kernels: gradients against eager's, kernels forward / backward."""
    g = torch.Generator(device="cpu").manual_seed(1)

    def rand(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    cases = {"grad segment_mean": (segment_mean, (96,)), "grad segment_max": (ragged.segment_max, (96,)),
             "grad jagged_softmax": (lambda r: ragged.jagged_softmax(r).values, ())}
    rows = []
    for name, (fn, feature) in cases.items():
        r = _long_rows(rand, g, feature, torch.float32)
        try:
            report = ember.Report()
            compiled = ember.compile(fn, options={"gpu_backend": backend}, report=report)
            grads = []
            for f in (compiled, fn):
                leaf = r.values.clone().requires_grad_()
                out = f(ragged.Ragged(leaf, r.offsets, r.max_length))
                out.backward(torch.ones_like(out).normal_(generator=torch.Generator(device).manual_seed(2)))
                grads.append(leaf.grad)
            kernels = "/".join(str(len(gr.kernels)) for gr in report.graphs)
            rows.append((name, _close(*grads), kernels, ", ".join(report.fallbacks) or "-"))
        except Exception as e:  # noqa: BLE001 -- a broken case is a row of the table
            rows.append((name, False, 0, f"{type(e).__name__}: {str(e)[:120]}"))
    return rows


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    if not a.dtype.is_floating_point:
        return torch.equal(a, b)
    tol = 2e-2 if a.dtype in (torch.bfloat16, torch.float16) else 1e-4
    return torch.allclose(a.float(), b.float(), rtol=tol, atol=tol)


def check_cases(backend: str, device: str) -> list[tuple[str, bool, int, str]]:
    rows = []
    for name, (fn, args) in _cases(device).items():
        report = ember.Report()
        try:
            out = ember.compile(fn, options={"gpu_backend": backend}, report=report)(*args)
            ok = _close(out, fn(*args))
            rows.append((name, ok, len(report.kernels), ", ".join(report.fallbacks) or "-"))
        except Exception as e:  # noqa: BLE001 -- a broken case is a row of the table
            rows.append((name, False, 0, f"{type(e).__name__}: {str(e)[:120]}"))
    return rows


def giou_training(backend: str, device: str, batch: int = 1024) -> dict[str, object]:
    """The ragged GIoU loss's fwd+bwd: gradient against eager, kernels, launches, time."""
    pred, targets, padded = make_batch(batch, dtype=torch.bfloat16, seed=0)
    pred, padded = pred.to(device), padded.to(device)
    targets = ragged.from_list([t.to(device) for t in targets])
    report = ember.Report()
    fast = ember.compile(ragged_giou_loss, options={"gpu_backend": backend}, report=report)
    mine, ref = pred.clone().requires_grad_(), pred.clone().float().requires_grad_()
    fast(mine, targets).backward()
    ragged_giou_loss(ref, ragged.Ragged(targets.values.float(), targets.offsets)).backward()
    err = ((mine.grad.float() - ref.grad).abs().max() / ref.grad.abs().max().clamp_min(1e-12)).item()

    def step(fn, p, t):
        p.grad = None
        fn(p, t).backward()

    leaf = pred.clone().requires_grad_()
    inductor = torch.compile(padded_giou_loss, dynamic=False)
    pleaf = pred.clone().requires_grad_()
    timings = {}
    for label, run in (("ember(ragged)", lambda: step(fast, leaf, targets)),
                       ("Inductor(pad)", lambda: step(inductor, pleaf, padded))):
        for _ in range(5):
            run()
        torch.cuda.synchronize()
        times = []
        for _ in range(50):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        timings[label] = sorted(times)[len(times) // 2]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step(fast, leaf, targets)
        torch.cuda.synchronize()
    launches = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return {"grad_rel_err": err, "kernels": [(g.kind, len(g.kernels), g.fallbacks) for g in report.graphs],
            "launches": launches, **{f"{k} us": round(v, 1) for k, v in timings.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="triton,cuda")
    args = parser.parse_args()
    device = "cuda"
    print(torch.cuda.get_device_name(), torch.__version__)
    failed = 0
    for backend in args.backends.split(","):
        print(f"\n== {backend}")
        print(f"{'case':22} {'ok':4} {'kernels':8} ATen")
        for name, ok, n, fallbacks in check_cases(backend, device) + check_gradients(backend, device):
            failed += not ok
            print(f"{name:22} {'yes' if ok else 'NO':4} {n:<8} {fallbacks}")
        try:
            print("ragged GIoU fwd+bwd:", giou_training(backend, device))
        except Exception as e:  # noqa: BLE001
            failed += 1
            print(f"ragged GIoU fwd+bwd failed: {type(e).__name__}: {e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
