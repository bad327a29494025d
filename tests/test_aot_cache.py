"""Compiled graphs in torch's AOTAutograd cache (ember/aot_cache.py): a warm start after
``torch._dynamo.reset()`` loads the forward, backward and inference graphs from it instead of
running AOTAutograd and ember's pipeline again; every setting that changes what ember compiles
changes the key; what cannot be cached is compiled as before. Each test has a fresh torch cache
directory (conftest)."""

from __future__ import annotations

import pickle
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.backends import debugging
from torch._dynamo.utils import counters
from torch._inductor.runtime import cache_dir_utils

import ember
from ember import aot_cache, driver
from ember.config import Config

from .helpers import assert_same

pytestmark = pytest.mark.skipif(not aot_cache.SUPPORTED, reason="this torch has no bundled AOTAutograd cache")


def rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def loss_fn(logits, target, w):
    return F.cross_entropy(torch.tanh(logits) * w, target)


def _aot(key: str) -> int:
    return counters["aot_autograd"][key]


def _compile_run(fn, *args, options=None, dynamic=None):
    """A fresh compile (Dynamo reset first) and one call; counters count that compile only."""
    torch._dynamo.reset()
    counters.clear()
    return ember.compile(fn, options=options, dynamic=dynamic)(*args)


def _step(fn, args, compiled=True, options=None):
    """Loss and gradients of one training step on copies of the leaves."""
    logits, target, w = args
    leaves = [logits.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()]
    loss = (_compile_run(fn, leaves[0], target, leaves[1], options=options) if compiled
            else fn(leaves[0], target, leaves[1]))
    loss.backward()
    return [loss.detach(), leaves[0].grad, leaves[1].grad]


def _training_args():
    return torch.randn(6, 10), torch.randint(0, 10, (6,)), torch.randn(10)


def test_inference_warm_start_loads_the_graph(monkeypatch):
    x, w = torch.randn(5, 16), torch.randn(16)
    assert_same(_compile_run(rmsnorm, x, w), rmsnorm(x, w))
    assert _aot("autograd_cache_miss") == 1 and _aot("autograd_cache_saved") == 1
    planned = []
    monkeypatch.setattr(driver, "plan", lambda *a: planned.append(a) or pytest.fail("planned again"))
    assert_same(_compile_run(rmsnorm, x, w), rmsnorm(x, w))
    assert _aot("autograd_cache_hit") == 1 and not planned


def test_training_from_the_cache_gives_eager_gradients():
    args = _training_args()
    ref = _step(loss_fn, args, compiled=False)
    assert_same(_step(loss_fn, args), ref)
    assert _aot("autograd_cache_saved") == 1  # forward and backward, one entry
    assert_same(_step(loss_fn, args), ref)
    assert _aot("autograd_cache_hit") == 1 and _aot("autograd_cache_miss") == 0
    # the cached backward keeps working over further steps, and through the graph twice
    logits, target, w = args
    leaves = [logits.clone().requires_grad_(), w.clone().requires_grad_()]
    step = ember.compile(loss_fn)
    step(leaves[0], target, leaves[1]).backward()
    loss = step(leaves[0], target, leaves[1])
    loss.backward(retain_graph=True)
    loss.backward()
    assert_same([leaves[0].grad / 3, leaves[1].grad / 3], ref[1:])


def test_symbolic_shapes_from_the_cache():
    w = torch.randn(16)
    _compile_run(rmsnorm, torch.randn(5, 16), w, dynamic=True)
    for rows in (3, 9):
        x = torch.randn(rows, 16)
        assert_same(_compile_run(rmsnorm, x, w, dynamic=True), rmsnorm(x, w))
        assert _aot("autograd_cache_hit") == 1


@pytest.mark.parametrize("first", ["apart", "aliased"])
def test_inputs_that_share_memory_never_load_an_entry_for_inputs_that_do_not(first):
    # AOTAutograd compiles aliasing inputs differently (one storage, written once); torch's key
    # leaves aliasing out, so f(y, y) had loaded the entry compiled for f(a, b): [1, 1, 1] for
    # eager's [2, 2, 2], and the other way round, a crash or a write into the wrong tensor
    def f(a, b):
        a.add_(1)
        return a + b

    def call(kind):
        if kind == "apart":
            a, b = torch.zeros(3), torch.zeros(3)
        else:
            a = torch.zeros(3)
            b = a.view(3)
        ref_a, ref_b = (a.clone(), b.clone()) if kind == "apart" else (lambda t: (t, t.view(3)))(a.clone())
        out = _compile_run(f, a, b)
        assert_same(out, f(ref_a, ref_b))
        assert_same([a, b], [ref_a, ref_b])

    call(first)
    call("aliased" if first == "apart" else "apart")
    assert _aot("autograd_cache_hit") == 0


def test_a_float_argument_baked_into_the_graph_never_loads_another_values_entry():
    # Dynamo passes a float argument that changed between calls as a 0-d tensor; an op that
    # takes it as a Python number (full's value, clamp's bound) bakes it into AOTAutograd's
    # graph, and Dynamo recompiles for each new value. Torch's key holds only that tensor's
    # metadata: every later value loaded the entry of the first, [1.7, 1.7] for eager's [2.5, 2.5]
    def f(x, a):
        return torch.full((2,), a), x.clamp(max=a), x * a

    fast = ember.compile(f)
    x = torch.randn(6) * 4
    for a in (0.5, 1.7, 2.5, -0.0, 3.5):
        assert_same(fast(x, a), f(x, a))


def test_a_float_a_loaded_entry_holds_as_a_constant_is_guarded():
    # x.clamp(max=a) bakes a into the graph while x * a keeps it an input; compiling it guards on
    # a's value, but torch's entry restores the guards of sizes only: after a warm start (a new
    # process) the entry loaded for a = 1.5 served a = 2.5, [-3, ..., 1.5] for eager's 2.5
    def f(x, a):
        return x.clamp(max=a), x * a

    x = torch.linspace(-3, 3, 7)
    for _ in range(2):
        torch._dynamo.reset()
        counters.clear()
        fast = ember.compile(f)
        for a in (0.5, 1.5, 2.5):
            assert_same(fast(x, a), f(x, a))
    assert _aot("autograd_cache_hit") == 3


def test_changed_settings_miss():
    x, w = torch.randn(5, 16), torch.randn(16)
    _compile_run(rmsnorm, x, w)
    _compile_run(rmsnorm, x, w, options={"max_recompute_ops": 3})
    assert _aot("autograd_cache_miss") == 1
    _compile_run(rmsnorm, x, w, options={"max_recompute_ops": 3})
    assert _aot("autograd_cache_hit") == 1
    torch.use_deterministic_algorithms(True)
    try:
        _compile_run(rmsnorm, x, w)
        assert _aot("autograd_cache_miss") == 1
    finally:
        torch.use_deterministic_algorithms(False)


def test_cache_tag_covers_what_ember_reads(monkeypatch):
    cfg = Config()
    tag = aot_cache.cache_tag(cfg)
    assert tag == aot_cache.cache_tag(Config())
    assert tag != aot_cache.cache_tag(cfg.replace(fusion=False))
    other = "triton" if cfg.gpu_backend == "cuda" else "cuda"  # (EMBER_GPU_BACKEND sets the default)
    assert tag != aot_cache.cache_tag(cfg.replace(gpu_backend=other))
    assert tag != aot_cache.cache_tag(cfg.replace(target="triton"))
    monkeypatch.setattr(aot_cache, "_SOURCE_DIGEST", "another ember")
    assert tag != aot_cache.cache_tag(cfg)


def test_a_kernel_cache_elsewhere_still_hits(tmp_path):
    # the plan rebuilds its kernels from whichever cache directory it runs with: a copied or
    # restored cache (another $HOME, a CI cache) missed every entry
    x, w = torch.randn(5, 16), torch.randn(16)
    _compile_run(rmsnorm, x, w, options={"cache_dir": str(tmp_path / "a")})
    assert_same(_compile_run(rmsnorm, x, w, options={"cache_dir": str(tmp_path / "b")}), rmsnorm(x, w))
    assert _aot("autograd_cache_hit") == 1
    # ... and builds them in the directory of the compile that hit, not the one the entry was
    # saved from (which another user, or a finished test, may own)
    assert sorted(p.name for p in (tmp_path / "b" / "cpp").glob("*.so")) == \
        sorted(p.name for p in (tmp_path / "a" / "cpp").glob("*.so"))


def test_a_hit_builds_forward_and_backward_in_its_own_cache_directory(tmp_path):
    args = _training_args()
    _step(loss_fn, args, options={"cache_dir": str(tmp_path / "a")})
    got = _step(loss_fn, args, options={"cache_dir": str(tmp_path / "b")})
    assert _aot("autograd_cache_hit") == 1
    assert_same(got, _step(loss_fn, args, compiled=False))
    built = [sorted(p.name for p in (tmp_path / d / "cpp").glob("*.so")) for d in "ab"]
    assert len(built[0]) >= 2 and built[0] == built[1]


@pytest.mark.skipif(not hasattr(debugging, "AOTEagerOutputCode"), reason="this torch's aot_eager has no cached mode")
def test_entries_never_mix_with_another_backends():
    """aot_eager's bundled entries (its cached mode) are keyed on the same Dynamo graph: ember
    never loads one, and never hands it one of its own."""
    x, w = torch.randn(5, 16), torch.randn(16)
    cached_aot_eager = torch._functorch.config.patch(bundled_autograd_cache=True, force_autograd_cache=True)

    def aot_eager():
        torch._dynamo.reset()
        counters.clear()
        with cached_aot_eager:
            torch.compile(rmsnorm, backend="aot_eager")(x, w)

    aot_eager()
    assert _aot("autograd_cache_saved") == 1
    before = ember.stats()["graphs_compiled"]
    assert_same(_compile_run(rmsnorm, x, w), rmsnorm(x, w))
    assert _aot("autograd_cache_miss") == 1 and ember.stats()["graphs_compiled"] == before + 1
    aot_eager()
    assert _aot("autograd_cache_hit") == 1 and ember.stats()["graphs_compiled"] == before + 1
    _compile_run(rmsnorm, x, w)
    assert _aot("autograd_cache_hit") == 1 and ember.stats()["graphs_compiled"] == before + 2


def test_switched_off(monkeypatch):
    x, w = torch.randn(5, 16), torch.randn(16)
    for _ in range(2):
        assert_same(_compile_run(rmsnorm, x, w, options={"aot_cache": False}), rmsnorm(x, w))
        assert not any(k.startswith("autograd_cache") for k in counters["aot_autograd"])
    monkeypatch.setenv("EMBER_AOT_CACHE", "0")
    assert Config().aot_cache is False
    # a report shows the whole pipeline: never a cached graph
    report = ember.Report()
    torch._dynamo.reset()
    ember.compile(rmsnorm, report=report)(x, w)
    assert report.graphs[0].passes


def test_what_cannot_be_cached_compiles_as_before(monkeypatch):
    x, w = torch.randn(5, 16), torch.randn(16)
    # a plan that does not pickle: torch bypasses its cache, the graph still runs through ember
    monkeypatch.setattr(aot_cache, "_dump_plan", lambda plan: pickle.dumps(lambda: None))
    assert_same(_compile_run(rmsnorm, x, w), rmsnorm(x, w))
    assert _aot("autograd_cache_bypass") == 1 and _aot("autograd_cache_saved") == 0
    monkeypatch.undo()
    # a graph ember could not compile (it runs through ATen) is not cached either
    monkeypatch.setattr(driver, "_planned", OrderedDict())
    monkeypatch.setattr(driver, "lower_graph", lambda *a: (_ for _ in ()).throw(NotImplementedError("no aot")))
    with pytest.warns(RuntimeWarning, match="runs through ATen"):
        assert_same(_compile_run(rmsnorm, x, w), rmsnorm(x, w))
    assert _aot("autograd_cache_saved") == 0


def test_an_entry_that_fails_to_rebuild_is_compiled_afresh(monkeypatch):
    x, w = torch.randn(5, 16), torch.randn(16)
    _compile_run(rmsnorm, x, w)

    def broken(*args):
        raise RuntimeError("kernel cache unreadable")

    monkeypatch.setattr(driver, "rebuild_graph", broken)
    before = ember.stats()["graphs_compiled"]
    assert_same(_compile_run(rmsnorm, x, w), rmsnorm(x, w))
    assert _aot("autograd_cache_hit") == 0 and ember.stats()["graphs_compiled"] == before + 1


def test_output_code_pickles_the_plan_only(monkeypatch):
    x, w = torch.randn(5, 16), torch.randn(16)
    codes = []
    real = aot_cache._serializable

    def spy(kind, fn, cfg, made, **kwargs):
        compiler = real(kind, fn, cfg, made, **kwargs)
        inner = compiler.compiler_fn
        compiler.compiler_fn = lambda gm, example_inputs: codes.append(inner(gm, example_inputs)) or codes[-1]
        return compiler

    monkeypatch.setattr(aot_cache, "_serializable", spy)
    _compile_run(rmsnorm, x, w)
    (code,) = codes
    assert not hasattr(code, "_fx_graph_cache_key")  # never mistaken for an Inductor entry
    assert code._program is not None and code._plan is None  # the plan was saved, then dropped
    (entry,) = (Path(cache_dir_utils.cache_dir()) / "aotautograd").glob("*/*")
    loaded = pickle.loads(entry.read_bytes()).compiled_fw.result
    assert isinstance(loaded, aot_cache.EmberOutputCode) and loaded._program is None
    loaded.post_compile([], None, {})
    assert_same(loaded([x, w])[0], rmsnorm(x, w))
