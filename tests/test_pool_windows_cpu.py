"""Padded pooling windows on the CPU, in inference: one kernel whose output rows split where every
window lies inside the input (codegen/cpp_split.find_window). The row's interior runs with its
guards constant and its reads unclamped, and GCC vectorizes it; the edges, and rows whose windows
reach into the padding, keep the guarded loop. A ResNet's 3 x 3 / 2 max pooling with padding 1
was ATen's kernel: 2.3x Inductor's time (frontend/pool_decomps.py: _decomposed)."""

from __future__ import annotations

import re
import subprocess

import pytest
import torch
import torch.nn.functional as F

from ember.codegen.cpp_prelude import PRELUDE
from ember.config import Config

from .helpers import assert_clean, assert_same, check, compile_checked
from .test_max_pool import _gcc

FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def _pooled(kind: str, **kw):
    if kind == "max":
        return lambda x: F.max_pool2d(torch.relu(x), **kw)
    return lambda x: F.avg_pool2d(torch.relu(x), **kw)


def _input(shape, dtype):
    x = (torch.randn(shape) * 3).to(dtype)
    x.view(-1)[::7] = -float("inf")
    x.view(-1)[3] = float("nan")
    return x


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("kind, kw", [
    ("max", {"kernel_size": 3, "stride": 2, "padding": 1}),
    ("max", {"kernel_size": 3, "stride": 1, "padding": 1, "dilation": 2}),
    ("max", {"kernel_size": (2, 4), "stride": (1, 3), "padding": (1, 2)}),
    ("avg", {"kernel_size": 3, "stride": 2, "padding": 1}),
    ("avg", {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False}),
])
def test_padded_windows_in_inference_match_eager(kind, kw, dtype):
    # rows with no interior (widths 1 and 2), one window wide, odd sizes, and a ResNet stem's;
    # one graph pools them all (one C++ module to build, not one per shape)
    shapes = [shape for shape in ((2, 3, 1, 1), (1, 2, 2, 5), (2, 3, 9, 11), (1, 4, 16, 16))
              # (a dilated window wider than the padded input: eager's error)
              if not ("dilation" in kw and kw["dilation"] * 2 >= min(shape[-2:]) + 2 * 1)]
    pool = _pooled(kind, **kw)
    with torch.no_grad():
        report = check(lambda *xs: [pool(x) for x in xs], *[_input(shape, dtype) for shape in shapes])
    assert not [c for c in report.fallbacks if "pool" in c], report.fallbacks
    # (each shape's ReLU inside its pooling kernel; kernels of shapes alike may be one)
    assert report.kernels and all("relu" in k.name and "pool" in k.name for k in report.kernels), \
        [k.name for k in report.kernels]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_channels_last_16_bit_windows_run_with_their_guards_constant(dtype):
    """A channels_last pixel's window guards are the same along the channels' loop: with all of
    them true (the window inside the input) the loop runs them as constants, else guarded."""
    for kind in ("max", "avg"):
        x = _input((2, 16, 9, 11), dtype).contiguous(memory_format=torch.channels_last)
        with torch.no_grad():
            report = check(_pooled(kind, kernel_size=3, stride=2, padding=1), x)
        assert not [c for c in report.fallbacks if "pool" in c], report.fallbacks
        (kernel,) = report.kernels
        assert re.search(r"if \(v\d+ && v\d+ && v\d+ && v\d+", kernel.source), kernel.source
        assert kernel.source.count("// v") >= 1 and "is true here" in kernel.source, kernel.source


def test_symbolic_widths_find_their_interior_at_run_time():
    fn = _pooled("max", kernel_size=3, stride=2, padding=1)
    compiled, report = compile_checked(fn, dynamic=True)
    with torch.no_grad():
        # (an interior of 17, 1, 10, 31 windows; odd widths only: torch 2.11's shape function
        # guards on the width's parity, and would compile even ones again)
        for width in (37, 5, 23, 65):
            x = _input((2, 3, 7, width), torch.float32)
            assert_same(compiled(x), fn(x))
    # one compile served every width: the bounds are computed from the sizes at run time
    assert_clean(report)
    assert len(report.graphs) == 1 and "o2_lo" in report.kernels[0].source


def test_training_and_channels_last_keep_atens_kernel():
    """In a training step the forward computes the indices for ATen's backward, which the
    decomposed forward did more slowly than ATen; channels_last rows stay slower than ATen too."""
    fn = _pooled("max", kernel_size=3, stride=2, padding=1)
    x = _input((2, 3, 9, 11), torch.float32).nan_to_num()
    report = check(fn, x.clone().requires_grad_())
    assert any("max_pool2d_with_indices" in c for c in report.fallbacks), report.fallbacks
    with torch.no_grad():
        report = check(fn, x.contiguous(memory_format=torch.channels_last))
    assert any("max_pool2d_with_indices" in c for c in report.fallbacks), report.fallbacks
    with torch.no_grad():  # (a strided input: ATen too)
        report = check(fn, x.transpose(2, 3))
    assert any("max_pool2d_with_indices" in c for c in report.fallbacks), report.fallbacks


def test_the_rows_interior_reads_unclamped_and_unguarded():
    x = _input((2, 3, 32, 32), torch.float32)
    with torch.no_grad():
        (kernel,) = check(_pooled("max", kernel_size=3, stride=2, padding=1), x).kernels
    source = kernel.source
    assert "const int64_t o2_lo = " in source and "const int64_t o2_hi = " in source, source
    interior = source.split("for (int64_t o2 = o2_lo; o2 < o2_hi; ++o2) {")[1].split("#pragma omp simd")[0]
    assert "ember_imin(" not in interior and "ember_imax(" not in interior, interior
    assert "if (" not in interior, interior
    # the edges keep their guards; so does the loop of rows whose windows reach the padding
    assert source.count("for (int64_t o2 = ") == 4, source


@pytest.mark.skipif(_gcc() is None, reason="asks GCC's vectorizer report (-fopt-info-vec)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_rows_interior_vectorizes(tmp_path, dtype):
    """Each window value's NaN test, written beside the value, was live across the loads of
    the values after it, and GCC 12 left the interior scalar ("no vectype for stmt"); written
    beside its use (cstyle._sunk_bools), the loop vectorizes."""
    x = _input((2, 3, 32, 32), dtype)
    with torch.no_grad():
        (kernel,) = check(_pooled("max", kernel_size=3, stride=2, padding=1), x).kernels
    path = tmp_path / "pool.cpp"
    path.write_text(PRELUDE + "\n" + kernel.source)
    proc = subprocess.run([_gcc(), *Config().cxx_flags, "-fopenmp", "-std=c++17", "-c", "-fopt-info-vec-optimized",
                           str(path), "-o", str(tmp_path / "pool.o")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = path.read_text().split("\n")
    interior = next(i for i, line in enumerate(lines) if "o2 = o2_lo; o2 < o2_hi" in line) + 1
    vectorized = {int(n) for n in re.findall(r"pool\.cpp:(\d+):\d+: optimized: loop vectorized", proc.stderr)}
    # (GCC reports a loop at a line of its body)
    end = next(i for i in range(interior, len(lines)) if "#pragma omp simd" in lines[i]) + 1
    assert any(interior <= n <= end for n in vectorized), (interior, end, proc.stderr[-3000:])
