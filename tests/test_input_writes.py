"""A compiled function's in-place updates of its inputs (frontend/lowering.py ``copy_``,
codegen/input_writes.py): the inputs end as eager leaves them, and the program stores a new
value straight into its input where nothing reads the input afterwards."""

from __future__ import annotations

import copy
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import ember
from ember.frontend.input_writes import InputWriteError
from ember.frontend.lowering import lower_graph

from .conftest import DEVICE, INTERPRETED_TRITON
from .helpers import assert_same, run


def _wrapper(report: ember.Report) -> str:
    return "\n".join(g.wrapper for g in report.graphs)


def _stored_in_place(report: ember.Report) -> int:
    return _wrapper(report).count("stored in place")


def _copies(report: ember.Report) -> int:
    return _wrapper(report).count("# the function's write into its input")


def check_writes(fn, *args, options=None, dynamic=None, rtol=None, atol=None) -> ember.Report:
    """ember(fn) returns what eager returns and leaves every argument as eager leaves it."""
    eager_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    ember_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    ref = fn(*eager_args)
    out, report = run(fn, *ember_args, options=options, dynamic=dynamic)
    assert_same(out, ref, rtol, atol)
    assert_same(ember_args, eager_args, rtol, atol)
    assert not [g.error for g in report.graphs if g.error], [g.error for g in report.graphs]
    return report


def _add_into(x, buf):
    buf.add_(x)
    return buf * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
def test_update_is_stored_in_place(dtype):
    x = torch.arange(37, device=DEVICE).to(dtype)
    buf = (torch.arange(37, device=DEVICE) * 3).to(dtype)
    report = check_writes(_add_into, x, buf)
    assert _stored_in_place(report) == 1 and _copies(report) == 0, _wrapper(report)
    assert "write %arg" in str(report)  # (the IR says what it writes)


@pytest.mark.parametrize("n", [0, 1, 4099])
def test_sizes_zero_one_and_many(n):
    check_writes(_add_into, torch.randn(n, device=DEVICE), torch.randn(n, device=DEVICE))


def test_symbolic_sizes_no_recompile():
    f = ember.compile(_add_into, dynamic=True)
    for n in (5, 9, 130):
        x, buf = torch.randn(n, device=DEVICE), torch.randn(n, device=DEVICE)
        ref_buf = buf + x
        out = f(x, buf)
        torch.testing.assert_close(buf, ref_buf)
        torch.testing.assert_close(out, ref_buf * 2)


def test_value_also_returned_is_a_tensor_of_its_own():
    # the new value is returned too: copied into the input, and the output is not the input
    def f(x, buf):
        new = buf + x
        buf.copy_(new)
        return new

    x, buf = torch.randn(50, device=DEVICE), torch.randn(50, device=DEVICE)
    report = check_writes(f, x, buf)
    out = ember.compile(f)(x, buf)
    assert out.data_ptr() != buf.data_ptr()
    before = buf.clone()
    out.add_(1)
    assert torch.equal(buf, before)
    assert _stored_in_place(report) == 0 and _copies(report) == 1


def test_clone_taken_before_the_write_keeps_the_old_values():
    # ember's IR makes the clone the input itself: the input must not be written before it is copied
    def f(buf):
        old = buf.clone()
        buf.mul_(2)
        return old

    check_writes(f, torch.randn(64, device=DEVICE))


def test_read_before_the_write():
    def f(x, buf):
        total = buf.sum()
        buf.add_(x)
        return total, buf.amax()

    check_writes(f, torch.randn(300, device=DEVICE), torch.randn(300, device=DEVICE))


@pytest.mark.parametrize("fn", [
    lambda buf: buf.copy_(buf.roll(1, 0)),                  # the value reads other elements
    lambda buf: buf.copy_(buf.flip(0) + buf),
    lambda buf: buf[1:].copy_(buf[:-1].clone()),            # a shifted slice of itself
    lambda buf: buf.copy_(buf.t().contiguous().t() * 2),    # read transposed
    lambda buf: buf.copy_(torch.softmax(buf, -1)),          # a row kernel reads the whole row first
    lambda buf: buf.copy_(buf.cumsum(-1)),
], ids=["roll", "flip", "shifted-slice", "transposed", "softmax", "cumsum"])
def test_values_that_read_other_elements(fn):
    buf = torch.randn(33, 33, device=DEVICE)
    report = check_writes(lambda b: (fn(b), None)[1], buf)
    assert report.graphs


def test_cast_and_broadcast_into_the_input():
    def f(x, buf):
        buf.copy_(x)
        return x.sum()

    check_writes(f, torch.randn(1, 4, device=DEVICE), torch.zeros(3, 4, dtype=torch.float64, device=DEVICE))


def test_non_contiguous_input():
    buf = torch.randn(6, 8, device=DEVICE).t()
    check_writes(lambda x, b: (b.mul_(x), b.sum())[1], torch.randn(8, 6, device=DEVICE), buf)
    buf = torch.randn(6, 16, device=DEVICE)[:, ::2]
    check_writes(lambda x, b: (b.add_(x), None)[1], torch.randn(6, 8, device=DEVICE), buf)


def test_write_into_part_of_an_input():
    def f(x, buf):
        buf[1:3].add_(x)
        buf[:, 0] = 7
        return x + 1

    check_writes(f, torch.randn(2, 5, device=DEVICE), torch.randn(4, 5, device=DEVICE))


def test_aliased_inputs():
    # one argument a view of the other: AOTAutograd merges them into one base the graph writes
    def f(a, b):
        a.add_(1)
        return b * 2

    buf = torch.randn(10, device=DEVICE)
    ref_buf = buf.clone()
    ref = f(ref_buf, ref_buf[2:])
    out = ember.compile(f)(buf, buf[2:])
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(buf, ref_buf)


def test_counter_and_two_buffers():
    def f(x, a, b, n):
        a.mul_(0.9).add_(x, alpha=0.1)
        b.copy_(torch.maximum(b, x))
        n.add_(1)
        return (a - b).abs().sum()

    x = torch.randn(8, 3, device=DEVICE)
    report = check_writes(f, x, torch.randn(8, 3, device=DEVICE), torch.randn(8, 3, device=DEVICE),
                          torch.tensor(4, device=DEVICE))
    assert _stored_in_place(report) == 3, _wrapper(report)


def test_under_no_grad_and_inference_mode():
    f = ember.compile(_add_into)
    for mode in (torch.no_grad, torch.inference_mode):
        x, buf = torch.randn(20, device=DEVICE), torch.randn(20, device=DEVICE)
        expected = buf + x
        with mode():
            f(x, buf)
        torch.testing.assert_close(buf, expected)


def test_leaf_written_under_no_grad_in_training():
    # a target network's update: the leaf changes, its .grad stays None, the loss's gradient flows
    def f(x, w, target):
        loss = (x @ w).square().mean()
        with torch.no_grad():
            target.lerp_(w, 0.5)
        return loss

    x = torch.randn(6, 4, device=DEVICE)
    w = torch.randn(4, 3, device=DEVICE, requires_grad=True)
    target = torch.zeros(4, 3, device=DEVICE, requires_grad=True)
    w2, t2 = w.detach().clone().requires_grad_(), target.detach().clone().requires_grad_()
    f(x, w2, t2).backward()
    ember.compile(f)(x, w, target).backward()
    torch.testing.assert_close(target, t2)
    torch.testing.assert_close(w.grad, w2.grad)
    assert target.grad is None


def test_recompute_never_reads_the_written_input():
    # the forward writes w after computing exp(w * x): the backward needs exp's value from
    # before, which a backward recomputing it from w would not have
    def f(x, w):
        y = (w * x).exp()
        with torch.no_grad():
            w.mul_(2)
        return y.sum()

    x = torch.randn(40, device=DEVICE)
    w = torch.randn(40, device=DEVICE, requires_grad=True)
    w2 = w.detach().clone().requires_grad_()
    f(x, w2).backward()
    ember.compile(f)(x, w).backward()
    torch.testing.assert_close(w, w2)
    torch.testing.assert_close(w.grad, w2.grad)


@pytest.mark.parametrize("channels_last", [False, True])
def test_batchnorm_training_steps(channels_last):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).to(DEVICE)
    reference = copy.deepcopy(model)
    compiled = ember.compile(model)
    for _ in range(3):
        x = torch.randn(4, 3, 10, 10, device=DEVICE)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        compiled(x).square().mean().backward()
        reference(x).square().mean().backward()
    bn, ref_bn = model[1], reference[1]
    torch.testing.assert_close(bn.running_mean, ref_bn.running_mean)
    torch.testing.assert_close(bn.running_var, ref_bn.running_var)
    assert int(bn.num_batches_tracked) == int(ref_bn.num_batches_tracked) == 3
    torch.testing.assert_close(model[0].weight.grad, reference[0].weight.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,channels_last", [((8, 16, 10, 10), False), ((8, 16, 10, 10), True),
                                                 ((2, 3, 1, 1), True), ((0, 4, 3, 3), False)])
@pytest.mark.parametrize("options", [None, pytest.param({"target": "triton"}, marks=INTERPRETED_TRITON)],
                         ids=["default", "triton"])
def test_batchnorm_statistics_stored_in_place_by_its_kernel(shape, channels_last, dtype, options):
    # The new running mean and variance are per-channel epilogues of the statistics kernel
    # (schedule/domains.py), stored straight into the buffers they update
    # (schedule/inplace.py: an outer store whose old value feeds it alone): one kernel for the
    # normalization, one for the step counter, no copies. 8x16x10x10 channels_last is a column
    # kernel whose 800 rows the C++ threads share in runs.
    if options and DEVICE != "cpu":
        pytest.skip("the interpreter runs Triton on CPU tensors")
    x = torch.randn(shape, device=DEVICE, dtype=dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    c = shape[1]
    mean = torch.rand(c, device=DEVICE, dtype=dtype)
    var = torch.rand(c, device=DEVICE, dtype=dtype) + 1
    w, b = torch.randn(c, device=DEVICE, dtype=dtype), torch.randn(c, device=DEVICE, dtype=dtype)
    steps = torch.zeros((), dtype=torch.int64, device=DEVICE)

    def f(x, mean, var, steps):
        steps.add_(1)
        return F.batch_norm(x, mean, var, w, b, training=True, momentum=0.1)

    tol = 2e-2 if dtype == torch.bfloat16 else None
    report = check_writes(f, x, mean, var, steps, rtol=tol, atol=tol, options=options)
    if x.numel() == 0:  # (eager leaves the statistics as they were: nothing to compute)
        return
    assert _stored_in_place(report) == 3 and _copies(report) == 0, _wrapper(report)
    assert len(report.kernels) == 2, [k.name for k in report.kernels]


@pytest.mark.parametrize("columns", [False, True])
def test_an_outer_write_whose_old_value_the_loops_read_is_copied(columns):
    # The old running mean is read inside the loops that normalize each row, and so by every
    # thread of a row's kernel: another thread storing the new one first would change what they
    # read (in the C++ column kernel, the runs' second loop reads it again after the combine has
    # stored). That value goes into its input by a copy after the kernel.
    def f(x, mean):
        rows = x if not columns else x.t()
        y = (rows - mean[:, None]) / rows.std(1, keepdim=True)
        mean.mul_(0.9).add_(rows.mean(1) * 0.1)
        return y

    x = torch.randn(16, 800, device=DEVICE)
    if columns:
        x = x.t().contiguous()
    report = check_writes(f, x, torch.randn(16, device=DEVICE))
    assert _copies(report) == 1 and len(report.kernels) == 1, _wrapper(report)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_optimizer_steps(name):
    torch.manual_seed(0)
    params = [torch.randn(64, 32, device=DEVICE, requires_grad=True),
              torch.randn(32, device=DEVICE, requires_grad=True)]
    twins = [p.detach().clone().requires_grad_() for p in params]
    kwargs = {"lr": 0.01, "momentum": 0.9} if name == "SGD" else {"lr": 0.01}
    opt, ref_opt = getattr(torch.optim, name)(params, **kwargs), getattr(torch.optim, name)(twins, **kwargs)
    step = ember.compile(opt.step)
    for _ in range(3):
        for p, q in zip(params, twins):
            g = torch.randn_like(p)
            p.grad, q.grad = g.clone(), g.clone()
        step()
        ref_opt.step()
    for p, q in zip(params, twins):
        torch.testing.assert_close(p, q)
    for p, q in zip(params, twins):
        for key, value in ref_opt.state[q].items():
            # (Dynamo makes a compiled Adam capturable: its step count lives on the GPU there)
            torch.testing.assert_close(opt.state[p][key].cpu(), value.cpu())


def test_written_inputs_after_a_warm_start():
    # the second compile loads the plan from torch's AOTAutograd cache: it still writes the input
    from torch._dynamo.utils import counters

    from ember import aot_cache
    if not aot_cache.SUPPORTED:
        pytest.skip("this torch has no bundled AOTAutograd cache")
    for expected_hits in (0, 1):
        torch._dynamo.reset()
        counters.clear()
        x, buf = torch.randn(16, device=DEVICE), torch.randn(16, device=DEVICE)
        expected = buf + x
        ember.compile(_add_into)(x, buf)
        torch.testing.assert_close(buf, expected)
        assert counters["aot_autograd"]["autograd_cache_hit"] == expected_hits


@pytest.mark.parametrize("target", [pytest.param("triton", marks=INTERPRETED_TRITON)])
def test_triton_kernel_stores_in_place(target):
    if DEVICE != "cpu":
        pytest.skip("the interpreter runs Triton on CPU tensors")
    report = check_writes(_add_into, torch.randn(37), torch.randn(37), options={"target": target})
    assert _stored_in_place(report) == 1


def test_kernel_that_fails_to_build_still_writes(tmp_path):
    # the kernel runs through ATen (group_fallback), storing into the input all the same
    if DEVICE != "cpu":
        pytest.skip("a C++ flag the compiler refuses")
    before = ember.stats()["build_failures"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = check_writes(_add_into, torch.randn(40), torch.randn(40),
                              options={"cxx_flags": ["-fno-such-flag-at-all"], "cache_dir": tmp_path})
    assert ember.stats()["build_failures"] > before and _stored_in_place(report) == 1


def test_other_writes_into_inputs_are_never_dropped():
    # set_ (FSDP's parameters) is lowered by nobody: lowering refuses the graph, which runs
    # through ATen, rather than dropping a call no value reads
    def f(x, y):
        x.set_(y)
        return y + 1

    gm = make_fx(f)(torch.randn(3), torch.randn(3))
    with pytest.raises(InputWriteError, match="set_"):
        lower_graph(gm)


def test_input_read_after_its_write_is_refused():
    def f(x, y):
        torch.ops.aten.copy_.default(x, y)
        return x + 1

    gm = make_fx(f)(torch.randn(3), torch.randn(3))
    with pytest.raises(InputWriteError, match="x_1"):
        lower_graph(gm)


def test_relu_dropout_module_state_untouched():
    # a function that writes no input: nothing is written, nothing extra is returned
    x = torch.randn(5, 7, device=DEVICE)
    report = check_writes(lambda x: F.relu(x) + 1, x)
    assert _copies(report) == 0 and _stored_in_place(report) == 0


def test_written_input_returned():
    # ``return a.mul_(3)``: the graph returns the input itself, written
    def f(a, b):
        return a.mul_(3), a.float() * b

    a = torch.randn(300, dtype=torch.float16, device=DEVICE)
    report = check_writes(f, a, torch.randn(300, device=DEVICE))
    out = ember.compile(f)(a, torch.randn(300, device=DEVICE))
    assert out[0] is a
    assert _stored_in_place(report) == 1


@pytest.mark.parametrize("case", ["index_copy", "index_put", "index_add", "put_accumulate"])
def test_writes_at_indices_go_straight_into_the_input(case):
    # a KV cache's update (HF's StaticCache: index_copy_ at the cache positions): no copy of the
    # whole cache in, none back
    def f(cache, k, pos):
        if case == "index_copy":
            cache.index_copy_(2, pos, k)
        elif case == "index_put":
            cache[:, :, pos] = k
        elif case == "index_add":
            cache.index_add_(2, pos, k)
        else:
            cache.index_put_((torch.zeros_like(pos),), k.sum(), accumulate=True)
        return k.sum()

    cache = torch.randn(2, 3, 40, 8, device=DEVICE)
    k = torch.randn(2, 3, 3, 8, device=DEVICE)
    pos = torch.tensor([5, 17, 5] if case in ("index_add", "put_accumulate") else [5, 17, 39], device=DEVICE)
    report = check_writes(f, cache, k, pos)
    assert _stored_in_place(report) == 1 and _copies(report) == 0, _wrapper(report)
    assert ".copy_(" not in _wrapper(report)


def _domains(report: ember.Report) -> list[str]:
    """The outer domain of every kernel, as its source's header gives it."""
    return [re.search(r"outer \[([^\]]*)\]", k.source).group(1) for g in report.graphs for k in g.kernels]


@pytest.mark.parametrize("case", ["one_position", "stepped", "cast", "constant", "read_before", "read_after"])
def test_a_slice_written_into_an_input_writes_only_the_slice(case):
    # ``cache[:, :, 5:6] = k``: functionalized to slice_scatter(cache, k) copied into cache; the
    # kernel runs over k's elements and stores them into the cache, not a select over all of it
    def f(cache, k):
        out = cache.sum(-1) if case == "read_before" else None
        if case == "stepped":
            cache[:, :, 1:9:3] = k
        elif case == "constant":
            cache[:, :, 2:4] = 7.5
        else:
            cache[:, :, 5:5 + k.shape[2]] = k
        return cache @ cache.transpose(-1, -2) if case == "read_after" else out

    cache = torch.randn(2, 3, 16, 8, device=DEVICE)
    k = torch.randn(2, 3, 3 if case == "stepped" else 1, 8, device=DEVICE,
                    dtype=torch.float64 if case == "cast" else torch.float32)
    report = check_writes(f, cache, k)
    assert _stored_in_place(report) == 1 and _copies(report) == 0, _wrapper(report)
    written = "6, 16" if case == "constant" else "6, 3, 8" if case == "stepped" else "6, 8"
    assert written in _domains(report), (_domains(report), _wrapper(report))


def test_a_slice_at_a_position_given_each_call():
    # the start a size argument: checked against the cache's length, one compile for every later
    # position
    def f(cache, k, pos: int):
        cache[:, :, pos:pos + 1] = k

    cache = torch.randn(2, 3, 16, 8, device=DEVICE)
    compiled = ember.compile(f)
    before = ember.stats()["graphs_compiled"]
    for pos in (0, 7, 15, 3):
        k = torch.randn(2, 3, 1, 8, device=DEVICE)
        expected = cache.clone()
        expected[:, :, pos] = k[:, :, 0]
        compiled(cache, k, pos)
        assert torch.equal(cache, expected)
    assert ember.stats()["graphs_compiled"] - before == 2  # (Dynamo specializes the first position)
    report = check_writes(f, cache, torch.randn(2, 3, 1, 8, device=DEVICE), 9)
    assert _stored_in_place(report) == 1 and "6, 8" in _domains(report)


def test_a_slice_written_at_dynamic_sizes():
    # at symbolic sizes the trace writes the slice into the whole of each outer dim (a
    # slice_scatter over all of it, which is its source): still one kernel, storing in place
    def f(x, v):
        x[:, 2:3] = v
        return x * 2

    for rows in (5, 9):
        report = check_writes(f, torch.randn(rows, 6, device=DEVICE), torch.randn(rows, 1, device=DEVICE),
                              dynamic=True)
        assert _stored_in_place(report) == 1 and _copies(report) == 0, _wrapper(report)
        assert len(_domains(report)) == 1


def test_a_slice_of_a_slice_written_into_an_input():
    # x[1:3, 2:4] = v: the rows' slice_scatter reads the input (the row slice written into),
    # so it keeps the select over the whole input
    def f(x, v):
        x[1:3, 2:4] = v
        return x * 2

    check_writes(f, torch.randn(5, 6, device=DEVICE), torch.randn(2, 2, device=DEVICE))


def test_a_slice_written_into_a_copy_stays_one_select():
    # not an input: the select over the whole result fuses with what reads it
    def f(cache, k):
        c = cache.clone()
        c[:, :, 2:3] = k
        return c * 2

    report = check_writes(f, torch.randn(2, 3, 16, 8, device=DEVICE), torch.randn(2, 3, 1, 8, device=DEVICE))
    assert len(_domains(report)) == 1


def test_write_at_indices_reading_the_input_is_copied():
    # the values written come from the input itself: the kernel reads the input it would write
    def f(cache, src_pos, dst_pos):
        cache.index_copy_(0, dst_pos, cache.index_select(0, src_pos) * 2)

    cache = torch.randn(30, 6, device=DEVICE)
    report = check_writes(f, cache, torch.tensor([1, 2, 3], device=DEVICE), torch.tensor([2, 3, 4], device=DEVICE))
    assert report.graphs


def test_input_read_after_a_write_at_indices():
    def f(cache, k, pos):
        before = cache * 1
        cache.index_copy_(0, pos, k)
        return before.sum(0), cache.sum(0)

    check_writes(f, torch.randn(30, 6, device=DEVICE), torch.randn(2, 6, device=DEVICE),
                 torch.tensor([0, 29], device=DEVICE))


def test_bad_index_raises_as_eager_does():
    def f(cache, k, pos):
        cache.index_copy_(0, pos, k)

    cache, k = torch.randn(8, 3, device=DEVICE), torch.randn(1, 3, device=DEVICE)
    if DEVICE != "cpu":
        pytest.skip("a device-side assert ends the process's CUDA context")
    with pytest.raises(IndexError):
        f(cache.clone(), k, torch.tensor([8]))
    with pytest.raises(IndexError):
        ember.compile(f)(cache, k, torch.tensor([8]))


def test_value_read_through_views():
    # the new cache is read transposed by a matmul: a view of the input, read after its write
    def f(cache, q, k, pos):
        cache.index_copy_(2, pos, k)
        return q @ cache.transpose(-1, -2)

    report = check_writes(f, torch.randn(2, 3, 40, 8, device=DEVICE), torch.randn(2, 3, 1, 8, device=DEVICE),
                          torch.randn(2, 3, 1, 8, device=DEVICE), torch.tensor([7], device=DEVICE))
    assert _stored_in_place(report) == 1 and _copies(report) == 0, _wrapper(report)


@pytest.mark.parametrize("fn", [
    lambda buf, x: (buf.add_(x), buf.clone()[1:])[1],     # a view of a clone of the written input
    lambda buf, x: (buf.add_(x), buf.clone().t())[1],
    lambda buf, x: (buf.add_(x), buf[1:])[1],             # a view of the input itself
])
def test_views_of_the_new_value_returned(fn):
    # the output shares the input's memory exactly where eager's does
    buf, x = torch.randn(6, 6, device=DEVICE), torch.randn(6, 6, device=DEVICE)
    check_writes(fn, buf, x)
    for run_fn in (fn, ember.compile(fn)):
        b = buf.clone()
        out = run_fn(b, x)
        shares = out.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        if run_fn is fn:
            eager_shares = shares
    assert shares == eager_shares


def _swap(a, b):
    t = a.clone()
    a.copy_(b)
    b.copy_(t)


def _copy_then_zero(a, b):
    a.copy_(b)
    b.zero_()


def _view_then_mul(a, b):
    a.copy_(b.t())
    b.mul_(2)


def _sum_then_swap_in(a, b):
    s = a.sum(0)
    a.copy_(b)
    b.add_(s)


def _scaled_copy_back(a, b):
    t = b * 1
    b.copy_(a)
    a.copy_(t)


@pytest.mark.parametrize("fn", [_swap, _copy_then_zero, _view_then_mul, _sum_then_swap_in, _scaled_copy_back])
def test_writes_of_old_values_happen_at_once(fn):
    # The graph writes every input at once: a value that is another written input's old memory
    # (itself, a view, a clone that ember's IR made the input) is read before that input is
    # written, by a kernel storing in place or by a copy at the end. Found by a helper's hunt:
    # a swap left both inputs equal.
    a = torch.arange(6.0, device=DEVICE).reshape(2, 3) if fn is not _view_then_mul else torch.zeros(3, 3, device=DEVICE)
    b = torch.arange(6.0, device=DEVICE).reshape(2, 3) * 10 + 1 if fn is not _view_then_mul else (
        torch.arange(9.0, device=DEVICE).reshape(3, 3))
    check_writes(fn, a, b)


def test_a_module_keeping_its_last_two_inputs():
    # prev <- cur's old value, cur <- x * 2: the kernel computing x * 2 must not store into cur
    # before prev has copied it
    class Delay(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("prev", torch.zeros(4, device=DEVICE))
            self.register_buffer("cur", torch.zeros(4, device=DEVICE))

        def forward(self, x):
            self.prev.copy_(self.cur)
            self.cur.copy_(x * 2)
            return x + 1

    eager = Delay()
    module = copy.deepcopy(eager)
    compiled = ember.compile(module)
    for step in range(4):
        x = torch.full((4,), float(step + 1), device=DEVICE)
        torch.testing.assert_close(compiled(x), eager(x))
        torch.testing.assert_close(module.prev, eager.prev)
        torch.testing.assert_close(module.cur, eager.cur)


@pytest.mark.parametrize("mode", [torch.enable_grad, torch.no_grad])
def test_an_inference_tensor_written_outside_inference_mode_raises_as_eager(mode):
    # a kernel storing into it would not check what ATen's in-place op does: the graph runs
    # eagerly, and eager's error follows; a normal tensor still gets the compiled program
    def f(x, y):
        x.add_(y)
        return x.sum()

    with torch.inference_mode():
        x = torch.zeros(4, device=DEVICE)
    compiled = ember.compile(f)
    with mode():
        with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
            f(x, torch.ones(4, device=DEVICE))
        with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
            compiled(x, torch.ones(4, device=DEVICE))
        normal = torch.zeros(4, device=DEVICE)
        compiled(normal, torch.ones(4, device=DEVICE))
    assert_same(normal, torch.ones(4, device=DEVICE))
