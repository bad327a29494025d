"""The gradient-in-forward plan (frontend/partition.py) where the scale ``u`` it multiplies by
afterwards may not be finite: a mean's divisor of 0 (cross-entropy's total class weight, a count
of real targets). Where a masked chain also has a factor of 0, eager's gradient there is NaN and
the plan's 0, so the plan is not taken; where the divisor counts the very rows the chain masks (a
language model's ignored tokens), it is, as the GPT guard below checks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import ember
from bench.gpt_step import GPT
from ember.config import config
from ember.frontend import partition as partition_module
from ember.frontend.dynamo import make_backend

from .helpers import assert_same


def _grads(fn, args):
    """[loss, gradients of the inputs that require grad] of one step of fn on copies of args."""
    leaves = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    loss = fn(*leaves)
    loss.backward()
    return [loss.detach()] + [a.grad for a in leaves if a.requires_grad]


@pytest.fixture
def plan_where_it_applies(monkeypatch):
    """The gradient-in-forward plan wherever it applies, whatever the bytes (these losses are
    small enough for min-cut to win on bytes; the plan's values are what is tested)."""
    planned, build, cost = [], partition_module.gradient_in_forward, partition_module.plan_cost

    def build_and_remember(*args, **kwargs):
        modules = build(*args, **kwargs)
        planned.append(modules)
        return modules

    monkeypatch.setattr(partition_module, "gradient_in_forward", build_and_remember)
    monkeypatch.setattr(partition_module, "plan_cost", lambda fw, bw, n: partition_module.PlanCost(0, 0, 0, 0)
                        if (fw, bw) in planned else cost(fw, bw, n))


# Losses whose mean divides by a sum that is 0 when every target (every row kept) weighs 0, with
# weights computed in the function: eager's gradient is then NaN (-0 * inf), where the plan's
# mask of ignored rows had kept the zeros of those rows: a gradient of 0 and a silent step.
_WEIGHTED_MEANS = {
    # classes 0 and 2 weigh 0
    "tensor_made_inside": lambda x, t, w: F.cross_entropy(x, t, weight=torch.tensor([0.0, 1, 0, 1, 1])),
    "abs_of_an_input": lambda x, t, w: F.cross_entropy(x, t, weight=w.abs()),
    "nll_loss": lambda x, t, w: F.nll_loss(F.log_softmax(x, 1), t, weight=w * 2, ignore_index=1),
    "written_out": lambda x, t, w: (F.cross_entropy(x, t, reduction="none") * w.abs()[t]).sum() / w.abs()[t].sum(),
    # a mean over the rows a condition keeps, of a relu (its backward masks): a count of 0
    "relu_over_a_count": lambda x, t, w: (x.relu() * (t > 2)[:, None]).sum() / (t > 2).sum(),
}


@pytest.mark.parametrize("loss", list(_WEIGHTED_MEANS))
def test_computed_weights_of_zero_keep_eagers_nan_gradient(loss, plan_where_it_applies):
    fn, w = _WEIGHTED_MEANS[loss], torch.tensor([0.0, 1, 0, -1, 2])
    x, targets = torch.randn(4, 5).requires_grad_(), torch.tensor([0, 2, 0, 2])
    compiled = ember.compile(fn)
    expected = _grads(fn, [x, targets, w])
    assert expected[1].isnan().any()  # (expected: [loss, gradient of x])
    assert_same(_grads(compiled, [x, targets, w]), expected)
    targets = torch.tensor([0, 4, 3, 1])  # weights that are not all 0: the same program, eager's values
    assert_same(_grads(compiled, [x, targets, w]), _grads(fn, [x, targets, w]))


def test_a_sum_with_weights_of_zero_keeps_the_plan():
    # no divisor, no NaN: eager's gradient of a sum whose targets all weigh 0 is 0, as the plan's
    def fn(x, t, w):
        return F.nll_loss(F.log_softmax(x, 1), t, weight=w.abs(), reduction="sum")

    x, targets, w = torch.randn(64, 5).requires_grad_(), torch.tensor([0, 2] * 32), torch.tensor([0.0, 1, 0, 1, 1])
    ember.reset_stats()
    assert_same(_grads(ember.compile(fn), [x, targets, w]), _grads(fn, [x, targets, w]))
    assert ember.stats()["grads_in_forward"] == 1


class _Loss(torch.nn.Module):
    """The GPT's loss as a graph AOTAutograd takes (its output a tuple)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.model(idx, targets),)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpt_loss_takes_the_gradient_in_forward(dtype):
    # bench/gpt_step.py's GPT at its sizes (one block of two), traced with fake tensors through
    # ember's backend and partitioner (nothing compiled or run). Its loss is masked (ignored
    # tokens) and its chain multiplies by weights that may be 0 (LayerNorm's), but its mean divides
    # by the count of the tokens the mask keeps: a check that refused the plan for it made the
    # GPU step 4x slower. In float32 the LayerNorm weights are graph inputs the chain multiplies
    # by, which had been taken for class weights of 0.
    vocab, width, heads, layers, seq, batch = 32000, 768, 12, 1, 1024, 8
    default = torch.get_default_dtype()
    with FakeTensorMode():
        torch.set_default_dtype(dtype)  # (parameters made in dtype: a fake module's .to() cannot swap them)
        try:
            loss = _Loss(GPT(vocab, width, heads, layers, seq))
        finally:
            torch.set_default_dtype(default)
        idx, targets = torch.zeros(batch, seq, dtype=torch.long), torch.zeros(batch, seq, dtype=torch.long)
    kinds = []

    def record(gm, example_inputs, kind):
        kinds.append(kind)
        return gm

    ember.reset_stats()
    make_backend(record, config)(loss, [idx, targets])
    assert kinds == ["forward"]  # (the backward is compiled at its first call)
    assert ember.stats()["grads_in_forward"] == 1
