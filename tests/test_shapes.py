"""Awkward shapes and values against eager: sizes 0 and 1, scalars, broadcasting, non-contiguous
and transposed inputs, large values, NaN and inf, across the dtypes ember generates code for.
On the device the suite runs on (``EMBER_TEST_DEVICE=cuda``: the GPU backends too)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import ember

from .conftest import DEVICE
from .helpers import assert_same, check

FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
ALL = FLOATS + [torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool]


def make(shape, dtype, special=False):
    if dtype == torch.bool:
        return (torch.rand(shape) > 0.5).to(DEVICE)
    if not dtype.is_floating_point:
        lo = 0 if dtype == torch.uint8 else -50
        return torch.randint(lo, 50, shape, dtype=dtype).to(DEVICE)
    x = torch.randn(shape, dtype=torch.float64) * 3
    if special and x.numel() >= 6:
        flat = x.view(-1)
        flat[0], flat[1], flat[2], flat[3], flat[4] = float("nan"), float("inf"), -float("inf"), 1e30, -0.0
    return x.to(dtype).to(DEVICE)


SHAPES = [(), (0,), (0, 5), (1,), (1, 1), (7,), (5, 9), (2, 3, 4), (3, 1, 5)]


def check_cases(fn, cases, **kwargs):
    """check(fn, *case) for every case in one program: one compile, each case's result compared
    on its own (fn returns one tensor: check's "output i" is case i). The callers' cases have
    results of different numbers of elements, so no case's kernel takes in another's work."""
    sizes = [len(case) for case in cases]

    def program(*t):
        out, k = [], 0
        for n in sizes:
            out.append(fn(*t[k:k + n]))
            k += n
        return out

    return check(program, *[a for case in cases for a in case], **kwargs)


def pointwise(x, y):
    return x * y + x


def mixed(x, y):
    return torch.where(x > y, x - y, y * 2) + torch.abs(x)


@pytest.mark.parametrize("dtype", ALL, ids=str)
def test_pointwise_shapes(dtype):
    fn = pointwise if dtype != torch.bool else (lambda x, y: x & ~y | (x ^ y))
    # (one program per group; within a group no two shapes have one number of elements)
    for group in ([(), (0,), (7,), (5, 9), (2, 3, 4), (3, 1, 5)], [(1,), (0, 5)], [(1, 1)]):
        assert set(group) <= set(SHAPES)
        check_cases(fn, [(make(shape, dtype), make(shape, dtype)) for shape in group])
    # symbolic sizes: one compiled kernel for every shape of the same rank
    for shape in [(0, 5), (1, 1), (5, 9), (3, 1)]:
        check(fn, make(shape, dtype), make(shape, dtype), dynamic=True)


@pytest.mark.parametrize("dtype", ALL[:-1], ids=str)
def test_broadcasting(dtype):
    check_cases(mixed, [(make((3, 1, 5), dtype), make((4, 1), dtype)), (make((6, 5), dtype), make((), dtype)),
                        (make((0, 5), dtype), make((5,), dtype))])


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_special_values(dtype):
    def fn(x, y):
        return (torch.exp(torch.clamp(x, max=10)), torch.maximum(x, y), x.amax(-1), x.sum(-1),
                torch.sigmoid(x), torch.tanh(x), torch.relu(x), x.argmax(-1), torch.sqrt(torch.abs(x)))

    check(fn, make((6, 8), dtype, special=True), make((6, 8), dtype, special=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_non_contiguous_inputs(dtype):
    base = make((12, 10), dtype)
    views = [base.t(), base[::2, 1::3], base[:, 3], base.unsqueeze(1).expand(12, 4, 10), base.t()[2:9]]
    for fn in (lambda x: x * 2 + 1, lambda x: x.sum(-1), lambda x: (x.t() + 1) if x.dim() == 2 else x - 1):
        check_cases(fn, [(v,) for v in views])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.bool], ids=str)
def test_transposed_layouts(dtype):
    """Kernels that read or write along a second-to-last dim (GPU backends: 2D tiles, the CUDA
    C++ one through shared memory) at sizes that leave tiles partly past either end, with
    transposed inputs and outputs, leading dims flattened, and symbolic sizes, 0 and 1 among them."""
    def scale(x):
        return x * 2 if dtype != torch.bool else ~x

    def mix(x, y):
        return x + y if dtype != torch.bool else x ^ y

    # (one program; its results, outputs 0 to 4, of other sizes but the last two, as before)
    check(lambda a, b, c, d, x, y, z: (scale(a.t()).contiguous(), scale(b.permute(0, 2, 1)).contiguous(),
                                       mix(c.mT, d),  # a transposed output
                                       mix(x.t(), y), scale(z.t())),
          make((70, 33), dtype), make((3, 40, 65), dtype), make((2, 17, 48), dtype), make((2, 48, 17), dtype),
          make((33, 20), dtype), make((20, 33), dtype), make((33, 20), dtype))
    for m, n in [(100, 50), (1, 20), (20, 1), (0, 40), (129, 130)]:
        check(lambda x, y: mix(x.t(), y), make((m, n), dtype), make((n, m), dtype), dynamic=True)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_reductions_over_awkward_shapes(dtype):
    def fn(x):
        return x.sum(-1), x.amax(0), x.mean(), torch.softmax(x, -1), x.var(-1)

    for shape in [(1, 1), (1, 7), (7, 1), (5, 9), (3, 300)]:
        check(fn, make(shape, dtype))
        check(fn, make(shape, dtype), dynamic=True)
    check(lambda x: x.sum(0), make((0, 4), dtype))


def test_large_values_and_integer_wraparound():
    x = torch.tensor([2**62, -2**62, 2**63 - 1, 5], dtype=torch.int64, device=DEVICE)
    check(lambda a: a * 4 + 3, x)
    check(lambda a: (a * 100).to(torch.int64), torch.tensor([120, -100, 7], dtype=torch.int8, device=DEVICE))
    check(lambda a: a.sum(), torch.full((1000,), 2**40, dtype=torch.int64, device=DEVICE))


@pytest.mark.skipif(DEVICE != "cpu", reason="eager raises on the CPU only (a GPU's integer division does not trap)")
def test_integer_division_by_zero_raises_like_eager():
    import ember

    a = torch.tensor([4, 5, 6])
    b = torch.tensor([2, 0, 3])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        a // b
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        ember.compile(lambda x, y: x // y + 1)(a, b)
    check(lambda x, y: x // y + 1, a, b + 1)  # and the next call is fine


@pytest.mark.parametrize("fn, shape", [
    (lambda x: x.view(3, 0, 2) * 2, (6, 0)),
    (lambda x: (torch.arange(x.shape[1])[None, :] > torch.arange(x.shape[1])[:, None]).float() + x, (2, 0, 0)),
    (lambda x: x.reshape(0, 5).sum(0) + x.view(5, 0).t().sum(), (0, 5)),
], ids=["view_of_empty", "causal_mask_of_length_0", "reshape_then_reduce"])
def test_reshapes_of_empty_tensors(fn, shape):
    # a reshape's index arithmetic divided by a stride of 0: the graph ran through ATen
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        check(fn, torch.randn(shape))


@pytest.mark.parametrize("fn, make", [
    (lambda x: x.sum(-1).sum(), lambda: (torch.randn(4, 0, 10),)),
    (lambda x: torch.logsumexp(x, 1).sum(), lambda: (torch.randn(4, 10, 0),)),
    (lambda x, t: F.cross_entropy(x, t), lambda: (torch.randn(4, 10, 0), torch.randint(0, 10, (4, 0)))),
    (lambda x, t: (x.argmax(-1) == t).float().mean(), lambda: (torch.randn(4, 0, 10), torch.randint(0, 10, (4, 0)))),
], ids=["sum_of_sums", "logsumexp_then_sum", "cross_entropy_of_no_tokens", "accuracy_of_no_tokens"])
def test_a_reduction_of_an_empty_result_reads_nothing(fn, make):
    # the second kernel's load of the empty intermediate lost its loop variable ("element 0")
    # and ran before a loop of no steps: a read of an empty buffer, and a crash
    check(fn, *make())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape, dim", [((3, 0, 37), 1), ((3, 0, 37), 0), ((0, 5, 37), 1), ((0, 5, 37), 0)],
                         ids=["mid-empty-along", "mid-empty-across", "lead-empty-along", "lead-empty-across"])
def test_results_with_no_elements_are_no_kernels_stores(dtype, shape, dim):
    # a 16-bit softmax over an empty dim failed to build (a column tile read back a value no
    # loop had computed: the loads of the empty input were constants), and its ATen fallback
    # raised "cannot evaluate input" (the kernel never loaded the input, so took no such
    # parameter). A result with no elements is stored by no loop now.
    fn = lambda x: (torch.softmax(x, dim), x.sum(dim), x.float().exp().sum(dim))  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        check(fn, make(shape, dtype))


@pytest.mark.skipif(DEVICE != "cpu", reason="the bad compiler flag is the CPU compiler's")
def test_a_group_falling_back_makes_the_empty_inputs_its_kernel_never_loaded(tmp_path):
    opts = {"cache_dir": tmp_path, "cxx_flags": ("-O3", "-fPIC", "-shared", "--not-a-real-flag")}
    x, y = torch.randn(3, 0, 37, dtype=torch.float16), torch.randn(2, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (the one build warning)
        check(lambda x, y: (torch.softmax(x, 1), x.float().sum(1), y.sum(1) + 1), x, y, options=opts,
              expect_built=False)


@pytest.mark.parametrize("fn, args, error", [
    (lambda x, t: F.nll_loss(x, t), (torch.randn(2, 0), torch.tensor([1, 0])), IndexError),
    (lambda x, i: x.gather(1, i) + 1, (torch.randn(2, 0), torch.zeros(2, 1, dtype=torch.long)), RuntimeError),
    (lambda x, i, v: x.index_put((i,), v), (torch.randn(0, 5), torch.tensor([0]), torch.randn(1, 5)), IndexError),
    (lambda x, i, v: x.index_put((i,), v, accumulate=True) * 2,
     (torch.randn(0, 5), torch.tensor([0]), torch.randn(1, 5)), IndexError),
    (lambda x, i, v: x.scatter_add(0, i, v),
     (torch.randn(0, 3), torch.zeros(1, 3, dtype=torch.long), torch.randn(1, 3)), RuntimeError),
    (lambda x, i, v: x.scatter(1, i, v) + 1,
     (torch.randn(3, 0), torch.zeros(3, 1, dtype=torch.long), torch.randn(3, 1)), RuntimeError),
    (lambda x, i: x.scatter(0, i, 2.0), (torch.randn(0), torch.tensor([0])), RuntimeError),
    (lambda x, i, v: x.index_copy(0, i, v), (torch.randn(0, 3), torch.tensor([0]), torch.randn(1, 3)), RuntimeError),
], ids=["nll_loss_of_no_classes", "gather_from_empty_dim", "index_put", "index_put_accumulate", "scatter_add",
        "scatter", "scatter_value", "index_copy"])
def test_indices_into_an_empty_dim_raise_eagers_error(fn, args, error):
    # every index is out of range. The nll_loss's and the gather's checks were dropped with the
    # loads they guard (loads of an empty tensor are constants): 0.0 came back where eager
    # raises. The writes stored at index 0 of an empty buffer, and the process crashed
    # (SIGSEGV): nothing is stored into an empty tensor now. A scatter returned an empty tensor
    # (its decomposition checks an index only where the result has elements), and an index_copy
    # raised an IndexError where eager raises a RuntimeError: both run through ATen now.
    with pytest.raises(error):
        fn(*args)
    with pytest.raises(error):  # (on the CPU: GPU kernels clamp indices, as eager's CUDA kernels do not raise)
        ember.compile(fn)(*args)


@pytest.mark.parametrize("dim", [0, 1])
def test_index_add_into_an_empty_matrix_returns_it_as_eager_does(dim):
    # eager's kernel returns an empty self of rank > 1 before it reads an index: ember raised
    # that the index was out of bounds. (A 1-d self is checked by eager and by ember.)
    x = torch.randn(0, 3) if dim == 0 else torch.randn(3, 0)
    source = torch.randn(2, 3) if dim == 0 else torch.randn(3, 2)
    index = torch.tensor([5, 0])
    check(lambda x, i, s: x.index_add(dim, i, s) * 2, x, index, source)
    with pytest.raises(IndexError):
        ember.compile(lambda x, i, s: x.index_add(0, i, s))(torch.randn(0), index, torch.randn(2))


@pytest.mark.parametrize("fn", [
    lambda d: torch.linalg.vector_norm(d, dim=-1), lambda d: F.normalize(d, dim=1),
    lambda d: torch.linalg.vector_norm(d.double() * 1e150, dim=-1, keepdim=True),
], ids=["vector_norm", "normalize", "float64"])
def test_the_norm_of_one_element_is_its_size(fn):
    # sqrt(x * x) overflowed past 1.8e19 in float32 (1.3e154 in float64) and went subnormal
    # below 1e-19, where eager's norm of a size-1 dim is |x|. (torch 2.11's meta function keeps
    # that dim where its eager op drops it: there the graph runs through ATen, and only the
    # values are compared.)
    d = torch.tensor([[3e20], [-2e-22], [1.5e-30], [0.0]])
    report = ember.Report()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = ember.compile(fn, report=report)(d)
    assert_same(out, fn(d))
    assert all(g.error is None or "ATen gives" in g.error for g in report.graphs), [g.error for g in report.graphs]
    if torch.__version__ >= "2.13":
        assert not [g.error for g in report.graphs if g.error]


def test_a_norm_over_a_dim_of_size_1_trains_as_eager():
    # Under torch 2.11 the traced norm keeps the dim (1, n) where ATen computes (n,): the forward
    # runs through ATen, and so does its backward, whose kernels would read the saved values and
    # gradients in the traced shapes (an IndexError)
    def fn(x):
        v = torch.linalg.vector_norm(x.unsqueeze(0), dim=-2)
        return (v > v.flip(-1)).to(v.dtype), v * 2

    x = torch.randn(64, device=DEVICE, requires_grad=True)
    report = ember.Report()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = ember.compile(fn, report=report)(x)
    want = fn(x)
    grads = [torch.autograd.grad(out[1].sum(), x)[0] for out in (got, want)]
    assert_same((*got, grads[0]), (*want, grads[1]))
    if torch.__version__ >= "2.13":
        assert [g.error for g in report.graphs] == [None, None]
