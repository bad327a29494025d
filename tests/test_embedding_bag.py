"""embedding_bag (nn.EmbeddingBag) in sum and mean modes: a gather reduced per bag, forward and
backward, against eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember

from .conftest import DEVICE
from .helpers import assert_clean, assert_same, compile_checked, on_the_interpreter
from .test_cuda import compile_batches, explain, needs_nvcc, sources

# bags of 3, 0, 5, 1 and 0 indices (empty ones in the middle and at the end)
LENGTHS = [3, 0, 5, 1, 0]


@pytest.fixture(autouse=True)
def _generated_on_the_cpu_too(monkeypatch):
    # (the CPU keeps ATen's op unless asked: test_the_cpu_keeps_aten_s_op_by_default)
    monkeypatch.setattr(ember.config, "cpu_embedding_bag", True)


def bags(lengths: list[int], rows: int = 12, dtype: torch.dtype = torch.int64, last: bool = False,
         device: str = DEVICE) -> tuple[torch.Tensor, torch.Tensor]:
    total = sum(lengths)
    indices = torch.randint(0, rows, (total,), dtype=dtype, device=device)
    starts = torch.tensor([0, *lengths], device=device).cumsum(0).to(dtype)
    return indices, starts if last else starts[:-1]


def grads(fn, *args):
    """fn(*args) and the gradients of its sum (times a fixed random tensor) to the float args."""
    out = fn(*args)
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
    return out, torch.autograd.grad((out * weight).sum(), leaves)


def leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(True)


@pytest.mark.parametrize("mode, dtype, last", [
    ("sum", torch.float32, False), ("mean", torch.float32, True), ("sum", torch.float64, True),
    ("mean", torch.bfloat16, False), ("sum", torch.bfloat16, True), ("mean", torch.float16, True)])
def test_forward_and_backward_match_eager(mode, dtype, last):
    indices, offsets = bags(LENGTHS, last=last)
    weight = torch.randn(12, 6, device=DEVICE).to(dtype)

    def fn(weight, indices, offsets):
        return F.embedding_bag(indices, weight, offsets, mode=mode, include_last_offset=last) * 2

    compiled, report = compile_checked(fn)
    out, (grad,) = grads(compiled, leaf(weight), indices, offsets)
    ref, (ref_grad,) = grads(fn, leaf(weight), indices, offsets)
    assert_same((out, grad), (ref, ref_grad))
    assert_clean(report)
    # nothing of the bags in ATen (on the CPU, the op that checks the offsets as eager does)
    assert report.fallbacks == (["ember.bag_bounds"] if DEVICE == "cpu" else []), report.fallbacks


@pytest.mark.parametrize("padding_idx", [None, 3, -1])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_per_sample_weights_and_padding(padding_idx, index_dtype):
    indices, offsets = bags([4, 2, 0, 6], dtype=index_dtype)
    indices[1] = 3
    indices[-1] = 11
    weight = torch.randn(12, 5, device=DEVICE)
    per_sample = torch.randn(indices.shape, device=DEVICE)

    def fn(weight, per_sample, indices, offsets):
        summed = F.embedding_bag(indices, weight, offsets, mode="sum", per_sample_weights=per_sample,
                                 padding_idx=padding_idx)
        mean = F.embedding_bag(indices, weight, offsets, mode="mean", padding_idx=padding_idx)
        return torch.cat([summed, mean], 1)

    compiled, report = compile_checked(fn)
    out = grads(compiled, leaf(weight), leaf(per_sample), indices, offsets)
    ref = grads(fn, leaf(weight), leaf(per_sample), indices, offsets)
    assert_same(out, ref)
    assert_clean(report)
    if padding_idx is not None:  # the padding row gets no gradient
        assert out[1][0][padding_idx].abs().sum() == 0


def test_one_kernel_gathers_and_reduces_each_bag():
    indices, offsets = bags([5, 1, 7])
    weight = torch.randn(12, 8, device=DEVICE)
    compiled, report = compile_checked(lambda w, i, o: F.embedding_bag(i, w, o, mode="mean").relu())
    assert_same(compiled(weight, indices, offsets), F.embedding_bag(indices, weight, offsets, mode="mean").relu())
    (kernel,) = report.kernels
    assert "gather_segment_reduce" in kernel.name and "relu" in kernel.source


def test_two_dim_input_module_and_training_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.EmbeddingBag(20, 8, mode="mean"), torch.nn.Linear(8, 3)).to(DEVICE)
    twin = torch.nn.Sequential(torch.nn.EmbeddingBag(20, 8, mode="mean"), torch.nn.Linear(8, 3)).to(DEVICE)
    twin.load_state_dict(model.state_dict())
    indices = torch.randint(0, 20, (6, 4), device=DEVICE)  # 6 bags of 4

    def step(m, indices):
        loss = m(indices).square().mean()
        loss.backward()
        return loss

    compiled, report = compile_checked(step)
    assert_same(compiled(model, indices), step(twin, indices))
    for p, q in zip(model.parameters(), twin.parameters()):
        assert_same(p.grad, q.grad)
    assert_clean(report)


def test_changing_bag_counts_do_not_recompile():
    weight = leaf(torch.randn(30, 4, device=DEVICE))
    compiled, report = compile_checked(lambda w, i, o: F.embedding_bag(i, w, o, mode="sum"), dynamic=True)
    for lengths in ([2, 3], [1, 0, 4, 2], [0, 0, 3, 1, 1, 5], [9, 2, 2]):
        indices, offsets = bags(lengths, rows=30)
        assert_same(compiled(weight, indices, offsets), F.embedding_bag(indices, weight, offsets, mode="sum"))
    assert len([g for g in report.graphs if g.kind == "forward"]) == 1
    assert_clean(report)


@pytest.mark.parametrize("case", ["no bags", "no indices"])
def test_empty(case):
    weight = torch.randn(12, 4, device=DEVICE)
    indices, offsets = bags([]) if case == "no bags" else bags([0, 0])
    fn = lambda w, i, o: F.embedding_bag(i, w, o, mode="mean")  # noqa: E731
    compiled, report = compile_checked(fn)
    assert_same(compiled(weight, indices, offsets), fn(weight, indices, offsets))


def test_max_mode_and_scaled_gradients_stay_eager_s():
    # max gives a tie's whole gradient to its first index (a segment max would split it)
    weight = torch.zeros(6, 3, device=DEVICE)
    indices, offsets = torch.tensor([0, 1, 2, 1], device=DEVICE), torch.tensor([0, 2], device=DEVICE)

    def fn(weight, indices, offsets):
        return (F.embedding_bag(indices, weight, offsets, mode="max")
                + F.embedding_bag(indices, weight, offsets, scale_grad_by_freq=True))

    compiled, report = compile_checked(fn)
    assert_same(grads(compiled, leaf(weight), indices, offsets), grads(fn, leaf(weight), indices, offsets))
    assert "aten._embedding_bag" in report.fallbacks


@pytest.mark.skipif(DEVICE != "cpu", reason="eager's GPU kernel does not check offsets (that would sync)")
@pytest.mark.parametrize("offsets, last", [([1, 3], False), ([0, 9], False), ([0, 5, 3], False),
                                           ([0, 4, 9], True)])
def test_bad_offsets_raise_eager_s_error(offsets, last):
    weight, indices = torch.randn(10, 4), torch.arange(8)
    offsets = torch.tensor(offsets)
    fn = lambda w, i, o: F.embedding_bag(i, w, o, include_last_offset=last)  # noqa: E731
    with pytest.raises(RuntimeError, match="offsets"):
        ember.compile(fn)(weight, indices, offsets)


@pytest.mark.skipif(DEVICE != "cpu", reason="a GPU kernel's bad index is a device-side assert")
@pytest.mark.parametrize("bad", [10, -1])
def test_index_out_of_range_is_a_runtime_error(bad):
    weight, indices, offsets = torch.randn(10, 4), torch.tensor([1, bad, 2]), torch.tensor([0, 1])
    fn = lambda w, i, o: F.embedding_bag(i, w, o)  # noqa: E731
    with pytest.raises(RuntimeError):
        fn(weight, indices, offsets)
    with pytest.raises(RuntimeError, match="out of"):
        ember.compile(fn)(weight, indices, offsets)


def test_internal_outputs_are_eager_s():
    weight = torch.randn(10, 4, device=DEVICE)
    indices, offsets = bags([2, 3, 0], rows=10)
    fn = lambda w, i, o: torch.embedding_bag(w, i, o, False, 1)  # noqa: E731 -- all four outputs
    compiled, report = compile_checked(fn)
    assert_same(compiled(weight, indices, offsets), fn(weight, indices, offsets))


@on_the_interpreter
def test_triton_matches_eager():
    indices, offsets = bags(LENGTHS)
    weight = torch.randn(12, 6)

    def fn(weight, indices, offsets):
        return F.embedding_bag(indices, weight, offsets, mode="mean", padding_idx=2)

    compiled, report = compile_checked(fn, options={"target": "triton"})
    assert_same(grads(compiled, leaf(weight), indices, offsets), grads(fn, leaf(weight), indices, offsets))
    assert_clean(report)


@needs_nvcc
def test_cuda_sources_compile_for_sm90(tmp_path):
    indices, offsets = bags([3, 1], device="cpu")  # (rendered on the CPU, for any machine)
    weight, per_sample = torch.randn(12, 6), torch.randn(4)

    def fn(weight, per_sample, indices, offsets):
        return (F.embedding_bag(indices, weight, offsets, mode="mean", padding_idx=1)
                + F.embedding_bag(indices, weight, offsets, mode="sum", per_sample_weights=per_sample))

    report = explain(fn, leaf(weight), leaf(per_sample), indices, offsets, dynamic=True)
    assert any("segment_reduce" in k.name for k in report.kernels)
    compile_batches(sources(report, "bag"), tmp_path, per_file=8)


def test_the_cpu_keeps_aten_s_op_by_default():
    weight = torch.randn(12, 6)
    indices, offsets = bags([3, 1], device="cpu")
    fn = lambda w, i, o: F.embedding_bag(i, w, o, mode="sum")  # noqa: E731
    compiled, report = compile_checked(fn, options={"cpu_embedding_bag": False})
    assert_same(compiled(weight, indices, offsets), fn(weight, indices, offsets))
    assert "aten._embedding_bag_forward_only" in report.fallbacks or "aten._embedding_bag" in report.fallbacks, \
        report.fallbacks
