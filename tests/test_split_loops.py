"""CPU loops split where a guard ``position < length`` turns false (codegen/cpp_split.py): the
padding of padded and ragged code is skipped for real, not computed and masked. Results against
eager, the split proved in the generated C++."""

from __future__ import annotations

import re

import pytest
import torch

import ember
from ember import ragged

from .helpers import check


def _expensive(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(torch.sin(x) * 2) / (1 + x * x)


def _padded_by_lengths(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    mask = torch.arange(x.shape[1])[None, :] < lengths[:, None]
    return torch.where(mask, _expensive(x), 0.0)


def _splits(report: ember.Report) -> list[str]:
    return [m for k in report.kernels for m in re.findall(r"const int64_t (\w+)_split = ", k.source)]


def _unswitched(report: ember.Report) -> list[str]:
    return [m for k in report.kernels for m in re.findall(r"// v\d+, the same along (\w+)", k.source)]


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_padded_row_is_computed_only_up_to_its_length(dynamic):
    # lengths below 0, 0, inside, the whole row and past it: the split point is clamped
    x = torch.randn(6, 37)
    lengths = torch.tensor([-3, 0, 1, 20, 37, 50])
    report = check(_padded_by_lengths, x, lengths, dynamic=dynamic)
    assert _splits(report) == ["o1"]
    source = report.kernels[0].source
    # each part folds the guard: the first loop has it true, the second false
    assert source.count("const bool") >= 2 and "= true;" in source and "= false;" in source
    if dynamic:  # a row of symbolic length: the bound's values are computed only where it has elements
        check(_padded_by_lengths, torch.randn(6, 0), lengths, dynamic=True)
        check(_padded_by_lengths, torch.randn(2, 5), lengths[:2], dynamic=True)


@pytest.mark.parametrize("form", ["le", "gt", "ge"])
def test_every_comparison_of_the_position_with_its_bound_splits(form):
    def fn(x, lengths):
        pos, n = torch.arange(x.shape[1])[None, :], lengths[:, None]
        mask = {"le": pos <= n, "gt": n > pos, "ge": pos >= n}[form]
        return torch.where(mask, _expensive(x), -x)

    report = check(fn, torch.randn(5, 19), torch.tensor([-1, 0, 7, 18, 30]))
    assert _splits(report) == ["o1"]


def test_a_bound_that_varies_along_the_row_is_no_split():
    # the position against a per-element bound: no prefix to split at, the guard stays
    def fn(x, bound):
        return torch.where(torch.arange(x.shape[1])[None, :] < bound, _expensive(x), 0.0)

    report = check(fn, torch.randn(4, 23), torch.randint(0, 23, (4, 23)))
    assert _splits(report) == []


def test_an_index_check_in_the_bound_still_raises_like_eager():
    # the length is read at an index: hoisted out of the row's loop, its check still raises
    def fn(x, lengths, rows):
        return _padded_by_lengths(x, lengths[rows])

    x, lengths = torch.randn(4, 9), torch.tensor([3, 9, 0, 5])
    check(fn, x, lengths, torch.tensor([3, 2, 1, 0]))
    with pytest.raises(IndexError):
        fn(x, lengths, torch.tensor([0, 1, 2, 7]))
    with pytest.raises(IndexError):
        ember.compile(fn)(x, lengths, torch.tensor([0, 1, 2, 7]))


def test_a_ragged_gathers_gradient_skips_the_padding():
    # the backward of pred[row_ids, positions] is a gather over the (B, N, 4) places:
    # n < length[b] ? grad[offsets[b] + n] : 0, the same along the last dim: unswitched
    torch.manual_seed(0)
    r = ragged.from_list([torch.randn(n, 4) for n in (3, 0, 7, 1)])
    pred = torch.randn(4, 8, 4, requires_grad=True)

    def step(p, targets):
        matched = p[targets.row_ids(), targets.positions()]
        return (_expensive(matched) * targets.values).sum()

    report = ember.Report()
    loss = ember.compile(step, report=report)(pred, r)
    loss.backward()
    got, pred.grad = pred.grad, None
    step(pred, r).backward()
    torch.testing.assert_close(got, pred.grad)
    assert _unswitched(report) == ["o2"]


def test_a_rows_mask_unswitches_the_loop_over_its_features():
    def fn(x, keep):
        return torch.where(keep[:, None], _expensive(x), x * 0.5)

    report = check(fn, torch.randn(7, 33), torch.tensor([True, False, True, True, False, False, True]))
    assert _unswitched(report) == ["o1"] and _splits(report) == []
    source = report.kernels[0].source
    assert re.search(r"if \(.*\) \{  // v\d+, the same along o1\n", source), source


def _bias_corrected(p: torch.Tensor, g: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """An Adam-style update: its bias correction, from a 0-d step, is the same at every element."""
    return p - 0.1 * g / (1 - 0.999 ** step).sqrt()


@pytest.mark.parametrize("dynamic", [False, True])
def test_values_the_same_at_every_element_are_computed_once_before_the_loops(dynamic):
    p, g, step = torch.randn(1000), torch.randn(1000), torch.tensor(3.0)
    report = check(_bias_corrected, p, g, step, dynamic=dynamic)
    (source,) = [k.source for k in report.kernels]
    before, loop = source.split("#pragma omp parallel", 1)
    assert "ember_pow_narrow(" in before and "std::sqrt" in before
    assert "ember_pow_narrow(" not in loop and "std::sqrt" not in loop
    # over symbolic sizes, the step is loaded only where the loop has an element
    assert (" > 0) {" in before) == dynamic
    for n in (0, 1, 7):  # (an empty update reads no step)
        check(_bias_corrected, torch.randn(n), torch.randn(n), torch.tensor(2.0), dynamic=dynamic)


def test_an_integer_division_the_same_at_every_element_stays_in_the_loop():
    # it raises on a zero divisor only where an element computes it
    def shifted(x, a, b):
        return x + a // b

    x, a, b = torch.arange(10), torch.tensor(7), torch.tensor(2)
    report = check(shifted, x, a, b)
    (source,) = [k.source for k in report.kernels]
    before, loop = source.split("#pragma omp parallel", 1)
    assert "ember_floordiv" in loop and "ember_floordiv" not in before
