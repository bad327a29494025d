"""Timed choices (runtime/choice.py): a graph whose matmuls ember fuses is also built with cuBLAS
computing them, and the user's first calls, each run once in one of the two, time both; the
faster serves every later call of that size bucket."""

from __future__ import annotations

import gc
import json
import time

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import ember
from ember import aot_cache
from ember.config import Config
from ember.runtime import capture, choice
from ember.runtime.choice import HostClock, TimedChoice

from .helpers import assert_same, on_the_interpreter

F16 = torch.float16


class _Program:
    """A stand-in for a CompiledProgram: records its calls, takes ``seconds`` a call."""

    def __init__(self, name: str, seconds: float, log: list[tuple[str, tuple[int, ...]]]):
        self.name, self.seconds, self.log = name, seconds, log
        self.host_sizes, self.opaque_sizes = {}, False

    def run(self, args: list) -> str:
        self.log.append((self.name, tuple(a for a in args if type(a) is int)))
        time.sleep(self.seconds)
        return self.name

    __call__ = run


def _choice(seconds: tuple[float, float], log: list, ready=lambda: True) -> TimedChoice:
    programs = [_Program("fused", seconds[0], log), _Program("cublas", seconds[1], log)]
    return TimedChoice("g", programs, Config(), HostClock(), ready=ready)


@pytest.mark.parametrize("faster", [0, 1])
def test_calls_take_turns_once_each_then_the_faster_serves(faster):
    log = []
    slow = 0.02
    c = _choice((0.0, slow) if faster == 0 else (slow, 0.0), log)
    turns = 2 * (choice.WARMUP + choice.SAMPLES)
    outs = [c.run([torch.zeros(1)]) for _ in range(turns)]
    assert outs == ["fused", "cublas"] * (turns // 2)   # each call ran once, in one program
    assert len(log) == turns and c.chosen == {(): faster}
    assert [c.run([torch.zeros(1)]) for _ in range(3)] == [["fused", "cublas"][faster]] * 3


def test_each_size_bucket_chooses_for_itself():
    log = []
    c = _choice((0.0, 0.01), log)
    for _ in range(2 * (choice.WARMUP + choice.SAMPLES)):
        c.run([torch.zeros(1), 100])
    assert c.chosen == {(7,): 0}
    assert c.run([torch.zeros(1), 120]) == "fused"       # 120: the same bit length, chosen
    assert c.run([torch.zeros(1), 1000]) == "fused"      # another bucket: timing again, from the first
    assert c.run([torch.zeros(1), 1000]) == "cublas"
    assert (10,) not in c.chosen


def test_no_timing_while_kernels_compile_or_under_the_graph_check():
    log, ready = [], [False]
    c = _choice((0.0, 0.0), log, ready=lambda: ready[0])
    for _ in range(4):
        assert c.run([torch.zeros(1)]) == "fused"     # (a kernel still compiling: the first program)
    ready[0] = True
    capture.active.append(None)  # (a check on; the list stays a list for the tests after this one)
    try:
        assert c([torch.zeros(1)]) == "fused"
    finally:
        capture.active.remove(None)
    assert not c._timing and not c.chosen
    assert c.run([torch.zeros(1)]) == "fused" and c.run([torch.zeros(1)]) == "cublas"


def _choices() -> dict[int, TimedChoice]:
    return {id(o): o for o in gc.get_objects() if type(o) is TimedChoice}  # (type: gc holds dead proxies)


def _swiglu(x, wg, wu):
    return F.silu(x @ wg) * (x @ wu)


def _saved_choice(path, key: str, log: list, seconds=(0.0, 0.01), built: list | None = None) -> TimedChoice:
    """A choice whose choices are kept in ``path``; its cuBLAS program given as a builder, which
    appends to ``built`` when called."""
    def build():
        built.append("cublas")
        return _Program("cublas", seconds[1], log)
    programs = [_Program("fused", seconds[0], log), build if built is not None else _Program("cublas", seconds[1], log)]
    return TimedChoice("g", programs, Config(), HostClock(), labels=["fused", "cublas"],
                       saved=choice.SavedChoices(path), key=key)


@pytest.mark.parametrize("faster", [0, 1])
def test_a_saved_choice_serves_the_next_process_at_once_building_only_what_it_runs(tmp_path, faster):
    path, log = tmp_path / "choices.json", []
    first = _saved_choice(path, "graph-a", log, (0.0, 0.01) if faster == 0 else (0.01, 0.0))
    for _ in range(2 * (choice.WARMUP + choice.SAMPLES)):
        first.run([torch.zeros(1), 7])
    assert first.chosen == {(3,): faster}
    assert json.loads(path.read_text()) == {"graph-a|3": ["fused", "cublas"][faster]}
    # a later process: the saved choice serves its first call, untimed; the other program is
    # built only where it was chosen
    log.clear()
    built: list[str] = []
    later = _saved_choice(path, "graph-a", log, built=built)
    assert later.run([torch.zeros(1), 5]) == ["fused", "cublas"][faster]
    assert log == [(["fused", "cublas"][faster], (5,))] and built == ["cublas"] * faster
    assert later.chosen == {(3,): faster} and not later._timing
    # another size bucket, or another graph, is timed afresh
    assert later.run([torch.zeros(1), 100]) == "fused" and later._timing
    other = _saved_choice(path, "graph-b", log)
    assert other.run([torch.zeros(1), 7]) == "fused" and other._timing


def test_a_program_that_fails_to_build_leaves_the_first_serving_every_call(tmp_path):
    log = []
    path = tmp_path / "choices.json"
    path.write_text(json.dumps({"graph-a|": "cublas"}))

    def broken():
        raise RuntimeError("its cubin no longer loads")

    c = TimedChoice("g", [_Program("fused", 0.0, log), broken], Config(), HostClock(), labels=["fused", "cublas"],
                    saved=choice.SavedChoices(path), key="graph-a")
    with pytest.warns(RuntimeWarning, match="cublas failed to build"):
        assert c.run([torch.zeros(1)]) == "fused"
    assert [c.run([torch.zeros(1)]) for _ in range(2)] == ["fused"] * 2 and c.saved is None


@pytest.mark.parametrize("content", ["{not json", '["a list"]', '{"graph-a|": "a label of nothing"}'])
def test_a_damaged_or_foreign_choices_file_means_timing_again(tmp_path, content):
    path, log = tmp_path / "choices.json", []
    path.write_text(content)
    c = _saved_choice(path, "graph-a", log, (0.01, 0.0))
    for _ in range(2 * (choice.WARMUP + choice.SAMPLES)):
        c.run([torch.zeros(1)])
    assert c.chosen == {(): 1} and json.loads(path.read_text())["graph-a|"] == "cublas"


def test_choices_of_other_processes_are_kept_when_saving(tmp_path):
    path, log = tmp_path / "choices.json", []
    a, b = _saved_choice(path, "graph-a", log), _saved_choice(path, "graph-b", log)  # (both read the file empty)
    for c in (a, b):
        for _ in range(2 * (choice.WARMUP + choice.SAMPLES)):
            c.run([torch.zeros(1)])
    assert json.loads(path.read_text()).keys() == {"graph-a|", "graph-b|"}


@on_the_interpreter
def test_a_fused_matmul_graph_is_timed_against_cublas_and_matches_eager():
    x = torch.randn(40, 64, dtype=F16)
    wg, wu = torch.randn(64, 90, dtype=F16) * 0.2, torch.randn(64, 90, dtype=F16) * 0.2
    before, existing = ember.stats()["timed_choices"], _choices()
    compiled = ember.compile(_swiglu, options={"target": "triton"})
    ref = _swiglu(x, wg, wu)
    assert_same(compiled(x, wg, wu), ref)
    (c,) = [o for i, o in _choices().items() if i not in existing]
    assert [p.name.endswith("_cublas") for p in c.programs] == [False, True]
    assert "aten_mm" in c.programs[1].source and "aten_mm" not in c.programs[0].source
    for _ in range(2 * (choice.WARMUP + choice.SAMPLES)):
        assert_same(compiled(x, wg, wu), ref)          # every call, whichever program ran it
    assert ember.stats()["timed_choices"] == before + 1 and c.chosen.keys() == {()}


@on_the_interpreter
@pytest.mark.parametrize("mode", ["all", "off"])
def test_other_modes_and_deterministic_algorithms_build_one_program(mode):
    x = torch.randn(40, 64, dtype=F16)
    wg, wu = torch.randn(64, 90, dtype=F16) * 0.2, torch.randn(64, 90, dtype=F16) * 0.2
    before = _choices()
    assert_same(ember.compile(_swiglu, options={"target": "triton", "matmul_epilogues": mode})(x, wg, wu),
                _swiglu(x, wg, wu))
    torch.use_deterministic_algorithms(True)
    try:
        assert_same(ember.compile(_swiglu, options={"target": "triton"})(x, wg, wu), _swiglu(x, wg, wu))
    finally:
        torch.use_deterministic_algorithms(False)
    assert _choices().keys() <= before.keys()


@on_the_interpreter
@pytest.mark.skipif(not aot_cache.SUPPORTED, reason="this torch has no bundled AOTAutograd cache")
def test_a_warm_start_rebuilds_both_plans_and_times_them_again():
    x = torch.randn(40, 64, dtype=F16)
    wg, wu = torch.randn(64, 90, dtype=F16) * 0.2, torch.randn(64, 90, dtype=F16) * 0.2
    ref = _swiglu(x, wg, wu)
    for start in ("cold", "warm"):
        torch._dynamo.reset()
        counters.clear()
        existing = _choices()
        compiled = ember.compile(_swiglu, options={"target": "triton"})
        assert_same(compiled(x, wg, wu), ref)
        (c,) = [o for i, o in _choices().items() if i not in existing]
        # a warm start builds cuBLAS's program when the timing first needs it
        assert len(c.programs) == 2 and hasattr(c.programs[1], "run") == (start == "cold")
        for _ in range(2 * (choice.WARMUP + choice.SAMPLES)):
            assert_same(compiled(x, wg, wu), ref)
        assert c.chosen.keys() == {()} and "aten_mm" in c.programs[1].source
        assert counters["aot_autograd"]["autograd_cache_hit"] == (start == "warm")


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the Hopper template fuses a lone matmul on compute capability 9.0 GPUs")
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_the_hopper_kernel_is_timed_against_cublas_on_the_gpu(backend):
    def gelu_linear(x, w, b):
        return F.gelu(x @ w + b)

    w = torch.randn(512, 384, dtype=torch.bfloat16, device="cuda") * 0.05
    b = torch.randn(384, dtype=torch.bfloat16, device="cuda")
    existing = _choices()
    compiled = ember.compile(gelu_linear, dynamic=True, options={"gpu_backend": backend, "background_compile": False})
    for rows in (1000, 3000):  # two size buckets, each timed and chosen
        x = torch.randn(rows, 512, dtype=torch.bfloat16, device="cuda")
        ref = gelu_linear(x, w, b)
        for _ in range(2 * (choice.WARMUP + choice.SAMPLES) + 2):
            assert_same(compiled(x, w, b), ref)
    (c,) = [o for i, o in _choices().items() if i not in existing]
    assert "ember_wgmma" in c.programs[0].source or "fused_mm" in c.programs[0].source
    assert "aten_addmm" in c.programs[1].source or "aten_mm" in c.programs[1].source
    assert len(c.chosen) == 2 and isinstance(c.clock, choice.CudaClock)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the Hopper template fuses a lone matmul on compute capability 9.0 GPUs")
def test_a_gpu_choice_is_saved_and_a_warm_start_serves_it_untimed(tmp_path):
    def gelu_linear(x, w, b):
        return F.gelu(x @ w + b)

    x = torch.randn(2000, 512, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(512, 384, dtype=torch.bfloat16, device="cuda") * 0.05
    b = torch.randn(384, dtype=torch.bfloat16, device="cuda")
    ref = gelu_linear(x, w, b)
    options = {"background_compile": False, "cache_dir": str(tmp_path)}
    for start in ("cold", "warm"):
        torch._dynamo.reset()
        counters.clear()
        existing, timed = _choices(), ember.stats()["timed_choices"]
        compiled = ember.compile(gelu_linear, options=options)
        for _ in range(2 * (choice.WARMUP + choice.SAMPLES)):
            assert_same(compiled(x, w, b), ref)
        (c,) = [o for i, o in _choices().items() if i not in existing]
        assert c.chosen.keys() == {()} and c.saved is not None
        # the warm start served the saved choice: nothing timed; rebuilt from torch's
        # AOTAutograd cache, cuBLAS's program is built only if it was the one chosen
        assert ember.stats()["timed_choices"] - timed == (start == "cold")
        if start == "warm" and counters["aot_autograd"]["autograd_cache_hit"]:
            assert hasattr(c.programs[1], "run") == (c.chosen[()] == 1)
    assert json.loads((tmp_path / "choices.json").read_text())
