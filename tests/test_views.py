"""Views as eager has them: slices that start where torch's trace says (from the end, clamped,
at symbolic positions), outputs that share memory exactly where eager's do, and as_strided of
a computed value reading it in eager's memory order."""

from __future__ import annotations

import warnings

import pytest
import torch

import ember

from .helpers import assert_same, run


@pytest.mark.parametrize("fn, calls", [
    (lambda x, k: x[-k:] * 2, [(torch.arange(8.), 3), (torch.arange(8.), 5)]),
    (lambda x, y: x[:, -y.shape[1]:] - y, [(torch.arange(10.).view(1, 10), torch.zeros(1, 4)),
                                           (torch.arange(12.).view(1, 12), torch.zeros(1, 7))]),
    (lambda x: x[-5:] * 2, [(torch.arange(8.),), (torch.arange(3.),), (torch.arange(6.),)]),
    (lambda x: x.select(0, -(x.shape[0] // 2)) * 2, [(torch.arange(8.),), (torch.arange(5.),)]),
    (lambda x, k: x[k - 10:] * 1, [(torch.arange(6.), 12), (torch.arange(6.), 7)]),
    (lambda x, i: x[i], [(torch.arange(12.).view(6, 2), 1), (torch.arange(12.).view(6, 2), 2),
                         (torch.arange(12.).view(6, 2), -1)]),
    (lambda x, i: x.narrow(1, i, 1) + 1, [(torch.randn(3, 5), 1), (torch.randn(3, 5), 3)]),
], ids=["last_k", "last_like_y", "last_5_of_fewer", "select_from_end", "start_past_the_front",
        "select_at_int", "narrow_at_int"])
@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
def test_slices_start_where_torch_traced_them(fn, calls, dynamic):
    # the start was taken from the op's arguments: a symbolic negative start stayed negative
    # (reads before the tensor), a literal one was not clamped for shorter sizes, and a start
    # bound only in a view the wrapper replays was an unbound name
    compiled = ember.compile(fn, dynamic=dynamic)
    for args in calls:
        assert_same(compiled(*args), fn(*args))


def test_a_write_into_the_tail_of_a_shorter_input():
    def scale_tail(x):
        x[-4:].mul_(2)
        return x
    compiled = ember.compile(scale_tail, dynamic=True)
    for n in (8, 3, 5):
        a, b = torch.ones(n), torch.ones(n)
        compiled(a)
        scale_tail(b)
        assert_same(a, b)


def test_views_of_one_value_share_its_memory_as_in_eager():
    def v(x):
        y = x.exp()
        return y[1:], y[:2]
    a, b = ember.compile(v)(torch.zeros(4))
    a.mul_(0)
    assert b.tolist() == [1.0, 0.0]  # eager: b[1] is a[0]


def test_equal_values_merged_by_cse_still_come_back_apart():
    def v(x):
        return x.exp()[1:], x.exp()[:2]
    a, b = ember.compile(v)(torch.zeros(4))
    a.mul_(0)
    assert b.tolist() == [1.0, 1.0]  # eager: two exps, two memories


@pytest.mark.parametrize("fn, clone", [
    (lambda b: (lambda out: (out[1:], out))(b.clone()), 1),
    (lambda b: (lambda out: (out, out[1:]))(b.clone()), 0),
    (lambda b: (lambda out: (out.t(), out))(b.clone()), 1),
    (lambda b: (lambda out: (out.view(-1), out[0], out))(b.clone()), 2),
], ids=["slice_first", "clone_first", "transpose", "three"])
def test_a_clone_returned_with_its_views_is_one_memory_of_its_own(fn, clone):
    # a clone is its input in the IR: returned beside a view of it, the clone came back as the
    # caller's input and the view as a copy on its own (found by a helper's hunt)
    b = torch.arange(6.0).reshape(2, 3)
    outs = ember.compile(fn)(b)
    assert_same(outs, fn(b.clone()))
    assert all(o.untyped_storage().data_ptr() != b.untyped_storage().data_ptr() for o in outs)
    outs[clone].fill_(7)  # every view of the clone sees the write, the input does not
    assert all(bool((o == 7).all()) for o in outs), outs
    assert_same(b, torch.arange(6.0).reshape(2, 3))


@pytest.mark.parametrize("fn", [
    lambda x: (lambda v: (v[0::3], v[0::2]))(x.repeat(1)),
    lambda x: (lambda v: (v[0::3], v))(x.repeat(1)),
    lambda x: (lambda v: (v[1:], v[::2]))(x.clone()),
    lambda x: (lambda v: (v[:, ::2], v[::2, 1:]))(x.view(-1, 1).repeat(1, 3)),
    lambda x: (lambda v: (v[:, ::2], v[::2, 1:]))(x.view(-1, 1).expand(-1, 3).clone()),
], ids=["two_strided", "strided_then_whole", "offset_and_strided", "of_a_repeat", "of_an_expanded_clone"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_strided_views_of_a_copy_share_all_of_its_values(fn, dynamic):
    # a stride-3 view spans all seven elements of its memory but holds three: taken for the
    # whole memory, it was the only one copied, and the other view read the gaps (fuzz 11008).
    # Views of an expanded value came back as broadcast views of a copy of the input: their
    # values right, but strides of 0, which eager's in-place writes refuse
    compiled = ember.compile(fn, dynamic=dynamic)
    for n in (7, 9):
        x = torch.randn(n)
        outs, ref = compiled(x), fn(x)
        assert_same(outs, ref)
        assert [o.stride() for o in outs] == [r.stride() for r in ref]
        assert all(o.untyped_storage().data_ptr() != x.untyped_storage().data_ptr() for o in outs)
        outs[0].fill_(7)  # the two share memory, as eager's do
        ref[0].fill_(7)
        assert_same(outs, ref)


def test_a_clone_returned_with_its_view_keeps_the_values_before_a_write():
    def f(b):
        out = b.clone()
        b.add_(1)
        return out[1:], out

    b, ref_b = torch.zeros(3), torch.zeros(3)
    assert_same(ember.compile(f)(b), f(ref_b))
    assert_same(b, ref_b)


@pytest.mark.parametrize("view", [
    lambda y: y.diagonal(), lambda y: y.unfold(0, 2, 1), lambda y: y.view(torch.int32),
    lambda y: y.as_strided((2,), (3,)),
], ids=["diagonal", "unfold", "dtype_view", "as_strided"])
def test_an_aten_view_of_a_clone_is_not_the_input(view):
    # a clone is its source in the IR, so the ATen view was taken of the caller's input: writing
    # into the result changed the input
    fn = lambda x: view(x.clone())  # noqa: E731
    x = torch.ones(3, 3)
    out = ember.compile(fn)(x)
    out.zero_()
    assert_same(x, torch.ones(3, 3))


@pytest.mark.parametrize("fn", [
    lambda x: x.exp().t().as_strided((2, 2), (1, 3), 1),
    lambda x: (x.t() * 2).as_strided((3,), (2,)),
    lambda x: (x * 1).as_strided((2, 3), (1, 2), 2),
    lambda x: x.exp()[1:].as_strided((2,), (4,), 3),
    lambda x: x.clone().as_strided((2, 2), (2, 1), 1),
    lambda x: x.as_strided((2, 2), (2, 1), 1) * 2,
    lambda x: (x @ x.t()).as_strided((2, 2), (1, 3)),
], ids=["exp_t", "mul_t", "mul", "exp_sliced", "clone", "input", "matmul"])
def test_as_strided_reads_a_computed_value_in_eager_memory_order(fn):
    # the argument's buffer is laid out ember's way; as_strided read it as if it were eager's
    x = torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # compiled, not run through ATen
        out, _ = run(fn, x)
    assert_same(out, fn(x))


def test_as_strided_of_a_value_sliced_from_a_transposed_input():
    # (an input's clone keeps the input's strides in eager: its memory order is the input's)
    fn = lambda x: x.clone().as_strided((2, 3), (1, 2))  # noqa: E731
    x = torch.randn(4, 3).t()
    assert_same(ember.compile(fn)(x), fn(x))


def test_as_strided_with_symbolic_sizes_compiles():
    # GroupNorm's decomposition as_strided a computed value to (batch, groups): with a batch
    # size that changes, the symbolic size failed to lower and the whole graph ran through ATen
    norm = torch.nn.GroupNorm(2, 4)
    compiled = ember.compile(norm)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for batch in (4, 5, 7):
            x = torch.randn(batch, 4, 5, requires_grad=True)
            ref = x.detach().clone().requires_grad_()
            out = compiled(x)
            out.sum().backward()
            expected = norm(ref)
            expected.sum().backward()
            assert_same(out, expected)
            assert_same(x.grad, ref.grad)


def test_group_norm_with_symbolic_channels_compiles():
    # with the channels symbolic too, the as_strided's argument has strides and a storage size
    # spelled with Max(1, c // 2): its memory order was not proved and the graph ran through ATen
    fn = lambda x, w, b: torch.nn.functional.group_norm(x, 2, w, b)  # noqa: E731
    compiled = ember.compile(fn, dynamic=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for shape in ((2, 4, 5), (3, 6, 4)):
            args = [torch.randn(shape), torch.randn(shape[1]), torch.randn(shape[1])]
            assert_same(compiled(*args), fn(*args))


def test_view_output_of_an_expanded_input_that_aten_would_copy_from_a_contiguous_one():
    # the reshape copies a contiguous (2, 3, 4) but is a view of the expanded input, with a
    # stride 0: the program replays it from the input, which planning made a kernel's root
    # ("fusion planning is stuck") and the whole graph ran through ATen
    fn = lambda x: x.permute(1, 0, 2).reshape(6, 4)  # noqa: E731
    x = torch.randn(1, 1, 4).expand(2, 3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        out, report = run(fn, x)
    assert not [g.error for g in report.graphs if g.error]
    assert_same(out, fn(x))
    assert out.stride() == fn(x).stride()


def test_slices_and_writes_with_a_symbolic_step_compile():
    # a SymInt step (x[::k] with k an int argument Dynamo made dynamic) failed to lower and the
    # whole graph ran through ATen; the write y[::k] = v (slice_scatter) ran as an ATen call
    def fn(x, k):
        y = x.clone()
        y[1::k] = -1.0
        return x[::k] * 2, y

    report = ember.Report()
    compiled = ember.compile(fn, dynamic=True, report=report)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for k in (2, 3, 1, 9):
            x = torch.randn(8)
            assert_same(compiled(x, k), fn(x, k))
    assert not [g.error for g in report.graphs if g.error]
    assert report.fallbacks == []


@pytest.mark.parametrize("fn", [
    lambda x: torch.diag(x + 1),
    lambda x: [t.contiguous() for t in (x + 1).split(4, 1)],
    lambda x: (x.T @ x)[1:2].clone(),
    lambda x: x.cumsum(0)[-1].clone(),
    lambda x: x.cumsum(0)[-1],
], ids=["diag", "split_contiguous", "row_of_a_product", "row_of_a_scan", "view_of_a_scan"])
def test_a_fresh_output_viewing_a_kernel_buffer_has_eager_strides(fn):
    # the clone eager makes is no op in ember's IR: the output came back as the view of the
    # buffer ((11,) for diag, (10, 1) for the first piece), and the user's .view(-1) raised.
    # A clone of a row of an ATen result or a scan's buffer had eager's strides but was a view
    # of the whole: it kept all of that memory alive with it (where eager's view stays one)
    x = torch.randn(3, 10)
    out, ref = ember.compile(fn)(x), fn(x)
    assert_same(out, ref)
    out, ref = ([out], [ref]) if torch.is_tensor(out) else (out, ref)
    layout = lambda t: (t.stride(), t.storage_offset(), t.untyped_storage().nbytes())  # noqa: E731
    assert [layout(t) for t in out] == [layout(t) for t in ref]


def test_an_unfold_returned_beside_its_base_is_a_view_of_it():
    # unfold is lowered as a gather: returned with the value it unfolds, it came back as a copy,
    # and a write into one did not show in the other as in eager
    fn = lambda x: (lambda y: (y, y.unfold(1, 2, 2)))(x * 2)  # noqa: E731
    x = torch.randn(4, 6)
    out, ref = ember.compile(fn)(x), fn(x)
    assert_same(out, ref)
    out[1].zero_()
    ref[1].zero_()
    assert_same(out[0], ref[0])
