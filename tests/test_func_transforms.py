"""torch.func's transforms (vmap, grad, jacrev, jacfwd, hessian) inside compiled functions,
compared with eager PyTorch; every graph compiled by ember (no whole-graph fallback)."""

from __future__ import annotations

import warnings

import torch
from torch.func import hessian, vmap

from .helpers import check


def _compiled_without_fallback(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        return check(fn, *args, rtol=1e-3, atol=1e-3)


def test_nested_vmap_multiplying_by_a_python_number_compiles():
    # the graph of nested vmap casts the literal itself, aten._to_copy(2, dtype=float32): its
    # lowering read the number as a tensor node (AttributeError), and the graph ran eagerly
    def doubled_exp(x):
        return vmap(vmap(lambda a: a.exp() * 2))(x)

    def shifted(x):
        return vmap(vmap(lambda a: a * 3 + 1))(x)

    x = torch.linspace(-2, 2, 20).reshape(4, 5)
    _compiled_without_fallback(doubled_exp, x)
    _compiled_without_fallback(shifted, (x * 10).long())


def test_hessian_of_a_matmul_inside_a_compiled_function():
    # hessian's jacrev writes its basis in place through a view (new_zeros(...).diagonal()
    # .fill_(1)) under jacfwd: the overlap check read the storage of Dynamo's values there,
    # torch.func's wrappers, which have none ("Cannot access storage of TensorWrapper"), and
    # the compile failed (an exception where eager computes)
    def curvature(x, w):
        return hessian(lambda a: (a @ w).tanh().sum())(x)

    x = torch.linspace(-1, 1, 5)
    w = torch.linspace(-1, 1, 15).reshape(5, 3)
    _compiled_without_fallback(curvature, x, w)
