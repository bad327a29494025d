"""Bad input raises what eager raises, naming the op and what was wrong."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
import torch.nn.functional as F

import ember

from .helpers import assert_same, check, compile_checked, run


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


def test_compiled_modules_raise_eagers_error_too():
    # ember.compile(module) stays a module; its errors are the op's own, as a function's are
    bn, ln = torch.nn.BatchNorm1d(4), torch.nn.LayerNorm(8)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        bn(torch.randn(1, 4))
    with pytest.raises(ValueError, match="more than 1 value per channel") as info:
        ember.compile(bn)(torch.randn(1, 4))
    assert type(info.value) is ValueError
    assert _eager_error(ln, torch.randn(3, 5)) is RuntimeError
    with pytest.raises(RuntimeError) as info:
        ember.compile(ln)(torch.randn(3, 5))
    assert type(info.value) is RuntimeError
    compiled = ember.compile(bn)
    assert isinstance(compiled, torch.nn.Module)
    assert [id(p) for p in compiled.parameters()] == [id(p) for p in bn.parameters()]


def test_dtype_error_matches_eager():
    fn = lambda a, b: torch.bitwise_and(a, b)  # noqa: E731
    a, b = torch.randn(4), torch.randn(4)
    eager = _eager_error(fn, a, b)
    with pytest.raises(eager, match="bitwise_and"):
        ember.compile(fn)(a, b)


@pytest.mark.parametrize("case", ["var of ints", "std of ints", "argmax of bools", "argmin of bools",
                                  "abs of bools"])
def test_dtypes_eager_rejects_raise_its_error(case):
    fn, x = {"var of ints": (lambda x: x.var(), torch.arange(5)),
             "std of ints": (lambda x: x.std(0), torch.arange(10).reshape(2, 5)),
             "argmax of bools": (lambda x: x.argmax(), torch.tensor([True, False])),
             "argmin of bools": (lambda x: x.argmin(0), torch.tensor([True, False])),
             "abs of bools": (lambda x: x.abs(), torch.tensor([True, False]))}[case]
    eager = _eager_error(fn, x)
    with pytest.raises(eager):
        ember.compile(fn)(x)


_U8 = torch.tensor([0, 1, 255, 128], dtype=torch.uint8)
_I8 = torch.tensor([-3, 4, 100, -128], dtype=torch.int8)
_MASK = torch.tensor([True, False, True, False])


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_scalars_that_overflow_their_dtype_raise_as_in_eager(dynamic):
    """clamp's bounds, fill values and add's alpha are converted with an overflow check in eager;
    ember wrapped them (uint8 clamp(-5, 300) gave 44 everywhere). Arithmetic with a Python int
    wraps in eager too, and still compiles."""
    raising = [(lambda x: x.clamp(-5, 300), _U8), (lambda x: x.clamp(min=-200), _I8),
               (lambda x: x.masked_fill(_MASK, 300), _I8), (lambda x: torch.where(_MASK, x, 300), _U8),
               (lambda x: torch.full_like(x, 300), _U8), (lambda x: x.clone().fill_(300), _U8),
               (lambda x: torch.nn.functional.threshold(x, 50, 300), _I8),
               (lambda x: torch.add(x, x, alpha=300), _I8),
               (lambda x: x.clamp(max=1e5), _U8.to(torch.float16)),
               # float16 fills of masked_fill / index_fill: torch's decompositions gave inf
               (lambda x: x.masked_fill(_MASK, 1e5), _U8.to(torch.float16)),
               (lambda x: x.index_fill(0, torch.tensor([0]), -7e4), _U8.to(torch.float16)),
               (lambda x: x.index_fill(0, torch.tensor([1]), 128), _I8)]
    for fn, x in raising:
        assert _eager_error(fn, x) is RuntimeError
        with pytest.raises(RuntimeError, match="without overflow"):
            ember.compile(fn, dynamic=dynamic)(x)
    wrapping = lambda x: [x + 256, x | -1, x.clamp(-5, 200), x.clamp(max=255.0)]  # noqa: E731
    out, report = run(wrapping, _U8, dynamic=dynamic)
    assert not report.fallbacks and not [g.error for g in report.graphs if g.error]
    assert_same(out, wrapping(_U8))


def test_integer_division_by_zero_raises_inside_a_where():
    """A where's untaken branch is skipped in ember's kernels (conditional execution), but eager
    evaluates both: an integer division by zero there raises."""
    for fn in (lambda x, y: torch.where(y != 0, x // y, 0), lambda x, y: torch.where(y != 0, x % y, x)):
        x, y = torch.arange(4), torch.tensor([1, 0, 2, 0])
        assert _eager_error(fn, x, y) is RuntimeError
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            ember.compile(fn)(x, y)


def test_an_integer_division_of_constants_by_zero_raises_when_it_runs():
    # constant folding evaluated 7 // 0 while compiling: its ZeroDivisionError failed the compile
    # and the whole graph ran through ATen, with a warning
    fn = lambda x: x + torch.full((), 7) // torch.full((), 0) + torch.full((), 7) % torch.full((), 2)  # noqa: E731
    x = torch.ones(3, dtype=torch.int64)
    assert _eager_error(fn, x) is RuntimeError
    compiled, report = compile_checked(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            compiled(x)
    assert report.kernels and not [g.error for g in report.graphs if g.error]


def test_a_view_of_incompatible_strides_raises_runtime_error():
    """x.view(n, -1) of a channels_last tensor: torch's reference raises ValueError while
    tracing, eager's view RuntimeError."""
    fn = lambda x: x.view(2, -1) * 1  # noqa: E731
    x = torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last)
    assert _eager_error(fn, x) is RuntimeError
    with pytest.raises(RuntimeError, match="view"):
        ember.compile(fn)(x)
    with pytest.raises(ValueError):  # a Python-level check raises ValueError in eager too
        ember.compile(lambda x: torch.nn.functional.interpolate(x, mode="nope"))(x)


def test_index_error_matches_eager():
    fn = lambda a: a.select(0, 10)  # noqa: E731
    a = torch.randn(4, 3)
    eager = _eager_error(fn, a)
    with pytest.raises(eager, match="select"):
        ember.compile(fn)(a)


@pytest.mark.parametrize("bad", [7, -1])
def test_scatter_index_out_of_range_raises_as_in_eager(bad):
    # scatter of a few entries per row is a select per element; a bad index matched no
    # position and wrote nothing, where eager raises
    x, src = torch.zeros(2, 4), torch.ones(2, 1)
    index = torch.tensor([[1], [bad]])
    for fn in (lambda x, i, s: x.scatter(1, i, s), lambda x, i, s: x.scatter(1, i, 5.0) * 2):
        assert _eager_error(fn, x, index, src) is RuntimeError
        with pytest.raises(RuntimeError, match="scatter: index out of bounds"):
            ember.compile(fn)(x, index, src)
    good = torch.tensor([[1], [3]])
    out, report = run(lambda x, i, s: x.scatter(1, i, s) * 2, x, good, src)
    assert_same(out, x.scatter(1, good, src) * 2)
    assert report.fallbacks == []


@pytest.mark.parametrize("fn, unused", [
    (lambda x, i: x[i][:1] * 2, 3), (lambda x, i: (x[i] + 1)[1:].sum(), 0), (lambda x, i: x[i].t()[:, :1], 3),
    (lambda x, i: torch.gather(x, 1, i[:, None].expand(4, 3))[:, :1] + 1, 2),
    (lambda x, i: x[i][torch.tensor([0, 0])], 3), (lambda x, i: x[i].sum(1)[:2] * 2, 2),
], ids=["sliced", "sliced_after_add", "sliced_after_permute", "gather_sliced", "indexed_again", "sum_sliced"])
def test_an_index_used_only_in_part_is_checked_whole(fn, unused):
    # the kernel reading x[i][:1] inlined the gather at the first index only: an index out of
    # range elsewhere went unchecked (garbage, or a read out of bounds), where eager raises
    x, bad = torch.randn(5, 3), torch.tensor([0, 1, 2, 3])
    bad[unused] = 7  # an index whose row the result never shows
    kind = _eager_error(fn, x, bad)
    with pytest.raises(kind, match="index out of bounds"):
        ember.compile(fn)(x, bad)
    good = torch.tensor([2, 0, 1, 2])
    out, report = run(fn, x, good)
    assert_same(out, fn(x, good))
    assert report.fallbacks == []


def test_slices_past_the_indexed_dims_leave_the_gather_inlined():
    # a box's coordinates sliced from x[rows, pos] read every index element: no buffer for it
    fn = lambda x, r, p: (x[r, p][:, 0] - x[r, p][:, 2]).abs()  # noqa: E731
    x, r, p = torch.randn(3, 5, 4), torch.tensor([0, 2, 2, 1]), torch.tensor([4, 0, 1, 3])
    out, report = run(fn, x, r, p)
    assert_same(out, fn(x, r, p))
    assert len(report.kernels) == 1


@pytest.mark.parametrize("write", [
    lambda x, i, v: x.index_put((i,), v), lambda x, i, v: x.index_put((i,), v.long(), accumulate=True),
    lambda x, i, v: x.index_add(0, i, v), lambda x, i, v: x.index_copy(0, i, v),
    lambda x, i, v: x.scatter_add(0, i[:, None].expand(2, 3), v), lambda x, i, v: x.scatter(0, i[:, None], v[:, :1]),
], ids=["index_put", "index_put_accumulate", "index_add", "index_copy", "scatter_add", "scatter"])
def test_writes_of_a_source_of_another_dtype_raise_as_in_eager(write):
    x, i, v = torch.zeros(4, 3), torch.tensor([0, 2]), torch.ones(2, 3, dtype=torch.float64)
    assert _eager_error(write, x, i, v) is RuntimeError
    with pytest.raises(RuntimeError, match="dtype|scalar type"):
        ember.compile(write)(x, i, v)


@pytest.mark.parametrize("fn", [
    lambda x: x.index_add(0, torch.tensor([0, 2, 2, 4]), torch.ones(4, 1)),
    lambda x: x.index_add(1, torch.tensor([0, 2]), torch.ones(1, 2)),
    lambda x: x.index_add(0, torch.tensor([0.5, 2.9]), torch.ones(2, 3)),
    lambda x: x.index_select(0, torch.tensor([0.7, 2.0])),
    lambda x: x.index_select(0, torch.tensor([0, 2], dtype=torch.int16)),
    lambda x: x.index_put((torch.tensor([0, 2], dtype=torch.int16),), torch.ones(2, 3), accumulate=True),
    lambda x: x.index_fill(0, torch.tensor([0.0, 2.0]), 1.0),
    lambda x: x.index_fill(0, torch.tensor([0, 2], dtype=torch.int32), 1.0),
    lambda x: x.scatter_add(0, torch.tensor([[0, 1, 2]], dtype=torch.int16), torch.ones(1, 3)),
    # eager's IndexError, where torch's meta functions check with a RuntimeError
    lambda x: x.index_add(1, torch.tensor([0, 5]), torch.ones(5, 2), alpha=2.0),
    lambda x: x[torch.tensor([0.0, 1.0])],
    lambda x: x[torch.tensor([0, 1], dtype=torch.int16)],
    lambda x: x[torch.tensor([0, 1, 2]), torch.tensor([0, 1])],
    lambda x: x.index_copy(0, torch.tensor([0, 1, 2]), torch.ones(2, 3)),
    lambda x: F.embedding(torch.tensor([0]), x, padding_idx=7),  # (F.embedding's own assert)
    # index_copy's and index_add's checks of ranks: eager's IndexError (index_fill's RuntimeError)
    lambda x: x.index_copy(0, torch.tensor([[1]]), torch.ones(1, 3)),
    lambda x: x.index_copy(0, torch.tensor(1), torch.ones(3)),
    lambda x: x.index_copy(0, torch.tensor([1, 2]), torch.tensor(1.0)),
    lambda x: x.index_add(0, torch.tensor([[1]]), torch.ones(1, 3)),
    lambda x: x.index_fill(0, torch.tensor([[1]]), 1.0),
], ids=["index_add_broadcast_rows", "index_add_broadcast_columns", "index_add_float_index",
        "index_select_float_index", "index_select_int16_index", "index_put_int16_index", "index_fill_float_index",
        "index_fill_int32_index", "scatter_add_int16_index", "index_add_alpha_out_of_range", "getitem_float_index",
        "getitem_int16_index", "getitem_indices_not_broadcasting", "index_copy_lengths", "embedding_padding_idx",
        "index_copy_2d_index", "index_copy_source_rank", "index_copy_scalar_at_two", "index_add_2d_index",
        "index_fill_2d_index"])
def test_writes_and_reads_at_indices_eager_refuses_raise_its_error(fn):
    # these computed values (a broadcast source, indices truncated from floats or read from
    # int16) or raised another exception type than eager
    x = torch.zeros(5, 3)
    expected = _eager_error(fn, x)
    assert expected is not None
    with pytest.raises(expected):
        ember.compile(fn)(x)


def test_scatter_reads_only_the_part_of_a_larger_source_the_index_covers():
    # src larger than the index on the other dims: an IR error sent the graph through ATen
    index = torch.tensor([[0, 1], [1, 3], [4, 4], [2, 1]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        check(lambda x, s: x.scatter(1, index, s), torch.zeros(4, 5), torch.arange(42.0).view(6, 7))
        check(lambda x, s: x.scatter(0, index[:1].repeat(1, 3)[:, :5] % 4, s), torch.zeros(4, 5),
              torch.arange(42.0).view(6, 7))


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


@pytest.mark.parametrize("fn, args, match", [
    # torch 2.13's Python decomposition of one_hot drops eager's checks: int32 expert ids, or an
    # empty tensor with no classes, gave a one-hot where eager raises
    (lambda t: F.one_hot(t, 4) * 2, (torch.tensor([0, 3, 1], dtype=torch.int32),), "^one_hot: .*LongTensor"),
    pytest.param(lambda t: F.one_hot(t, 0), (torch.zeros(0, dtype=torch.int64),), "^one_hot: Can not infer",
                 marks=pytest.mark.skipif(torch.__version__ < "2.13", reason="torch 2.11 traces one_hot another "
                                          "way, without eager's check (aot_eager gives a (0, 0) tensor too)")),
    # histc's meta function refuses integers with a RuntimeError; eager's dispatch, NotImplementedError
    (lambda t: torch.histc(t, bins=4, min=0, max=3), (torch.tensor([0, 3, 1]),), "^histc: .*not implemented for"),
], ids=["one_hot_int32", "one_hot_empty_no_classes", "histc_of_integers"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_routing_ops_refuse_what_eager_refuses(fn, args, match, dynamic):
    eager = _eager_error(fn, *args)
    with pytest.raises(eager, match=match) as info:
        ember.compile(fn, dynamic=dynamic)(*args)
    assert type(info.value) is eager
    good = torch.tensor([0, 3, 1, 2])
    assert torch.equal(ember.compile(lambda t: F.one_hot(t, 4) * 2, dynamic=dynamic)(good), F.one_hot(good, 4) * 2)


def test_checks_in_torchs_decompositions_raise_eagers_runtime_error():
    """A class weight of the wrong length fails an assert in torch's Python decomposition of the
    loss; eager's own check raises RuntimeError, and so does ember (it raised AssertionError)."""
    import torch.nn.functional as F
    fn = lambda x, t, w: F.cross_entropy(x, t, weight=w)  # noqa: E731
    args = torch.randn(8, 5), torch.randint(0, 5, (8,)), torch.rand(4)
    assert _eager_error(fn, *args) is RuntimeError
    with pytest.raises(RuntimeError):
        ember.compile(fn)(*args)


@pytest.mark.skipif(tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 13),
                    reason="torch 2.11's fake tensors raise the IndexError otherwise (still IndexError there)")
def test_cat_of_zero_dimensional_tensors_raises_eagers_runtime_error():
    # prims.cat's meta function indexed the 0-d shape: an IndexError came through Dynamo
    fn = lambda a, b: torch.cat([a, b * 2])  # noqa: E731
    args = torch.tensor(1.0), torch.tensor(2.0)
    assert _eager_error(fn, *args) is RuntimeError
    with pytest.raises(RuntimeError, match="zero-dimensional"):
        ember.compile(fn)(*args)


def test_unknown_option_is_a_clear_type_error():
    with pytest.raises(TypeError, match="unknown ember option"):
        ember.compile(lambda x: x, options={"fuse_everything": True})
    # options of the wrong type are named ("debug": "1" failed at the first compile, with
    # "'<' not supported between instances of 'str' and 'int'")
    with pytest.raises(TypeError, match="'debug' takes an int"):
        ember.compile(lambda x: x, options={"debug": "1"})
    with pytest.raises(TypeError, match="'fusion' is a switch"):
        ember.compile(lambda x: x, options={"fusion": "off"})
    assert ember.config.replace(fusion=0).fusion is False  # (0 and 1 are switches too)


def test_threads_get_their_own_errors():
    # kernels release the GIL; one error flag per program gave one thread's bad index to
    # another thread's call, and left the first with garbage and no error
    import threading

    fn = ember.compile(lambda x, i: torch.gather(x, 1, i) * 2 + 1)
    x = torch.randn(64, 4096)
    good, bad = torch.randint(0, 4096, (64, 4096)), torch.full((64, 4096), 5000)
    fn(x, good)
    outcomes = {"bad": [], "good": []}

    def calls(name, index):
        for _ in range(60):
            try:
                out = fn(x, index)
                outcomes[name].append("ok" if torch.equal(out, torch.gather(x, 1, good) * 2 + 1) else "wrong")
            except RuntimeError:
                outcomes[name].append("raised")

    threads = [threading.Thread(target=calls, args=("bad", bad)), threading.Thread(target=calls, args=("good", good))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(outcomes["bad"]) == {"raised"} and set(outcomes["good"]) == {"ok"}, outcomes


@pytest.mark.parametrize("fn", [lambda e: e.amax(0), lambda e: e.argmax(), lambda e: torch.aminmax(e, dim=0),
                                lambda e: e.amin(), lambda e: e.amax(()), lambda e: torch.aminmax(e),
                                lambda e: e.kthvalue(1, 0)],
                         ids=["amax", "argmax", "aminmax", "amin_all", "amax_no_dims", "aminmax_all", "kthvalue"])
def test_reductions_over_an_empty_dim_raise_eagers_error(fn):
    # torch's references refuse them with a RuntimeError while tracing; eager's is an IndexError
    # for a dim named (or argmax()), a RuntimeError for a reduction over every dim (kthvalue's
    # meta function checks only k against the dim's size: its RuntimeError)
    e = torch.randn(0, 5)
    expected = _eager_error(fn, e)
    with pytest.raises(expected) as info:
        ember.compile(fn)(e)
    assert type(info.value) is expected


@pytest.mark.parametrize("fn, x", [(lambda x: x.softmax(2), torch.randn(2, 3)),
                                   (lambda x: F.softmax(x, -3), torch.randn(2, 3)),
                                   (lambda x: x.softmax(1), torch.tensor(1.5))], ids=["2d", "2d_negative", "0d"])
def test_softmax_over_a_dim_out_of_range_raises_eagers_error(fn, x):
    # the decomposition's amax raised while tracing: the whole graph ran eagerly, with a warning
    expected = _eager_error(fn, x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(expected):
            ember.compile(fn)(x)
    assert not [w for w in caught if "ember" in str(w.message)]


def test_ops_eager_refuses_for_bools_raise_its_error():
    # subtraction with a bool, clamp of bools and bool powers compiled to numbers; bool ** True
    # is a bool copy in eager (int64 in ember, from the traced dtype)
    b, i = torch.tensor([True, False]), torch.tensor([3, 4])
    for fn, args in ((lambda a: a - True, (i,)), (lambda a, c: a - c, (i, b)), (lambda c: c - 1.5, (b,)),
                     (lambda c: 2 - c, (b,)), (lambda c: torch.clamp_min(c, True), (b,)),
                     (lambda c: torch.clamp(c, False, True), (b,)), (lambda c: True ** c, (b,))):
        expected = _eager_error(fn, *args)
        with pytest.raises(expected):
            ember.compile(fn)(*args)
    out = ember.compile(lambda c: c ** True)(b)
    assert out.dtype == torch.bool and torch.equal(out, b)


def test_python_ints_made_symbolic_are_checked_as_in_eager():
    # a varying int argument becomes a size symbol: clamp's bound, a fill value and an integer
    # exponent then went unchecked (int8 clamp_min(a, 300) gave 44 where eager raises)
    a = torch.tensor([1, -5, 100], dtype=torch.int8)
    for fn in (lambda a, s: torch.clamp_min(a, s), lambda a, s: torch.full_like(a, s), lambda a, s: a ** (6 - s)):
        compiled = ember.compile(fn)
        for s in (2, 3, 4):
            assert_same(compiled(a, s), fn(a, s))
        with pytest.raises(RuntimeError):
            compiled(a, 300)


def test_index_copy_of_a_negative_index_raises_as_in_eager():
    # its decomposition into index_put wrapped -1 to the last row
    x, s = torch.zeros(5, 2), torch.ones(2, 2)
    fn = lambda x, i, s: x.index_copy(0, i, s) * 2  # noqa: E731
    assert _eager_error(fn, x, torch.tensor([0, -1]), s) is IndexError
    with pytest.raises(IndexError):
        ember.compile(fn)(x, torch.tensor([0, -1]), s)
    assert_same(ember.compile(fn)(x, torch.tensor([0, 3]), s), fn(x, torch.tensor([0, 3]), s))


@pytest.mark.parametrize("fn, x", [
    (lambda x: torch.add(x, x, alpha=True), torch.tensor([1, 2, 3])),
    (lambda x: torch.sub(x, x, alpha=True), torch.tensor([1.0, 2.0])),
    (lambda x: torch.add(x, x, alpha=2.5), torch.tensor([True, False])),
    (lambda x: torch.add(x, x, alpha=2.5), torch.tensor([1, 2])),
    (lambda x: x.masked_fill(x > 1, float("nan")), torch.tensor([1, 2])),
    (lambda x: x.masked_fill(x > 1, float("inf")), torch.tensor([1, 2])),
    # (eager converts hardshrink's lambd and threshold's value to the input's dtype, an integer
    # threshold to the integer type, checked; celu divides by alpha: the decompositions computed)
    (lambda x: F.hardshrink(x, 1e5), torch.tensor([1.0, -2.0], dtype=torch.float16)),
    (lambda x: F.threshold(x, 1.0, 70000.0), torch.tensor([1.0, -2.0], dtype=torch.float16)),
    (lambda x: F.threshold(x, 1e20, 1), torch.tensor([1, 2])),
    (lambda x: F.celu(x, 0.0), torch.tensor([1.0, -2.0])),
], ids=["bool_alpha_ints", "bool_alpha_floats", "float_alpha_bools", "float_alpha_ints", "nan_into_ints",
        "inf_into_ints", "hardshrink_lambd_past_half", "threshold_value_past_half", "threshold_past_int64",
        "celu_alpha_0"])
def test_scalars_eager_refuses_for_the_dtype_raise_runtime_error(fn, x):
    assert _eager_error(fn, x) is RuntimeError
    with pytest.raises(RuntimeError) as info:
        ember.compile(fn)(x)
    assert type(info.value) is RuntimeError


@pytest.mark.parametrize("fn", [
    lambda x: F.batch_norm(x, torch.zeros(6, dtype=torch.float64), torch.ones(6, dtype=torch.float64)),
    lambda x: F.group_norm(x, 2, torch.ones(6, dtype=torch.float64)),
    lambda x: F.layer_norm(x, (5,), torch.ones(5, dtype=torch.float64)),
    lambda x: F.layer_norm(x.bfloat16(), (5,), torch.ones(5, dtype=torch.bfloat16), torch.zeros(5)),
    lambda x: F.nll_loss(x[:, :, 0], torch.zeros(4, dtype=torch.long), weight=torch.ones(6, dtype=torch.float64)),
], ids=["batch_norm", "group_norm", "layer_norm", "layer_norm_half_mixed", "nll_loss_weight"])
def test_parameters_of_another_dtype_raise_as_in_eager(fn):
    # the decompositions (and ember's layer_norm) computed in the wider dtype
    x = torch.randn(4, 6, 5)
    assert _eager_error(fn, x) is RuntimeError
    with pytest.raises(RuntimeError):
        ember.compile(fn)(x)


@pytest.mark.parametrize("value", [-2.0, torch.tensor(5.0)], ids=["scalar", "tensor"])
def test_index_fill_takes_negative_indices_as_eager(value):
    # its decomposition is an index_copy, which refuses them: they are wrapped first
    fn = lambda x, i: x.index_fill(1, i, value) * 2  # noqa: E731
    x = torch.randn(3, 4)
    check(fn, x, torch.tensor([-1, 0, -4]))
    check(lambda x, i: x.clone().index_fill_(-1, i, value), x, torch.tensor([-2]))
    check(lambda x, i: x.index_fill(0, i, value), torch.tensor(1.5), torch.tensor([-1]))  # 0-d
    for bad in ([-5], [4]):  # out of range either way: eager's IndexError
        assert _eager_error(fn, x, torch.tensor(bad)) is IndexError
        with pytest.raises(IndexError):
            ember.compile(fn)(x, torch.tensor(bad))
    leaf = x.clone().requires_grad_()
    ember.compile(fn)(leaf, torch.tensor([-1])).sum().backward()
    expected = torch.full((3, 4), 2.0)
    expected[:, -1] = 0
    assert_same(leaf.grad, expected)


@pytest.mark.parametrize("shape", [(3,), (2, 3), (0, 3), ()], ids=["1d", "2d", "empty", "0d"])
def test_logsumexp_over_no_dims_is_eagers(shape):
    """``logsumexp(x, ())``: eager raises for a tensor with dims (and returns a 0-d result for
    an empty one); torch's decomposition returned a (1, ..., 1) tensor. Those calls keep the op."""
    fn = lambda x: torch.logsumexp(x * 2, ())  # noqa: E731
    x = torch.randn(shape)
    try:
        expected = fn(x)
    except RuntimeError:
        with pytest.raises(RuntimeError, match="broadcast shape"):
            ember.compile(fn)(x)
        return
    assert_same(ember.compile(fn)(x), expected)


@pytest.mark.parametrize("p", [
    torch.tensor([0.5, 1.5]), torch.tensor([0.2, float("nan")]), torch.tensor([-1e-30, 0.5]),
    torch.tensor([0, 1, 3]), torch.tensor([True, False]),
], ids=["above_one", "nan", "negative", "ints", "bools"])
def test_bernoulli_checks_its_probabilities_as_eager(p):
    # its decomposition (rand < p) drew samples from any p; eager checks the range and the dtype
    fn = lambda p: torch.bernoulli(p * 1)  # noqa: E731
    expected = _eager_error(fn, p)
    with pytest.raises(expected) as info:
        ember.compile(fn)(p)
    assert type(info.value) is expected
    ok = torch.tensor([0.0, 1.0, 0.0, 1.0])
    assert_same(ember.compile(fn)(ok), ok)


@pytest.mark.parametrize("fn, arg", [
    (lambda n: torch.randn(n, dtype=torch.int32), 3),
    (lambda x: torch.randn_like(x), torch.arange(3)),
    (lambda x: x.normal_(), torch.arange(3)),
    (lambda x: torch.normal(x, 1.0), torch.arange(3)),
    (lambda x: x.log_normal_(), torch.arange(3)),
], ids=["randn", "randn_like", "normal_", "normal", "log_normal_"])
def test_normal_samples_of_integers_raise_eagers_error(fn, arg):
    # torch's references refuse the dtype with a RuntimeError; eager has no kernel for it
    expected = _eager_error(fn, arg.clone() if isinstance(arg, torch.Tensor) else arg)
    assert expected is NotImplementedError
    with pytest.raises(NotImplementedError):
        ember.compile(fn)(arg)


@pytest.fixture
def data_dependent_shapes(monkeypatch):
    # (torch 2.11's Dynamo, the GPU machines', fails with the first switch itself, and once set it
    # failed the later tests of the same worker)
    if tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 13):
        pytest.skip("torch 2.11's Dynamo fails with capture_dynamic_output_shape_ops itself")
    import torch._dynamo.config as dynamo_config

    monkeypatch.setattr(dynamo_config, "capture_dynamic_output_shape_ops", True)
    monkeypatch.setattr(dynamo_config, "capture_scalar_outputs", True)


@pytest.mark.parametrize("fn", [
    lambda x: torch.argmax(x[x > 5]), lambda x: torch.max(x[x > 5], 0), lambda x: torch.max(x[x > 5]),
    lambda x: torch.amin(x[x > 5]) * 2,
], ids=["argmax", "max_dim", "max", "amin"])
def test_reductions_over_a_size_that_may_be_zero_raise(fn, data_dependent_shapes):
    # a boolean mask's count is only known when the graph runs: the kernel over no elements gave
    # -inf and index INT64_MAX where eager raises; such reductions run through ATen
    x = torch.randn(8)
    with pytest.raises((IndexError, RuntimeError)):
        fn(x)
    with pytest.raises((IndexError, RuntimeError)):
        ember.compile(fn)(x)
    y = torch.tensor([6.0, 1.0, 7.0, 9.0])
    assert_same(ember.compile(fn)(y), fn(y))


def test_torch_check_on_a_value_runs(data_dependent_shapes):
    # torch._check of a value read with .item(): its assertion returns nothing, and was dropped
    def fn(x):
        n = x.sum().item()
        torch._check(n > 0)
        return x * n

    compiled = ember.compile(fn)
    assert_same(compiled(torch.ones(4)), fn(torch.ones(4)))
    with pytest.raises(RuntimeError):
        compiled(-torch.ones(4))


@pytest.mark.parametrize("fn, x", [
    (lambda x: F.pad(x, (1, 1), value=300), torch.tensor([[1, 2]], dtype=torch.uint8)),
    (lambda x: F.pad(x, (1, 1), value=-1), torch.tensor([[1, 2]], dtype=torch.uint8)),  # (no wrap in a pad)
    (lambda x: F.pad(x, (1, 1), value=255.9), torch.tensor([[1, 2]], dtype=torch.uint8)),
    (lambda x: F.pad(x, (1, 1), value=200), torch.tensor([[1, 2]], dtype=torch.int8)),
    (lambda x: F.pad(x, (1, 1), value=1e6), torch.zeros(1, 2).half()),
    (lambda x: x.scatter(1, torch.zeros(1, 2, dtype=torch.long), 300), torch.tensor([[1, 2]], dtype=torch.uint8)),
    (lambda x: x.masked_fill(x > 0, -0.5), torch.tensor([[1, 2]], dtype=torch.uint8)),  # (a float below 0)
], ids=["pad_300", "pad_minus_one", "pad_fraction_above", "pad_int8", "pad_half", "scatter", "fill_negative_float"])
def test_scalars_that_overflow_the_dtype_raise_as_eager(fn, x):
    # the value was converted without eager's check: a uint8 border of 300 came out 44
    assert _eager_error(fn, x) is RuntimeError
    with pytest.raises(RuntimeError, match="overflow"):
        ember.compile(fn)(x)


def test_scalars_that_fit_still_compile():
    u = torch.tensor([[1, 2]], dtype=torch.uint8)
    for fn in (lambda x: F.pad(x, (1, 1), value=255), lambda x: x.scatter(1, torch.zeros(1, 2, dtype=torch.long), -1)):
        check(fn, u)


@pytest.mark.parametrize("fn, x", [
    (lambda x: torch.lerp(x, x * 2, 0.5), torch.tensor([1, 0])),
    (lambda x: torch.floor(x), torch.tensor([True, False])),
    (lambda x: torch.round(x), torch.tensor([True, False])),
    (lambda x: torch.relu(x), torch.tensor([True, False])),
    (lambda x: F.gelu(x), torch.tensor([1, 2])),
    (lambda x: F.silu(x), torch.tensor([1, 2])),
    (lambda x: torch.logaddexp(x, x), torch.tensor([1, 2])),
    (lambda x: torch.addcmul(x, x, x), torch.tensor([True, False])),
    *[(fn, x) for fn in (lambda x: F.hardsigmoid(x * 3), lambda x: F.hardswish(x * 3), lambda x: F.softplus(x * 3),
                         lambda x: F.leaky_relu(x * 3, 2), lambda x: torch.frac(x * 3), lambda x: F.glu(x * 3),
                         lambda x: F.mish(x * 3), lambda x: F.celu(x * 3), lambda x: F.logsigmoid(x * 3),
                         lambda x: F.prelu(x * 3, torch.ones(1, dtype=torch.int64)),
                         lambda x: F.smooth_l1_loss(x * 3, x), lambda x: F.huber_loss(x * 3, x),
                         lambda x: torch.heaviside(x * 3, x > 0))
      for x in (torch.tensor([-3, 0, 2, 5]),)],
    (lambda x: torch.ones(2, 3) @ x, torch.ones(3, dtype=torch.float64)),
    (lambda x: torch.mv(x[None].expand(2, 3), x), torch.tensor([True, False, True])),
    (lambda x: torch.dot(x, x), torch.tensor([True, False, True])),
    (lambda x: torch.trace(x[None].expand(3, 3)), torch.tensor([True, False, True])),
    (lambda x: torch.linalg.cross(torch.ones(3), x), torch.ones(3, dtype=torch.float64)),
    (lambda x: torch.linalg.cross(x, x), torch.tensor([True, False, True])),
    # (their references raised ValueError (a float slope) and TypeError (finfo of an integer
    # dtype) while tracing; hardshrink's decomposition and threshold's computed them)
    (lambda x: F.leaky_relu(x), torch.tensor([-3, 2])),
    (lambda x: F.softshrink(x, 1.0), torch.tensor([-3, 2])),
    (lambda x: F.softshrink(x), torch.tensor([True, False])),
    (lambda x: F.hardshrink(x, 1.0), torch.tensor([-3, 2])),
    (lambda x: F.threshold(x, 0.5, 1.0), torch.tensor([True, False])),
], ids=["lerp_int", "floor_bool", "round_bool", "relu_bool", "gelu_int", "silu_int", "logaddexp_int", "addcmul_bool",
        "hardsigmoid_int", "hardswish_int", "softplus_int", "leaky_relu_int", "frac_int", "glu_int", "mish_int",
        "celu_int", "logsigmoid_int", "prelu_int", "smooth_l1_int", "huber_int", "heaviside_mixed",
        "mv_mixed", "mv_bool", "dot_bool", "trace_bool", "cross_mixed", "cross_bool", "leaky_relu_float_slope_int",
        "softshrink_int", "softshrink_bool", "hardshrink_int", "threshold_bool"])
def test_dtypes_eager_has_no_kernel_for_raise_its_error(fn, x):
    # the decompositions (or ember's lowerings) computed something for them
    expected = _eager_error(fn, x)
    with pytest.raises(expected) as info:
        ember.compile(fn)(x)
    assert type(info.value) is expected


def test_ops_on_dtypes_ember_does_not_generate_run_through_aten_alone():
    # a comparison of complex or uint32 operands (or isnan of a complex) made the whole graph
    # run through ATen with a warning; the op alone runs there now, the rest compiles
    for x in (torch.tensor([1 + 1j, 2j]), torch.tensor([3, 4], dtype=torch.uint32)):
        for fn in (lambda x, y: ((x == x[0]) * y).exp(), lambda x, y: (torch.isnan(x) + y) * 2):
            y = torch.randn(2)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                report = check(fn, x, y)
            assert report.kernels


def test_interpolation_to_no_pixels_raises_eagers_runtime_error():
    # the decomposition divided by the output size: ZeroDivisionError
    fn = lambda x: F.interpolate(x, size=(0, 3))  # noqa: E731
    assert _eager_error(fn, torch.randn(2, 3, 4, 4)) is RuntimeError
    with pytest.raises(RuntimeError):
        ember.compile(fn)(torch.randn(2, 3, 4, 4))


@pytest.mark.parametrize("size", [[2, 3, 1, 5], [2, 3, 4, 1], [2, 3, 1, 1]])
def test_affine_grids_one_pixel_wide(size):
    # the decomposition's torch.tensor(0) put an in-place detach_ in the graph: the compile failed
    check(lambda t: F.affine_grid(t, size, align_corners=False) * 2, torch.randn(2, 2, 3))


def test_pixel_unshuffle_of_an_empty_image_keeps_its_shape():
    check(lambda x: F.pixel_unshuffle(x, 2), torch.randn(1, 3, 0, 0))


@pytest.mark.parametrize("fn, args", [
    (lambda s, m, v: s.masked_fill(m, v), (torch.zeros(3, dtype=torch.int8), torch.tensor([True, False, True]),
                                          torch.tensor(300))),
    (lambda s, m, v: s.masked_fill(m, v).softmax(-1), (torch.randn(2, 3).half(), torch.tensor([False, True, False]),
                                                       torch.tensor(torch.finfo(torch.float32).min))),
], ids=["int8_of_300", "float16_of_float32_min"])
def test_masked_fill_of_a_tensor_value_that_overflows_raises(fn, args):
    # the value is known when the op runs: the decomposition had wrapped 300 to 44 and made
    # float32's finfo.min -inf (a common attention-mask idiom on float16 scores)
    assert _eager_error(fn, *args) is RuntimeError
    with pytest.raises(RuntimeError, match="overflow"):
        ember.compile(fn)(*args)
    fits = (args[0], args[1], torch.tensor(7, dtype=args[0].dtype))
    assert_same(ember.compile(fn)(*fits), fn(*fits))


@pytest.mark.parametrize("fn, args", [
    (lambda x, t: F.binary_cross_entropy(x, t), (torch.tensor([0.5, 1.5]), torch.tensor([1.0, 0.0]))),
    (lambda x, t: F.smooth_l1_loss(x, t, beta=-1.0), (torch.randn(4), torch.randn(4))),
    # (eager checks beta >= 0, which NaN fails: the decomposition computed a NaN loss)
    (lambda x, t: F.smooth_l1_loss(x, t, beta=float("nan")), (torch.randn(4), torch.randn(4))),
    (lambda x, t: F.cross_entropy(x, t), (torch.randn(3, 5), torch.tensor([0, 4, 2], dtype=torch.int32))),
    (lambda x, t: F.nll_loss(x, t), (torch.randn(3, 5), torch.tensor([0, 4, 2], dtype=torch.int32))),
], ids=["bce_out_of_range", "smooth_l1_negative_beta", "smooth_l1_nan_beta", "cross_entropy_int32_target",
        "nll_int32_target"])
def test_loss_inputs_eager_refuses_raise_its_error(fn, args):
    # the decompositions computed a loss (nan for the BCE input of 1.5)
    assert _eager_error(fn, *args) is RuntimeError
    with pytest.raises(RuntimeError):
        ember.compile(fn)(*args)


@pytest.mark.parametrize("fn", [
    lambda x: torch.fake_quantize_per_tensor_affine(x, 0.1, 0, 10, 5),
    lambda x: torch.fake_quantize_per_channel_affine(x[None], torch.ones(3), torch.zeros(1, dtype=torch.int32),
                                                     0, 0, 255),
], ids=["qmin_above_qmax", "scales_of_another_length"])
def test_an_ops_error_raised_while_torch_handled_another_is_the_ops(fn):
    # fake tensors raise the op's argument check while handling their missing meta kernel's
    # NotImplementedError: ember's unwrapping went past the op's RuntimeError to that one
    x = torch.randn(4)
    assert _eager_error(fn, x) is RuntimeError
    with pytest.raises(Exception) as info:
        ember.compile(fn)(x)
    assert type(info.value) is RuntimeError, info.value
