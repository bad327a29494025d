"""Bad input raises what eager raises, naming the op and what was wrong."""

from __future__ import annotations

import inspect

import pytest
import torch

import ember


def _eager_error(fn, *args):
    with pytest.raises(Exception) as info:
        fn(*args)
    return info.type


def test_shape_mismatch_raises_runtime_error_naming_the_op():
    fn = lambda a, b: a + b  # noqa: E731
    a, b = torch.randn(3, 4), torch.randn(5, 6)
    assert _eager_error(fn, a, b) is RuntimeError
    with pytest.raises(RuntimeError, match=r"^add: .*broadcast") as info:
        ember.compile(fn)(a, b)
    assert type(info.value) is RuntimeError  # eager's exact type, not a Dynamo wrapper
    assert "add" in str(info.value)


def test_matmul_shape_error():
    fn = lambda a, b: a @ b  # noqa: E731
    a, b = torch.randn(3, 4), torch.randn(5, 6)
    eager = _eager_error(fn, a, b)
    with pytest.raises(eager, match="matmul|mm|shapes"):
        ember.compile(fn)(a, b)


def test_dtype_error_matches_eager():
    fn = lambda a, b: torch.bitwise_and(a, b)  # noqa: E731
    a, b = torch.randn(4), torch.randn(4)
    eager = _eager_error(fn, a, b)
    with pytest.raises(eager, match="bitwise_and"):
        ember.compile(fn)(a, b)


def test_index_error_matches_eager():
    fn = lambda a: a.select(0, 10)  # noqa: E731
    a = torch.randn(4, 3)
    eager = _eager_error(fn, a)
    with pytest.raises(eager, match="select"):
        ember.compile(fn)(a)


def test_cross_entropy_target_out_of_range_matches_eager():
    """The target class is gathered inside the fused loss kernel; out of range it is eager's
    IndexError (with ignore_index still ignored)."""
    import torch.nn.functional as F
    fn = lambda x, t: F.cross_entropy(x, t)  # noqa: E731
    x, t = torch.randn(8, 5), torch.tensor([0, 1, 7, 2, 3, -100, 0, 1])
    eager = _eager_error(fn, x, t)
    assert eager is IndexError
    with pytest.raises(eager, match="out of bounds"):
        ember.compile(fn)(x, t)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_value_checks_run_as_in_eager(dynamic):
    """Checks that return nothing (one_hot's class bounds, torch._assert_async) run: dropped as
    dead code, one_hot gave an all-zero row for a class out of range."""
    import torch.nn.functional as F
    one_hot = lambda t: F.one_hot(t, 4).float() * 2  # noqa: E731
    positive = lambda x: (torch._assert_async((x > 0).all(), "x must be positive"), x * 2)[1]  # noqa: E731
    compiled_one_hot = ember.compile(one_hot, dynamic=dynamic)
    compiled_positive = ember.compile(positive, dynamic=dynamic)
    ember.reset_stats()
    good = torch.tensor([0, 3, 1])
    assert torch.equal(compiled_one_hot(good), one_hot(good))
    # (one_hot's decomposition checks the classes since torch 2.13; earlier ones, as on the GPU
    # machines, check nothing once traced, in aot_eager and Inductor too)
    decomposition = getattr(torch._decomp.decompositions, "one_hot", None)
    traced_checks = decomposition is not None and "_assert_async" in inspect.getsource(decomposition)
    assert traced_checks or torch.__version__ < "2.13"
    for bad, match in ((torch.tensor([0, 5, 1]), "smaller than num_classes"),
                       (torch.tensor([0, -1, 2]), "non-negative")):
        assert _eager_error(one_hot, bad) is RuntimeError
        if traced_checks:
            with pytest.raises(RuntimeError, match=match):
                compiled_one_hot(bad)
    assert torch.equal(compiled_positive(torch.tensor([1.0, 2.0])), torch.tensor([2.0, 4.0]))
    with pytest.raises(RuntimeError, match="x must be positive"):
        compiled_positive(torch.tensor([1.0, -1.0]))
    assert ember.stats()["graph_fallbacks"] == 0  # (compiled, not run through ATen)


def test_checks_in_torchs_decompositions_raise_eagers_runtime_error():
    """A class weight of the wrong length fails an assert in torch's Python decomposition of the
    loss; eager's own check raises RuntimeError, and so does ember (it raised AssertionError)."""
    import torch.nn.functional as F
    fn = lambda x, t, w: F.cross_entropy(x, t, weight=w)  # noqa: E731
    args = torch.randn(8, 5), torch.randint(0, 5, (8,)), torch.rand(4)
    assert _eager_error(fn, *args) is RuntimeError
    with pytest.raises(RuntimeError):
        ember.compile(fn)(*args)


def test_unknown_option_is_a_clear_type_error():
    with pytest.raises(TypeError, match="unknown ember option"):
        ember.compile(lambda x: x, options={"fuse_everything": True})
