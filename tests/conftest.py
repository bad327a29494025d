"""Test setup: a kernel cache private to the test run, IR verification after every pass."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# Before ember is imported anywhere: one cache for the whole run (shared by xdist workers).
_CACHE = Path(os.environ.get("EMBER_TEST_CACHE") or Path(tempfile.gettempdir()) / "ember-test-cache")
os.environ["EMBER_CACHE_DIR"] = str(_CACHE)
# Where the op suite runs (EMBER_TEST_DEVICE=cuda on a GPU machine runs it on the GPU). On the CPU,
# Triton kernels run on CPU tensors through Triton's interpreter.
DEVICE = os.environ.get("EMBER_TEST_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("TORCHDYNAMO_VERBOSE", "0")

import torch  # noqa: E402

import ember  # noqa: E402

ember.config.verify = True
torch._dynamo.config.cache_size_limit = 64
torch._dynamo.config.accumulated_cache_size_limit = 4096


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch.manual_seed(0)  # reproducible inputs
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def cache_dir() -> Path:
    return _CACHE
