"""Test setup: a kernel cache private to the test run, torch's caches private to each test, IR
verification after every pass."""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# Before ember is imported anywhere: one cache for the whole run (shared by xdist workers).
_CACHE = Path(os.environ.get("EMBER_TEST_CACHE") or Path(tempfile.gettempdir()) / "ember-test-cache")
os.environ["EMBER_CACHE_DIR"] = str(_CACHE)
# torch's caches (its AOTAutograd cache holds ember's compiled graphs) live in a directory of this
# process, a fresh one for each test (_fresh_dynamo): no test sees what another one compiled, or
# what an earlier run left, and nothing is written to the user's cache.
_TORCH_CACHE = Path(tempfile.mkdtemp(prefix="ember-test-torch-"))
os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(_TORCH_CACHE)
atexit.register(shutil.rmtree, _TORCH_CACHE, ignore_errors=True)
_test_ids = itertools.count()
# Where the op suite runs (EMBER_TEST_DEVICE=cuda on a GPU machine runs it on the GPU). On the CPU,
# Triton kernels run on CPU tensors through Triton's interpreter.
DEVICE = os.environ.get("EMBER_TEST_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
# tests that run Triton kernels on CPU tensors: the interpreter is only set up in the CPU run
INTERPRETED_TRITON = pytest.mark.skipif(
    DEVICE != "cpu", reason="Triton on CPU tensors runs interpreted, as only the CPU test run sets up")
os.environ.setdefault("TORCHDYNAMO_VERBOSE", "0")

import torch  # noqa: E402

import ember  # noqa: E402

ember.config.verify = True
torch._dynamo.config.cache_size_limit = 64
torch._dynamo.config.accumulated_cache_size_limit = 4096


@pytest.fixture(autouse=True, scope="session")
def _opinfo_samples_without_stack_walks():
    # OpInfo's sample_inputs looks up the stack for a unittest TestCase (its sample skips) with
    # inspect.stack(), which reads every frame's source file: 0.1-0.4 s a call, minutes of the
    # suite. A pytest function is never one, so the answer is always None
    # (so does the iterator that tracks which sample a test is at, for the same TestCase)
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core as opinfo_core
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(opinfo_core, "extract_test_fn", lambda: None)
        patch.setattr(common_utils, "extract_test_fn", lambda: None)
        yield


@pytest.fixture(autouse=True)
def _fresh_dynamo(monkeypatch):
    torch.manual_seed(0)  # reproducible inputs
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(_TORCH_CACHE / f"test{next(_test_ids)}"))
    torch._dynamo.reset()
    yield
    # a Triton compile left on ember's background pool enters and leaves warnings.catch_warnings
    # per AST node (Triton's code generator), which is process-wide state: leaving, it put back
    # the warning filters and showwarning of its entry, and the next test's record=True lost
    # what it caught (test_input_sharing's warning, once in the GPU suite)
    ember.wait_for_kernels(timeout=300)
    torch._dynamo.reset()


@pytest.fixture
def cache_dir() -> Path:
    return _CACHE


@pytest.fixture
def padded_on_cpu(monkeypatch):
    """Padded pooling windows, and overlapping windows' backwards, decomposed on CPU tensors too
    (frontend/pool_decomps.py keeps them with ATen there, for speed), as on GPUs, and max
    pooling's gathered backward on (kept with ATen for now), so that their values are checked."""
    from ember.frontend import pool_decomps
    monkeypatch.setattr(pool_decomps, "PADDED_ON_CPU", True)
    monkeypatch.setattr(pool_decomps, "GATHERED_MAX_BACKWARD", True)


@pytest.fixture
def fuzz(monkeypatch):
    """bench/fuzz.py and bench/fuzz_ragged.py, imported as the scripts import each other."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "bench"))
    import fuzz
    import fuzz_ragged
    yield fuzz, fuzz_ragged
    for name in ("fuzz", "fuzz_ragged", "fuzz_programs", "fuzz_int_ops"):
        sys.modules.pop(name, None)
