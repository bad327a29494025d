"""Kernels over 2^31 elements or more (64-bit flat indices), on the GPU, against eager.

A compiled function first runs on small tensors (32-bit indices), then, with the same compiled
code, on tensors past 2^31 elements: the CUDA C++ backend builds its 64-bit entry points at that
launch, Triton specializes its kernel. The CPU side of this (which entry point a launch takes,
and the fallback when the 64-bit one fails to build) is in test_cuda.py, with a fake driver.
Needs a GPU with 12 GiB free: ``EMBER_TEST_DEVICE=cuda pytest tests/test_wide_index.py``.
"""

from __future__ import annotations

import fcntl
import tempfile
import warnings
from pathlib import Path

import pytest
import torch

import ember

from .conftest import DEVICE

pytestmark = pytest.mark.skipif(DEVICE != "cuda", reason="runs GPU kernels over 4 GiB: EMBER_TEST_DEVICE=cuda")

WIDE = 1 << 31


@pytest.fixture(autouse=True)
def one_wide_test_at_a_time():
    """Under pytest-xdist these tests take turns (a lock file all workers share): one ran an H100
    out of memory beside a 48 GiB process (-n 14), most likely another of them (18 GiB or more
    each: the inputs, outputs and eager's slices)."""
    with open(Path(tempfile.gettempdir()) / "ember-test-wide-index.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            torch.cuda.empty_cache()
            yield
        finally:
            torch.cuda.empty_cache()  # (this worker's cached blocks back for the next one)
            fcntl.flock(lock, fcntl.LOCK_UN)


def scale_shift(x):
    return x * 2 + 1


def softmax(x):
    return torch.softmax(x, -1)


@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("fn, shape", [(scale_shift, (WIDE + 24,)), (softmax, (WIDE // 4096 + 1, 4096))],
                         ids=["pointwise", "rows"])
def test_past_2_to_the_31_elements_after_small_calls(backend, fn, shape):
    if torch.cuda.mem_get_info()[0] < 12 << 30:
        pytest.skip("needs 12 GiB of free GPU memory")
    compiled = ember.compile(fn, dynamic=True, options={"gpu_backend": backend})
    small = torch.randn(33, *shape[1:], device="cuda", dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no kernel may fall back to ATen
        torch.testing.assert_close(compiled(small), fn(small))
        graphs = ember.stats()["graphs_compiled"]
        x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
        out = compiled(x)
    assert ember.stats()["graphs_compiled"] == graphs  # the same compiled graph
    # eager a slice at a time (both functions work element- or row-wise), the last elements
    # first: those are the ones 32-bit indices would miss
    step = 1 << 28 if len(shape) == 1 else (1 << 28) // shape[1]
    torch.testing.assert_close(out[-3:], fn(x[-3:]))
    for start in range(0, shape[0], step):
        torch.testing.assert_close(out[start:start + step], fn(x[start:start + step]))
