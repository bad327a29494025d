"""Embedding-heavy training compiled end to end: forward, backward and optimizer steps against
eager (max_norm's in-place renorm of the weight, sparse gradients)."""

from __future__ import annotations

import copy

import torch
from torch import nn

import ember
from tests.helpers import assert_same


class _Bag(nn.Module):
    def __init__(self, **embedding: object) -> None:
        super().__init__()
        self.emb = nn.Embedding(12, 4, **embedding)
        self.proj = nn.Linear(4, 1)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.proj(self.emb(idx)).pow(2).mean()


def _train_both(make: type[nn.Module], steps: int, **embedding: object) -> None:
    """Eager and ember train copies of one model with SGD; gradients (dense) and updated
    parameters agree after every step."""
    torch.manual_seed(0)
    eager = make(**embedding)
    with torch.no_grad():
        eager.emb.weight.mul_(3)  # rows past max_norm, which the forward renormalizes in place
    compiled_model = copy.deepcopy(eager)
    compiled = ember.compile(compiled_model)
    opt_eager = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_compiled = torch.optim.SGD(compiled_model.parameters(), lr=0.1)
    for step in range(steps):
        idx = torch.tensor([[1, 2, 2], [5, 1, 7]]) + step
        eager(idx).backward()
        compiled(idx).backward()
        for p_eager, p_compiled in zip(eager.parameters(), compiled_model.parameters()):
            assert_same(p_compiled.grad.to_dense(), p_eager.grad.to_dense())
        opt_eager.step()
        opt_compiled.step()
        opt_eager.zero_grad()
        opt_compiled.zero_grad()
        for p_eager, p_compiled in zip(eager.parameters(), compiled_model.parameters()):
            assert_same(p_compiled.detach(), p_eager.detach())


def test_max_norm_renormalizes_the_weight_in_place_while_training() -> None:
    _train_both(_Bag, 2, max_norm=1.0, norm_type=1.0, padding_idx=-2)


def test_sparse_gradient_of_a_renormalized_embedding() -> None:
    # max_norm writes the weight, so AOTAutograd adds the sparse gradient to the write's dense
    # one: that add ran as a kernel reading the sparse tensor's memory as dense (an ATen error)
    _train_both(_Bag, 2, max_norm=1.0, sparse=True)

