"""Found by a second differential fuzzer (random programs of views, cat/split, indexing, scans,
sorts, matmuls, norms and in-place writes to inputs and their views, against eager): a write
reading a view that shares elements with it, neither dense, which eager's overlap check does not
look at and its kernel writes in its own order."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.frontend.overlap import _share_an_element, may_overlap

from .conftest import DEVICE
from .helpers import assert_same


def _shift_right(x):
    x[:, 1:] = x[:, :-1]
    return x * 2


def _shift_right_copy(x):
    x[:, 1:].copy_(x[:, :-1])
    return x * 2


def _add_left_neighbour(x):
    x[:, 1:] += x[:, :-1]
    return x * 2


@pytest.mark.filterwarnings("ignore:ember. a graph writes")
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("fn", [_shift_right, _shift_right_copy, _add_left_neighbour], ids=lambda f: f.__name__)
def test_a_write_reading_an_overlapping_view_that_is_not_dense_is_eagers(fn, dynamic):
    # x[:, 1:] and x[:, :-1] are not dense: eager's overlap check gives up ("too hard"), raises
    # nothing, and its copy reads what it wrote (each row's first element along the row);
    # functionalized, every element was read as it was before the write
    x = torch.randn(4, 5, device=DEVICE)
    ref_x, out_x = x.clone(), x.clone()
    ref = fn(ref_x)
    assert_same(ember.compile(fn, dynamic=dynamic)(out_x), ref)
    assert_same(out_x, ref_x)


def test_views_sharing_no_element_still_compile():
    def fn(x):
        x[:, 0] = x[:, 1]
        x[:, 1::2] += x[:, ::2][:, :2]
        return x * 2

    x = torch.randn(4, 5, device=DEVICE)
    ref_x, out_x = x.clone(), x.clone()
    fallbacks = ember.stats()["graph_fallbacks"]
    assert_same(ember.compile(fn)(out_x), fn(ref_x))
    assert_same(out_x, ref_x)
    assert ember.stats()["graph_fallbacks"] == fallbacks


def test_views_sharing_no_element_compile_with_symbolic_sizes():
    # with symbolic strides the exact check cannot run; x[:, 0] and x[:, 1] of an (s0, s1)
    # tensor are 1 apart, less than their stride s1 >= 2, which ran the graph eagerly
    # (x[:, 0] = x[:, 1] of a 3-d x, s2 apart with a smallest stride of 1, still runs eagerly)
    def columns(x):
        x[:, 0] = x[:, 1]
        return x * 2

    def last_dim(x):
        x[:, :, 2] += x[:, :, 0]
        return x * 2

    for fn, shapes in [(columns, [(4, 5), (6, 3)]), (last_dim, [(3, 4, 5), (2, 6, 3)])]:
        compiled = ember.compile(fn, dynamic=True)
        fallbacks, graphs = ember.stats()["graph_fallbacks"], ember.stats()["graphs_compiled"]
        for shape in shapes:
            x = torch.randn(shape, device=DEVICE)
            ref_x, out_x = x.clone(), x.clone()
            assert_same(compiled(out_x), fn(ref_x))
            assert_same(out_x, ref_x)
        assert ember.stats()["graph_fallbacks"] == fallbacks
        assert ember.stats()["graphs_compiled"] == graphs + 1


def test_which_strided_views_share_an_element():
    x = torch.zeros(4, 5)
    assert not _share_an_element(x[:, 0], x[:, 1])
    assert not _share_an_element(x[::2], x[1::2])
    assert not _share_an_element(x[:, ::2], x[:, 1::2])
    assert _share_an_element(x[:, 1:], x[:, :-1])
    assert _share_an_element(x[:, ::2], x[:, 2::2])
    assert _share_an_element(x[1:, 1:], x[:-1, :-1])
    assert _share_an_element(x[:, 0], x[:, 1].to(torch.float64))  # (other layouts: not looked at)


def _unfold_windows(x):
    return x.unfold(-1, 2, 1).split(42, dim=-2)[0]


def _unfold_all(x):
    return x.unfold(-1, 3, 1) * 1  # (a copy: its tangent is dense)


def _unfold_view_and_sum(x):
    return x.unfold(-1, 3, 2), x.sum()


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("fn", [_unfold_windows, _unfold_all, _unfold_view_and_sum], ids=lambda f: f.__name__)
def test_the_gradient_of_an_output_whose_elements_share_memory_is_eagers(fn, dynamic):
    # x.unfold(0, 2, 1) has strides (1, 1). torch traced its tangent with those strides, and at
    # run time copied the incoming gradient into a tensor of them: elements sharing memory kept
    # one of their values (aot_eager and Inductor alike). ember traces such graphs' tangents in
    # the outputs' memory formats
    torch.manual_seed(0)
    compiled = ember.compile(fn, dynamic=dynamic)
    for n in (50, 61):
        x = torch.randn(n, device=DEVICE, requires_grad=True)
        outs = fn(x)
        outs = outs if isinstance(outs, tuple) else (outs,)
        seeds = [torch.randn(o.shape, device=DEVICE) for o in outs]
        want = torch.autograd.grad(outs, x, seeds)[0]
        got_outs = compiled(x)
        got_outs = got_outs if isinstance(got_outs, tuple) else (got_outs,)
        for g, o in zip(got_outs, outs):
            assert_same(g, o)
        assert_same(torch.autograd.grad(got_outs, x, seeds)[0], want)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_an_overlapping_output_beside_its_sort_and_gather_in_a_dynamic_graph(dynamic):
    # A fuzzer's program (seed 10702): the windows of a celu along dim 0, returned beside a
    # gather and a sort of them. Compiled dynamic, its outputs carry symbolic strides, and the
    # tangents were traced in the windows' strides (33, 1, 1, 33): x's gradient was off by up to 5
    def fn(x, picks):
        windows = F.celu(x, 0.5).unfold(0, 2, 1)
        taken = torch.take_along_dim(windows, picks.argmax(-1, keepdim=True), dim=-1)
        return windows, taken, F.mish(torch.sort(windows, dim=3).values)

    torch.manual_seed(0)
    compiled = ember.compile(fn, dynamic=dynamic)
    for n in (8, 13):
        x = torch.randn(n, 33, 1, device=DEVICE, requires_grad=True)
        picks = torch.randn(n - 1, 33, 1, 2, device=DEVICE)
        outs = fn(x, picks)
        seeds = [torch.randn(o.shape, device=DEVICE) for o in outs]
        got = compiled(x, picks)
        assert_same(got, outs)
        assert_same(torch.autograd.grad(got, x, seeds)[0], torch.autograd.grad(outs, x, seeds)[0])


def test_which_strides_may_share_memory():
    x = torch.randn(50)
    assert may_overlap(x.unfold(0, 2, 1)) and may_overlap(torch.randn(1, 5).expand(3, 5))
    assert not may_overlap(x.unfold(0, 2, 2)) and not may_overlap(torch.randn(3, 4).t())
    assert not may_overlap(torch.randn(4, 1, 3)[:, :, ::2]) and not may_overlap(torch.randn(()))


def _scaled_flat(x):
    return x.mul_(1.5).reshape(-1)


def _shifted_rows(x):
    v = x.add_(1)
    return v.permute(1, 0, 2)[1:], v.sum()


def _clamped_tail(x):
    return x.clamp_(-0.5, 0.5)[:, :, 1:].flatten(1), x * 2


def _clamped_unflattened(x):
    # (ember's IR writes a reshape of the clamp into x and returns the clamp itself)
    v = x.unflatten(-1, (1, -1))
    v.clamp_(-0.5, 0.5)
    return v, x.sum()


def _added_flat_clamped_unflattened(x):
    v1 = x.reshape(-1)
    v1.add_(1)
    v2 = x.unflatten(-1, (1, -1))
    v2.clamp_(-0.5, 0.5)
    return v1, v2


def _permuted_flat_added(x):
    # (CPU fuzz seed 738533157370) ember's IR writes the sum permuted back into x and returns the
    # sum itself: its strides were a fresh value's, not eager's view of x
    v = x.permute(2, 0, 1).reshape(x.shape[2], -1)
    v.add_(0.5)
    return v


def _zeroed_flat(x):
    # (CPU fuzz seed 154407021780) passes folded the output, a reshape of the zeros written into
    # x, into a broadcast zero of its own, returned as a fresh copy
    return x.reshape(-1).zero_(), x.abs()


_LAYOUTS = {"strided": lambda b: b[..., ::2], "offset": lambda b: b[1:], "transposed": lambda b: b.transpose(1, 2)}


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("layout", list(_LAYOUTS))
@pytest.mark.parametrize("fn", [_scaled_flat, _shifted_rows, _clamped_tail, _clamped_unflattened,
                                _added_flat_clamped_unflattened, _permuted_flat_added, _zeroed_flat],
                         ids=lambda f: f.__name__)
def test_views_of_an_input_written_in_place_are_eagers_views(fn, layout, dynamic):
    # (CPU fuzz seed 339336268174) with symbolic sizes AOTAutograd rebuilds an output that views
    # an input from the returned tensor's strides and offset; the graph returned it as a view of
    # the written value, laid out as a fresh value: x.mul_(1.5).reshape(-1) of a strided x read
    # the gaps between x's elements (aot_eager and Inductor alike). Now a view of the input
    base = torch.arange(2 * 3 * 8, dtype=torch.float32, device=DEVICE).reshape(2, 3, 8) / 7 - 3
    ref_x, out_x = (_LAYOUTS[layout](base.clone()) for _ in range(2))
    ref = fn(ref_x)
    out = ember.compile(fn, dynamic=dynamic)(out_x)
    assert_same(out, ref)
    assert_same(out_x, ref_x)
    for o, r in zip(out, ref) if isinstance(ref, tuple) else [(out, ref)]:
        assert o.stride() == r.stride() and o.storage_offset() == r.storage_offset()
        # (a view of the input where eager's is one; a reshape of a transposed one is a copy)
        assert (o.untyped_storage().data_ptr() == out_x.untyped_storage().data_ptr()) == (
            r.untyped_storage().data_ptr() == ref_x.untyped_storage().data_ptr())
    if dynamic:  # another size, the same compiled graph
        bigger = torch.randn(3, 5, 8, device=DEVICE)
        ref_x, out_x = (_LAYOUTS[layout](bigger.clone()) for _ in range(2))
        assert_same(ember.compile(fn, dynamic=dynamic)(out_x), fn(ref_x))
        assert_same(out_x, ref_x)


def _every_third_flat(x):
    return torch.chunk(x, 2, dim=-3)[0][..., 1::3].reshape(-1)


@pytest.mark.parametrize("width", [33, 34], ids=["viewable", "copied"])
def test_a_reshape_that_the_sizes_make_a_view_is_eagers_view(width):
    # (CPU fuzz seed 560251378204) x[..., 1::3].reshape(-1) of a width that 3 divides is a view
    # (stride 3, offset 1): Dynamo traces aten.view under a guard, and AOTAutograd rebuilds the
    # output from the input with the returned tensor's strides and offset; ember's IR reshape of
    # symbolic sizes copies, and the copy's offset 0 read the elements before them
    x = torch.randn(5, 1, 7, width, device=DEVICE)
    compiled = ember.compile(_every_third_flat, dynamic=True)
    for y in (x, torch.randn(3, 1, 4, width, device=DEVICE)):  # (two sizes, one graph)
        ref = _every_third_flat(y)
        out = compiled(y)
        assert_same(out, ref)
        assert (out.stride(), out.storage_offset(), out._is_view()) == (ref.stride(), ref.storage_offset(),
                                                                         ref._is_view())


def _repeated_and_its_middle(x):
    v = torch.repeat_interleave(x, 2, dim=0)
    return v, v.narrow(-1, 1, v.shape[-1] - 2)


def _expanded_clone_flat(x):
    v = x.unsqueeze(-1).expand(*x.shape, 3).contiguous().view(x.shape[0], -1)
    return v, v[:, 1:], v.t()


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("fn", [_repeated_and_its_middle, _expanded_clone_flat], ids=lambda f: f.__name__)
def test_outputs_rebuilt_from_an_expanded_clone_in_training(fn, dynamic):
    # (CPU fuzz seed 577833368708) the training graph returns the clone of an expanded input, the
    # base AOTAutograd rebuilds the other outputs from (clone.view(-1), its slices); a clone being
    # its source in ember's IR, the base came back as a broadcast view and AOTAutograd's view raised
    x = torch.randn(6, 5, device=DEVICE)
    xr, xe = (x.clone().requires_grad_() for _ in range(2))
    ref, out = fn(xr), ember.compile(fn, dynamic=dynamic)(xe)
    assert_same(out, ref)
    sum(o.sum() * (k + 1) for k, o in enumerate(ref)).backward()
    sum(o.sum() * (k + 1) for k, o in enumerate(out)).backward()
    assert_same(xe.grad, xr.grad)


def _strided_clone_flat(x):
    c = x[..., ::2].contiguous()
    return c.view(c.shape[0], -1)[:, 1::3], c


def _strided_clone_viewed(x):
    c = x[..., ::2].contiguous()
    v = c.view(c.shape[0], c.shape[1], -1)
    return v, v[:, :, 1::3], c.sum()


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("fn", [_strided_clone_flat, _strided_clone_viewed], ids=lambda f: f.__name__)
def test_a_clone_of_a_strided_view_returned_after_its_views(fn, dynamic, train):
    # (CPU fuzz seed 979702047567) the clone's memory is shared by views returned before it; a
    # clone being its source in ember's IR, the group was copied as the whole input (strides
    # (32, 8, 2) for eager's (16, 4, 1)), or in training the clone came back as a strided view of
    # the input and AOTAutograd's view of it raised where eager runs
    x = torch.randn(3, 4, 7, 8, device=DEVICE)
    xr, xe = (x.clone().requires_grad_(train) for _ in range(2))
    ref, out = fn(xr), ember.compile(fn, dynamic=dynamic)(xe)
    assert_same(out, ref)
    for o, r in zip(out, ref):
        assert o.stride() == r.stride()
    assert out[0].untyped_storage().data_ptr() == out[1].untyped_storage().data_ptr()
    if train:
        sum(o.sum() * (k + 1) for k, o in enumerate(ref)).backward()
        sum(o.sum() * (k + 1) for k, o in enumerate(out)).backward()
        assert_same(xe.grad, xr.grad)
