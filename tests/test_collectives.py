"""torch.distributed's functional collectives inside a compiled function (one-rank gloo group):
every rank must issue the same collectives in the same order, so ember never merges two of them
and keeps them in program order, whatever its plan (ranks with a last batch of one row fold
their graphs differently: two all-reduces had been merged, or swapped, on one rank only)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.distributed as dist

import ember

from .helpers import assert_same

funcol = pytest.importorskip("torch.distributed._functional_collectives")


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("needs torch.distributed with gloo")
    store = dist.FileStore(str(tmp_path_factory.mktemp("dist") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _collectives(report: ember.Report) -> list[str]:
    """The all-reduce calls of the host programs, in the order they are issued."""
    return [line.strip() for g in report.graphs for line in g.wrapper.splitlines() if "all_reduce" in line]


def test_two_all_reduces_that_fold_alike_stay_two(group):
    # over one row, sum(0) and amax(0) fold to the same value: CSE had merged the collectives
    def fn(x):
        a = funcol.all_reduce(x.sum(0), "sum", group)
        b = funcol.all_reduce(x.amax(0), "sum", group)
        return a, b

    x = torch.randn(1, 4)
    report = ember.Report()
    assert_same(ember.compile(fn, report=report)(x), fn(x))
    assert len(_collectives(report)) == 2, _collectives(report)


def test_collectives_are_issued_in_program_order(group):
    # r1 and r2 fuse into one kernel, which reads b: placing it pulled b's all-reduce ahead of a's
    def fn(x, y, z):
        r1 = (x * x).sum(0)
        a = funcol.all_reduce(y + 1, "sum", group)
        b = funcol.all_reduce(z * 2, "sum", group)
        return r1, a, (x * b).sum(0)

    x, y, z = torch.randn(8, 4), torch.randn(3), torch.randn(4)  # (a has 3 elements, b 4)
    report = ember.Report()
    assert_same(ember.compile(fn, report=report)(x, y, z), fn(x, y, z))
    calls = _collectives(report)
    assert len(calls) == 2, calls
    (wrapper,) = [g.wrapper for g in report.graphs]
    first_input = re.search(r"all_reduce\w*\((\w+)", calls[0]).group(1)
    assert re.search(rf"{first_input} = empty_cpu\(\(3,\)", wrapper), wrapper
