"""Bad input raises the exception type eager raises: integers or bools where an op takes floats,
scalars out of the dtype's range, index checks of several ops in one kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

import ember
from ember import driver
from ember.report import GraphReport

from .helpers import assert_same, check

inf = float("inf")
_INTS = torch.tensor([-3, 0, 2, 5], dtype=torch.int32)
_BOOLS = torch.tensor([True, False, True, True])


def _same_error(fn, *args, expected: type[BaseException]) -> None:
    """eager raises ``expected`` (exactly), and so does ember."""
    def fresh():
        return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]

    with pytest.raises(expected) as info:
        fn(*fresh())
    assert type(info.value) is expected
    with pytest.raises(expected) as info:
        ember.compile(fn)(*fresh())
    assert type(info.value) is expected, info.value


@pytest.mark.parametrize("fn, x", [
    (lambda x: F.hardtanh(x, -inf, inf), _INTS),
    (lambda x: F.hardtanh(x, -inf, 1.0), _INTS.to(torch.uint8)),
    (lambda x: F.hardtanh(x.clone(), -inf, inf, inplace=True), _INTS.long()),
], ids=["int32", "uint8_lower_only", "int64_in_place"])
def test_an_infinite_bound_of_integers_is_eagers_runtime_error(fn, x):
    # hardtanh's reference converts its bounds with int(): an OverflowError while tracing
    _same_error(fn, x, expected=RuntimeError)


@pytest.mark.parametrize("fn", [
    lambda x: F.softplus(x, beta=0.5), lambda x: F.softplus(x, beta=inf), lambda x: F.celu(x, 2.0),
], ids=["softplus_beta", "softplus_beta_inf", "celu_alpha"])
@pytest.mark.parametrize("x", [_INTS, _BOOLS], ids=["int32", "bool"])
def test_float_parameters_of_integer_activations_raise_not_implemented(fn, x):
    # the references refuse a float beta or alpha for an integer dtype with a ValueError (which
    # became a RuntimeError); eager has no kernel for the dtype
    _same_error(fn, x, expected=NotImplementedError)


_LAST_BAD, _FIRST_BAD = torch.tensor([0, 1, 2, 9]), torch.tensor([7, 0, 0, 0])


@pytest.mark.parametrize("fn, i, j, expected", [
    (lambda x, i, j: (x[i], x.gather(0, i)), _LAST_BAD, None, IndexError),
    (lambda x, i, j: x[i] * 2 + x.gather(0, i), _LAST_BAD, None, IndexError),
    (lambda x, i, j: (x.add_(1), x[i], x.gather(0, i))[1:], _LAST_BAD, None, IndexError),
    (lambda x, i, j: (x[i], x.gather(0, j)), _LAST_BAD, _FIRST_BAD, IndexError),
    (lambda x, i, j: (x.index_select(0, i), x.gather(0, j)), _LAST_BAD, _FIRST_BAD, IndexError),
    (lambda x, i, j: (x.gather(0, i), x[j]), _LAST_BAD, _FIRST_BAD, RuntimeError),
], ids=["index_then_gather", "fused_sum", "after_a_write", "bad_at_another_element", "index_select_then_gather",
        "gather_then_index"])
def test_the_first_op_with_a_bad_index_raises(fn, i, j, expected):
    # one kernel checks both ops' indices: it kept the check that failed first in its loop
    # (gather's RuntimeError: checked before the negative-index wrap x[i] needs, or at an
    # earlier element), where eager raises at the first op in the program that fails
    _same_error(fn, torch.arange(4.0), i, j, expected=expected)


@pytest.mark.parametrize("fn, args", [
    (lambda a, b: F.mse_loss(a, b), (_INTS, _INTS)),
    (lambda a, b: F.mse_loss(a, b, reduction="sum"), (_INTS, _INTS)),
    (lambda a, b: F.mse_loss(a, b, reduction="none"), (_BOOLS, _BOOLS)),
    (lambda a, b: F.binary_cross_entropy_with_logits(a, b), (_INTS, _INTS)),
    (lambda a, b: F.binary_cross_entropy(a, b), (_BOOLS, _BOOLS)),
    (lambda a, b: F.smooth_l1_loss(a, b), (_BOOLS, _BOOLS)),
    (lambda a, b: F.huber_loss(a, b, reduction="sum"), (_BOOLS, _BOOLS)),
    (lambda a, b: F.log_softmax(a, 0), (_BOOLS, None)),
], ids=["mse_ints", "mse_ints_sum", "mse_bools", "bce_with_logits_ints", "bce_bools", "smooth_l1_bools",
        "huber_bools", "log_softmax_bools"])
def test_losses_of_integers_raise_not_implemented(fn, args):
    # their references fail inside (a mean of integers, bools subtracted or negated) with a
    # RuntimeError, or computed (an integer mse_loss summed); eager has no kernel for the dtype
    _same_error(fn, *args, expected=NotImplementedError)


@pytest.mark.parametrize("fn, x, expected", [
    (lambda x: F.unfold(x, 2), torch.ones(1, 1, 3, 3, dtype=torch.int64), NotImplementedError),
    (lambda x: F.pad(x, (1, 1), mode="reflect"), torch.ones(1, 1, 4, dtype=torch.bool), NotImplementedError),
    (lambda x: F.pad(x, (1, 1, 1, 1), mode="reflect"), torch.ones(1, 1, 3, 3, dtype=torch.bool), NotImplementedError),
    (lambda x: torch.mvlgamma(x, 1), _BOOLS, RuntimeError),
    (lambda x: torch.searchsorted(x, x, side="middle"), torch.arange(4.0), RuntimeError),
    (lambda x: torch.bucketize(x, x), torch.arange(4.0).view(2, 2), RuntimeError),
], ids=["unfold_ints", "reflection_pad1d_bools", "reflection_pad2d_bools", "mvlgamma_bools", "searchsorted_side",
        "bucketize_2d_boundaries"])
def test_ops_eager_refuses_do_not_compute(fn, x, expected):
    # the decompositions (or ember's lowering) computed a result
    _same_error(fn, x, expected=expected)


def test_the_ops_kept_for_eagers_errors_still_compile_for_floats():
    x = torch.randn(1, 2, 4, 4)
    check(lambda x: F.unfold(x, 2) * 2, x)
    check(lambda x: F.pad(x, (1, 1, 1, 1), mode="reflect") + 1, x)
    check(lambda x: F.mse_loss(x, x.flip(-1)), x)
    check(lambda x: torch.searchsorted(torch.tensor([-1.0, 0.0, 1.0]), x, side="right"), x)


def _same_as_eager_each_call(fn, calls, expected: type[BaseException] = RuntimeError) -> ember.Report:
    """One compiled ``fn`` over ``calls`` (argument tuples, in order): eager's exception type
    (exactly, ``expected``) where eager raises, eager's values (and inputs written as eager's)
    where it computes."""
    report = ember.Report()
    compiled = ember.compile(fn, report=report)
    for args in calls:
        mine = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        ref = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        try:
            want = fn(*ref)
        except expected as e:
            assert type(e) is expected
            with pytest.raises(expected) as info:
                compiled(*mine)
            assert type(info.value) is expected, info.value
        else:
            assert_same(compiled(*mine), want)
        assert_same(mine, ref)
    return report


_H = torch.tensor([0.5, -1.25, 3.0, 2.0], dtype=torch.float16)


@pytest.mark.parametrize("fn, x, big", [
    (lambda x, v: torch.add(x, x.flip(0), alpha=v), _H, 7e4),
    (lambda x, v: x.sub_(x.flip(0), alpha=-v), _H.bfloat16(), 1e39),
    (lambda x, v: torch._foreach_add([x, x * 2], [x, x], alpha=v), _H.float(), 1e39),
], ids=["float16_add", "bfloat16_sub_in_place", "float32_foreach_add"])
def test_a_python_float_alpha_made_symbolic_is_checked_on_each_call(fn, x, big):
    # from the second value on, Dynamo passes the float as a 0-d tensor: the alpha eager checks
    # against the result's dtype was multiplied in unchecked (float16's 7e4: inf); eager's error,
    # raised by the host program before any kernel writes (the in-place update leaves x as it is)
    report = _same_as_eager_each_call(fn, [(x, 2.0), (x, big), (x, 3.0), (x, -big), (x, 65504.0), (x, float("inf"))])
    if torch.__version__ >= "2.13":  # (torch 2.11's Dynamo compiles each value as a constant: an
        # out-of-range one keeps the op, and ATen raises)
        assert [f for g in report.graphs for f in g.fallbacks] == []  # (read on the host, no ATen call)


def test_a_symbolic_alpha_checked_in_a_gpu_graph_is_no_aten_call(monkeypatch):
    # in a CUDA graph the check is a host call (raise_unless_fits) made before any kernel runs:
    # ember's own, it was listed among the report's ATen calls and counted in stats' fallbacks
    graphs = []
    compile_graph = driver._compile

    def captured(gm, *args, **kwargs):
        graphs.append(gm)
        return compile_graph(gm, *args, **kwargs)

    monkeypatch.setattr(driver, "_compile", captured)
    report = _same_as_eager_each_call(lambda x, v: torch.add(x, x.flip(0), alpha=v), [(_H, 2.0), (_H, 3.0)])
    assert report.fallbacks == []  # (on the CPU: a check of the host program's sizes)
    gm = graphs[-1]  # (alpha as a 0-d float64 tensor), traced again over a CUDA tensor
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        x, alpha = torch.empty(4, dtype=torch.float16, device="cuda"), torch.empty((), dtype=torch.float64)
    FakeTensorProp(gm, mode).propagate(x, alpha)
    monkeypatch.setattr(driver, "_runs_on", lambda target, device: False)  # (rendered only: no GPU here)
    before = ember.stats()["fallbacks"]
    for target in ("cuda", "triton"):
        graph = GraphReport("inference_0", "inference")
        compile_graph(gm, "inference_0", ember.config.replace(target=target), graph)
        assert "raise_unless_fits(arg1_1_item, 65504.0" in graph.wrapper
        assert graph.fallbacks == [], target
    assert ember.stats()["fallbacks"] == before


@pytest.mark.parametrize("fn, x, big", [
    (lambda x, v: F.hardshrink(x, v), _H, 7e4),
    (lambda x, v: torch.linspace(0, v, 3, dtype=x.dtype) + x[:3], _H, 7e4),
    # eager fills one step with start, unchecked (inf), and converts nothing for none
    (lambda x, v: torch.linspace(v, 1.0, 1, dtype=x.dtype) + x[:1], _H, 7e4),
    (lambda x, v: torch.linspace(v, 1.0, 0, dtype=x.dtype) + x[:0], _H, 7e4),
    (lambda x, v: torch.logspace(v, 1.0, 1, dtype=x.dtype) + x[:1], _H, 7e4),
    (lambda x, v: torch.logspace(1.0, v, 2, base=2.0, dtype=x.dtype) + x[:2], _H, 7e4),
    (lambda x, v: F.softplus(x, beta=v), _H.float(), 1e39),
    # an alpha of 0 (or -0.0) is eager's RuntimeError; made symbolic, torch's decomposition
    # divided by it (NaN and inf where x < 0, no error): the op is kept, and ATen checks each call
    (lambda x, v: F.celu(x, alpha=v), _H.float(), 0.0),
], ids=["hardshrink_lambd", "linspace_end", "linspace_one_step", "linspace_no_steps", "logspace_one_step",
        "logspace_end", "softplus_beta", "celu_alpha_zero"])
def test_other_python_floats_made_symbolic_are_checked_on_each_call(fn, x, big):
    _same_as_eager_each_call(fn, [(x, 2.0), (x, big), (x, 3.0), (x, -big)])


# (70001 steps from 7.9 to -3.3: eager's step of -1/7000, fused into each multiply-add, gives 2
# at i = 28000, where the product rounded first gives 3)
@pytest.mark.parametrize("steps", [0, 1, 2, 5, 70001])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8])
def test_an_integer_linspace_of_symbolic_floats_compiles_once_as_eagers(dtype, steps):
    # eager truncates start and end to the integer type (with its overflow check), then steps
    # between them in float64 with fused multiply-adds: torch's decomposition computed in
    # float32 (0.5 to 3.7 in 5 steps gave [0, 1, 2, 2, 3] for [0, 0, 1, 2, 3]), and a symbolic
    # start or end was specialized, a recompile for each new value
    fn = lambda a, b: torch.linspace(a, b, steps, dtype=dtype)  # noqa: E731
    ember.reset_stats()
    _same_as_eager_each_call(fn, [(0.5, 3.7), (1.5, 9.2), (-2.3, 4.1), (7.9, -3.3), (-0.7, -0.2), (100.99, -100.99),
                                  (127.9, -128.9), (255.5, 0.25), (300.0, 2.0), (2.0, -1e30), (3.5e9, -3.5e9)])
    assert ember.stats()["graphs_compiled"] == 2  # (the first call's constants, then every value)
    # (NaN and inf raise; Dynamo compiles a NaN apart)
    _same_as_eager_each_call(fn, [(1.0, 2.0), (1.5, 2.5), (float("nan"), 1.0), (1.0, float("inf"))])


def test_an_integer_linspace_of_python_numbers_or_tensors_is_eagers():
    # torch's decomposition computed these in float32, from the untruncated floats
    check(lambda: torch.linspace(0, 10**8 + 7, 7, dtype=torch.int64))
    check(lambda: torch.linspace(2**60 + 1, -(2**60), 7, dtype=torch.int64))
    check(lambda: torch.linspace(-3, 250, 5, dtype=torch.uint8))  # (eager wraps -3 to 253)
    check(lambda: torch.linspace(0.5, 3.7, 5, dtype=torch.int32))
    check(lambda s, e: torch.linspace(s, e, 5, dtype=torch.int64), torch.tensor(0.5, dtype=torch.float64),
          torch.tensor(3.7, dtype=torch.float64))


@pytest.mark.parametrize("fn, x", [
    (lambda x: torch.linspace(0, 7e4, 3, dtype=x.dtype), _H),
    (lambda x: torch.logspace(1e39, 0, 3, dtype=x.dtype), _H.bfloat16()),
    (lambda x: torch.addr(x.view(2, 2), x[:2], x[2:], alpha=7e4), _H),
    (lambda x: torch.logit(x, eps=7e4), _H),
    (lambda x: torch.baddbmm(x.view(1, 2, 2), x.view(1, 2, 2), x.view(1, 2, 2), beta=1e39), _H),
    (lambda x: F.leaky_relu(x, 1e39), _H),
    (lambda x: F.elu(x, alpha=-1e39), _H.float()),
    (lambda x: F.softplus(x, threshold=1e39), _H.bfloat16()),
], ids=["linspace", "logspace", "addr_alpha", "logit_eps", "baddbmm_beta", "leaky_relu_slope", "elu_alpha",
        "softplus_threshold"])
def test_python_floats_beyond_the_converted_dtype_are_eagers_runtime_error(fn, x):
    # eager converts each with its overflow check, to the result's dtype (float16's 65504) or to
    # its op math type's (float32 for 16-bit tensors); the decompositions and lowerings gave inf
    _same_error(fn, x, expected=RuntimeError)


_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool)


def test_max_pool1d_of_integers_is_eagers_not_implemented_error():
    # eager's CPU composite takes its floating-only kernel; traced, it took the path with indices
    # (max_pool2d), which computes integers
    x = (torch.arange(16) % 5).view(1, 2, 8)
    for dtype in _INT_DTYPES:
        _same_error(lambda x: F.max_pool1d(x, 2), x.to(dtype), expected=NotImplementedError)
    check(lambda x: F.max_pool1d(x, 2, return_indices=True), x.to(torch.int16))  # (eager computes these)


# (area is an adaptive average pool, which ATen runs, refusing integers as eager does)
_MODES = [("nearest", 3), ("nearest-exact", 5), ("linear", 3), ("bilinear", 4), ("bicubic", 4), ("trilinear", 5)]


@pytest.mark.parametrize("mode, rank", _MODES, ids=[f"{m}_{r}d" for m, r in _MODES])
@pytest.mark.parametrize("train", [False, True])
def test_interpolate_of_no_channels_or_pixels_raises_as_eager(mode, rank, train):
    # (CPU fuzz seeds 853602114899, 599914614669) eager's kernels refuse an input with no
    # channels or no pixels; the decompositions returned an empty result
    fn = lambda x: F.interpolate(x, scale_factor=2, mode=mode)  # noqa: E731
    for empty in range(1, rank):
        shape = [2, 3, 4, 5, 6][:rank]
        shape[empty] = 0
        _same_error(fn, torch.randn(shape, requires_grad=train), expected=RuntimeError)
    check(fn, torch.randn([0, 3, 4, 5, 6][:rank]))  # (no images: eager returns none)


@pytest.mark.parametrize("mode, rank", _MODES, ids=[f"{m}_{r}d" for m, r in _MODES])
def test_interpolate_of_integers_refuses_or_computes_as_eager(mode, rank):
    # eager's kernels have floating types, and uint8 for nearest, nearest-exact, bilinear and
    # bicubic (bilinear's and bicubic's rounding their own): the decompositions computed every
    # dtype, and uint8 bilinear to other values
    fn = lambda x: F.interpolate(x, scale_factor=1.5, mode=mode)  # noqa: E731
    for dtype in _INT_DTYPES:
        x = torch.randint(0, 256, (1, 2, 5, 4, 3)[:rank]).to(dtype)
        if dtype != torch.uint8 or mode in ("linear", "trilinear"):
            _same_error(fn, x, expected=NotImplementedError)
        else:
            check(fn, x)
