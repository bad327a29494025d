"""Ops ember does not generate run through ATen inside the compiled program; nothing raises."""

from __future__ import annotations

import warnings

import pytest
import torch

import ember

from .helpers import assert_same, check, run


def test_unknown_ops_run_through_aten_and_fuse_around():
    def fn(x):
        y = torch.sort(torch.relu(x), dim=-1).values  # sort: not generated
        return y * 2 + 1

    report = check(fn, torch.randn(8, 16))
    assert "aten.sort" in report.fallbacks
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
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (a complex vector_norm failed the whole graph's compile)
        check(lambda a: torch.linalg.vector_norm(a, dim=1) + 1, x)


def test_decomposed_ops_of_complex_tensors_run_through_aten_and_the_rest_compiles():
    # nan_to_num's decomposition fails to trace a complex input (isneginf): the whole graph ran
    # eagerly, with a warning; the op runs through ATen now, and the relu is still generated
    z = torch.tensor([complex("nan"), 1 + 2j, complex(float("inf"), -1.0), -1j])
    x = torch.tensor([1.0, -2.0, 3.0, 0.5])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = check(lambda z, x: torch.nan_to_num(z) * torch.relu(x), z, x)
    assert "aten.nan_to_num" in report.fallbacks and report.kernels


@pytest.mark.parametrize("fn", [
    lambda z, w: torch.nn.functional.mse_loss(z, w),
    lambda z, w: torch.xlogy(z, w),
    lambda z, w: torch.nansum(z * w),
], ids=["mse_loss", "xlogy", "nansum"])
def test_ops_eager_has_no_complex_kernel_for_raise_eagers_error(fn):
    # their decompositions computed a complex result where eager's kernels refuse the dtype
    z, w = torch.randn(3, dtype=torch.complex64), torch.randn(3, dtype=torch.complex64)
    with pytest.raises((NotImplementedError, RuntimeError)) as expected:
        fn(z, w)
    with pytest.raises(type(expected.value)) as info:
        ember.compile(fn)(z, w)
    assert type(info.value) is type(expected.value)


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


def test_random_draws_keep_eagers_order_under_a_seed():
    # dead-code elimination rebuilt the graph walking back from the outputs: the randn_like of
    # the first output drew before the rand_like written above it (and the second dropout's
    # mask before the first's), so under one seed every value differed from eager's
    def draws(x):
        a = torch.rand_like(x)
        b = torch.randn_like(x)
        return b + 1, a * 2

    def dropouts(x, w):
        h = torch.nn.functional.dropout(x * w, 0.5, training=True)
        g = torch.nn.functional.dropout(x + w, 0.3, training=True)
        return g * 2, h * 3

    x = torch.zeros(3, 50)
    torch.manual_seed(0)
    expected = draws(x)
    torch.manual_seed(0)
    assert_same(ember.compile(draws)(x), expected)
    results = []
    for f in (dropouts, ember.compile(dropouts)):
        xs, w = torch.ones(3, 50, requires_grad=True), torch.full((50,), 0.5, requires_grad=True)
        torch.manual_seed(1)
        g, h = f(xs, w)
        (g.sum() + h.square().sum()).backward()
        results.append((g, h, xs.grad, w.grad))
    assert_same(results[1], results[0])


def _dropout_all(x):
    return torch.nn.functional.dropout(x, 1.0, training=True) + torch.rand(3)


def _fill_in_place(x):
    mask = torch.empty_like(x).bernoulli_(0.4)  # (in place: drawn in x's memory order)
    return mask * x, torch.nn.functional.alpha_dropout(x, 0.3, training=True)


@pytest.mark.parametrize("fn", [_dropout_all, _fill_in_place], ids=["dropout_p1", "bernoulli_transposed"])
def test_random_draws_are_eagers_draws(fn):
    # dropout at p=1 drew a mask that eager's kernel never draws (every later draw differed);
    # bernoulli_ of a transposed tensor became bernoulli.p, which draws in row-major order where
    # the in-place op draws in memory order (alpha_dropout of a transposed input fills one so)
    x = torch.randn(3, 4).t()
    torch.manual_seed(0)
    expected = (fn(x), torch.rand(2))
    torch.manual_seed(0)
    assert_same((ember.compile(fn)(x), torch.rand(2)), expected)


def test_dropout_without_draws_returns_its_input_as_eager():
    # eager's dropout returns the input itself where nothing is dropped: a write into the
    # result of an evaluation-mode dropout reaches the input
    def fn(x):
        y = torch.nn.functional.dropout(x, 0.5, training=False)
        y.add_(1)
        return x * 2

    x, y = torch.zeros(4), torch.zeros(4)
    assert_same(ember.compile(fn)(x), fn(y))
    assert_same(x, y)


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


def test_a_kernel_over_an_empty_batch_that_fails_to_build_runs_through_aten(tmp_path):
    # its ATen fallback computed the group's values of no elements: an empty input, which is no
    # kernel parameter, raised "cannot evaluate input", and a max over each segment of no
    # tokens raised amax's IndexError. Empty values are allocated, and a max over nothing is
    # its start, -inf, as the kernel's
    from ember import ragged

    def f(r, x):
        rows = x.index_select(0, r.row_ids())
        soft = ragged.jagged_softmax(ragged.Ragged(rows, r.offsets, validate=False)).values
        return soft, ragged.segment_max(ragged.Ragged(rows, r.offsets, validate=False)), (x * x).mean()

    opts = {"cache_dir": tmp_path, "cxx_flags": ("-O3", "-fPIC", "-shared", "--not-a-real-flag")}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check(f, ragged.from_list([torch.randn(0, 8)]), torch.randn(1, 8), options=opts, expect_built=False)
    assert len([w for w in caught if "failed to build" in str(w.message)]) == 1


def test_a_compiler_asked_for_by_name_is_used_or_named(tmp_path):
    # options={"cxx": ...} (or EMBER_CXX) naming no compiler fell back to g++ without a word
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = check(lambda a: torch.relu(a) + 1, torch.randn(5), expect_built=False,
                       options={"cache_dir": tmp_path, "cxx": "no-such-compiler++"})
    assert [w for w in caught if "'no-such-compiler++'" in str(w.message)]
    assert report.kernels and not report.kernels[0].built


@pytest.mark.parametrize("compiler", ["missing", "writes nothing"])
def test_a_compiler_that_builds_nothing_warns_once_per_graph(tmp_path, compiler):
    # a missing or broken compiler (EMBER_CXX) warned once per kernel, each built alone; one
    # that exited 0 writing no library sent the whole graph through ATen (FileNotFoundError)
    cxx = "no-such-compiler++"
    if compiler == "writes nothing":
        script = tmp_path / "fake c++"
        script.write_text("#!/bin/sh\nexit 0\n")
        script.chmod(0o755)
        cxx = str(script)
    x = torch.randn(6, 7)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = check(lambda a: torch.softmax(a, -1).cumsum(-1) + a.sum(), x, expect_built=False,
                       options={"cache_dir": tmp_path / "cache", "cxx": cxx})
    assert len(report.kernels) > 1 and not any(k.built for k in report.kernels)
    messages = [str(w.message) for w in caught if "ember" in str(w.message)]
    assert len(messages) == 1 and "failed to build" in messages[0], messages


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

    from ember.schedule import fusion, group_spec

    def needs_its_own_buffer(self):
        raise group_spec.NeedsBuffer(self.spec.roots[0])

    monkeypatch.setattr(fusion.KernelBuilder, "build", needs_its_own_buffer)
    x = torch.randn(4, 8)
    start = time.perf_counter()
    with pytest.warns(RuntimeWarning, match="runs through ATen"):
        out, report = run(lambda a: (a.sin() + 1).softmax(-1), x)
    assert_same(out, (x.sin() + 1).softmax(-1))
    assert "fusion planning is stuck" in report.graphs[0].error
    assert time.perf_counter() - start < 10


def _cond(x):
    y = torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,))
    return (y * 2 + 1).softmax(-1)


def _while(x):
    from torch._higher_order_ops.while_loop import while_loop
    _, y = while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, y * 1.5 + 1), (torch.tensor(0), x))
    return y.relu().sum(-1)


@torch.compiler.nested_compile_region
def _layer(x):
    return torch.tanh(x) * 2


@pytest.mark.parametrize("fn", [_cond, _while, lambda x: _layer(_layer(x)).softmax(-1)],
                         ids=["cond", "while_loop", "nested_compile_region"])
def test_higher_order_ops_run_through_aten_and_the_rest_fuses(fn):
    # a higher-order op's subgraphs are graph attributes that are no tensors: the lowering took
    # them for constants and the whole graph ran through ATen with a warning
    for x in (torch.randn(8, 16), -torch.rand(8, 16)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            report = check(fn, x)
        assert report.kernels


def test_higher_order_op_in_training():
    x = torch.randn(8, 16)
    weights = torch.arange(16.0)
    grads = []
    for f in (ember.compile(_cond), _cond):
        xg = x.clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (forward and backward compiled, neither through ATen whole)
            (f(xg) * weights).sum().backward()
        grads.append(xg.grad)
    assert_same(grads[0], grads[1])


@torch.library.custom_op("ember_test::tens_as_int64", mutates_args=())
def _tens_as_int64(x: torch.Tensor) -> torch.Tensor:
    return (x * 10).long()


@_tens_as_int64.register_fake
def _(x):  # a meta function that disagrees with the op's dtype (torch 2.11's unique inverse did)
    return torch.empty_like(x, dtype=torch.float32)


def test_an_aten_result_of_another_dtype_than_traced_is_converted_for_kernels():
    # kernels read the int64 result's bits as float32: tiny denormals where eager gives 10 * x
    def fn(x):
        return torch.ops.ember_test.tens_as_int64(x) * 2 + 1

    x = torch.arange(6.0)
    torch.testing.assert_close(ember.compile(fn)(x).double(), fn(x).double())



@torch.library.custom_op("ember_test::column_sums", mutates_args=())
def _column_sums(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0)


@_column_sums.register_fake
def _(x):  # a user's fake that disagrees with the op's sizes
    return torch.empty_like(x)


def test_a_custom_op_result_of_other_sizes_than_its_fake_raises_naming_the_op():
    # the kernel adding 1 read the (4,) result as (3, 4): past its memory, a (3, 4) result of
    # garbage; eager and aot_eager compute from the op's real (4,) result, Inductor asserts
    fn = lambda x: torch.ops.ember_test.column_sums(x) + 1  # noqa: E731
    with pytest.raises(RuntimeError, match=r"ember_test.column_sums: the op returned sizes \(4,\)"):
        ember.compile(fn)(torch.ones(3, 4))

def _rope_channels_first(x):  # (B, D, T): made contiguous for view_as_complex
    y = x.transpose(1, 2).contiguous()
    return torch.view_as_real(torch.view_as_complex(y.view(*y.shape[:-1], -1, 2)) * 1j).flatten(-2)


def _rope_scores(q, k, fc):  # llama's complex rotary embedding, then q @ k^T
    qc = torch.view_as_complex(q.reshape(*q.shape[:-1], -1, 2)) * fc
    kc = torch.view_as_complex(k.reshape(*k.shape[:-1], -1, 2)) * fc
    return torch.view_as_real(qc).flatten(-2) @ torch.view_as_real(kc).flatten(-2).mT


def test_an_aten_call_gets_its_inputs_laid_out_as_eager_did():
    """ember lowers a clone (``.contiguous()``) as no op; the view it handed view_as_complex in
    its place had a last stride of 5 ("Tensor must have a last dimension with stride 1"), in the
    forward and in the backward of a complex rotary embedding."""
    check(_rope_channels_first, torch.randn(2, 8, 5))
    fc = torch.polar(torch.ones(5, 2), torch.randn(5, 2))
    q, k = torch.randn(3, 5, 4, requires_grad=True), torch.randn(3, 5, 4, requires_grad=True)
    _rope_scores(q, k, fc).square().sum().backward()
    grads = q.grad, k.grad
    q.grad = k.grad = None
    ember.compile(_rope_scores)(q, k, fc).square().sum().backward()
    assert_same((q.grad, k.grad), grads)


@pytest.mark.parametrize("loss", ["mse", "smooth_l1", "huber"])
def test_a_mean_losss_gradient_over_an_empty_batch_compiles(loss):
    # torch's own decompositions, run by AOTAutograd before ember sees the graph, divide by the
    # batch's numel in Python; the compile failed with "ZeroDivisionError: float division by
    # zero" (and the graph ran eagerly with a warning) where eager gives NaN and empty gradients
    fn = {"mse": torch.nn.functional.mse_loss, "smooth_l1": torch.nn.functional.smooth_l1_loss,
          "huber": torch.nn.functional.huber_loss}[loss]
    x, y = torch.randn(0, 7, requires_grad=True), torch.randn(0, 7)
    expected = fn(x, y)
    expected.backward()
    grad, x.grad = x.grad, None
    before = ember.stats()["graph_fallbacks"]
    # (their backwards are ember's decompositions, frontend/loss_decomps.py: compiled, no warning)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = ember.compile(fn)(x, y)
        out.backward()
    assert_same((out, x.grad), (expected, grad))
    assert ember.stats()["graph_fallbacks"] == before


def test_a_graph_torch_cannot_trace_runs_eagerly_with_one_warning(monkeypatch):
    # torch's own mse_loss_backward decomposition back in the table: its ZeroDivisionError while
    # AOTAutograd traces leaves the graph to eager, right, with one warning
    from torch._decomp import decomposition_table as torch_table

    from ember.frontend import dynamo
    op = torch.ops.aten.mse_loss_backward.default
    ours = dynamo.decomposition_table
    monkeypatch.setattr(dynamo, "decomposition_table", lambda: {**ours(), op: torch_table[op]})
    x, y = torch.randn(0, 7, requires_grad=True), torch.randn(0, 7)
    expected = torch.nn.functional.mse_loss(x, y)
    expected.backward()
    grad, x.grad = x.grad, None
    before = ember.stats()["graph_fallbacks"]
    with pytest.warns(RuntimeWarning, match="could not trace"):
        out = ember.compile(torch.nn.functional.mse_loss)(x, y)
    out.backward()
    assert_same((out, x.grad), (expected, grad))
    assert ember.stats()["graph_fallbacks"] == before + 1


def test_a_graph_whose_trace_fails_on_eagers_own_check_raises_eagers_error_alone():
    # torch's trace fails where the op's own check does (an interpolation to a width of 0, CPU
    # fuzz seed 608735179811): the call raises eager's error, with no warning blaming the
    # compiler; the graph's warning comes on its first call that returns
    import torch.nn.functional as F

    def fn(x):
        return F.interpolate(torch.nan_to_num(x), scale_factor=2, mode="linear") + 1

    compiled = ember.compile(fn)
    with pytest.raises(RuntimeError) as eager_error:
        fn(torch.randn(3, 7, 0))
    with warnings.catch_warnings(record=True) as caught, pytest.raises(RuntimeError) as ember_error:
        warnings.simplefilter("always")
        compiled(torch.randn(3, 7, 0))
    assert str(ember_error.value) == str(eager_error.value)
    assert not [w for w in caught if str(w.message).startswith("ember")], [str(w.message) for w in caught]
    x = torch.randn(3, 7, 5)  # (valid sizes: compiled, no warning either)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(compiled(x), fn(x))


def test_meta_tensors_run_through_atens_meta_kernels_without_a_warning():
    # meta tensors hold no data, so there is nothing to generate: the graph (and its backward)
    # ran through ATen after "ember could not compile graph" (no kernel backend for 'meta')
    def fn(x, w):
        return (x * w).softmax(-1).sum(0)

    x, w = torch.empty(3, 4, device="meta"), torch.empty(4, device="meta", requires_grad=True)
    expected = fn(x, w)
    before = ember.stats()["graph_fallbacks"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = ember.compile(fn)(x, w)
        out.sum().backward()
    assert (out.shape, out.dtype, out.device, out.requires_grad) == (
        expected.shape, expected.dtype, expected.device, expected.requires_grad)
    assert w.grad.shape == w.shape and w.grad.device.type == "meta"
    assert ember.stats()["graph_fallbacks"] == before


def test_fake_tensors_run_the_graph_eagerly_as_eager_does():
    # under a FakeTensorMode (shape and memory estimates) the program's buffers came back fake
    # and its kernels wrote through their null data pointers: a segfault
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    def fn(x, w):
        return (x @ w).relu().sum(-1) + x.sin().mean()

    fast = ember.compile(fn)
    make = ember.compile(lambda: torch.ones(3).sin() * 2)  # no inputs: only the mode says fake
    x, w = torch.randn(3, 4), torch.randn(4, 5, requires_grad=True)
    assert_same(fast(x, w), fn(x, w))
    assert_same(make(), torch.ones(3).sin() * 2)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with mode:
            out, made = fast(x, w), make()  # the graphs compiled for real tensors, fake results
            out.sum().backward()
        fake_x, fake_w = mode.from_tensor(x), mode.from_tensor(torch.randn(4, 5))
        outside = fast(fake_x, fake_w)  # fake inputs outside the mode: compiled for fake ones
    for t in (out, made, outside, w.grad):
        assert isinstance(t, FakeTensor)
    assert (out.shape, made.shape, outside.shape, w.grad.shape) == ((3,), (3,), (3,), (4, 5))
    w.grad = None
    assert_same(fast(x, w), fn(x, w))  # real calls after them: compiled as before


def test_a_forward_whose_trace_disagrees_on_a_shape_runs_its_backward_through_aten_too(monkeypatch):
    # torch 2.11's fake linalg_vector_norm kept a dim of size 1 its eager op drops: the forward ran
    # through ATen, its saved values came in the shapes ATen gives, and the backward compiled for
    # the traced shapes raised IndexError. A forward that falls back over a shape disagreement
    # (here a lowering raises one) runs its backward through ATen too.
    from ember.frontend import aten_reductions, context  # noqa: F401  (LOWERINGS filled before the patch)

    def disagreeing(ctx, x, *_):
        raise context.ShapeDisagreement(f"lowering of {ctx.aten} built {list(x.shape)}, ATen gives []")

    for op in (torch.ops.aten.sum.default, torch.ops.aten.sum.dim_IntList):  # (the forward's only)
        monkeypatch.setitem(context.LOWERINGS, op, disagreeing)
    fn = lambda x: (x.sin() * x.exp()).sum()  # noqa: E731
    report = ember.Report()
    x = torch.randn(5, 3, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = ember.compile(fn, report=report)(x)
    got.backward()
    x_eager = x.detach().requires_grad_()
    want = fn(x_eager)
    (want_grad,) = torch.autograd.grad(want, x_eager)
    assert_same((got, x.grad), (want, want_grad))
    forward, backward = report.graphs
    assert "ShapeDisagreement" in forward.error
    assert "its forward ran through ATen over a shape" in backward.error and not backward.kernels
