"""Found by bench/fuzz.py on an H200 (random programs through ember's GPU backends against
eager): a CUDA C++ row kernel over gathered rows (``x[idx]`` reduced per row) computed its
vector head from the row's start, which holds the gathered index, before the loop that loads
it; the kernel did not build and its ops ran through ATen."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .conftest import DEVICE
from .helpers import check
from .test_cuda import compile_batches, explain, needs_nvcc, sources


def _gathered_max(x):
    return x[torch.arange(0, 4, 3, device=x.device)].amax(dim=[1, 2])


def _gathered_layer_norm(x, w, b):
    return F.layer_norm(x.index_select(0, torch.tensor([2, 0], device=x.device)), (127,), w, b)


CASES = [(_gathered_max, lambda: (torch.randn(4, 33, 7, device=DEVICE),)),
         (_gathered_layer_norm, lambda: (torch.randn(3, 127, device=DEVICE, dtype=torch.float16),
                                         torch.randn(127, device=DEVICE, dtype=torch.float16),
                                         torch.randn(127, device=DEVICE, dtype=torch.float16)))]


@needs_nvcc
def test_rows_of_a_gather_compile_for_sm90(tmp_path):
    kernels = []
    for i, (fn, make) in enumerate(CASES):
        report = explain(fn, *(t.cpu() for t in make()))
        kernels += sources(report, f"g{i}")
    compile_batches(kernels, tmp_path, per_file=len(kernels))


def test_rows_of_a_gather_match_eager():
    for fn, make in CASES:
        check(fn, *make())
