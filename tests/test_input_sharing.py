"""In-place writes and aliasing against eager: a graph compiled for inputs apart, then called
with inputs that are views of one memory (Dynamo guards on the same tensor passed twice, not on
two distinct tensors sharing memory)."""

from __future__ import annotations

import warnings

import pytest
import torch

import ember

from .conftest import DEVICE
from .helpers import assert_same


def _apart(n):
    return [torch.arange(float(n), device=DEVICE), torch.arange(float(n), device=DEVICE) + 10]


def _overlapping(n):
    base = torch.arange(float(n + 1), device=DEVICE)
    return [base[:-1], base[1:]]


@pytest.mark.parametrize("fn", [
    lambda x, y: x.copy_(y.flip(0)),
    lambda x, y: (x.add_(1), y * 2),
    lambda x, y: (x.mul_(2), y.add_(1)),
    lambda x, y: x.add_(y),                       # eager raises its partial-overlap error
    lambda x, y: torch.cumsum(y, 0, out=x),
], ids=["copy_flip", "write_then_read", "write_both", "add_overlap_error", "out_overlap_error"])
def test_a_graph_compiled_for_inputs_apart_called_with_overlapping_views_is_eagers(fn):
    compiled = ember.compile(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for make in (_apart, _overlapping, _apart):
            ref_args, args = make(5), make(5)
            try:
                expected = fn(*ref_args)
            except RuntimeError as e:
                with pytest.raises(RuntimeError, match="single memory location"):
                    compiled(*args)
                assert "single memory location" in str(e)
                continue
            out = compiled(*args)
            assert_same(out, expected)
            assert_same(list(args), list(ref_args))
            assert_same(args[0]._base if args[0]._base is not None else args[0],
                        ref_args[0]._base if ref_args[0]._base is not None else ref_args[0])


def _shared_calls():
    return ember.stats()["calls_on_shared_inputs"]


def test_views_at_other_offsets_of_a_storage_the_graph_was_compiled_for_are_eagers():
    # compiled for two views of one buffer apart; called with views of the same sizes and strides
    # that meet (Dynamo's guards pass: only the storage offset differs)
    def fn(x, y):
        return x.copy_(y.flip(0))

    compiled = ember.compile(fn)
    compiled(*(lambda b: (b[:3], b[4:]))(torch.arange(7.0, device=DEVICE)))
    before = _shared_calls()
    b, ref = torch.arange(7.0, device=DEVICE), torch.arange(7.0, device=DEVICE)
    compiled(b[:3], b[1:4])
    fn(ref[:3], ref[1:4])
    assert_same(b, ref)
    assert _shared_calls() == before + 1


def test_disjoint_views_of_one_buffer_run_compiled():
    def fn(x, y):
        return x.mul_(2).add_(y)

    compiled = ember.compile(fn)
    compiled(torch.ones(3, device=DEVICE), torch.ones(3, device=DEVICE))
    before = _shared_calls()
    b, ref = torch.arange(6.0, device=DEVICE), torch.arange(6.0, device=DEVICE)
    compiled(b[:3], b[3:])
    fn(ref[:3], ref[3:])
    assert_same(b, ref)
    assert _shared_calls() == before


def test_a_foreach_step_over_views_of_a_flat_buffer_runs_compiled_every_call():
    # parameters as views of one flat buffer (as FSDP's flat parameters): shared when compiled,
    # shared the same way at every call
    sizes = [5, 7, 1, 16]

    def step(params, grads):
        torch._foreach_add_(params, grads, alpha=-0.5)

    flat, ref_flat = torch.randn(29, device=DEVICE), None
    ref_flat = flat.clone()
    grads = [torch.randn(n, device=DEVICE) for n in sizes]
    compiled = ember.compile(step)
    before = _shared_calls()
    for _ in range(3):
        compiled(list(flat.split(sizes)), grads)
        step(list(ref_flat.split(sizes)), grads)
    assert_same(flat, ref_flat)
    assert _shared_calls() == before


@pytest.mark.parametrize("check", [True, False])
def test_check_input_sharing_option(check):
    def fn(x, y):
        return x.add_(y.flip(0))

    compiled = ember.compile(fn, options={"check_input_sharing": check})
    compiled(torch.ones(2, device=DEVICE), torch.ones(2, device=DEVICE))
    before = _shared_calls()
    b, ref = torch.arange(5.0, device=DEVICE), torch.arange(5.0, device=DEVICE)
    compiled(b[:2], b[1:3])
    fn(ref[:2], ref[1:3])
    if check:
        assert_same(b, ref)
    assert _shared_calls() == before + check


_MERGED_VIEWS = {"rows": lambda b: (b[1:], b[1:][..., 1:]), "t": lambda b: (b, b.t()),
                 "step": lambda b: (b[1:], b[::2])}


@pytest.mark.parametrize("view", sorted(_MERGED_VIEWS))
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("fn, runs_eagerly", [
    (lambda x0, x1: (x1 + 1, x0.mul_(2.0)[0]), True),    # AOTAutograd gave b[0] for x0[0] (torch 2.13 too)
    (lambda x0, x1: (x1.add_(1.0), x0.sum()), True),     # x1 with the whole base's shape (torch 2.11)
    (lambda x0, x1: (x0.add_(1.0).t(), x1 * 2), True),   # AOTAutograd raised after the graph ran
    (lambda x0, x1: (x0.fill_(2.0), x1.bool())[::-1], True),
    (lambda x0, x1: (x0.fill_(2.0), x1.sum(-1))[1], False),  # returns no memory of the inputs
    (lambda x0, x1: (x1.add_(1.0), x0 * 2)[1], False),
], ids=["view_of_written", "written_returned", "transposed_written", "fill_returned", "write_then_read",
        "write_then_scale"])
def test_a_written_input_that_overlaps_another_and_is_returned_is_eagers(fn, runs_eagerly, view, dynamic):
    # inputs that meet from the first call: AOTAutograd merges them into one synthetic base and
    # rebuilds the outputs that view it; ember runs those graphs eagerly, with one warning
    torch._dynamo.reset()
    ember.reset_stats()
    base = torch.randn(34, 254, device=DEVICE)
    ref_base, got_base = base.clone(), base.clone()
    expected = fn(*_MERGED_VIEWS[view](ref_base))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = ember.compile(fn, dynamic=dynamic)(*_MERGED_VIEWS[view](got_base))
    expected, got = (expected, got) if isinstance(expected, tuple) else ((expected,), (got,))
    for e, g in zip(expected, got):
        assert (g.shape, g.stride(), g.storage_offset()) == (e.shape, e.stride(), e.storage_offset())
        torch.testing.assert_close(g, e)
    torch.testing.assert_close(got_base, ref_base)
    fallbacks = [w for w in caught if "AOTAutograd rebuilds wrongly" in str(w.message)]
    assert len(fallbacks) == int(runs_eagerly)
    assert ember.stats()["graph_fallbacks"] == int(runs_eagerly)
