"""Training through ember: forward and backward graphs compiled, gradients equal to eager."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import ember

from .helpers import assert_same


def _grads(fn, *args):
    args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    out = fn(*args)
    out.backward(torch.ones_like(out))
    return out.detach(), [a.grad for a in args if a.requires_grad]


def test_gradients_of_fused_ops_match_eager():
    def fn(x, w, b):
        h = F.layer_norm(x, (x.shape[-1],), w, b)
        return (torch.softmax(h, -1) * F.gelu(h)).sum(-1)

    x = torch.randn(6, 20, dtype=torch.float64, requires_grad=True)
    w = torch.randn(20, dtype=torch.float64, requires_grad=True)
    b = torch.randn(20, dtype=torch.float64, requires_grad=True)
    report = ember.Report()
    fast = ember.compile(fn, report=report)
    out, grads = _grads(fast, x, w, b)
    ref_out, ref_grads = _grads(fn, x, w, b)
    assert_same(out, ref_out)
    assert_same(grads, ref_grads)
    assert {g.kind for g in report.graphs} == {"forward", "backward"}
    assert all(g.kernels for g in report.graphs)


def test_mixed_requires_grad_and_no_grad():
    x = torch.randn(4, 5, requires_grad=True)
    y = torch.randn(4, 5)
    fast = ember.compile(lambda a, b: (a * b).exp().sum())
    out, grads = _grads(fast, x, y)
    ref_out, ref_grads = _grads(lambda a, b: (a * b).exp().sum(), x, y)
    assert_same(grads, ref_grads)
    with torch.no_grad():
        assert_same(fast(x, y), (x * y).exp().sum())


def test_small_mlp_trains_like_eager():
    torch.manual_seed(0)
    make = lambda: torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))  # noqa: E731
    ref_model = make()
    model = make()
    model.load_state_dict(ref_model.state_dict())
    fast = ember.compile(model)
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.05) for m in (model, ref_model))
    data = torch.randn(64, 8)
    target = data.sum(-1, keepdim=True).sin()
    losses, ref_losses = [], []
    for _ in range(10):
        for m, o, out_list in ((fast, opt, losses), (ref_model, ref_opt, ref_losses)):
            o.zero_grad()
            loss = F.mse_loss(m(data), target)
            loss.backward()
            o.step()
            out_list.append(loss.item())
    for a, b in zip(losses, ref_losses):
        assert abs(a - b) <= 1e-4 * abs(b) + 1e-6, (losses, ref_losses)
