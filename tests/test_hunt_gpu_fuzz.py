"""Found by bench/fuzz.py on an H200 (random programs through ember's GPU backends against
eager): a CUDA C++ row kernel over gathered rows (``x[idx]`` reduced per row) computed its
vector head from the row's start, which holds the gathered index, before the loop that loads
it; the kernel did not build and its ops ran through ATen."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember

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


def _norm_weight_also_summed(x, w, rms):
    """A LayerNorm's weight also reduced over its own elements: the weight's gradient is a column
    sum over x's rows (outer: the columns) beside the gradient of ``w * w.sum()`` (or a
    hand-written RMSNorm of w), whose sum over the same columns each column then needs."""
    normed = F.layer_norm(x, (w.shape[0],), w)  # (first: in the other order the plan differs)
    if rms:
        return normed, w * torch.rsqrt(w.pow(2).mean(-1, keepdim=True) + 1e-6)
    return normed, w * w.sum()


@pytest.mark.filterwarnings("error:ember")  # (the CPU kernel did not build: a warning, and ATen)
@pytest.mark.parametrize("rms", [False, True], ids=["sum", "rms"])
@pytest.mark.parametrize("options", [{}, {"target": "triton"}], ids=["default", "triton"])
def test_a_weight_gradient_beside_a_sum_over_the_same_columns(rms, options):
    """Found by the fuzzer's training runs: the column-sum kernel finished ``w.sum()`` after all
    columns and stored every column's gradient there, where no column is. C++ did not build
    ('o0' was not declared); Triton wrote garbage (1e37) or freed memory twice."""
    if options and DEVICE != "cpu":
        return  # (the Triton target on CPU tensors is the interpreter's)
    torch.manual_seed(0)
    x, w = torch.randn(20, 33, device=DEVICE), torch.randn(33, device=DEVICE)
    ups = [torch.randn(20, 33, device=DEVICE), torch.randn(33, device=DEVICE)]

    def grads(fn):
        ins = [x.clone().requires_grad_(), w.clone().requires_grad_()]
        outs = fn(*ins, rms)
        sum((o * u).sum() for o, u in zip(outs, ups)).backward()
        return [t.grad for t in ins]

    for got, want in zip(grads(ember.compile(_norm_weight_also_summed, options=options)),
                         grads(_norm_weight_also_summed)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_max_of_a_16_bit_chain_is_one_of_its_rounded_values(dtype):
    """Found by the fuzzer's training runs (both GPU backends, and the CPU): the max of a 16-bit
    chain was taken of its float32 values, unrounded between ops, where eager rounds each op; the
    max then equalled none of eager's values, and its backward, x == max over the column,
    divided the gradient by a count of 0: NaN."""
    torch.manual_seed(0)
    x = torch.randn(8, 33, device=DEVICE).to(dtype)

    def fn(x):
        y = x - x.flip(-1) + x
        return y.amax(0), y.amin(1)

    ref_x, out_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref, out = fn(ref_x), ember.compile(fn)(out_x)
    for got, want in zip(out, ref):
        assert torch.equal(got, want)  # (a max is one of the values: exact)
    sum(o.float().sum() for o in ref).backward()
    sum(o.float().sum() for o in out).backward()
    assert not out_x.grad.isnan().any()
    torch.testing.assert_close(out_x.grad, ref_x.grad)
