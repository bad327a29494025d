"""CUDA C++ row kernels split few long rows over blocks (codegen/cuda_plan.py: split_rows,
runtime/cuda_launch.py: row_slices): a BatchNorm's per-channel sums over an NCHW activation
were a block per channel, 64 blocks on 132 SMs each walking 800K elements."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

import ember
from ember.codegen import cuda
from ember.runtime import cuda_backend, cuda_launch

from .conftest import DEVICE
from .helpers import check, record_rendered
from .test_cuda import NVCC, compile_batches, needs_nvcc, sources, workspace_launcher
from .test_split_passes import _bn_args, bn_relu_with_grads


def channel_stats(x):
    """A BatchNorm's statistics and an activation, as one kernel of one loop over each channel."""
    return x.sum((0, 2, 3)), (x * x).mean((0, 2, 3)), torch.relu(x)


def _kernels(monkeypatch, fn, *args, dynamic=None):
    seen = record_rendered(monkeypatch, cuda_backend.CudaBackend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = ember.explain(fn, *args, target="cuda", dynamic=dynamic)
    return list(seen), report


def test_few_long_rows_split_over_blocks():
    plan, sms = cuda_launch.plan_launch, 132
    # a ResNet stem's BatchNorm sums: 64 channels of 64 x 112 x 112, 16 slices of 50K elements
    assert plan("rows", 64, 802816, sms, 512, vector=4, split=True) == (False, (64, 16), 512)
    assert plan("rows", 64, 802816, sms, 512, vector=4) == (False, 64, 512)  # (a kernel that cannot split)
    # a slice is at least SLICE_ELEMENTS long; rows enough for two blocks an SM are not split
    assert plan("rows", 8, 40000, sms, 512, vector=4, split=True)[1] == (8, 4)
    assert plan("rows", 8, 8000, sms, 512, vector=4, split=True)[1] == 8
    assert plan("rows", 264, 10**6, sms, 512, vector=4, split=True)[1] == 264
    assert plan("rows", 2, 10**7, sms, 512, split=True)[1] == (2, 64)  # at most 64 slices
    # about four blocks an SM: 4 rows of 256K in 32 slices, not 64 (a slice would be 4096 long)
    assert plan("rows", 4, 32 * 8192, sms, 512, vector=4, split=True) == (False, (4, 32), 512)
    assert plan("rows", 1, 64 * 8192, sms, 512, vector=4, split=True) == (False, (1, 64), 512)


def test_split_row_kernels_combine_their_slices_in_the_rows_last_block(monkeypatch):
    (k,), report = _kernels(monkeypatch, channel_stats, torch.randn(8, 16, 64, 64))
    meta = cuda.launch_meta(k)
    assert meta["strategy"] == "rows" and meta["split_rows"] and meta["workspace"]
    source = report.kernels[0].source
    assert "which few long rows split over gridDim.y blocks" in source
    # slice y takes loop steps y, y + gridDim.y, ... of its row, in both the vector and scalar forms
    assert source.count("(I)threadIdx.x + (I)blockIdx.y * blockDim.x * EMBER_UNROLL;") == 2
    assert source.count("+= (I)gridDim.y * blockDim.x * EMBER_UNROLL)") == 2
    assert "ember_last = atomicAdd(&counter[ember_row], 1) == (int)gridDim.y - 1;" in source
    assert "if (ember_last) counter[ember_row] = 0;" in source
    # the row's last block adds the slices in slice order, then stores the row's results
    combine = source.index("for (unsigned ember_s = 0; ember_s < gridDim.y; ++ember_s)")
    assert combine < source.index("buf0[o0] = v1;")


def test_what_does_not_split_keeps_a_block_a_row(monkeypatch):
    x = torch.randn(8, 16, 64, 64)
    # a softmax's several loops over each row; an argmax; integer sums (a float64 workspace)
    for fn in (lambda x: torch.softmax(x, -1), lambda x: x.flatten(1).argmax(1),
               lambda x: (x > 0).flatten(1).long().sum(1) * 3):
        kernels, report = _kernels(monkeypatch, fn, x)
        assert not any(cuda.launch_meta(k)["split_rows"] for k in kernels), report.kernels[0].source[:400]
        assert "gridDim.y" not in "".join(k.source for k in report.kernels)


@needs_nvcc
def test_split_row_kernels_compile_for_sm90(tmp_path):
    assert NVCC
    kernels = []
    for i, (fn, args) in enumerate([
            (channel_stats, (torch.randn(8, 16, 64, 64),)),
            (channel_stats, (torch.randn(8, 16, 64, 64).bfloat16(),)),
            (lambda x: (x.amax(1), x.mean(1), x.any(1) if x.dtype == torch.bool else x.sum(1)),
             (torch.randn(5, 3, 70000),)),
    ]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kernels += sources(ember.explain(fn, *args, target="cuda", dynamic=True), f"s{i}")
    assert any("counter[ember_row]" in k for k in kernels)
    compile_batches(kernels, tmp_path, per_file=len(kernels))


def test_split_row_launches_take_a_partial_per_slice_row_and_reduction(monkeypatch):
    (k,), _ = _kernels(monkeypatch, channel_stats, torch.randn(8, 16, 64, 64), dynamic=True)
    meta = cuda.launch_meta(k)
    kernel, driver, allocated = workspace_launcher(monkeypatch, k, meta)

    # the sizes' symbols: the channels (the rows), the side (squared: H and W are duck-sized
    # alike) and the batch
    side = re.search(r"\((\w+) \* \1\)", meta["inner"]).group(1)
    (batch_size,) = set(meta["sizes"]) - {meta["outer"], side}

    def call(batch, channels, width):
        sizes = {batch_size: batch, meta["outer"]: channels, side: width}
        kernel(*(1,) * meta["n_params"], *[sizes[s] for s in meta["sizes"]])

    call(64, 64, 112)  # the stem: 64 rows, 16 slices; 2 reductions x 16 x 64 partials fit 2 x 1024
    (gx, gy, _, bx, by, _), = driver.geometry
    assert (gx, gy, bx, by) == (64, 16, 512, 1)
    assert allocated == [("partials", 2 * cuda.MAX_BLOCKS), ("counters", 64)]
    call(64, 512, 7)  # many short rows: a block each, no slices
    assert driver.geometry[-1][:2] == (512, 1)


@pytest.mark.skipif(DEVICE != "cuda", reason="runs CUDA kernels: EMBER_TEST_DEVICE=cuda on a GPU machine")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_rows_match_eager_on_the_gpu(dtype):
    options = {"gpu_backend": "cuda"}
    tol = {"rtol": 1e-4, "atol": 1e-3} if dtype == torch.float32 else {}
    # rows split in 64 and 16 slices; a row shorter than the slices (empty slices); an odd length
    for shape in ((2, 1, 1024, 1024), (64, 64, 112, 112), (3, 5, 3, 70001), (1, 3, 1, 8191)):
        x = torch.randn(shape, dtype=dtype, device="cuda")
        for _ in range(2):  # the second call finds the counters the first one left
            check(channel_stats, x, options=options, **tol)
        # symbolic sizes: the kernel is rendered for groups of rows, and a split launch reduces
        # each slice through ember_row_reduce's whole-block branch
        check(channel_stats, x, options=options, dynamic=True, **tol)


@pytest.mark.skipif(DEVICE != "cuda", reason="runs CUDA kernels: EMBER_TEST_DEVICE=cuda on a GPU machine")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_batch_norm_sums_match_a_float64_reference_on_the_gpu(dtype):
    """A BatchNorm + ReLU training step whose sums split over blocks, with gradients, against
    float64 on the same inputs: no further from it than eager in ``dtype`` (bfloat16's weight
    gradient sums 100K terms each rounded to bfloat16: about 1% off in eager and ember alike)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(32, 64, 56, 56, device="cuda", generator=gen) * 2 + 0.5).to(dtype)
    w, b = torch.rand(64, device="cuda", generator=gen) + 0.5, torch.randn(64, device="cuda", generator=gen)
    g = torch.randn(x.shape, device="cuda", generator=gen).to(dtype)
    args = (x, w, b, torch.zeros(64, device="cuda"), torch.ones(64, device="cuda"), g)

    def inputs(to=None):
        return [a.detach().clone().to(to or a.dtype).requires_grad_(i < 3) for i, a in enumerate(args)]

    reference = bn_relu_with_grads(*inputs(torch.float64))
    eager = bn_relu_with_grads(*inputs())
    ours = ember.compile(bn_relu_with_grads, options={"gpu_backend": "cuda"})(*inputs())
    for i, (o, e, r) in enumerate(zip(ours, eager, reference)):
        scale = r.abs().max().item() or 1.0
        ours_off, eager_off = ((t.double() - r).abs().max().item() / scale for t in (o, e))
        assert o.dtype == e.dtype and ours_off <= 2 * eager_off + 1e-5, (i, ours_off, eager_off)


def test_batch_norm_sums_split_rows_on_the_cuda_target(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    kernels, _ = _kernels(monkeypatch, bn_relu_with_grads, *_bn_args((8, 16, 128, 64)))
    assert sum(cuda.launch_meta(k)["split_rows"] for k in kernels) >= 3
