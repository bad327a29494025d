"""An index out of range in a GPU kernel stops it with a device-side assert, as eager's CUDA
kernels (and Inductor's) do. ember's GPU kernels clamped such an index into range and returned
wrong numbers without a word. Checked on the CPU: Triton's interpreter runs the asserts, and the
CUDA and Triton sources compile to PTX that calls the device runtime's ``__assertfail``; on a GPU
(``EMBER_TEST_DEVICE=cuda``), in a process of its own, as the assert ends its CUDA context."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import ember

from .conftest import DEVICE
from .helpers import assert_same, compile_for_sm90, cuda_ptx, on_the_interpreter

TRITON = {"target": "triton"}


def _cases():
    x, w = torch.randn(5, 3), torch.randn(6, 4)
    logits = torch.randn(4, 7)
    # (what each reads with a good index, then a bad one, and the op the assert names)
    return [
        ("index", lambda x, i: x[i] * 2, x, torch.tensor([0, 4, -5]), torch.tensor([0, 5, 1])),
        ("gather", lambda x, i: torch.gather(x, 1, i) + 1, x, torch.tensor([[0], [2], [1], [0], [2]]),
         torch.tensor([[0], [3], [1], [0], [2]])),
        ("embedding", lambda w, i: F.embedding(i, w).sum(-1), w, torch.tensor([[0, 5], [2, 1]]),
         torch.tensor([[0, 6], [2, 1]])),
        ("index_select", lambda x, i: x.index_select(0, i).exp(), x, torch.tensor([4, 0]), torch.tensor([-1, 0])),
        ("nll_loss/cross_entropy target", lambda z, t: F.cross_entropy(z, t), logits, torch.tensor([0, 6, 3, 1]),
         torch.tensor([0, 7, 3, 1])),
    ]


@on_the_interpreter
@pytest.mark.parametrize("case", range(5), ids=[c[0] for c in _cases()])
def test_an_index_out_of_range_asserts_in_triton_kernels(case):
    op, fn, x, good, bad = _cases()[case]
    failures = ember.stats()["build_failures"]  # (counted since the process started: other tests' too)
    compiled = ember.compile(fn, options=TRITON)
    assert_same(compiled(x, good), fn(x, good), rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match=f"device-side assert triggered: ember: {op}: index out of bounds"):
        compiled(x, bad)
    assert_same(compiled(x, good), fn(x, good), rtol=1e-5, atol=1e-6)  # (still the kernel's, no fallback)
    assert ember.stats()["build_failures"] == failures


@on_the_interpreter
def test_lanes_past_the_end_do_not_assert():
    # a block's lanes past the tensor's end load index 0, and i + 5 of them is out of range
    def shifted(x, i):
        return torch.gather(x, 0, i + 5) * 3

    x = torch.randn(5)
    for n in (1, 3, 7, 130):
        i = torch.randint(-5, 0, (n,))
        assert_same(ember.compile(shifted, options=TRITON)(x, i), shifted(x, i))


def _explained(target: str) -> ember.Report:
    return ember.explain(lambda x, i: x[i] + 1, torch.randn(5), torch.tensor([0, 4, 1]), target=target)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not installed")
def test_cuda_kernels_call_the_device_runtime_assert(tmp_path):
    report = _explained("cuda")
    assert "ember_assert_index(" in report.kernels[0].source
    ptx = cuda_ptx(tmp_path / "k.cu", report)
    assert "__assertfail" in ptx


def test_triton_kernels_compile_their_asserts_for_sm90(tmp_path):
    pytest.importorskip("triton")
    (kernel,) = _explained("triton").kernels
    assert "tl.device_assert(" in kernel.source
    params = kernel.source.split(f"def {kernel.name}(")[1].split(")")[0]
    types = {"arg0_1": "*fp32", "arg1_1": "*i64", "buf0": "*fp32", "WORKSPACE": "*fp64", "COUNTER": "*i32"}
    constexprs = {"BIG": False, "XBLOCK": 1024, "RBLOCK": 1, "PERSISTENT": False, "NPROG_BLOCK": 1}
    constexprs = {k: v for k, v in constexprs.items() if k in params}
    ptx, _ = compile_for_sm90(tmp_path, kernel.source, kernel.name, types, constexprs,
                              options={"debug": True, "sanitize_overflow": False})
    assert "__assertfail" in ptx
    (tmp_path / "plain").mkdir()
    ptx, _ = compile_for_sm90(tmp_path / "plain", kernel.source, kernel.name, types, constexprs)
    assert "__assertfail" not in ptx  # (Triton drops asserts outside its debug mode)


_ON_THE_GPU = """
import torch, ember
x, i = torch.randn(5, device="cuda"), torch.tensor([0, 9, 1], device="cuda")
f = ember.compile(lambda x, i: x[i] * 2, options={{"gpu_backend": "{backend}"}})
print("good", f(x, i.clamp(max=4)).tolist(), "build failures", ember.stats()["build_failures"], flush=True)
try:
    f(x, i)
    torch.cuda.synchronize()
    print("no error")
except RuntimeError as e:
    print("raised", type(e).__name__, str(e).splitlines()[0])
"""


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a GPU (EMBER_TEST_DEVICE=cuda)")
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_an_index_out_of_range_asserts_on_the_gpu(backend, tmp_path):
    script = textwrap.dedent(_ON_THE_GPU.format(backend=backend))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "EMBER_CACHE_DIR": str(tmp_path)})
    out = done.stdout + done.stderr
    # (ember's kernel raised it: an ATen fallback's would too)
    assert "build failures 0" in done.stdout and "raised" in done.stdout, out[-3000:]
    assert "device-side assert" in out, out[-3000:]
