"""Fusion is proved by counting kernels in what ember generated (and checked against eager)."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.workloads.giou import make_batch, padded_giou_loss

from .conftest import DEVICE
from .helpers import assert_same, check, compile_checked, kernel_count, on_the_interpreter
from .test_cuda import compile_batches, needs_nvcc, sources


def test_relu_add_is_one_kernel():
    report = check(lambda x, y: torch.relu(x) + y + 1, torch.randn(256, 64), torch.randn(256, 64))
    assert kernel_count(report) == 1
    (k,) = report.kernels
    assert k.backend == "cpp"
    assert "aten.relu" in k.aten_ops and "aten.add" in k.aten_ops
    assert "relu" in k.name and "add" in k.name  # the name says what it fused
    assert report.fallbacks == []


def test_broadcast_and_cast_fuse():
    def fn(x, b):
        return (x.to(torch.float64) * 2 + b).to(torch.float32)

    report = check(fn, torch.randn(33, 7), torch.randn(7, dtype=torch.float64))
    assert kernel_count(report) == 1


def test_rmsnorm_is_one_kernel():
    def rmsnorm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    report = check(rmsnorm, torch.randn(64, 300), torch.randn(300))
    assert kernel_count(report) == 1
    assert "loop 2" in report.kernels[0].kernel_ir  # sum of squares, then the scaled store


def test_softmax_is_one_kernel():
    def manual(x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)

    for fn in (lambda x: torch.softmax(x, -1), manual):
        report = check(fn, torch.randn(32, 100))
        assert kernel_count(report) == 1


def test_layer_norm_and_its_statistics_share_a_kernel():
    def fn(x, w, b):
        return F.layer_norm(x, (x.shape[-1],), w, b)

    report = check(fn, torch.randn(17, 96), torch.randn(96), torch.randn(96))
    assert kernel_count(report) == 1


def test_padded_giou_loss_is_one_kernel():
    pred, _, padded = make_batch(32)
    report = check(padded_giou_loss, pred, padded)
    assert kernel_count(report) == 1  # both sums and the division in one kernel


def test_matmul_runs_in_aten_with_fused_epilogue():
    def fn(x, w, b):
        return F.gelu(x @ w + b)

    report = check(fn, torch.randn(16, 32), torch.randn(32, 24), torch.randn(24))
    assert report.fallbacks == ["aten.mm"]
    assert kernel_count(report) == 1  # bias + gelu after the matmul


def test_cross_entropy_gathers_inside_the_kernel():
    def ce(logits, target):
        return F.cross_entropy(logits, target)

    target = torch.randint(0, 50, (16,))
    target[3] = -100  # ignore_index
    report = check(ce, torch.randn(16, 50), target)
    assert report.fallbacks == []  # the gather of the target logit is generated, not an ATen call
    assert kernel_count(report) == 1  # row statistics, gather, and the mean over the rows
    loss = report.kernels[-1]
    assert "aten.nll_loss_forward" in loss.aten_ops  # named for what the user wrote
    assert "ember_check_index" in loss.source  # the target logit is read in the kernel, bounds-checked


def test_gather_index_out_of_range_raises_like_eager():
    import pytest

    import ember

    x, index = torch.randn(4, 5), torch.tensor([[1], [7], [0], [2]])
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.gather(x, 1, index)
    with pytest.raises(RuntimeError, match="out of bounds"):
        ember.compile(lambda a, i: torch.gather(a, 1, i) * 2)(x, index)


def test_cat_and_pad_fuse():
    report = check(lambda x, y: torch.cat([x.sin(), y * 2, x + 1], 1), torch.randn(5, 3), torch.randn(5, 4))
    assert report.fallbacks == [] and kernel_count(report) == 1
    report = check(lambda x: F.pad(x.exp(), (1, 2, 0, 3), value=-1.5), torch.randn(4, 6))
    assert report.fallbacks == [] and kernel_count(report) == 1


def test_reductions_over_different_rows_split_kernels():
    def fn(x):
        return x.sum(0), x.sum(1)

    report = check(fn, torch.randn(40, 30))
    assert kernel_count(report) == 2


@pytest.mark.parametrize("options", [None, {"row_chunks": 0}])
def test_reductions_crosswise_over_a_square_split_kernels(options):
    """A square matrix's reductions over rows and over columns have equal domains by chance; one
    kernel would read one of them crosswise, a strided load in every lane (schedule/fusion.py:
    crosswise). Each kernel's loads of x step along its own loop's dim."""
    def fn(x, w):
        return x.sum(0), x.sum(1), torch.softmax(x, 0) * w, (x * w).sum(0) + x.amax(1)

    x = torch.randn(48, 48)
    report = check(fn, x, torch.randn(48), options=options)
    for k in report.kernels:
        loads = set(re.findall(r"x\[(48\*\w+ \+ \w+)\]", k.source.replace("arg0_1", "x")))
        assert len({load.split(" + ")[1] for load in loads}) <= 1, k.source


def test_shared_expensive_value_is_computed_once():
    # e feeds two different reductions' kernels: it is stored once, by the first of them (which
    # also sums it), rather than recomputed; its parts are not stored
    def fn(x):
        e = torch.exp(torch.sin(x) * torch.cos(x) + torch.tanh(x))
        return e.sum(0), e.sum(1)

    report = check(fn, torch.randn(20, 30))
    assert kernel_count(report) == 2
    first, second = (k.kernel_ir for k in report.kernels)
    assert first.count("= store") == 2 and "exp" not in second


def _rotary(x):
    t, d = x.shape[1], x.shape[3]
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = torch.arange(t, dtype=torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


def test_a_rotary_embeddings_tables_are_computed_once_not_at_every_element():
    # cos and sin of (T, D/2) angles, read broadcast over (B, T, H, D): recomputed at each of
    # B H 2 = 16 times as many elements, they made the CPU kernel 24-46x slower than with tables
    # (bench/RESULTS.md). The tables get buffers, in one kernel with the angles and frequencies
    # under them (the frequencies' pow, amplified T times there, costs too little alone); a
    # cheap broadcast value, or one read at 4 times its size, stays inlined.
    report = check(_rotary, torch.randn(2, 16, 4, 32))
    assert kernel_count(report) == 2
    big = [k for k in report.kernels if "cat" in k.name]
    assert len(big) == 1 and not re.search(r"ember_(sin|cos|pow)", big[0].source), big[0].source
    tables = [k for k in report.kernels if "cos" in k.name and "sin" in k.name]
    assert len(tables) == 1 and tables[0].kernel_ir.count("= store") == 2
    kept = check(_rotary, torch.randn(2, 16, 4, 32), options={"max_broadcast_recompute": 10 ** 9})
    assert kernel_count(kept) == 1
    cheap = check(lambda x, b: x * (b * 2 + 1)[:, None], torch.randn(64, 64), torch.randn(64))
    assert kernel_count(cheap) == 1
    few = check(lambda x, b: x * b.exp().sin()[:, None], torch.randn(64, 4), torch.randn(64))  # 4x its size
    assert kernel_count(few) == 1
    one = check(lambda x, b: x * b.exp()[:, None], torch.randn(64, 64), torch.randn(64))  # one exp: cheap
    assert kernel_count(one) == 1


def _residual_stack(x, ws):
    for w in ws:  # a pre-norm block: x_k = x_{k-1} + relu(norm(x_{k-1}) @ w)
        x = x + torch.relu(F.layer_norm(x, (x.shape[-1],)) @ w)
    return x


def _reads(kernel_ir: str) -> int:
    """How many buffers a kernel reads: the arguments of its IR's header not marked ``out``."""
    args = kernel_ir.split("(", 1)[1].split(";", 1)[0].split(", ")
    return sum(1 for a in args if not a.startswith("out "))


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_residual_stream_is_stored_not_summed_again_by_every_norm(dynamic):
    # x_k feeds layer k's norm and the next sum. Recomputed in both, layer k's norm kernel read
    # the input and every block's output before it (k full-size buffers, until max_recompute_ops
    # counted the adds and relus as too many). A shared value whose recomputation reads more
    # than max_recompute_reads (3) such buffers is stored instead, by the kernel of the norm
    # that reads it: as many kernels, none reading more than four buffers (the sum of three
    # stored by the one that reads a fourth).
    x, ws = torch.randn(16, 32), torch.randn(6, 32, 32) / 6
    stored = check(_residual_stack, x, ws, dynamic=dynamic)
    summed = check(_residual_stack, x, ws, dynamic=dynamic, options={"max_recompute_reads": 100})
    assert kernel_count(stored) == kernel_count(summed)
    assert max(_reads(k.kernel_ir) for k in summed.kernels) == 6
    assert max(_reads(k.kernel_ir) for k in stored.kernels) == 4


def test_fusion_off_gives_a_kernel_per_op():
    report = check(lambda x, y: torch.relu(x) + y + 1, torch.randn(8, 8), torch.randn(8, 8),
                   options={"fusion": False})
    assert kernel_count(report) == 3


def test_transposed_inputs_are_read_in_place():
    x = torch.randn(30, 40)
    report = check(lambda a: a.t() * 2 + 1, x)
    assert kernel_count(report) == 1
    report = check(lambda a: a * 3, x.t())  # a non-contiguous input
    assert kernel_count(report) == 1


def test_kernels_never_need_each_other():
    # logsumexp's kernel stores w * exp(x - o) and reads w; w's kernel (with the sum over o * w)
    # reads o: grouping w with the sum and the store with logsumexp would need each other
    def fn(x):
        o = torch.logsumexp(x, -2)
        w = torch.linspace(-1, 2, 5, dtype=o.dtype)
        return (o * w).sum(), w * torch.exp(x - o)

    check(fn, torch.randn(5, 5, dtype=torch.float64))


def test_a_buffer_and_its_transpose_for_two_matmuls():
    # Attention's probabilities feed one batched matmul and, transposed, another (the backward's
    # dV = P^T @ dO). The transpose is replayed as an ATen view of the buffer. It had been a root
    # of the buffer's own kernel, reading it at another point: the plan never converged (10 x
    # the graph's nodes tries, 15 minutes for a 2-layer GPT's training graph), and the graph
    # ran through ATen.
    def fn(scores, v):
        p = scores.softmax(-1).reshape(6, 5, 5)
        return torch.bmm(p, v), torch.bmm(p.transpose(1, 2), v)

    report = check(fn, torch.randn(2, 3, 5, 5), torch.randn(6, 5, 4))
    assert report.fallbacks == ["aten.bmm", "aten.bmm"]
    assert kernel_count(report) == 1
    (graph,) = report.graphs
    assert ".permute((0, 2, 1))" in graph.wrapper


def test_heads_flattened_for_a_batched_matmul_are_copied_by_kernels():
    # Attention's q, k and v come from one projection; each is viewed as heads, permuted to
    # (B, H, T, D) and flattened to (B*H, T, D) for bmm. No view can do that: replayed in the
    # host program, ATen's reshape copied them (strided copies at 20-45% of the GPU's copy
    # bandwidth in a GPT). A kernel copies them now, q and v together; the backward's bmm reads
    # the same copies transposed instead of copying again.
    def fn(x, w):
        b, t, d = x.shape
        q, k, v = (x @ w).split(d, dim=-1)
        q, k, v = (z.view(b, t, 4, d // 4).transpose(1, 2) for z in (q, k, v))
        p = (q @ k.transpose(-2, -1)).softmax(-1)
        return (p @ v).transpose(1, 2).reshape(b, t, d)

    for dynamic in (False, True):
        report = check(fn, torch.randn(2, 5, 16), torch.randn(16, 48), dynamic=dynamic)
        (graph,) = report.graphs
        assert not re.search(r"\.permute\(\([^)]*\)\)\.reshape\(", graph.wrapper), graph.wrapper
        # q and v, k transposed, softmax, the heads joined again (with every size symbolic, v's
        # width (s21 - 2*s53)//4 is not provably q's s53//4: q and v copied apart)
        assert kernel_count(report) == (5 if dynamic else 4)
    x, w = torch.randn(2, 5, 16, requires_grad=True), torch.randn(16, 48, requires_grad=True)
    fast, report = compile_checked(fn)
    fast(x, w).square().sum().backward()
    got = x.grad, w.grad
    x.grad = w.grad = None
    fn(x, w).square().sum().backward()
    assert_same(got, (x.grad, w.grad), rtol=1e-4, atol=1e-3)  # gradients up to 562: float32 sums differ
    assert [g.kind for g in report.graphs] == ["forward", "backward"]
    assert all(not re.search(r"\.permute\(\([^)]*\)\)\.reshape\(", g.wrapper) for g in report.graphs)


def test_a_pointwise_value_that_cannot_join_a_column_sum_walks_its_own_shape():
    # gelu(x) has the shape of the column sum's input and is offered its domain (columns x rows,
    # to share its loads), but the sum reads a matmul of it: it may not join. Alone, it had kept
    # the sum's transposed loops, a reduction kernel without a reduction (a GPT's MLP in CUDA
    # C++: lanes on columns, 2-byte loads, 3.6x the time of a pointwise kernel).
    def fn(x, w):
        y = F.gelu(x) @ w
        return y, (y * x).sum(0)

    report = check(fn, torch.randn(64, 32), torch.randn(32, 32))
    (gelu,) = [k for k in report.kernels if "gelu" in k.name]
    assert "inner []  loops 0" in gelu.kernel_ir.splitlines()[1], gelu.kernel_ir


def test_positions_stored_for_an_embedding_are_recomputed_by_a_causal_mask():
    # torch.arange(T) feeds a position embedding (an ATen call: it gets a buffer) and, the same
    # iota after CSE, the causal mask of tril(ones(T, T)). The softmax kernel computes the
    # positions from its loop indices; it had loaded them, 8 bytes an element, more than the
    # scores themselves (and int64 groups of 2 made the CUDA C++ loops read the scores 2 at a time).
    def fn(scores, table):
        t = scores.shape[-1]
        positions = torch.arange(t)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        return scores.masked_fill(~causal, float("-inf")).softmax(-1), F.embedding(positions, table)

    for dynamic in (False, True):
        report = check(fn, torch.randn(2, 3, 9, 9), torch.randn(16, 4), dynamic=dynamic)
        (softmax,) = [k for k in report.kernels if "softmax" in k.name]
        assert not re.search(r"i64 = load", softmax.kernel_ir), softmax.kernel_ir
        assert "index r0" in softmax.kernel_ir


def test_softmax_regrouped_for_a_batched_matmul_is_one_kernel():
    # (B, H, T, T) probabilities reshaped to (B*H, T, T): a row kernel over the reshape's rows,
    # whose statistics read each row at its (b, h); one pass, not a statistics kernel and a
    # normalizing one. Symbolic sizes too.
    def fn(scores, v):
        b, h, t, _ = scores.shape
        return torch.bmm(scores.softmax(-1).reshape(b * h, t, t), v)

    report = check(fn, torch.randn(2, 3, 7, 7), torch.randn(6, 7, 4))
    assert kernel_count(report) == 1
    assert "loop 3" in report.kernels[0].kernel_ir  # max, sum, then the normalized store
    for t in (7, 9):
        report = check(fn, torch.randn(2, 3, t, t), torch.randn(6, t, 4), dynamic=True)
        assert kernel_count(report) == 1


@pytest.mark.parametrize("options", [None, pytest.param({"target": "triton"}, marks=on_the_interpreter)],
                         ids=["cpp", "triton"])
def test_a_total_added_to_a_tensor_of_another_shape_builds(options):
    # a mixture-of-experts router's aux loss added to its (T, D) output: the total of a column
    # sum, which the column sum's kernel finishes after its rows, was also asked to add it to
    # every element of (T, D) there, with no loops over them ("o1 was not declared")
    def f(a, p):
        m = p.sum(0)
        return a + m.sum(), m

    check(f, torch.randn(16, 8), torch.randn(16, 4), options=options)


_VIEWS_OF_CATS = {  # a gather at a point of a reshaped cat, pad or roll: its position is x // d or (x // d) % m
    "stacked_steps_cross_entropy": (lambda a, b, t: F.cross_entropy(torch.stack([a, b, a * 2], 1).reshape(-1, 4),
                                                                      t.reshape(-1)),
                                    lambda: (torch.randn(3, 4), torch.randn(3, 4), torch.randint(0, 4, (3, 3)))),
    "cat_gather": (lambda a, b, t: torch.cat([a, b], 1).view(-1, 4).gather(1, t[:, None]),
                   lambda: (torch.randn(3, 4), torch.randn(3, 4), torch.tensor([1, 3, 0, 2, 3, 1]))),
    "pad_index": (lambda a, t: F.pad(a, (2, 0)).view(-1, 3)[torch.arange(6), t],
                  lambda: (torch.randn(3, 4), torch.tensor([1, 2, 0, 2, 0, 1]))),
    "roll_gather": (lambda a, t: torch.roll(a, 1, 1).view(-1, 2).gather(1, t[:, None]),
                    lambda: (torch.randn(3, 4), torch.tensor([1, 0, 0, 1, 1, 0]))),
    "repeated_arange": (lambda o: torch.arange(6).repeat_interleave(2)[o] + 0, lambda: (torch.tensor([3, 0, 11, 5]),)),
}


@pytest.mark.parametrize("options", [None, pytest.param({"target": "triton"}, marks=on_the_interpreter)],
                         ids=["native", "triton"])
@pytest.mark.parametrize("case", list(_VIEWS_OF_CATS))
def test_gathers_from_reshaped_cats_and_pads_fuse(case, options):
    # the position a cat or pad is read at, under a reshape of a loaded index, is a floor
    # division (and a remainder) of it: "has no form ember computes", the graph ran through ATen
    fn, make = _VIEWS_OF_CATS[case]
    with warnings.catch_warnings():  # (the interpreter's numpy warns of log(0) in masked-off lanes)
        warnings.filterwarnings("error", message="ember could not compile", category=RuntimeWarning)
        for dynamic in (False, True):
            check(fn, *make(), dynamic=dynamic, options=options)


@needs_nvcc
def test_gathers_from_reshaped_cats_compile_as_cuda(tmp_path):
    kernels = []
    for case, (fn, make) in _VIEWS_OF_CATS.items():
        kernels += sources(ember.explain(fn, *make(), target="cuda"), case)
    compile_batches(kernels, tmp_path, per_file=len(kernels))


_FLIPPED_PADS = {  # a flip of a value a pad or cat computed: each position read at (size - 1 - i)
    "circular_pad": (lambda x: (lambda p: p * p.flip(-1))(F.pad(x, (2, 0), mode="circular")), (17, 1, 17)),
    "zero_pad_rows": (lambda x: F.pad(x, (1, 1, 2, 0)).flip(1, 2) + 1, (2, 5, 6)),
    "cat": (lambda x: torch.cat([x, -x], -1).flip(-1) * 2, (3, 7)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", list(_FLIPPED_PADS))
def test_a_flip_of_a_computed_value_reads_it_unchecked(case, dtype):
    # a flip's position b - i is never out of range: checked as a gather's index, it cost a bound
    # check an element, and NVVM spun for over ten minutes on the CUDA kernel of a circular pad's
    # flip (GPU fuzz seed 927498836294: the check's clamp, then a branch on its result)
    fn, shape = _FLIPPED_PADS[case]
    x = torch.randn(shape, dtype=dtype, device=DEVICE)
    for dynamic in (False, True):
        check(fn, x, dynamic=dynamic)
    for target in ("cpp", "cuda"):
        report = ember.explain(fn, x.cpu(), target=target)
        assert not [k.name for k in report.kernels if re.search(r"ember_(check|assert)_index", k.source)]


def _empty_slice_of_a_shared_loss(x, y):
    loss = F.kl_div(F.log_softmax(x.sum(), -1), F.softmax(y, -1), reduction="batchmean").unsqueeze(0)
    return loss.narrow(0, 1, 0), -loss


def test_a_view_replayed_from_a_shared_value_keeps_its_buffer():
    # the loss was buffered for sharing (several kernels read it), an empty slice of it returned
    # was then replayed from that buffer, and the buffer released (its readers ended up in its
    # own kernel): the host program looked for it, KeyError, and the graph ran through ATen
    # (CPU fuzz seed 625457012128)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="ember could not compile", category=RuntimeWarning)
        for dynamic in (False, True):
            check(_empty_slice_of_a_shared_loss, torch.randn(5, 4), torch.randn(()), dynamic=dynamic)
