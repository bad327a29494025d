"""Ops ember does not generate run through ATen inside the compiled program; nothing raises."""

from __future__ import annotations

import warnings

import pytest
import torch

import ember

from .helpers import assert_same, check, run


def test_unknown_ops_run_through_aten_and_fuse_around():
    def fn(x):
        y = torch.cumsum(torch.relu(x), dim=-1)  # cumsum: not generated
        return y * 2 + 1

    report = check(fn, torch.randn(8, 16))
    assert "aten.cumsum" in report.fallbacks
    assert len(report.kernels) == 2  # relu before, mul+add after


def test_matmul_and_convolution_use_aten():
    conv = torch.nn.Conv2d(3, 4, 3)
    report = check(lambda x: torch.relu(conv(x)).mean((2, 3)), torch.randn(2, 3, 8, 8))
    assert "aten.convolution" in report.fallbacks
    report = check(lambda a, b: (a @ b).softmax(-1), torch.randn(5, 7), torch.randn(7, 3))
    assert report.fallbacks == ["aten.mm"]


def test_unsupported_dtypes_stay_correct():
    x = torch.randn(4, 4, dtype=torch.complex64)
    check(lambda a: a * 2 + 1, x)
    check(lambda a: (a.abs() + 1).sum(), x)


def test_multi_output_aten_ops():
    def fn(x):
        values, indices = torch.sort(x, -1)
        return values * 2, indices + 1

    report = check(fn, torch.randn(6, 5))
    assert "aten.sort" in report.fallbacks


def test_random_ops_are_not_merged():
    torch.manual_seed(0)

    def fn(x):
        return torch.rand_like(x) + torch.rand_like(x)

    out = ember.compile(fn)(torch.zeros(1000))
    assert out.std() > 0.3  # two independent draws, not one doubled (std of 2u is 0.58)


def test_kernel_build_failure_falls_back_with_one_warning(tmp_path):
    # An invalid compiler flag makes every build fail: the program still runs, through ATen.
    opts = {"cache_dir": tmp_path, "cxx_flags": ("-O3", "-fPIC", "-shared", "--not-a-real-flag")}
    x, y = torch.randn(5, 6), torch.randn(5, 6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = check(lambda a, b: torch.relu(a) + b * 2, x, y, options=opts, expect_built=False)
    build_warnings = [w for w in caught if "failed to build" in str(w.message)]
    assert len(build_warnings) == 1
    assert report.kernels and not report.kernels[0].built
    assert "aten.relu" in report.fallbacks


def test_a_compiler_asked_for_by_name_is_used_or_named(tmp_path):
    # options={"cxx": ...} (or EMBER_CXX) naming no compiler fell back to g++ without a word
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = check(lambda a: torch.relu(a) + 1, torch.randn(5), expect_built=False,
                       options={"cache_dir": tmp_path, "cxx": "no-such-compiler++"})
    assert [w for w in caught if "'no-such-compiler++'" in str(w.message)]
    assert report.kernels and not report.kernels[0].built


def test_graph_level_fallback_when_ember_cannot_compile(monkeypatch):
    from ember import driver

    def broken(*args, **kwargs):
        raise RuntimeError("simulated scheduler bug")

    monkeypatch.setattr(driver, "plan", broken)
    ember.reset_stats()
    x = torch.randn(4)
    with pytest.warns(RuntimeWarning, match="runs through ATen"):
        out, report = run(lambda a: a.sin() + 1, x)
    assert_same(out, x.sin() + 1)
    assert ember.stats()["graph_fallbacks"] == 1
    assert "simulated scheduler bug" in report.graphs[0].error


def test_a_plan_that_cannot_progress_stops_at_once(monkeypatch):
    # A kernel asking for a buffer its value already has would be planned the same way again and
    # again (a Llama block spent 40 s in 10 x nodes attempts): the planner stops at the first
    # repeat and the graph runs through ATen with one warning.
    import time

    from ember.schedule import build, fusion

    def needs_its_own_buffer(self):
        raise build.NeedsBuffer(self.spec.roots[0])

    monkeypatch.setattr(fusion.KernelBuilder, "build", needs_its_own_buffer)
    x = torch.randn(4, 8)
    start = time.perf_counter()
    with pytest.warns(RuntimeWarning, match="runs through ATen"):
        out, report = run(lambda a: (a.sin() + 1).softmax(-1), x)
    assert_same(out, (x.sin() + 1).softmax(-1))
    assert "fusion planning is stuck" in report.graphs[0].error
    assert time.perf_counter() - start < 10
