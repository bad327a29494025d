"""Outputs written over inputs that die in their kernel (codegen/wrapper.py, schedule/inplace.py):
when the host program reuses memory, and that results, gradients and the user's tensors stay
what eager gives."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn.functional as F

import ember

from .conftest import INTERPRETED_TRITON
from .helpers import assert_same, check


def _written_over(report: ember.Report, kind: str | None = None) -> list[str]:
    return [line.strip() for g in report.graphs if kind is None or g.kind == kind
            for line in g.wrapper.splitlines() if "written over" in line]


def swiglu(x, wg, wu):
    return F.silu(x @ wg) * (x @ wu)


@pytest.mark.parametrize("options", [None, pytest.param({"target": "triton"}, marks=INTERPRETED_TRITON)],
                         ids=["cpp", "triton"])
def test_epilogue_written_over_the_matmul_result(options):
    # the product dies in its epilogue kernel: the epilogue writes over it
    x, w, b = torch.randn(33, 16), torch.randn(16, 24), torch.randn(24)
    report = check(lambda x, w, b: F.gelu(x @ w + b), x, w, b, options=options)
    assert _written_over(report) == ["buf1 = buf0  # written over buf0, which dies here"]


def test_row_kernel_written_over_its_input():
    # softmax reads each row three times (max, sum, store); the store is in the last loop
    x, w = torch.randn(9, 8), torch.randn(8, 70)
    report = check(lambda x, w: torch.softmax(x @ w, -1), x, w)
    assert len(_written_over(report)) == 1


@pytest.mark.parametrize("fn", [
    lambda x, w: torch.relu((x @ w).t()),            # read transposed: element i is not read at i
    lambda x, w: (x @ w) + (x @ w).roll(1, 0),       # read at a shifted index too
    lambda x, w: (x @ w).sum(-1, keepdim=True) * 2,  # another shape
], ids=["transposed", "shifted", "reduced"])
def test_no_reuse_where_elements_are_read_elsewhere(fn):
    x, w = torch.randn(16, 16), torch.randn(16, 16)
    report = check(fn, x, w)
    assert _written_over(report) == []


@pytest.mark.parametrize("options", [None, pytest.param({"target": "triton"}, marks=INTERPRETED_TRITON)],
                         ids=["cpp", "triton"])
@pytest.mark.parametrize("fn", [
    lambda x, w: ((v := torch.stack([x, x.flip(1)], 2)).diagonal(0, -2, -1), v.sin()),
    lambda x, w: ((v := x @ w).diagonal(), v.sin()),
], ids=["stack", "matmul"])
def test_no_reuse_of_memory_an_aten_view_keeps(fn, options):
    # the diagonal runs through ATen and is a view of the buffer; the kernel after it read that
    # buffer last, and wrote the sines over it before the diagonal was copied out (seed 32953412410)
    x, w = torch.randn(6, 5), torch.randn(5, 5)
    report = check(fn, x, w, options=options)
    assert _written_over(report) == []


def test_never_over_the_users_tensors():
    # forward inputs, outputs and a gradient the user passes are never written over
    x = torch.randn(12, 16)
    f = ember.compile(lambda x: torch.exp(x) * 2)
    x_before = x.clone()
    y = f(x)
    assert torch.equal(x, x_before)
    assert_same(y, torch.exp(x_before) * 2)


def test_backward_writes_over_saved_products():
    # the gated MLP's backward: the gradient kernel's outputs reuse the saved products x @ wg and
    # x @ wu (AOTAutograd's donated buffers), and the user's upstream gradient is left alone
    torch.manual_seed(0)
    args = [torch.randn(32, 16, requires_grad=True), torch.randn(16, 48, requires_grad=True),
            torch.randn(16, 48, requires_grad=True)]
    ref_args = [a.detach().clone().requires_grad_() for a in args]
    grad = torch.randn(32, 48)
    grad_before = grad.clone()
    report = ember.Report()
    out = ember.compile(swiglu, report=report)(*args)
    out.backward(grad)
    swiglu(*ref_args).backward(grad_before)
    assert torch.equal(grad, grad_before)
    for a, r in zip(args, ref_args):
        assert_same(a.grad, r.grad)
    reused = _written_over(report, "backward")
    assert any(line.startswith(("buf0 = mm_in ", "buf0 = mm_1 ")) for line in reused), reused


def test_saved_tensors_are_kept_when_the_backward_may_run_again():
    # With retain_graph=True autograd keeps the saved tensors for a second backward: the program
    # checks that at run time and allocates instead. (AOTAutograd itself refuses retain_graph on
    # graphs with donated buffers; its config switch turned off after compiling lets one through.)
    from torch._functorch import config as functorch_config

    args = [torch.randn(8, 16, requires_grad=True), torch.randn(16, 24, requires_grad=True),
            torch.randn(16, 24, requires_grad=True)]
    ref_args = [a.detach().clone().requires_grad_() for a in args]
    report = ember.Report()
    f = ember.compile(swiglu, report=report)
    out = f(*args)
    ref = swiglu(*ref_args)
    with functorch_config.patch(donated_buffer=False):
        out.sum().backward(retain_graph=True)
        out.sum().backward()
    ref.sum().backward(retain_graph=True)
    ref.sum().backward()
    assert _written_over(report, "backward")
    for a, r in zip(args, ref_args):
        assert_same(a.grad, r.grad)


def test_no_donation_when_torch_turns_it_off():
    from torch._functorch import config as functorch_config

    args = [torch.randn(8, 16, requires_grad=True), torch.randn(16, 24, requires_grad=True),
            torch.randn(16, 24, requires_grad=True)]
    report = ember.Report()
    with functorch_config.patch(donated_buffer=False):
        ember.compile(swiglu, report=report)(*args).sum().backward()
    assert not any("if not keep_graph()" in line for line in _written_over(report, "backward"))


def test_aten_fallback_computes_every_output_before_writing(tmp_path):
    # a kernel that fails to build runs through ATen with the same arguments, the reused input
    # among them: its outputs must all be computed before the first is written
    opts = {"cache_dir": tmp_path, "cxx_flags": ("-O3", "-fPIC", "-shared", "--not-a-real-flag")}
    x, w = torch.randn(10, 12), torch.randn(12, 12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = check(lambda x, w: (torch.sigmoid(x @ w), torch.relu(x @ w) * 3), x, w,
                       options=opts, expect_built=False)
    assert len(_written_over(report)) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA kernels need a GPU")
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_backward_writes_over_saved_products_on_the_gpu(backend):
    torch.manual_seed(0)
    args = [torch.randn(300, 64, device="cuda", requires_grad=True),
            torch.randn(64, 200, device="cuda", requires_grad=True),
            torch.randn(64, 200, device="cuda", requires_grad=True)]
    ref_args = [a.detach().clone().requires_grad_() for a in args]
    report = ember.Report()
    f = ember.compile(swiglu, report=report, options={"gpu_backend": backend})
    for _ in range(2):  # the second step runs into memory the caching allocator hands back
        for a in args:
            a.grad = None
        f(*args).square().sum().backward()
    swiglu(*ref_args).square().sum().backward()
    exact = [a.detach().double().requires_grad_() for a in args]
    swiglu(*exact).square().sum().backward()
    assert _written_over(report, "backward")
    # ember sums dx's two products in one addmm where eager rounds each: both against float64
    for a, r, e in zip(args, ref_args, exact):
        mine, theirs = (((t.grad.double() - e.grad).norm() / e.grad.norm()).item() for t in (a, r))
        assert mine <= 2 * theirs + 1e-6, (mine, theirs)


FRESH_CASES = {
    "clone of an input": lambda x: x.clone(),
    "contiguous copy of a transposed input": lambda x: x.t().contiguous(),
    "contiguous copy of an expanded input": lambda x: x.unsqueeze(0).expand(2, *x.shape).contiguous(),
    "two equal results": lambda x: (x * 2, x * 2),
    "two clones": lambda x: (x.clone(), x.clone()),
    "a result and its clone": lambda x: (lambda y: (y, y.clone()))(x + 1),
    # (one 0-d constant after CSE: each came back a broadcast of it)
    "constants of two shapes": lambda x: (torch.zeros(2, 3), torch.zeros(3, 2), torch.full((4, 1), 1.5)),
}


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("case", FRESH_CASES, ids=str)
def test_outputs_eager_returns_fresh_share_no_memory(case, dynamic):
    # ember's IR makes a clone its source and CSE makes equal values one node: returned as they
    # were, a user's in-place change of one result changed the input, or the other result
    fn = FRESH_CASES[case]
    x = torch.randn(3, 16)
    keep = x.clone()
    outs = ember.compile(fn, dynamic=dynamic)(x)
    outs = outs if isinstance(outs, tuple) else (outs,)
    refs = fn(keep)
    refs = refs if isinstance(refs, tuple) else (refs,)
    for out, ref in zip(outs, refs):
        assert out.stride() == ref.stride(), (out.stride(), ref.stride())
        out.add_(1)  # (as eager: a tensor of its own, dense where eager's is)
    assert_same(x, keep)
    for out, ref in zip(outs, refs):
        assert_same(out, ref + 1)


def test_outputs_that_alias_stay_views():
    # a view of an input, or of another output, is returned as the view eager returns
    x = torch.randn(3, 16)
    y = ember.compile(lambda x: x.t())(x)
    assert y.data_ptr() == x.data_ptr() and y.stride() == (1, 16)
    a, b = ember.compile(lambda x: (lambda y: (y, y.t()))(x * 2))(x)
    assert a.data_ptr() == b.data_ptr()
    # a broadcast of a computed value is the broadcast view eager returns, not every repeated
    # element stored (an in-place change of it is eager's error, not a silent success)
    for fn in (lambda x: x.sum(0).expand(3, 16), lambda x: (x * 2)[None].expand(2, 3, 16)):
        out, ref = ember.compile(fn)(x), fn(x)
        assert out.stride() == ref.stride() and out.untyped_storage().nbytes() == ref.untyped_storage().nbytes()
        assert_same(out, ref)
        with pytest.raises(RuntimeError, match="more than one element"):
            out.add_(1)


def test_a_value_returned_with_its_detach_keeps_its_gradient():
    # ember's IR has no detach: y and y.detach() were one tensor object, and the detach's
    # "no gradient" reached y, so the view y.t() rebuilt from it had no gradient at all
    def view_and_detach(x):
        y = x + 1
        return y.t(), y.detach()

    outs, grads = [], []
    for fn in (view_and_detach, ember.compile(view_and_detach)):
        x = torch.randn(4, 3, requires_grad=True)
        a, b = fn(x)
        (a * torch.arange(12.0).view(3, 4)).sum().backward()
        outs.append((a.detach(), b, a.requires_grad, b.requires_grad))
        grads.append(x.grad)
    assert grads[1] is not None
    assert_same(grads[1], grads[0])
    assert outs[1][2:] == outs[0][2:] == (True, False)


def test_detached_views_and_repeated_outputs_are_tensors_of_their_own():
    def detached_view(x):
        y = x.exp()
        return y, y.t().detach()

    x = torch.randn(3, 3, requires_grad=True)
    y, d = ember.compile(detached_view)(x)
    assert not d.requires_grad
    d.add_(1)  # eager allows it; a view made under the compiled forward's no_grad raised
    assert_same(y.detach(), x.detach().exp() + 1)  # d is y's memory, as in eager

    def three_of_one(x):
        y = x + 1
        return y, y.detach(), y.view_as(y)

    a, b, c = ember.compile(three_of_one)(torch.randn(3))
    assert a is not b and a is not c and b is not c
    a.unsqueeze_(0)  # metadata of one output only, as in eager
    assert b.shape == c.shape == (3,)
    assert a.data_ptr() == b.data_ptr() == c.data_ptr()


def _iadd_broadcast(x):
    y = torch.broadcast_to(x[:1], (4, 5))
    y += 1


def _setitem_expand(x):
    y = x[:, :1].expand(4, 5)
    y[0] = 3.0


OVERLAPPING_WRITES = {
    "add_ of an expand": lambda x: x.unsqueeze(0).expand(3, 4, 5).add_(1),
    "+= of a broadcast": _iadd_broadcast,
    "setitem into an expand": _setitem_expand,
    "relu_ of an expand": lambda x: torch.relu_(x[:, :1].expand(4, 5)),
    "fill_ of an expand": lambda x: x.expand(3, 4, 5).fill_(1.0),  # (eager writes every alias)
    "zero_ of an expand": lambda x: x[:, :1].expand(4, 5).zero_(),
    "masked_fill_ of an expand": lambda x: x[:, :1].expand(4, 5).masked_fill_(x > 0, 2.0),
    "mul_ of overlapping as_strided": lambda x: x.as_strided((3, 3), (1, 2), 1).mul_(2),
    # the written tensor and one the op reads overlap in part
    "copy_ of a shifted view": lambda x: x[1:].copy_(x[:-1]),
    "add_ of its transpose": lambda x: (lambda s: s.add_(s.t()))(x.view(-1)[4:].view(4, 4)),
    "index_put_ of its own rows": lambda x: x.index_put_((torch.tensor([0, 1]),), x[1:3]),
    # a list op updates one tensor at a time: it raises on the i-th pair overlapping in part, and
    # a later index reads what an earlier one wrote (functionalized, both read the old values)
    "foreach add_ of a shifted view": lambda x: torch._foreach_add_([x[1:]], [x[:-1]]),
    "foreach add_ of a later written row": lambda x: torch._foreach_add_([x[0], x[1]], [x[1], x[0]]),
    # functionalized through unfold_backward, which zeroed the elements between the windows
    "mul_ of an unfold with gaps": lambda x: x.unfold(1, 2, 3).mul_(3),
    "setitem into a window of an unfold": lambda x: x.unfold(0, 1, 2)[1].fill_(7.0),
}


@pytest.mark.filterwarnings("ignore:ember. a graph writes", "ignore:Use of masked_fill_")
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("case", OVERLAPPING_WRITES, ids=str)
def test_writes_to_elements_that_share_memory_are_eagers(case, dynamic):
    # functionalized, an in-place op on a view whose elements share memory (or reading another
    # view of what it writes) computed every alias apart: no error where eager raises "... refers
    # to a single memory location", and other values where eager's kernels write each alias
    def fn(x):
        OVERLAPPING_WRITES[case](x)
        return x * 2

    x = torch.randn(4, 5)
    ref_x, out_x = x.clone(), x.clone()
    try:
        ref = fn(ref_x)
    except RuntimeError as e:
        assert "to a single memory location" in str(e)
        with pytest.raises(RuntimeError, match="to a single memory location"):
            ember.compile(fn, dynamic=dynamic)(out_x)
        assert_same(out_x, ref_x)
        return
    assert_same(ember.compile(fn, dynamic=dynamic)(out_x), ref)
    assert_same(out_x, ref_x)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_writes_to_views_of_one_element_per_address_still_compile(dynamic):
    def fn(x):
        x[:, 0].add_(1)
        x.t().mul_(2)
        x.view(-1)[::2].zero_()
        x.unsqueeze(1).expand(4, 1, 5).sub_(1)  # (a broadcast to size 1 shares nothing)
        # setitem writes x[i], not all of x: += copies a view onto itself, and rows apart
        x[0, 1:] += 1
        x[:2] = x[2:]
        x.unfold(0, 1, 1).add_(1)  # (windows covering the dim: written back right)
        return x * 2

    x = torch.randn(4, 5)
    ref_x, out_x = x.clone(), x.clone()
    fallbacks = ember.stats()["graph_fallbacks"]
    assert_same(ember.compile(fn, dynamic=dynamic)(out_x), fn(ref_x))
    assert_same(out_x, ref_x)
    assert ember.stats()["graph_fallbacks"] == fallbacks


def test_writes_to_rows_apart_at_symbolic_sizes_still_compile():
    # x[0] ends before x[-1] begins for every n > 1, which the size ranges alone do not prove
    # (n <= n * (n - 1)): guarded for the sizes called, not run eagerly at every size
    def fn(x):
        x[-1] = x[0]
        return x * 2

    compiled = ember.compile(fn)  # (the second size compiles it with symbolic sizes)
    fallbacks = ember.stats()["graph_fallbacks"]
    for n in (4, 6):
        x = torch.randn(n, n)
        ref_x, out_x = x.clone(), x.clone()
        assert_same(compiled(out_x), fn(ref_x))
        assert_same(out_x, ref_x)
    assert ember.stats()["graph_fallbacks"] == fallbacks


def _mul_into(a, b):
    a.mul_(b)
    return a * 2


def _multiply_into(a, b):
    a *= b
    return a


def _foreach_mul_into(a, b):
    torch._foreach_mul_(a, b)
    return a


@pytest.mark.parametrize("fn, make", [
    (_mul_into, lambda: (torch.arange(4), torch.rand(4))),
    (_multiply_into, lambda: (torch.arange(4), torch.tensor(2.5))),
    (_foreach_mul_into, lambda: ([torch.arange(4), torch.rand(3)], [torch.rand(4), torch.rand(3)])),
], ids=["mul_", "imul", "foreach_mul_"])
def test_in_place_results_eager_cannot_cast_raise_eagers_error(fn, make):
    """Functionalization drops eager's check that an in-place op's result type casts to the
    tensor written: int64 *= float32 computed a value (aot_eager too) where eager raises."""
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
        fn(*make())
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
        ember.compile(fn)(*make())
    floats = (torch.rand(4), torch.arange(4))  # (float *= int is fine: compiled as before)
    fallbacks = ember.stats()["graph_fallbacks"]
    assert_same(ember.compile(_mul_into)(*[t.clone() for t in floats]), _mul_into(*[t.clone() for t in floats]))
    assert ember.stats()["graph_fallbacks"] == fallbacks


def _addcmul_into(a, b, c):
    a.addcmul_(b, c, value=2.7)
    return a


def _addcmul_third_into(a, b, c):
    a.addcmul_(b, c, value=0.3)
    return a


def _addcdiv_into(a, b, c):
    a.addcdiv_(b, c, value=2)
    return a


def _add_tensor_alpha_into(a, b, c):
    a.add_(b, alpha=c)
    return a


def _ints(*shift):
    return torch.tensor([-5, 3, 4, -1, 2]) + torch.tensor(list(shift) or [0])


@pytest.mark.parametrize("fn, make", [
    (_addcmul_into, lambda: (_ints(), _ints(), _ints())),  # eager truncates the value to 2
    (_addcmul_third_into, lambda: (torch.linspace(-2, 2, 64), torch.linspace(-3, 1, 64).half(),
                                   torch.linspace(1, 9, 64).half())),  # 0.3 * t1 * t2 in float32, once
    (lambda a, b, c: torch.addcmul(a, b, c, value=0.5), lambda: (_ints(), _ints(), _ints())),
    (_addcmul_into, lambda: (_ints(), torch.rand(5), torch.rand(5))),  # float into int64
    (_addcdiv_into, lambda: (_ints(), _ints(), _ints(10))),  # integer addcdiv
    (_add_tensor_alpha_into, lambda: (_ints(), _ints(), torch.tensor(0.5))),  # float alpha for ints
    (_add_tensor_alpha_into, lambda: (torch.rand(5), torch.rand(5), torch.tensor([0.5]))),  # alpha with a dim
], ids=["addcmul_int_value", "addcmul_16bit", "addcmul_int_value_out_of_place", "addcmul_cast",
        "addcdiv_int", "add_float_alpha", "add_alpha_with_dim"])
@pytest.mark.skipif(tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 13),
                    reason="torch 2.11's Dynamo traces these updates otherwise (measured on the GPU machines)")
def test_in_place_updates_dynamo_rewrites_into_fma_are_eagers(fn, make):
    """Dynamo traces addcmul_/addcdiv_ with a value, and add_ with a tensor alpha, into
    ``x.copy_(fma(...))``, which cast silently where eager raises and computed other values (an
    integer addcmul_ truncates a float value first); addcmul's reference refused a float value for
    integers, so the whole graph ran eagerly with a warning. Values and errors are eager's now."""
    try:
        ref = fn(*make())
    except (RuntimeError, TypeError) as e:
        with pytest.raises(type(e), match=str(e).split(",")[0][:40].replace("(", r"\(").replace(")", r"\)")):
            ember.compile(fn)(*make())
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = ember.compile(fn)(*make())
    torch.testing.assert_close(out, ref)  # (exact for integers; float32 within eager's FMA's rounding)


@pytest.mark.skipif(tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 13),
                    reason="torch 2.11's Dynamo traces these updates otherwise (measured on the GPU machines)")
def test_in_place_updates_with_a_symbolic_value_or_an_alpha_needing_grad_are_eagers():
    """A value that changed between calls is symbolic in Dynamo's graph: its fma was not undone,
    so an integer addcmul_ used 0.5 where eager truncates it to 0, and a float one into an
    integer tensor cast silently. A tensor alpha that requires grad is no number to eager's
    parser (TypeError, under no_grad too)."""
    compiled = ember.compile(_addcmul_value_into)
    for value in (2, 0.5, 2.5):
        ref = _addcmul_value_into(_ints(), _ints(), _ints(), value)
        assert torch.equal(compiled(_ints(), _ints(), _ints(), value), ref)
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long"):
        compiled(_ints(), torch.rand(5), torch.rand(5), 1.5)
    alpha = torch.tensor(2.0, requires_grad=True)
    with torch.no_grad(), pytest.raises(TypeError, match="must be Number, not Tensor"):
        ember.compile(_add_tensor_alpha_into)(torch.rand(5), torch.rand(5), alpha)


def _addcmul_value_into(a, b, c, value):
    a.addcmul_(b, c, value=value)
    return a


def test_each_tensors_address_is_read_once_across_kernels():
    # An Adam step's outputs stored in place and read again by the next kernel: each memory's
    # data_ptr() is read once a call (it was read again under every name, by every kernel)
    params = [torch.randn(n, requires_grad=True) for n in (8, 16, 5)]
    for p in params:
        p.grad = torch.randn_like(p)
    ref = [p.detach().clone().requires_grad_() for p in params]
    for p, r in zip(params, ref):
        r.grad = p.grad.clone()
    opt, ref_opt = torch.optim.Adam(params, foreach=True), torch.optim.Adam(ref, foreach=True)
    report = ember.Report()
    step = ember.compile(opt.step, report=report)
    for _ in range(3):
        step()
        ref_opt.step()
    assert_same([p.detach() for p in params], [r.detach() for r in ref])
    wrapper = "\n".join(g.wrapper for g in report.graphs)
    reads = re.findall(r"(\w+)\.data_ptr\(\)", wrapper)
    assert len([line for line in wrapper.splitlines() if line.strip().startswith("fused_")]) >= 2, wrapper
    assert reads and len(reads) == len(set(reads)), wrapper
    assert re.search(r"\(\w+_p := \w+\.data_ptr\(\)\)", wrapper), wrapper


def test_an_address_is_read_again_after_an_aten_call():
    # a pointer kept in a local is forgotten where anything but a kernel runs in between
    def fn(x, y):
        a = (x + 1).sin()
        b = torch.linalg.matrix_exp(a.reshape(2, 2)).reshape(4)  # (ATen)
        return (a * y + b).cos(), a
    x, y = torch.randn(4), torch.randn(4)
    report = ember.Report()
    assert_same(ember.compile(fn, report=report)(x, y), fn(x, y))
    wrapper = "\n".join(g.wrapper for g in report.graphs)
    calls = [line.strip() for line in wrapper.splitlines() if line.strip().startswith("fused_")]
    assert len(calls) == 2 and "aten_linalg_matrix_exp" in wrapper, wrapper
    assert re.search(r"\((\w+)_p := \1\.data_ptr\(\)\)", calls[0]), wrapper  # kept after the first kernel ...
    assert not re.search(r"[(, ]\w+_p[,)]", calls[1]), wrapper  # ... and read again after the ATen call
