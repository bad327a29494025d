"""ptxas 12.8-13.0 drops the constant of a second packed 16-bit add (``add.s16x2``) that shares
it (triton-lang/triton#11581): on an H200, ``(x + w).narrow(-1, 1, 15).contiguous()`` of a
127 x 7 x 17 ``x`` read the element before in half its positions. Kernels whose PTX has packed
adds are assembled again with them split (runtime/ptxas_packed_adds.py). Checked here on the
CPU: Triton compiles ember's kernel for sm_90 without a GPU, and nvdisasm reads the SASS."""

from __future__ import annotations

import subprocess
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import ember
from ember.runtime import ptxas_packed_adds

from .helpers import compile_for_sm90

triton = pytest.importorskip("triton")
_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
needs_ptxas = pytest.mark.skipif(not (_BIN / "ptxas").is_file() or not (_BIN / "nvdisasm").is_file(),
                                 reason="Triton's bundled ptxas and nvdisasm")

PACKED = """\
\tmov.b32 \t%r291, 65537;
\tadd.s16x2 \t%r292, %r290, %r291;
\t@%p3 sub.u16x2 \t%r7, %r5, %r291;
\tadd.s32 \t%r8, %r7, 1;
"""


def test_packed_adds_are_split_into_halves():
    ptx, count = ptxas_packed_adds.split_packed_adds(PACKED)
    assert count == 2 and "16x2 \t%r" not in ptx
    assert "add.s16 %ember_a0, %ember_a0, %ember_b0;" in ptx and "sub.u16 %ember_a1, %ember_a1, %ember_b1;" in ptx
    assert "@%p3 mov.b32 %r7, {%ember_a0, %ember_a1};" in ptx  # (the guard stays on the write)
    assert "mov.b32 {%ember_a0, %ember_a1}, %r290;" in ptx and "add.s32 \t%r8, %r7, 1;" in ptx


def _narrowed(x, w):
    return (x + w).narrow(-1, 1, 15).contiguous()


def _sass(cubin: bytes, tmp_path: Path) -> str:
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    return subprocess.run([str(_BIN / "nvdisasm"), str(path)], capture_output=True, text=True, check=True).stdout


@needs_ptxas
def test_a_kernel_with_packed_adds_is_assembled_again(tmp_path, monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = ember.explain(_narrowed, torch.randn(127, 7, 17), torch.randn(7, 17), target="triton")
    (kernel,) = report.kernels
    types = {name: "*fp32" for name in ("arg0_1", "arg1_1", "buf0")} | {"WORKSPACE": "*fp64", "COUNTER": "*i32"}
    constexprs = {"BIG": False, "XBLOCK": 1024, "RBLOCK": 1, "PERSISTENT": False, "NPROG_BLOCK": 1}
    ptx, cubin = compile_for_sm90(tmp_path, kernel.source, kernel.name, types, constexprs)
    # the bug's mark: packed adds of a constant register, assembled as VIADD.16x2 (one of them of 0)
    assert "add.s16x2" in ptx and "VIADD.16x2" in _sass(cubin, tmp_path)
    binary = SimpleNamespace(name=kernel.name, asm={"ptx": ptx, "cubin": cubin}, kernel=cubin, module=None,
                             metadata=SimpleNamespace(target=SimpleNamespace(arch=90), enable_fp_fusion=False,
                                                      ptx_options=None))
    assert ptxas_packed_adds.repair(binary, tmp_path / "cache")
    assert "VIADD.16x2" not in _sass(binary.kernel, tmp_path) and binary.asm["cubin"] == binary.kernel
    assert list((tmp_path / "cache" / "triton").glob("split16-*.cubin"))  # kept: a warm start reads it
    assert not ptxas_packed_adds.repair(binary, tmp_path / "cache")  # (once)


def test_matmul_kernels_are_repaired_as_they_compile(monkeypatch):
    # Triton's matmul kernels launch through Triton's own launcher (runtime/triton_matmul.py):
    # each specialization's compile passes through the repair before Triton loads it
    from ember.config import Config
    from ember.runtime import triton_matmul

    repaired = []
    monkeypatch.setattr(ptxas_packed_adds, "repair", lambda binary, cache_dir: repaired.append(binary) or False)
    fn = SimpleNamespace(compile=lambda src, target=None, options=None: f"binary of {src}")
    meta = {"params": ["a", "b", "out"], "sizes": ["s0"], "m": "s0", "n": "16", "k": "16", "tma": None, "dots": 1}
    triton_matmul.MatmulLauncher("fused_mm_0", fn, meta, "hash", None, None, None, "heuristic", Config())
    assert fn.compile("src", target="cuda") == "binary of src" and repaired == ["binary of src"]
    triton_matmul.MatmulLauncher("fused_mm_0", fn, meta, "hash", None, None, None, "heuristic", Config())
    fn.compile("src2")
    assert repaired == ["binary of src", "binary of src2"]  # (wrapped once, however many launchers)
