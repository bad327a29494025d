"""The public API: torch.compile(backend="ember"), ember.compile, ember.explain, modules."""

from __future__ import annotations

import functools
import os

import pytest
import torch

import ember

from .helpers import assert_same


def _ember_installed() -> bool:
    import importlib.metadata

    try:
        importlib.metadata.distribution("ember")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# backend="ember" is registered by the package's entry point: a tree run without installing it
# (the GPU machines' copies) has none
by_name = pytest.mark.skipif(not _ember_installed(), reason="ember is not pip-installed here (its entry point)")


@by_name
def test_torch_compile_backend_by_name():
    fn = torch.compile(lambda x: torch.relu(x) * 2, backend="ember")
    x = torch.randn(16)
    assert_same(fn(x), torch.relu(x) * 2)


@by_name
def test_backend_takes_options():
    fn = torch.compile(lambda x: x.exp() + 1, backend="ember", options={"fusion": False})
    x = torch.randn(16)
    assert_same(fn(x), x.exp() + 1)


def test_explain_reports_passes_kernels_and_aten_calls():
    def f(x, w):
        return torch.softmax(x @ w, -1).sum()

    report = ember.explain(f, torch.randn(4, 8), torch.randn(8, 5))
    assert report.fallbacks == ["aten.mm"]
    # softmax over rows, then the sum over everything: two kernels
    assert len(report.kernels) == 2
    k = report.kernels[0]
    assert k.backend == "cpp" and 'extern "C"' in k.source and "aten._softmax" in k.aten_ops
    assert report.passes[0].startswith("# inference_") and "frontend" in report.passes[0]
    assert [p.name for p in report.graphs[0].passes][-1] == "dce_final"
    text = str(report)
    assert "-- after cse" in text and "-- kernel" in text and "-- host program" in text
    assert "2 kernel(s)" in report.summary()


def test_modules_and_decorator_form():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16)).eval()
    fast = ember.compile(model)
    x = torch.randn(5, 8)
    with torch.no_grad():
        assert_same(fast(x), model(x))

    @ember.compile(options={"debug": 0})
    def g(x):
        return x.sin() ** 2 + x.cos() ** 2

    assert_same(g(x), torch.ones_like(x), rtol=1e-6, atol=1e-6)


def test_outputs_alias_inputs_like_eager():
    def f(x):
        return x, x.t(), x[1:], x.view(-1)

    x = torch.randn(4, 3)
    out = ember.compile(f)(x)
    assert out[0].data_ptr() == x.data_ptr()
    assert out[1].data_ptr() == x.data_ptr() and out[1].stride() == (1, 3)
    assert_same(out, f(x))


def test_in_place_updates_of_inputs():
    def f(x, y):
        x.add_(1)
        y.mul_(2)
        return x + y

    x, y = torch.randn(5), torch.randn(5)
    x2, y2 = x.clone(), y.clone()
    out = ember.compile(f)(x, y)
    ref = f(x2, y2)
    assert_same(out, ref)
    assert_same((x, y), (x2, y2))


def test_instances_of_a_module_compiled_one_by_one_share_a_graph():
    # Dynamo keeps a code object's entries per backend: a backend per ember.compile call made
    # each instance another entry, and past Dynamo's limit of 8 the rest ran eagerly
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, x):
            return torch.relu(self.proj(x)) * 2 + x

    torch._dynamo.reset()
    ember.reset_stats()
    blocks = [Block() for _ in range(12)]
    compiled = [ember.compile(b) for b in blocks]
    x = torch.randn(4, 8)
    with torch.no_grad():
        for block, fast in zip(blocks, compiled):
            assert_same(fast(x), block(x))
    assert ember.stats()["graphs_compiled"] == 1


def test_torch_nn_modules_compiled_after_an_rnn_or_many_others_still_compile():
    # torch.nn modules all ran through one shared Dynamo frame (wrap_inline's inner): an nn.RNN,
    # which Dynamo refuses, marked it skipped, and every torch.nn module compiled after it ran
    # eagerly; past eight different modules, Dynamo's recompile limit did the same (here 2)
    torch._dynamo.reset()
    ember.reset_stats()
    x = torch.randn(3, 4)
    with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=2):
        ember.compile(torch.nn.RNN(4, 2))(x)
        activations = [torch.nn.Tanh(), torch.nn.Mish(), torch.nn.Hardswish()]
        for module in activations:
            assert_same(ember.compile(module)(x), module(x))
    assert ember.stats()["graphs_compiled"] == len(activations)


def test_compiled_modules_pickle_and_deep_copy():
    # the backend was a closure (torch.save of a compiled module failed) and a deep copy lost
    # the error unwrapping (Dynamo's TorchRuntimeError instead of the op's RuntimeError)
    import copy
    import io
    import pickle

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU())
    compiled = ember.compile(model)
    x = torch.randn(3, 4)
    buffer = io.BytesIO()
    torch.save(compiled, buffer)
    for other in (pickle.loads(pickle.dumps(compiled)), copy.deepcopy(compiled)):
        with torch.no_grad():
            assert_same(other(x), other._orig_mod(x))
        with pytest.raises(RuntimeError) as info:
            other(torch.randn(3, 5))
        assert type(info.value) is RuntimeError


def test_a_module_compiled_with_a_report_pickles():
    # its backend was a closure over the report's list: torch.save failed
    import pickle

    report = ember.Report()
    compiled = ember.compile(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU()), report=report)
    x = torch.randn(3, 4)
    with torch.no_grad():
        compiled(x)
        assert report.graphs and "kernel(s)" in report.summary()
        other = pickle.loads(pickle.dumps(compiled))  # compiles again, without the report
        assert_same(other(x), compiled._orig_mod(x))
    assert len(report.graphs) == 1


def test_option_values_of_the_wrong_type_are_clear_errors():
    # "-O2" as cxx_flags was split into characters and every build failed; a number as cxx or
    # cache_dir failed later without naming the option
    for options, name in (({"cxx_flags": "-O2"}, "cxx_flags"), ({"cxx": 5}, "cxx"), ({"cache_dir": 5}, "cache_dir"),
                          ({"triton_launch": 3}, "triton_launch"), ({"cxx_flags": None}, "cxx_flags"),
                          ({"passes_off": None}, "passes_off"), ({"passes_off": 5}, "passes_off"),
                          ({"triton_launch": {"PERSISTENT": "yes"}}, "PERSISTENT"),
                          ({"row_chunks": True}, "row_chunks"), ({"row_chunks": 1.0}, "row_chunks"),
                          ({"gpu_backend": None}, "gpu_backend"),
                          ({"target": 3}, "target"), ({"matmul_epilogues": 1}, "matmul_epilogues"),
                          ({"cuda_compile_timeout": "60"}, "cuda_compile_timeout"),
                          ({"cuda_compile_timeout": True}, "cuda_compile_timeout")):
        with pytest.raises(TypeError, match=name):
            ember.compile(lambda x: x + 1, options=options)
    # values of the right type out of range: a non-power-of-two RBLOCK failed every reduction's
    # launch, an unknown launch key was ignored, cache_dir="" cached in the working directory
    for options, name in (({"triton_launch": {"RBLOCK": 3}}, "RBLOCK"), ({"triton_launch": {"BOGUS": 3}}, "BOGUS"),
                          ({"row_chunks": -1}, "row_chunks"), ({"max_recompute_ops": -5}, "max_recompute_ops"),
                          ({"max_recompute_reads": -1}, "max_recompute_reads"),
                          ({"debug": -1}, "debug"), ({"cache_dir": ""}, "cache_dir"),
                          ({"cuda_compile_timeout": 0}, "cuda_compile_timeout"),
                          ({"cuda_compile_timeout": float("nan")}, "cuda_compile_timeout")):
        with pytest.raises(ValueError, match=name):
            ember.compile(lambda x: x + 1, options=options)


def test_settings_assigned_to_ember_config_are_checked_as_options(monkeypatch):
    # ember.config.debug = "1" failed inside Dynamo at the first call; passes_off = "cse" was
    # split into letters and blamed on EMBER_PASSES_OFF
    monkeypatch.setattr(ember.config, "debug", "1")
    with pytest.raises(TypeError, match="'debug' takes an int"):
        ember.compile(lambda x: x + 1)
    monkeypatch.setattr(ember.config, "debug", 0)
    monkeypatch.setattr(ember.config, "passes_off", "cse")
    assert_same(ember.compile(lambda x: x * 2)(torch.ones(3)), torch.full((3,), 2.0))
    monkeypatch.setattr(ember.config, "passes_off", ("nope",))
    with pytest.raises(ValueError, match="ember.config.passes_off: no pass named"):
        ember.compile(lambda x: x + 1)


@pytest.fixture(scope="module")
def bad_environment():
    """One process (each takes seconds to start) with bad choices for five settings in its
    environment: its stdout lines and stderr. Each setting is read and checked on its own."""
    import subprocess
    import sys

    env = {**os.environ, "EMBER_GPU_BACKEND": "rocm", "EMBER_TRITON_TUNING": "fast", "EMBER_DEBUG": "-1",
           "EMBER_ROW_CHUNKS": "x", "EMBER_CUDA_COMPILE_TIMEOUT": "-5"}
    code = ("import torch, ember; print(ember.config.gpu_backend, ember.config.triton_tuning, "
            "ember.config.cuda_compile_timeout); "
            "print(ember.compile(lambda x: x + 1)(torch.ones(2)).sum().item(), ember.config.debug)")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    return proc.stdout.splitlines(), proc.stderr


def test_bad_choices_in_the_environment_are_ignored_with_a_message(bad_environment):
    lines, stderr = bad_environment
    assert lines[:1] and lines[0].split() == ["triton", "heuristic", "120.0"], stderr[-3000:]
    assert "ignoring EMBER_GPU_BACKEND='rocm'" in stderr and "ignoring EMBER_TRITON_TUNING='fast'" in stderr
    assert "ignoring EMBER_CUDA_COMPILE_TIMEOUT='-5'" in stderr


def test_a_negative_ember_debug_is_ignored_with_a_message(bad_environment):
    # EMBER_DEBUG=-1 failed every compile with "ember option 'debug' is a count >= 0"
    lines, stderr = bad_environment
    assert lines[1:] and lines[1].split() == ["4.0", "0"], stderr[-3000:]
    assert "ignoring EMBER_DEBUG='-1'" in stderr
    assert stderr.count("ignoring EMBER_ROW_CHUNKS") == 1  # (it was said twice)


def test_compile_and_explain_check_their_own_arguments():
    # torch.compile's AssertionErrors, a message about mappings, or (fullgraph="no") a truthy
    # value taken as True
    fn = lambda x: x + 1  # noqa: E731
    for kwargs, match in (({"options": ["debug"]}, "dict of option names"), ({"options": {1: 2}}, "dict of option"),
                          ({"dynamic": "yes"}, "dynamic= takes bool or None"),
                          ({"fullgraph": "no"}, "fullgraph= takes bool"), ({"report": []}, "report= takes Report")):
        with pytest.raises(TypeError, match=match):
            ember.compile(fn, **kwargs)
    with pytest.raises(TypeError, match="ember.compile takes a function or an nn.Module, got int"):
        ember.compile(3)
    with pytest.raises(TypeError, match="ember.explain takes a function"):
        ember.explain("f", torch.ones(2))


def test_torch_compile_modes_are_accepted_and_explain_raises_the_ops_error():
    fn = lambda x: torch.relu(x) + 1  # noqa: E731
    x = torch.randn(8)
    assert_same(torch.compile(fn, backend=ember.ember_backend, mode="max-autotune")(x), fn(x))
    with pytest.raises(RuntimeError, match="Unrecognized mode='max-autotun'"):  # (as Inductor's; was ignored)
        torch.compile(fn, backend=ember.ember_backend, mode="max-autotun")(x)
    with pytest.raises(RuntimeError, match=r"shape '\[5, 7\]' is invalid"):  # (not Dynamo's wrapper)
        ember.explain(lambda a: a.view(5, 7), torch.randn(4, 8))


def test_a_report_says_why_kernels_rendered_for_another_target_run_through_aten():
    report = ember.explain(lambda x: torch.relu(x) + 1, torch.randn(8), target="cuda")
    (kernel,) = report.kernels
    assert not kernel.built and "not built on this" in kernel.not_built
    assert "build failed" not in str(report)


def test_a_compiled_modules_state_dict_has_the_modules_keys():
    # torch's compiled module prefixes every key with "_orig_mod.": a checkpoint saved from it
    # did not load into the plain module
    make = lambda: torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))  # noqa: E731
    compiled, plain = ember.compile(make()), make()
    plain.load_state_dict(compiled.state_dict())
    assert list(compiled.state_dict()) == list(plain.state_dict())
    compiled.load_state_dict(plain.state_dict())
    compiled.load_state_dict({"_orig_mod." + k: v for k, v in plain.state_dict().items()})
    x = torch.randn(5, 3)
    plain.eval()
    compiled.eval()
    assert_same(compiled(x), plain(x))
    # a model holding a compiled submodule loads its own checkpoint, and a plain model's (the
    # parent's load_state_dict reaches the submodule under "_orig_mod.": its keys were unexpected)
    parent, plain_parent = torch.nn.Sequential(ember.compile(make()), torch.nn.ReLU()), torch.nn.Sequential(make())
    assert list(parent.state_dict()) == list(plain_parent.state_dict())
    parent.load_state_dict(plain_parent.state_dict())
    parent.load_state_dict({k: v + 1 for k, v in parent.state_dict().items() if v.is_floating_point()}, strict=False)
    assert_same(parent[0]._orig_mod[0].weight, plain_parent[0][0].weight + 1)


def test_a_compiled_function_can_be_explained_and_compiled_again():
    # the wrapper copied Dynamo's attributes of the compiled function, and compiling it again
    # asserted on finding them
    fast = ember.compile(lambda x: x.sin() + 1)
    x = torch.randn(4)
    fast(x)
    report = ember.explain(fast, x)
    assert report.kernels
    assert_same(ember.compile(fast)(x), x.sin() + 1)
    assert_same(torch.compile(fast, backend=ember.ember_backend)(x), x.sin() + 1)


def test_explain_names_its_own_keywords_when_a_function_has_them():
    def loss(input, target):
        return torch.nn.functional.cross_entropy(input, target)

    targets = torch.tensor([1, 0, 3, 2])
    with pytest.raises(TypeError, match="functools.partial"):
        ember.explain(loss, torch.randn(4, 5), target=targets)
    assert ember.explain(functools.partial(loss, target=targets), torch.randn(4, 5)).kernels
    with pytest.raises(ValueError, match="target must be one of"):
        ember.explain(loss, torch.randn(4, 5), targets, target="")


def test_debug_3_prints_kernels_rendered_for_another_target(capfd):
    # a GPU target rendered on this machine printed neither kernel nor host program, and said
    # "0 ATen call(s)" for a graph that runs through ATen
    x = torch.randn(8)
    assert_same(ember.compile(lambda x: x.sin() * 2, options={"target": "cuda", "debug": 3})(x), x.sin() * 2)
    err = capfd.readouterr().err
    assert "__global__" in err and "host program" in err and "runs through ATen (kernels rendered only)" in err


def test_either_gpu_backend_runs_on_a_gpu_whichever_gpu_backend_is_set():
    # options={"target": "triton"} under gpu_backend="cuda" (EMBER_GPU_BACKEND=cuda) rendered
    # Triton kernels and ran the graph through ATen, silently
    from ember.driver import _runs_on

    assert _runs_on("triton", "cuda") and _runs_on("cuda", "cuda:1") and not _runs_on("cpp", "cuda")
    assert _runs_on("cpp", "cpu") and not _runs_on("cuda", "cpu")


def test_a_dead_program_leaves_no_source_behind():
    # each compiled program's source is in linecache for tracebacks; every recompile or
    # torch._dynamo.reset() left one more copy there for the life of the process
    import gc
    import linecache

    report = ember.Report()
    fn = ember.compile(lambda x: x.sin() * 2, report=report)
    fn(torch.randn(8))
    name = f"<ember wrapper {report.graphs[0].name}>"
    assert name in linecache.cache
    del fn
    torch._dynamo.reset()
    gc.collect()
    assert name not in linecache.cache


def test_copies_of_a_compiled_module_share_its_graph():
    # each deep copy (or unpickled copy) got a backend of its own, another entry of the module's
    # code: past Dynamo's limit of 8 the copies ran eagerly
    import copy

    compiled = ember.compile(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU()))
    x = torch.randn(3, 4)
    before = ember.stats()["graphs_compiled"]
    with torch.no_grad():
        for other in [compiled] + [copy.deepcopy(compiled) for _ in range(10)]:
            assert_same(other(x), other._orig_mod(x))
    assert ember.stats()["graphs_compiled"] - before == 1
    assert ember.stats()["graph_fallbacks"] == 0


def test_an_unpickled_module_takes_the_loading_processs_settings(monkeypatch, tmp_path):
    # the resolved settings travelled with the module: a checkpoint loaded elsewhere built its
    # kernels in the saver's cache directory (and with the saver's compiler and debug level)
    import pickle

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU())
    saved = pickle.dumps(ember.compile(model, options={"fusion": False}))
    monkeypatch.setattr(ember.config, "cache_dir", str(tmp_path / "loader"))
    loaded = pickle.loads(saved)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert_same(loaded(x), model(x))
    assert any(p.suffix == ".so" for p in (tmp_path / "loader").rglob("*"))


def test_a_kernel_of_only_a_constant_is_named_after_the_op_that_made_it():
    # (its constants are left out of names where they fuse into other ops: such a kernel was
    # fused_copy_0, "fuses -", and the report's summary listed no op for it)
    report = ember.explain(lambda x: torch.nn.functional.conv2d(x, torch.ones(1, 1, 3, 3)).sigmoid(),
                           torch.randn(1, 1, 8, 8))
    names = {k.name.rsplit("_", 1)[0]: k.aten_ops for k in report.kernels}
    assert names == {"fused_ones": ["aten.ones"], "fused_sigmoid": ["aten.sigmoid"]}, names
    assert "fuses -" not in "".join(k.source for k in report.kernels)
