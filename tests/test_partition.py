"""The training partitioner (frontend/partition.py): a scalar loss's gradient computed in the
forward graph and scaled in a one-kernel backward, chosen by bytes against min-cut; gradients equal
to eager's either way."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember
from ember import ragged
from ember.config import config
from ember.driver import compile_graph
from ember.frontend import partition as partition_module
from ember.frontend.dynamo import make_backend
from ember.workloads.giou import make_batch, padded_giou_loss, ragged_giou_loss

from .helpers import assert_same


def _grads(fn, args, grad_output=None):
    """[loss, gradients of the inputs that require grad] of one step of fn on copies of args."""
    leaves = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    loss = fn(*leaves)
    loss.backward(grad_output)
    return [loss.detach()] + [a.grad for a in leaves if a.requires_grad]


def _chosen(fn, args, options=None) -> bool:
    """Whether compiling fn for a training step took the gradient-in-forward plan; checks the
    loss and gradients against eager on the way."""
    ember.reset_stats()
    assert_same(_grads(ember.compile(fn, options=options), args), _grads(fn, args))
    return ember.stats()["grads_in_forward"] == 1


def _giou_batch(batch=8, dtype=torch.float32):
    pred, _, padded = make_batch(batch, dtype)
    return pred.requires_grad_(), padded


@pytest.fixture
def always_in_forward(monkeypatch):
    """Take the gradient-in-forward plan wherever it applies, whatever the bytes (tests the
    plan's mechanics apart from the cost model)."""
    planned, build, cost = [], partition_module.gradient_in_forward, partition_module.plan_cost

    def build_and_remember(*args, **kwargs):
        modules = build(*args, **kwargs)
        planned.append(modules)
        return modules

    def free_if_planned(fw, bw, n):
        return partition_module.PlanCost(0, 0, 0, 0) if (fw, bw) in planned else cost(fw, bw, n)

    monkeypatch.setattr(partition_module, "gradient_in_forward", build_and_remember)
    monkeypatch.setattr(partition_module, "plan_cost", free_if_planned)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_padded_giou_gradient_in_forward(dtype):
    assert _chosen(padded_giou_loss, _giou_batch(dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_padded_giou_16_bit_within_eager_error(dtype):
    pred, padded = _giou_batch(16, dtype)
    reference = _grads(padded_giou_loss, [pred.double(), padded.double()])
    ember.reset_stats()
    mine = _grads(ember.compile(padded_giou_loss), [pred, padded])
    # (float16 gradients use min-cut: the gradient at u = 1 could leave float16's range)
    assert ember.stats()["grads_in_forward"] == (1 if dtype == torch.bfloat16 else 0)
    eager = _grads(padded_giou_loss, [pred, padded])
    for m, e, r in zip(mine, eager, reference):
        assert m.dtype == dtype
        mine_error = (m.double() - r).norm() / r.norm()
        eager_error = (e.double() - r).norm() / r.norm()
        assert mine_error <= max(eager_error, 4e-3), (mine_error, eager_error)


def test_graphs_forward_one_kernel_backward_reads_no_input():
    pred, padded = _giou_batch()
    graphs, sink = {}, []

    def record(gm, example_inputs, kind):
        graphs[kind] = gm
        return compile_graph(gm, example_inputs, kind, config, sink)

    compiled = torch.compile(padded_giou_loss, backend=make_backend(record, config))
    compiled(pred, padded).backward()
    reports = {r.kind: r for r in sink}
    placeholders = graphs["backward"].graph.find_nodes(op="placeholder")
    # the inputs are there only as version witnesses (eager's backward saves views of both, so
    # changing one in place before backward raises): nothing reads them
    witnesses = [p for p in placeholders if p.name.startswith("primals")]
    assert len(witnesses) == 2 and not any(p.users for p in witnesses), [p.name for p in placeholders]
    inputs = [p.meta["val"] for p in placeholders if p not in witnesses]
    # K as four (B, 256) columns of the loss's loop, one scalar (the mask count), the tangent
    assert sum(v.numel() for v in inputs) == pred.numel() + 2, [p.name for p in placeholders]
    assert len(reports["forward"].kernels) == 1 and not reports["forward"].fallbacks
    assert len(reports["backward"].kernels) == 1 and not reports["backward"].fallbacks


def test_cross_entropy_and_its_gradient_are_one_row_kernel_in_the_forward(always_in_forward):
    # A linear head's logits, cast to float32 for the loss (as a language model's training step
    # writes it): the forward computes the loss and the logits' gradient in one pass over each row.
    # The log-softmax had been counted as too costly to recompute (its statistics' exp and log
    # included) and stored whole, float32, for the loss's gather and the gradient to read back.
    torch.manual_seed(0)
    w = torch.randn(16, 1000, dtype=torch.bfloat16) * 0.2

    def loss(h, w, targets):
        return F.cross_entropy((h @ w).float(), targets, ignore_index=-1)

    h = torch.randn(128, 16, dtype=torch.bfloat16).requires_grad_()
    targets = torch.randint(0, 1000, (128,))
    targets[:3] = -1
    report = ember.Report()
    ember.reset_stats()
    mine = _grads(ember.compile(loss, report=report), [h, w.requires_grad_(), targets])
    assert ember.stats()["grads_in_forward"] == 1
    assert_same(mine, _grads(loss, [h, w, targets]), rtol=2e-2, atol=2e-3)
    (forward,) = [g for g in report.graphs if g.kind == "forward"]
    assert len(forward.kernels) == 1, [k.name for k in forward.kernels]
    assert "log_softmax" in forward.kernels[0].name and "nll_loss_backward" in forward.kernels[0].name


@pytest.mark.parametrize("loss", ["cross_entropy", "nll_loss", "nan_to_num"])
def test_a_batch_with_every_target_ignored_has_zero_gradients(loss):
    # The loss is 0 / 0 = NaN and eager's gradient 0: its backward masks the ignored rows after
    # dividing by the total weight. The gradient in the forward is scaled by that division
    # afterwards, and zeros times 1 / 0 had made every gradient NaN (one padding-only batch
    # poisons the weights).
    fn = {"cross_entropy": lambda x, t: F.cross_entropy(x, t),
          "nll_loss": lambda x, t: F.nll_loss(x.log_softmax(1), t),
          "nan_to_num": lambda x, t: torch.nan_to_num(F.cross_entropy(x, t))}[loss]
    x, targets = torch.randn(4, 5), torch.full((4,), -100)
    ember.reset_stats()
    compiled = ember.compile(fn)
    assert_same(_grads(compiled, [x.requires_grad_(), targets]), _grads(fn, [x, targets]))
    assert ember.stats()["grads_in_forward"] == 1
    targets[1:] = torch.tensor([0, 3, 4])  # (and a batch with real targets, the same program)
    assert_same(_grads(compiled, [x, targets]), _grads(fn, [x, targets]))


def test_class_weights_of_zero_keep_eagers_nan_gradient():
    # every target of the batch has a class of weight 0: the loss is 0 / 0 and eager's gradient
    # NaN (-0 / 0). In the forward's gradient those rows are zeros like ignored ones, and the
    # mask that keeps ignored rows at 0 made them 0: this plan is not taken with class weights
    fn = lambda x, t, w: F.cross_entropy(x, t, weight=w)  # noqa: E731
    x, w = torch.randn(8, 5), torch.tensor([0.0, 1, 1, 1, 1])
    targets = torch.zeros(8, dtype=torch.long)
    compiled = ember.compile(fn)
    expected = _grads(fn, [x.requires_grad_(), targets, w])
    assert torch.isnan(expected[1]).all()  # (expected: [loss, gradient of x])
    assert_same(_grads(compiled, [x, targets, w]), expected)
    targets[2:] = torch.tensor([1, 2, 3, 4, 0, 1])  # real weights: the same program, eager's values
    assert_same(_grads(compiled, [x, targets, w]), _grads(fn, [x, targets, w]))


@pytest.mark.parametrize("weights", ["made inside", "a module's buffer"])
def test_class_weights_of_zero_not_passed_in_keep_eagers_nan_gradient(weights):
    # the weights made in the function (torch.zeros(C): a full node) or held by a module
    # (a constant of the graph) are no input of it, and were not seen as weights
    targets = torch.tensor([0, 1, 2, 3, 4, 0])
    if weights == "made inside":
        fn = lambda x: F.nll_loss(F.log_softmax(x, 1), targets, weight=torch.zeros(5))  # noqa: E731
    else:
        fn = torch.nn.CrossEntropyLoss(weight=torch.zeros(5))
        fn = (lambda loss: lambda x: loss(x, targets))(fn)
    x = torch.randn(6, 5)
    expected = _grads(fn, [x.requires_grad_()])
    assert torch.isnan(expected[1]).all()
    assert_same(_grads(ember.compile(fn), [x]), expected)


class _ClipGrad(torch.autograd.Function):
    """Identity forward whose backward clips the incoming gradient: not linear in it."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g.clamp(-0.01, 0.01)


def _clipped_by_hook(x, w):
    h = x * w
    h.register_hook(lambda g: g.clamp(-0.01, 0.01))
    return h.square().sum() * 0.001


class _ConstantGrad(torch.autograd.Function):
    """A straight-through estimator with a constant gradient: a fill, no multiple of the incoming."""

    @staticmethod
    def forward(ctx, x):
        return x.sign()

    @staticmethod
    def backward(ctx, g):
        return torch.full_like(g, 0.1)


def _identity_with_backward(backward, doc: str) -> type[torch.autograd.Function]:
    """x -> x, whose backward is ``backward(g)``: a custom backward the partitioner must judge."""

    class Identity(torch.autograd.Function):
        __doc__ = doc

        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return backward(g)

    return Identity


_TruncatedGrad = _identity_with_backward(lambda g: g.to(torch.int32).to(g.dtype),
                                         "rounds the gradient through int32: a cast that is not linear")
_SummedInHalf = _identity_with_backward(lambda g: g.cumsum(1, dtype=torch.float16).float(),
                                        "sums the gradient with dtype=torch.float16: a narrowing op, no cast")
_BitsNegated = _identity_with_backward(lambda g: g.view(torch.int32).neg().view(torch.float32),
                                       "reads the gradient's bits as int32: a view of another dtype")


def _compressed_by_hook(x, w):
    # float16 gradient compression: at scale one the gradient overflows float16, scaled it fits
    h = x * 1.0
    h.register_hook(lambda g: g.half().float())
    return (h * w * 1e5).sum() * 1e-4


@pytest.mark.parametrize("fn", [lambda x, w: _ClipGrad.apply(x * w).square().sum() * 0.001, _clipped_by_hook,
                                lambda x, w: (_ConstantGrad.apply(x) * w).sum() * 0.25,
                                lambda x, w: (_TruncatedGrad.apply(x) * w * 6).sum() * 0.25, _compressed_by_hook,
                                lambda x, w: (_SummedInHalf.apply(x) * w * 1e4).sum() * 1e-3,
                                lambda x, w: (_BitsNegated.apply(x) * w).sum() * 0.25],
                         ids=["custom_backward", "hook", "constant_fill", "integer_cast", "float16_cast",
                              "float16_dtype_argument", "dtype_view"])
def test_a_gradient_not_linear_in_the_incoming_one_uses_min_cut(fn, always_in_forward):
    # grad(u) = u * grad(1) does not hold for a clipped gradient: the plan clipped the gradient
    # at u = 1 and scaled it by 0.001 after, 1000x too small
    x, w = torch.randn(8, 16), torch.randn(8, 16).abs() + 1
    ember.reset_stats()
    assert_same(_grads(ember.compile(fn), [x.requires_grad_(), w]), _grads(fn, [x, w]))
    assert ember.stats()["grads_in_forward"] == 0


@pytest.mark.parametrize("loss", ["mse", "huber", "smooth_l1"])
def test_a_mean_over_an_empty_mask_has_eagers_nan_gradients(loss, always_in_forward):
    # the scale is 1 / 0; eager's gradient is inf * 0 = NaN, where a mask for cross-entropy's
    # ignored rows (zeros stay zeros) had made it 0 for every loss, hiding the NaN. The Huber
    # losses' backward is a where between two multiples of the gradient, no mask: it had made
    # every gradient 0.
    elementwise = {"mse": lambda p, t: (p - t) ** 2, "huber": lambda p, t: F.huber_loss(p, t, reduction="none"),
                   "smooth_l1": lambda p, t: F.smooth_l1_loss(p, t, reduction="none")}[loss]

    def masked_mean(pred, target, mask):
        return (elementwise(pred, target) * mask).sum() / mask.sum()

    pred, target = torch.randn(4, 16) * 3, torch.randn(4, 16)
    ember.reset_stats()
    mine = _grads(ember.compile(masked_mean), [pred.requires_grad_(), target, torch.zeros(4, 16)])
    assert ember.stats()["grads_in_forward"] == 1
    assert mine[0].isnan() and mine[1].isnan().all()


@pytest.mark.parametrize("pick", [
    lambda x: x.cummax(1).values, lambda x: x.cummin(1).values, lambda x: x.topk(2, 1).values,
    lambda x: x.sort(1).values[:, :2], lambda x: torch.relu(x),
], ids=["cummax", "cummin", "topk", "sort_slice", "relu"])
def test_gradients_written_into_zeros_keep_the_zeros_under_an_inf_scale(pick, always_in_forward):
    # loss / 0: eager's gradient is inf where an element was picked and 0 elsewhere (its
    # backward writes the gradient into zeros: a scatter, a slice's backward); inf * 0 had made
    # the zeros NaN
    def loss(x, c):
        return pick(x).sum() / c

    x, c = torch.tensor([[1.0, 0.0, 2.0, -1.0], [0.5, 3.0, -2.0, 1.0]]), torch.tensor(0.0)
    assert_same(_grads(ember.compile(loss), [x.requires_grad_(), c]), _grads(loss, [x, c]))


def test_a_float16_mean_of_many_elements_has_eagers_gradient(always_in_forward):
    # the gradient at u = 1 folds a mean's 1 / 65536, which was 1 / inf = 0 in float16: every
    # gradient was 0
    def loss(x, w):
        return (x * w).mean()

    x, w = torch.randn(2, 1024, 64).half()
    assert not _chosen(loss, [x.requires_grad_(), w])  # (float16 gradients: min-cut)
    (grad,) = _grads(ember.compile(loss), [x, w])[1:]
    assert (grad != 0).float().mean() > 0.9


def test_mse_loss():
    x, y = torch.randn(64, 32, requires_grad=True), torch.randn(64, 32)
    assert _chosen(F.mse_loss, [x, y])


def test_several_and_mixed_requires_grad():
    # the scale w and the predictions need gradients, the targets between them do not
    def weighted(w, targets, pred):
        return padded_giou_loss(pred, targets) * w

    pred, padded = _giou_batch()
    assert _chosen(weighted, [torch.tensor(1.5, requires_grad=True), padded, pred])


def test_several_inputs_mechanics(always_in_forward):
    def loss(a, b, c):
        return (a.sigmoid() * b + (c * a).exp()).mean()

    a, b, c = torch.randn(32, 8, requires_grad=True), torch.randn(32, 8), torch.randn(8, requires_grad=True)
    assert _chosen(loss, [a, b, c])


@pytest.mark.parametrize("grad_output", [None, torch.tensor(-2.5)])
@pytest.mark.parametrize("path", ["aot_cache", "plain"])
def test_retain_graph_twice(grad_output, path):
    # "aot_cache": ember.compile's default path (backward compiled with the forward, through
    # torch's AOTAutograd cache); "plain": a report attached, the backward compiled lazily
    pred, padded = _giou_batch()
    ember.reset_stats()
    loss = ember.compile(padded_giou_loss, report=ember.Report() if path == "plain" else None)(pred, padded)
    loss.backward(grad_output, retain_graph=True)
    first = pred.grad.clone()
    loss.backward(grad_output)
    assert ember.stats()["grads_in_forward"] == 1
    expected = _grads(padded_giou_loss, [pred, padded], grad_output)[1]
    assert_same(first, expected)
    assert_same(pred.grad, 2 * expected)


def test_dynamic_sizes_one_compile():
    ember.reset_stats()
    fn = ember.compile(padded_giou_loss, dynamic=True)
    for batch in (8, 5, 11):
        pred, padded = _giou_batch(batch)
        assert_same(_grads(fn, [pred, padded]), _grads(padded_giou_loss, [pred, padded]))
    assert ember.stats()["graphs_compiled"] == 2  # one forward, one backward, all batch sizes
    assert ember.stats()["grads_in_forward"] == 1


def test_marked_dynamic_with_symbolic_scale(always_in_forward):
    # a sum divided by a symbolic count: the scale u = t / n reads a saved size
    def loss(x, y):
        return ((x - y).abs() * x.sigmoid()).sum() / x.shape[0]

    ember.reset_stats()
    fn = ember.compile(loss)
    for n in (6, 9, 13):
        x, y = torch.randn(n, 4), torch.randn(n, 4)
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(y, 0)
        x.requires_grad_()
        out = fn(x, y)
        out.backward()
        assert_same([out.detach(), x.grad], _grads(loss, [x, y]))
    assert ember.stats()["graphs_compiled"] == 2
    assert ember.stats()["grads_in_forward"] == 1


def test_non_scalar_output_uses_min_cut():
    x = torch.randn(16, 4, requires_grad=True)
    ember.reset_stats()
    assert_same(_nonscalar_grads(ember.compile(lambda a: a.sin() * a), x),
                _nonscalar_grads(lambda a: a.sin() * a, x))
    assert ember.stats()["grads_in_forward"] == 0


def _nonscalar_grads(fn, x):
    leaf = x.detach().clone().requires_grad_()
    out = fn(leaf)
    out.backward(torch.ones_like(out) * 0.5)
    return leaf.grad


def test_two_outputs_use_min_cut():
    def two(a):
        return (a.sin() * a).sum(), a.exp().mean()

    a = torch.randn(16, requires_grad=True)
    ember.reset_stats()
    leaf = a.detach().clone().requires_grad_()
    out = ember.compile(two)(leaf)
    (out[0] + 2 * out[1]).backward()
    ref = a.detach().clone().requires_grad_()
    expected = two(ref)
    (expected[0] + 2 * expected[1]).backward()
    assert_same(leaf.grad, ref.grad)
    assert ember.stats()["grads_in_forward"] == 0


def test_cost_model_rejects_dense_gradient_of_sparse_use():
    # the gradient is a scatter into zeros of a 64k-element input: min-cut writes it once, the
    # plan would write it, read it and write it again
    x, idx = torch.randn(4096, 16, requires_grad=True), torch.tensor([3, 100, 7])
    assert not _chosen(lambda a, i: a[i].square().sum(), [x, idx])


def test_cost_model_rejects_ragged_giou():
    # the ragged loss gathers a few real boxes of the padded predictions: its gradient is a
    # dense (B, 256, 4) scatter that min-cut's one backward kernel writes once
    pred, targets, _ = make_batch(16)
    ember.reset_stats()
    mine, ref = pred.clone().requires_grad_(), pred.clone().requires_grad_()
    ember.compile(ragged_giou_loss)(mine, ragged.from_list(targets)).backward()
    ragged_giou_loss(ref, ragged.from_list(targets)).backward()
    assert_same(mine.grad, ref.grad)
    assert ember.stats()["grads_in_forward"] == 0


def test_cost_model_rejects_copy_of_a_saved_input():
    # min-cut saves w itself (an input, free); K would be a copy of it
    x, w = torch.randn(256, requires_grad=True), torch.randn(256)
    assert not _chosen(lambda a, b: (a * b).sum(), [x, w])


def test_option_off():
    assert not _chosen(padded_giou_loss, _giou_batch(), options={"grad_in_forward": False})


def _after_inplace_change(fn, change, x, y):
    """What ``loss.backward()`` gives after ``change(x, y)`` modified an input in place between
    forward and backward: ("raised", error type) or ("grad", the gradient of x)."""
    x, y = x.detach().clone().requires_grad_(), y.clone()
    loss = fn(x, y)
    change(x, y)
    try:
        loss.backward()
    except RuntimeError as e:
        assert "modified by an inplace operation" in str(e)
        return ("raised", RuntimeError)
    return ("grad", x.grad)


def _change_y(x, y):
    y.add_(1)


def _change_x(x, y):
    with torch.no_grad():
        x.mul_(2)


@pytest.mark.parametrize("change", [_change_x, _change_y])
@pytest.mark.parametrize("loss", [F.mse_loss, lambda x, y: (x * x.sigmoid() * y).sum()], ids=["mse", "silu_mul"])
def test_inputs_changed_in_place_before_backward_raise_as_in_eager(loss, change):
    # the backward reads only the saved K_i, but the inputs eager's backward reads are saved
    # too, so autograd checks their versions
    x, y = torch.randn(64, 32), torch.randn(64, 32)
    ember.reset_stats()
    got = _after_inplace_change(ember.compile(loss), change, x, y)
    assert ember.stats()["grads_in_forward"] == 1
    assert got == _after_inplace_change(loss, change, x, y) == ("raised", RuntimeError)


@pytest.mark.parametrize("loss", [
    lambda x, y: (x * y.t().t()).sum() + ((x - 1) ** 2).sum(),
    lambda x, y: (x.log_softmax(1) * y[:, None, 0]).sum(),
], ids=["transposed_twice", "unsqueezed"])
def test_inputs_read_through_views_changed_in_place_raise_as_in_eager(loss, always_in_forward):
    # eager's backward saves a view of y, which shares y's version: the witness is y itself
    x, y = torch.randn(6, 6), torch.randn(6, 6)
    ember.reset_stats()
    got = _after_inplace_change(ember.compile(loss), _change_y, x, y)
    assert ember.stats()["grads_in_forward"] == 1
    assert got == _after_inplace_change(loss, _change_y, x, y) == ("raised", RuntimeError)


@pytest.mark.parametrize("saved", [True, False])
def test_outputs_eager_saves_changed_in_place_raise_as_in_eager(saved, always_in_forward):
    # exp's backward reads its result, which the caller also gets (as a detached alias): eager
    # raises when the caller changes it before backward. A returned value the backward does not
    # read (a product's result here) may change.
    def f(x, w):
        y = (x * w).exp() if saved else x * w
        return (y * w).sum(), y.detach()

    def run(fn):
        x, w = torch.randn(8, 4).requires_grad_(), torch.randn(8, 4)
        loss, y = fn(x, w)
        y.zero_()
        try:
            loss.backward()
        except RuntimeError:
            return "raised"
        return "grad"

    ember.reset_stats()
    got = run(ember.compile(f))
    assert ember.stats()["grads_in_forward"] == 1
    assert got == run(f) == ("raised" if saved else "grad")


@pytest.mark.parametrize("copy", [
    lambda w: w.clone(), lambda w: w * 1, lambda w: w / 1, lambda w: w - 0, lambda w: w.neg().neg(),
    lambda w: w.to(copy=True), lambda w: w.t().contiguous(),
], ids=["clone", "times_1", "over_1", "minus_0", "negated_twice", "to_copy", "contiguous"])
@pytest.mark.parametrize("in_forward", [False, True], ids=["min_cut", "grad_in_forward"])
def test_returned_copies_of_an_input_saved_for_backward_raise_as_in_eager(copy, in_forward, request):
    # y is a copy of w that the caller gets and mul saves: ember's IR makes y the input w, and
    # the forward saved w itself beside the user's copy, so autograd never saw y.add_(1)
    if in_forward:
        request.getfixturevalue("always_in_forward")
    options = {"grad_in_forward": in_forward}

    def f(x, w):
        y = copy(w)
        return ((x * y).sin() * x).sum(), y

    x0, w0 = torch.randn(4, 4), torch.randn(4, 4)

    def run(fn, change):
        x, w = x0.clone().requires_grad_(), w0.clone()
        loss, y = fn(x, w)
        if change:
            y.add_(1)
        try:
            loss.backward()
        except RuntimeError as e:
            assert "modified by an inplace operation" in str(e)
            return "raised"
        return x.grad, y, w

    ember.reset_stats()
    assert run(ember.compile(f, options=options), True) == run(f, True) == "raised"
    assert ember.stats()["grads_in_forward"] == int(in_forward)
    got, expected = run(ember.compile(f, options=options), False), run(f, False)
    assert_same(got[:2], expected[:2])
    assert got[1].data_ptr() != got[2].data_ptr()  # (the user's y is memory of its own)


def test_inputs_eager_does_not_save_may_change_in_place(always_in_forward):
    # sigmoid's backward reads its output, not x: eager keeps the gradient at the old values
    def loss(x, y):
        return (x.sigmoid() * 3).sum() + y.sum()

    x, y = torch.randn(64, 32), torch.randn(64, 32)
    ember.reset_stats()
    got = _after_inplace_change(ember.compile(loss), _change_x, x, y)
    assert ember.stats()["grads_in_forward"] == 1
    expected = _after_inplace_change(loss, _change_x, x, y)
    assert got[0] == expected[0] == "grad"
    assert_same(got[1], expected[1])


@pytest.mark.parametrize("launch", [None, {"RBLOCK": 64}, {"PERSISTENT": False, "RBLOCK": 16}])
def test_triton_forward_and_backward_one_kernel_each(launch):
    # Triton kernels run on CPU tensors under Triton's interpreter (conftest.py)
    report = ember.Report()
    fn = ember.compile(padded_giou_loss, options={"target": "triton", "triton_launch": launch}, report=report)
    ember.reset_stats()
    pred, padded = _giou_batch(2)  # (512 boxes: 32 RBLOCK-16 chunks under launch2)
    assert_same(_grads(fn, [pred, padded]), _grads(padded_giou_loss, [pred, padded]))
    assert ember.stats()["grads_in_forward"] == 1
    assert [(g.kind, len(g.kernels), g.fallbacks) for g in report.graphs] == [("forward", 1, []), ("backward", 1, [])]


def test_float16_gradients_use_min_cut():
    # the gradient at u = 1 in float16 overflowed where the scaled gradient is 9 (a loss scaled
    # by 1e-4), and went subnormal for small ones
    def loss(x, y):
        return (((x - y) * 300) ** 2).sum() * 1e-4

    x, y = torch.tensor([0.5, -0.5, 0.4, 0.1]).half(), torch.zeros(4).half()
    ember.reset_stats()
    assert_same(_grads(ember.compile(loss), [x.requires_grad_(), y]), _grads(loss, [x, y]))
    assert ember.stats()["grads_in_forward"] == 0


def test_smooth_l1_gradient_of_a_nan_is_nan():
    # the decomposition of its backward took sign(NaN) = 0
    def loss(a, b):
        return F.smooth_l1_loss(a, b, beta=0.5, reduction="sum")

    a, b = torch.tensor([float("nan"), 0.2, 3.0]), torch.zeros(3)
    assert_same(_grads(ember.compile(loss), [a.requires_grad_(), b]), _grads(loss, [a, b]))


@pytest.mark.parametrize("dtype, tiny", [(torch.float32, 1e-40), (torch.bfloat16, 1e-39), (torch.float64, 1e-310)])
def test_a_loss_scaled_by_a_number_keeps_a_gradient_beyond_range_at_scale_one(dtype, tiny):
    # a sum divided by its count in Python: the gradient at u = 1 was 1 / tiny, inf in the dtype,
    # where eager's (1 / 1000) / tiny is finite; the plan now scales by the tangent, the number
    # folded into the chain as eager's backward computes it
    def nll(p, w):
        return -(torch.log(p) * w).sum() / p.shape[0]

    p = torch.full((1000,), 0.5, dtype=dtype)
    p[0] = tiny
    expected = _grads(nll, [p.requires_grad_(), torch.ones(1000, dtype=dtype)])
    assert expected[1][0].isfinite()
    assert _chosen(nll, [p, torch.ones(1000, dtype=dtype)])
