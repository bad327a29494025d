"""Compiled reductions launched on two CUDA streams at once: each stream has its own partials and
counters (runtime/triton_backend.py, runtime/cuda_backend.py). Needs a GPU: skipped elsewhere;
the GPU bench script runs it (``python tests/test_gpu_streams.py``)."""

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


@needs_cuda
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_reductions_on_two_streams_at_once(backend):
    _concurrent_sums(backend)


if __name__ == "__main__":
    for backend in ("triton", "cuda"):
        _concurrent_sums(backend)
        print(f"two streams at once, {backend}: every result matches")
