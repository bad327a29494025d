"""Writes at indices: index_put (accumulating or not), index_add and scatter_add become one kernel
over the written values that stores, or atomically adds, each where its indices point; what
computes the values fuses into it, so the backward of a gather is one kernel."""

from __future__ import annotations

import pytest
import torch

import ember
from ember import ragged
from ember.ragged.segment import segment_mean, segment_sum
from ember.workloads.giou import make_batch, ragged_giou_loss

from .conftest import DEVICE
from .helpers import assert_same, check, kernel_count

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32]


def _values(shape, dtype):
    return torch.randn(shape).to(dtype) if dtype.is_floating_point else torch.randint(-9, 9, shape, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_accumulating_index_put_is_one_kernel_with_its_values(dtype):
    x = _values((5, 7), dtype)
    rows = torch.tensor([0, 2, 2, 4, -1, 2])     # duplicates add up; -1 counts from the end
    cols = torch.tensor([1, 3, 3, 6, 0, 3])
    v = _values((6,), dtype)

    def fn(x, rows, cols, v):
        return x.index_put((rows, cols), v * 3 + 1, accumulate=True)

    report = check(fn, x, rows, cols, v)
    assert report.fallbacks == []
    # 16-bit floats accumulate in a float32 buffer, rounded by a second kernel
    assert kernel_count(report) == (2 if dtype in (torch.bfloat16, torch.float16) else 1)
    # each thread adds into the destination lines it owns (codegen/cpp_scatter.py). (The tensors
    # are CPU tensors on a GPU machine too: the word "line" matched the GPU sources' "inline")
    source = report.kernels[0].source
    assert "% ember_team == ember_me" in source and "ember_atomic_add" not in source, source


@pytest.mark.parametrize("case", ["leading_slice", "broadcast_values", "trailing_dims", "empty_index", "scalar_value",
                                  "boolean_masks"])
def test_index_put_shapes_like_eager(case):
    x = torch.randn(4, 6, 3)
    if case == "leading_slice":     # x[:, i] += v
        fn = lambda x, i, v: torch.ops.aten.index_put(x, [None, i], v, True)  # noqa: E731
        args = (torch.tensor([5, 0, 5]), torch.randn(4, 3, 3))
    elif case == "broadcast_values":
        fn = lambda x, i, v: x.index_put((i,), v, accumulate=True)  # noqa: E731
        args = (torch.tensor([[1, 1], [3, 0]]), torch.randn(3))
    elif case == "trailing_dims":
        fn = lambda x, i, j, v: x.index_put((i, j), v.exp(), accumulate=True)  # noqa: E731
        args = (torch.tensor([0, 3, 3]), torch.tensor([2, 5, 5]), torch.randn(3, 3))
    elif case == "empty_index":
        fn = lambda x, i, v: x.index_put((i,), v, accumulate=True) * 2  # noqa: E731
        args = (torch.zeros(0, dtype=torch.int64), torch.randn(0, 6, 3))
    elif case == "boolean_masks":   # x[:, m] = v and x[x[..., 0] > 0] += v: a where (ran through ATen)
        fn = lambda x, m, v: (torch.ops.aten.index_put(x, [None, m], v),  # noqa: E731
                              x.index_put((x[..., 0] > 0,), v, accumulate=True))
        args = (torch.tensor([True, False, False, True, True, False]), torch.randn(3))
    else:
        fn = lambda x, i, v: x.index_put((i,), v, accumulate=True)  # noqa: E731
        args = (torch.tensor([2, 2, 0]), torch.tensor(1.5))
    report = check(fn, x, *args)
    assert report.fallbacks == []


def test_index_put_without_accumulate_stores_at_unique_indices():
    def fn(x, i, v):
        return x.index_put((i,), torch.sigmoid(v))

    report = check(fn, torch.randn(6, 2), torch.tensor([4, 0, -1]), torch.randn(3, 2))
    assert report.fallbacks == [] and kernel_count(report) == 1
    assert "ember_atomic_add" not in report.kernels[0].source


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("dim", [0, 1])
def test_index_add_matches_eager(dtype, dim):
    x = _values((4, 5), dtype)
    index = torch.tensor([3, 0, 3]) if dim == 0 else torch.tensor([4, 4, 1])
    source = _values((3, 5) if dim == 0 else (4, 3), dtype)
    report = check(lambda x, i, s: x.index_add(dim, i, s, alpha=2), x, index, source)
    assert report.fallbacks == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_scatter_add_and_scatter_reduce_sum(dtype):
    x = torch.randn(4, 6).to(dtype)
    index = torch.randint(0, 6, (3, 4))              # smaller than src and self: only part is added
    src = torch.randn(4, 5).to(dtype)
    report = check(lambda x, i, s: x.scatter_add(1, i, s * 2), x, index, src)
    assert report.fallbacks == [] and kernel_count(report) == (2 if dtype == torch.bfloat16 else 1)
    rows = torch.randint(0, 4, (3, 4))
    report = check(lambda x, i, s: x.scatter_reduce(0, i, s, "sum"), x, rows, src)
    assert report.fallbacks == []
    check(lambda x, i, s: x.scatter_reduce(0, i, s, "prod"), x, rows, src)  # through ATen


def _scatter_reduces(x, i, s):
    """Every generated reduce, with and without self, along both dims; float32, 16-bit floats
    (max and min in float32) and small ints (in int32)."""
    outs = []
    small = (x * 4).nan_to_num().to(torch.int8), (s * 4).nan_to_num().to(torch.int8)
    for (a, b), reduces in (((x, s), ("amax", "amin", "mean", "sum")), ((x.bfloat16(), s.bfloat16()), ("amax", "mean")),
                            (small, ("amax", "amin"))):  # (int8 sums are ATen's: no int8 atomics)
        outs += [a.scatter_reduce(dim, i, b, reduce, include_self=own)
                 for reduce in reduces for own in (True, False) for dim in (0, 1)]
    return outs


def test_scatter_reduce_amax_amin_mean_like_eager():
    # duplicates, NaNs (eager's max and min keep them), +0.0 and -0.0, elements written to or not
    x, src = torch.randn(5, 6), torch.randn(4, 7)
    x[0, 1], x[2] = float("nan"), -0.0
    src[0, 2], src[1, :3], src[2, :3] = float("nan"), 0.0, -0.0
    index = torch.tensor([[0, 4, 2, 2, 1], [2, 2, 0, 3, 1], [4, 0, 2, 2, 0]])
    report = check(_scatter_reduces, x, index, src)
    assert report.fallbacks == []
    assert any("ember_atomic_amax" in k.source for k in report.kernels)


def test_scatter_reduce_empty_and_bad_indices_like_eager():
    x, src = torch.randn(4, 3), torch.randn(2, 3)
    report = check(lambda x, i, s: (x.scatter_reduce(0, i, s, "amax", include_self=False),
                                    x.scatter_reduce(1, i, s, "mean")), x, torch.zeros(0, 3, dtype=torch.int64), src)
    assert report.fallbacks == []
    fast = ember.compile(lambda x, i, s: x.scatter_reduce(0, i, s, "amin", include_self=False))
    for bad in (4, -1):
        with pytest.raises(RuntimeError, match="out of bounds"):
            x.scatter_reduce(0, torch.tensor([[bad, 0, 0]]), src, "amin", include_self=False)
        with pytest.raises(RuntimeError, match="out of bounds"):
            fast(x, torch.tensor([[bad, 0, 0]]), src)


def _into_negative_zeros(s, offsets):
    idx, rows = torch.tensor([0, 2]), ragged.ops.row_ids(offsets, s.shape[0])
    z = torch.full((4,), -0.0)
    summed = torch.full((offsets.shape[0] - 1, 2), -0.0).index_add(0, rows, s.view(2, 1).expand(2, 2))
    return (z.index_put((idx,), s, accumulate=True), z.index_add(0, idx, s), z.scatter_add(0, idx, s),
            z.scatter_reduce(0, idx, s, "sum"), z.index_fill(0, idx, 1.0) + s.sum(), summed)


def test_writes_into_a_negative_zero_fill_keep_its_sign():
    # -0.0 == 0, but a buffer filled with -0.0 is no buffer of zeros (zero_() writes +0.0), and
    # -0.0 + a sum starting from +0.0 is +0.0: eager keeps -0.0 where nothing, or -0.0, is added
    offsets = torch.tensor([0, 2, 2])  # (the last index_add adds by ragged row ids; row 1 is empty)
    s = torch.tensor([-0.0, -0.0])
    out = ember.compile(_into_negative_zeros)(s, offsets)
    for o, r in zip(out, _into_negative_zeros(s, offsets), strict=True):
        assert torch.equal(o, r) and torch.equal(torch.signbit(o), torch.signbit(r)), (o, r)


def test_bad_indices_raise_like_eager():
    x = torch.zeros(4, 3)
    with pytest.raises(IndexError):
        ember.compile(lambda x, i: x.index_put((i,), torch.ones(3), accumulate=True))(x, torch.tensor([4]))
    with pytest.raises(RuntimeError, match="out of bounds"):  # index_add takes no negative index
        ember.compile(lambda x, i: x.index_add(0, i, torch.ones(1, 3)))(x, torch.tensor([-1]))
    # eager's index_add raises IndexError into a 1-d self or with an int32 index
    for dst, index, src in ((torch.zeros(4), torch.tensor([7]), torch.ones(1)),
                            (x, torch.tensor([-1], dtype=torch.int32), torch.ones(1, 3))):
        with pytest.raises(IndexError):
            dst.index_add(0, index, src)
        # (ember's kernel, or ATen's own where torch 2.11 traced the source under a symbol of
        # its own: ember then cannot prove its fit)
        with pytest.raises(IndexError, match="index out of range"):
            ember.compile(lambda x, i, s: x.index_add(0, i, s) * 2)(dst, index, src)
    with pytest.raises(RuntimeError, match="out of bounds"):
        ember.compile(lambda x, i: x.scatter_add(0, i, torch.ones(1, 1)))(x, torch.tensor([[7]]))


def test_put_and_takes_backward_are_generated_with_eagers_errors():
    # put (take's backward) ran through ATen: an index_put into self flattened, negative indices
    # counted from the end, duplicates added when accumulating
    fn = lambda x, i, s: (x.put(i, s, accumulate=True) * 2, torch.take(x, i).sin())  # noqa: E731
    x, index, src = torch.randn(4, 6, requires_grad=True), torch.tensor([[3, 3], [-1, 23]]), torch.randn(2, 2)
    report = ember.Report()
    compiled = ember.compile(fn, report=report)
    out, expect = compiled(x, index, src), fn(x, index, src)
    assert_same(out, expect)
    (grad,) = torch.autograd.grad(out[1].sum(), x)
    assert_same(grad, torch.autograd.grad(expect[1].sum(), x)[0])
    assert report.fallbacks == [] and not [g.error for g in report.graphs if g.error]
    with pytest.raises(IndexError, match="put|take"):
        compiled(x, torch.tensor([[1, -25], [0, 0]]), src)


def test_unsupported_writes_run_through_aten():
    report = check(lambda x, i: x.index_put((i,), torch.tensor(True), accumulate=True),
                   torch.zeros(4, dtype=torch.bool), torch.tensor([1, 1]))
    assert any("index_put" in f for f in report.fallbacks)
    torch.use_deterministic_algorithms(True)
    try:  # ATen's deterministic kernels, not atomics
        report = check(lambda x, i, v: x.index_put((i,), v, accumulate=True),
                       torch.zeros(4), torch.tensor([1, 1]), torch.ones(2))
    finally:
        torch.use_deterministic_algorithms(False)
    assert any("index_put" in f for f in report.fallbacks)


def test_scatter_into_a_0d_tensor_runs_only_that_op_through_aten():
    # scatter's lowering read the index's dim 0 before its check of a 0-d self: the IndexError
    # failed the whole graph (its other ops ran through ATen too, with a warning)
    x, index = torch.tensor(1.5), torch.tensor(0)
    for fn, args in ((lambda x, i: x.scatter(0, i, 3.0) * 2, (x, index)),
                     (lambda x, i, v: x.scatter(0, i, v).exp(), (x, index, torch.tensor(-2.0)))):
        report = check(fn, *args)
        assert report.fallbacks == ["aten.scatter"] and kernel_count(report) == 1


def _write_layer(cache, k, pos):  # a stacked per-layer KV cache
    cache[1][:, :, pos] = k


def _write_batch_slice(cache, k, pos):  # a static cache used by a smaller batch
    cache[:k.shape[0], :, pos] = k


def _index_copy_layer(cache, k, pos):
    cache[1].index_copy_(2, pos, k)


def _index_add_columns(x, k, pos):
    x[:, 1:].index_add_(0, pos, k)


@pytest.mark.parametrize("write, cache, k", [
    (_write_layer, (3, 2, 2, 8, 4), (2, 2, 1, 4)),
    (_write_batch_slice, (4, 2, 8, 4), (2, 2, 1, 4)),
    (_index_copy_layer, (3, 2, 2, 8, 4), (2, 2, 1, 4)),
    (_index_add_columns, (4, 3), (1, 2)),
], ids=["layer", "batch_slice", "index_copy", "index_add"])
def test_writes_at_indices_into_views_of_inputs_compile(write, cache, k):
    # the write copies the view into its buffer; the view had no variable when the program
    # planned its buffers' lifetimes (a KeyError: the whole graph ran through ATen)
    cache, k, pos = torch.zeros(cache), torch.randn(k), torch.tensor([3 if len(cache) > 2 else 2])
    expected = cache.clone()
    write(expected, k, pos)
    report = ember.Report()
    ember.compile(write, report=report)(cache, k, pos)
    assert not [g.error for g in report.graphs if g.error]
    assert kernel_count(report) >= 1
    assert_same(cache, expected)


def test_backward_of_an_in_place_write_into_a_clone_compiles():
    def f(x, i, v):
        y = x.clone()
        y[:, :, i] += v
        return y.sum()

    x, v, i = torch.randn(4, 5, 6), torch.randn(4, 5, 3), torch.tensor([1, 1, -1])
    ember.reset_stats()
    grads = []
    for fn in (f, ember.compile(f)):
        xs, vs = x.clone().requires_grad_(), v.clone().requires_grad_()
        fn(xs, i, vs).backward()
        grads.append((xs.grad, vs.grad))
    assert ember.stats()["graph_fallbacks"] == 0
    assert_same(grads[1], grads[0])


def test_dynamic_sizes_do_not_recompile():
    report = ember.Report()
    fn = ember.compile(lambda x, i, v: x.index_put((i,), v * 2, accumulate=True), report=report, dynamic=True)
    for n in (5, 9, 3, 40):
        x, i, v = torch.randn(7, 2), torch.randint(0, 7, (n,)), torch.randn(n, 2)
        assert_same(fn(x, i, v), x.index_put((i,), v * 2, accumulate=True))
    assert len(report.graphs) == 1


def test_gather_backward_is_one_kernel():
    """The gradient of x[i, j] is an index_put(accumulate=True) of the incoming gradient:
    computed and scattered by one kernel, after the buffer is zeroed."""
    def fn(x, i, j):
        return (x[i, j].sin() * 3).sum()

    x, i, j = torch.randn(5, 6), torch.tensor([0, 4, 4, 2]), torch.tensor([1, 5, 5, 0])
    report = ember.Report()
    mine, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    ember.compile(fn, report=report)(mine, i, j).backward()
    fn(ref, i, j).backward()
    torch.testing.assert_close(mine.grad, ref.grad)
    backward = [g for g in report.graphs if g.kind == "backward"]
    assert backward and len(backward[0].kernels) == 1 and report.fallbacks == []
    assert ".zero_()" in backward[0].wrapper


def test_ragged_giou_backward_is_one_kernel_storing_each_coordinate():
    """The ragged GIoU loss's gradient (a stack of 4 coordinate gradients written into the
    padded predictions at (row ids, positions)) is one kernel over the dense (B, N) places
    (passes/ragged.py): no zero fill, no atomics, the shared terms computed once per box and the
    4 coordinates stored with 4 stores, not a loop over coordinates recomputing everything. The
    loop over positions is split at each row's length (codegen/cpp_split.py): the 4 stores are
    in each of its two parts."""
    report = ember.Report()
    fast = ember.compile(ragged_giou_loss, report=report)
    for seed in (1, 2):
        pred, targets, _ = make_batch(24, seed=seed)
        targets = ragged.from_list(targets)
        mine, ref = pred.clone().requires_grad_(), pred.clone().requires_grad_()
        fast(mine, targets).backward()
        ragged_giou_loss(ref, targets).backward()
        torch.testing.assert_close(mine.grad, ref.grad, rtol=1e-5, atol=1e-7)
    (backward,) = [g for g in report.graphs if g.kind == "backward"]
    assert len(backward.kernels) == 1 and report.fallbacks == []
    source = backward.kernels[0].source
    stores = [line for line in source.splitlines() if line.strip().startswith("buf0[")]
    assert len(stores) == 8 and "ember_atomic_add(" not in source and "for (int64_t o2" not in source
    assert "const int64_t o1_split = " in source
    assert "zero_()" not in backward.wrapper


def test_stack_of_coordinates_stores_each_position():
    def fn(a, b):
        s, d = a + b, a * b
        return torch.stack([s - d, s + d, s * d, s / (d.abs() + 1)], -1)

    report = check(fn, torch.randn(9, 5), torch.randn(9, 5))
    assert kernel_count(report) == 1
    assert "? " not in report.kernels[0].source, "positions are known: no select chain"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_segment_sums_compile_to_kernels(dtype):
    r = ragged.from_list([torch.randn(n, 8).to(dtype) for n in (3, 0, 5, 1)])
    for fn in (segment_sum, segment_mean):
        report = check(fn, r, rtol=2e-2 if dtype == torch.bfloat16 else None,
                       atol=2e-2 if dtype == torch.bfloat16 else None)
        assert report.fallbacks == []


# ---- CPU indices of GPU tensors ------------------------------------------------------------------
# Eager moves x[idx]'s and index_put's indices to x's device; a graph that gets them on the CPU
# moves them at entry, like a 0-d CPU tensor used as a scalar. Lowered here from a graph over
# fake CUDA tensors (no GPU needed); tests/test_ops.py runs OpInfo's CPU-index samples on a GPU.

def _lowered(mode, inputs: dict[str, torch.Tensor], body):
    """An FX graph over ``inputs`` (fake tensors of ``mode``, or CPU tensors) built by
    ``body(graph, placeholders)``, its nodes' values computed under ``mode``, lowered to ember's IR."""
    from ember.frontend.lowering import lower_graph
    graph = torch.fx.Graph()
    nodes = {name: graph.placeholder(name) for name in inputs}
    with mode:
        for name, node in nodes.items():
            t = inputs[name]
            node.meta["val"] = t if isinstance(t, torch._subclasses.FakeTensor) else mode.from_tensor(t)
        graph.output(body(graph, nodes))
        for node in graph.nodes:
            if node.op == "call_function":
                args = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["val"])
                node.meta["val"] = node.target(*args[0], **args[1])
    return lower_graph(torch.fx.GraphModule(torch.nn.Module(), graph))


def test_cpu_indices_of_gpu_tensors_move_to_the_gpu():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ember.driver import _graph_device
    aten = torch.ops.aten
    mode = FakeTensorMode()
    with mode:  # tensors on a GPU this machine may not have
        x, v = torch.empty(8, 3, device="cuda"), torch.empty(2, 3, device="cuda")
    rows, cols = torch.tensor([1, 5]), torch.tensor([0, 4, 4, 7])

    def put_then_take(g, n):
        put = g.call_function(aten.index_put.default, (n["x"], [n["rows"]], n["v"]))
        return g.call_function(aten.index.Tensor, (put, [n["cols"]]))
    graph = _lowered(mode, {"x": x, "rows": rows, "v": v, "cols": cols}, put_then_take)
    moved = {n.arg.name.removesuffix("_in"): (n.device, n.arg.to_device) for n in graph.inputs}  # (input_name)
    assert moved == {"x": ("cuda:0", None), "rows": ("cuda:0", "cuda:0"), "v": ("cuda:0", None),
                     "cols": ("cuda:0", "cuda:0")}
    assert _graph_device(graph) == "cuda"

    # used as anything but indices (here: a value on the CPU too), a CPU tensor stays there, and
    # the graph spanning devices runs through ATen, as before
    def also_a_value(g, n):
        taken = g.call_function(aten.index.Tensor, (n["x"], [n["rows"]]))
        return taken, g.call_function(aten.mul.Tensor, (n["rows"], 2))
    graph = _lowered(mode, {"x": x, "rows": rows}, also_a_value)
    assert {n.arg.name.removesuffix("_in"): n.arg.to_device for n in graph.inputs} == {"x": None, "rows": None}
    with pytest.raises(NotImplementedError, match="graph spans devices"):
        _graph_device(graph)

    # strided indices would not keep their strides through .to(): they stay, and so does the rest
    def take(g, n):
        return g.call_function(aten.index.Tensor, (n["x"], [n["rows"]]))
    graph = _lowered(mode, {"x": x, "rows": torch.tensor([1, 0, 5, 0])[::2]}, take)
    assert [n.arg.to_device for n in graph.inputs] == [None, None]


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a GPU: EMBER_TEST_DEVICE=cuda")
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_cpu_indices_of_gpu_tensors_compile_on_the_gpu(backend):
    x, v = torch.randn(64, 16, device="cuda"), torch.randn(3, 16, device="cuda")
    rows = torch.tensor([1, 5, -2])  # on the CPU, as eager allows

    def fn(x, rows, v):
        return torch.index_put(x, (rows,), v * 2)[rows] + x[rows]

    check(fn, x, rows, v, options={"gpu_backend": backend})  # compiled, every kernel built, as eager


@pytest.mark.parametrize("bins", [1, 10, 1000, 100_003])
def test_elements_added_by_the_threads_owning_their_lines(bins):
    """A scatter of single elements on the CPU: each thread adds the elements whose destination's
    64-byte line it owns, in source order. With atomics the threads added in whatever order they
    came, and a float sum changed from call to call; now it is the serial sum in source order."""
    if DEVICE != "cpu":
        pytest.skip("CPU kernels")
    before = torch.get_num_threads()
    torch.set_num_threads(8)  # (more threads than cores: they come in varying order)
    try:
        gen = torch.Generator().manual_seed(bins)
        idx, src = torch.randint(-bins, bins, (200_000,), generator=gen), torch.randn(200_000, generator=gen)
        fns = [lambda x, i, v: x.index_put((i,), v, accumulate=True),
               lambda x, i, v: x.scatter_add(0, i % bins, v * 2), lambda x, i, v: x.index_add(0, i % bins, v)]
        serial = torch.zeros(bins)
        for i, v in zip((idx % bins).tolist(), src.tolist()):  # (float32 adds, one at a time)
            serial[i] += v
        for fn in fns:
            # (200k float32 adds into one bin: eager's order and the serial one differ by ~1e-5)
            report = check(fn, torch.zeros(bins), idx, src, rtol=1e-3, atol=0.05)
            assert "line (16 elements) it owns" in report.kernels[0].source
            compiled = ember.compile(fn)
            results = {compiled(torch.zeros(bins), idx, src).numpy().tobytes() for _ in range(10)}
            assert len(results) == 1
        assert torch.equal(ember.compile(fns[0])(torch.zeros(bins), idx, src), serial)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bfloat16])
@pytest.mark.parametrize("width", [1, 5, 64, 300])
def test_whole_rows_added_by_the_threads_owning_them(dtype, width):
    """An embedding's backward, index_add and index_put of rows: on the CPU each thread adds the
    rows it owns (codegen/cpp_scatter.py), no atomics; duplicates, a negative index (index_put's),
    an empty source."""
    if DEVICE != "cpu":
        pytest.skip("CPU kernels")
    idx = torch.tensor([3, 0, 3, 7, 9, 3, 5] * 40)
    src = _values((idx.numel(), width), dtype)
    scale = _values((idx.numel(), 1), dtype)
    # (eager adds with atomics, in no fixed order)
    atol = 1e-5 if dtype == torch.float32 else None

    def index_add(x, idx, src, scale):
        return x.index_add(0, idx, src * scale)

    def index_put(x, idx, src):
        return x.index_put((idx,), src, accumulate=True)

    def embedding_backward(src, idx):
        return torch.ops.aten.embedding_dense_backward(src, idx, 10, -1, False)

    report = check(index_add, _values((10, width), dtype), idx, src, scale, atol=atol)
    sources = [k.source for k in report.kernels]
    if width > 1:
        assert any("destination it owns" in s and "ember_atomic_add" not in s for s in sources), sources
    # (eager's 16-bit index_put rounds after each add, ember's sums in float32: few duplicates)
    few = 14 if dtype == torch.bfloat16 else None
    check(index_put, _values((10, width), dtype), idx[:few] - 5, src[:few], atol=atol)
    if dtype in (torch.float32, torch.float64):
        check(embedding_backward, src, idx, atol=atol)
    check(index_add, _values((10, width), dtype), idx[:0], src[:0], scale[:0])


def test_rows_owned_across_threads_match_eager():
    # enough rows that the kernel runs on every thread (the team splits the destination rows).
    # Whole numbers sum exactly in any order: eager's own float sums change with its thread count
    # (by 2e-5 between 1 and 2 threads here), so random floats would test the order, not the sums
    idx = torch.randint(0, 50, (4000,))
    src = torch.randint(-64, 64, (4000, 96)).float()
    report = check(lambda x, i, s: x.index_put((i,), s * 2, accumulate=True), torch.zeros(50, 96), idx, src,
                   atol=0, rtol=0)
    (source,) = [k.source for k in report.kernels]
    assert "#pragma omp parallel if(" in source and "ember_me" in source
