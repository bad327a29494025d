"""Compiled reductions launched on two CUDA streams at once (each stream has its own partials and
counters: runtime/triton_backend.py, runtime/cuda_backend.py), and one compiled program run on
two GPUs (each device its own compiled kernels and workspaces). Needs GPUs: skipped elsewhere; the
GPU bench script runs it (``python tests/test_gpu_streams.py``)."""

from __future__ import annotations

import pytest
import torch

import ember

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _concurrent_sums(backend: str) -> None:
    def f(x, w):
        return (x * x).sum(), (x.float() * w).sum(0)  # a many-program sum, rows split over programs

    compiled = ember.compile(f, options={"gpu_backend": backend})
    xs = [torch.randn(1 << 22, device="cuda") * (i + 1) for i in range(2)]
    ws = [torch.randn(1 << 22, device="cuda") for _ in range(2)]
    columns = [torch.randn(64, 8192, device="cuda").bfloat16() for _ in range(2)]
    weights = [torch.randn(64, 8192, device="cuda") for _ in range(2)]
    expected = [f(xs[i], ws[i])[0] for i in range(2)]
    expected_cols = [f(columns[i], weights[i])[1] for i in range(2)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    compiled(xs[0], ws[0])  # compile outside the streams
    compiled(columns[0], weights[0])
    torch.cuda.synchronize()
    results: list[list[torch.Tensor]] = [[], []]
    for _ in range(50):
        for i, s in enumerate(streams):
            with torch.cuda.stream(s):
                results[i].append(compiled(xs[i], ws[i])[0])
                results[i].append(compiled(columns[i], weights[i])[1])
    torch.cuda.synchronize()
    for i in range(2):
        for j, r in enumerate(results[i]):
            want = expected[i] if j % 2 == 0 else expected_cols[i]
            torch.testing.assert_close(r, want, rtol=1e-4, atol=1e-2)


def _two_devices(backend: str) -> None:
    def f(x):
        return torch.softmax(x, -1), x.float().sum(), (x * 2).sum(0)

    compiled = ember.compile(f, options={"gpu_backend": backend})
    for _ in range(2):  # both devices, twice: the second round reuses what the first prepared
        for device in ("cuda:0", "cuda:1"):
            x = torch.randn(300, 700, device=device)
            for got, want in zip(compiled(x), f(x)):
                assert got.device == want.device
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)


@needs_cuda
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_reductions_on_two_streams_at_once(backend):
    _concurrent_sums(backend)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_one_program_on_two_devices(backend):
    _two_devices(backend)


if __name__ == "__main__":
    for backend in ("triton", "cuda"):
        _concurrent_sums(backend)
        print(f"two streams at once, {backend}: every result matches")
        if torch.cuda.device_count() >= 2:
            _two_devices(backend)
            print(f"one program on two devices, {backend}: every result matches")


def test_a_graph_knows_its_cuda_device():
    # (runs anywhere) the program makes that device current when another one is
    from ember.driver import cuda_index
    from ember.ir import GraphBuilder
    for device, index in (("cuda:1", 1), ("cuda:0", 0), ("cpu", None)):
        b = GraphBuilder(device=device)
        x = b.input((4,))
        assert cuda_index(b.build(b.exp(x))) == index
