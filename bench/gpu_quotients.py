"""GPU: what IEEE float32 division costs, and what the approximate one got wrong.

    python bench/gpu_quotients.py [--scale 1.0]

Triton's float32 ``/`` is div.full.f32 (2 ulp); eager's is IEEE (nvcc's default), and so is
ember's since the fuzzer found a trunc division off by one. This times, interleaved (CUDA-event
medians, ms), cases whose kernels divide in float32 element by element (softmax of bfloat16 rows
divides in float32 before rounding), eager against Inductor and ember's two GPU backends, and
counts the elements whose bits differ from eager's. Run it under two trees with
bench/ab_trees.sh to see the change's cost.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import interleaved_gpu_times, table  # noqa: E402

import ember  # noqa: E402


def giou_terms(p, t):
    # torchvision's GIoU terms for (N, 4) boxes: three float32 quotients an element
    x1, y1 = torch.maximum(p[:, 0], t[:, 0]), torch.maximum(p[:, 1], t[:, 1])
    x2, y2 = torch.minimum(p[:, 2], t[:, 2]), torch.minimum(p[:, 3], t[:, 3])
    inter = (x2 - x1).clamp(min=0) * (y2 - y1).clamp(min=0)
    union = (p[:, 2] - p[:, 0]) * (p[:, 3] - p[:, 1]) + (t[:, 2] - t[:, 0]) * (t[:, 3] - t[:, 1]) - inter
    iou = inter / (union + 1e-7)
    ex = (torch.maximum(p[:, 2], t[:, 2]) - torch.minimum(p[:, 0], t[:, 0])) * \
         (torch.maximum(p[:, 3], t[:, 3]) - torch.minimum(p[:, 1], t[:, 1]))
    return 1 - iou + (ex - union) / (ex + 1e-7)


def boxes(n: int) -> torch.Tensor:
    xy = torch.rand(n, 2, device="cuda")
    return torch.cat([xy, xy + torch.rand(n, 2, device="cuda")], 1)


def cases(scale: float) -> dict:
    r = lambda n: max(1, int(n * scale))  # noqa: E731
    cuda = {"device": "cuda"}
    return {
        "x / y f32 64M": (lambda x, y: x / y,
                          lambda: (torch.randn(r(64 << 20), **cuda), torch.randn(r(64 << 20), **cuda))),
        "floor(x / w) f32 64M": (lambda x, w: torch.floor(x / w),
                                 lambda: (torch.randn(r(64 << 20), **cuda) * 100, torch.full((1,), 0.1, **cuda))),
        "softmax bf16 16384x4096": (lambda x: F.softmax(x, -1),
                                    lambda: (torch.randn(r(16384), 4096, dtype=torch.bfloat16, **cuda),)),
        "softmax f32 8192x4096": (lambda x: F.softmax(x, -1), lambda: (torch.randn(r(8192), 4096, **cuda),)),
        "giou terms f32 16M boxes": (giou_terms, lambda: (boxes(r(16 << 20)), boxes(r(16 << 20)))),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--scale", type=float, default=1.0, help="shrink the problem sizes (smoke runs)")
    args = p.parse_args()
    torch.manual_seed(0)
    rows = []
    for name, (fn, make) in cases(args.scale).items():
        inputs = make()
        variants = {"eager": fn, "inductor": torch.compile(fn)}
        for backend in ("triton", "cuda"):
            variants[f"ember-{backend}"] = ember.compile(fn, options={"gpu_backend": backend})
        times = interleaved_gpu_times({k: (lambda v=v, a=inputs: v(*a)) for k, v in variants.items()})
        # (counted after the timing: ember's first calls run through ATen while its kernels build)
        ref = fn(*inputs)
        differ = {}
        for k, v in variants.items():
            out = v(*inputs)
            differ[k] = int((out != ref).sum() - (out.isnan() & ref.isnan()).sum())
        rows.append([name] + [f"{times[k]:.3f} ({differ[k]})" for k in variants])
        inputs = ref = out = None
        torch.cuda.empty_cache()
    print(f"{torch.cuda.get_device_name()}: ms, CUDA-event medians; (elements whose bits differ from eager's)")
    print(table(rows, ["case", "eager", "inductor", "ember-triton", "ember-cuda"]))


if __name__ == "__main__":
    main()
