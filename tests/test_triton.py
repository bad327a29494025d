"""The Triton backend, run on CPU tensors by Triton's interpreter (TRITON_INTERPRET=1, set in
conftest.py): the fusion patterns on each code path, PyTorch's OpInfo samples, fallbacks."""

from __future__ import annotations

import os
import re
import warnings

import pytest
import sympy
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.testing._internal.common_methods_invocations import op_db

import ember
from ember import ragged
from ember.runtime import triton_configs as tc
from ember.runtime import triton_helpers as eh
from ember.workloads.giou import make_batch, padded_giou_loss, ragged_giou_loss

from .conftest import INTERPRETED_TRITON
from .helpers import check
from .test_ops import _program, _samples, check_op

pytestmark = INTERPRETED_TRITON  # (the kernels run on CPU tensors)

TRITON = {"target": "triton"}
LOOPED = {"target": "triton", "triton_launch": {"PERSISTENT": False, "RBLOCK": 16}}


def rendered(fn, *args, **kwargs) -> ember.Report:
    """explain's Triton kernels, rendered and not run: the graph runs through ATen, as on a
    machine without Triton's interpreter. For tests that read or compile the sources; running
    them interpreted took up to 50 s for a LayerNorm of 64 rows of 4096 on this CPU."""
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        return ember.explain(fn, *args, target="triton", **kwargs)
    finally:
        if before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = before


def rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _special(x: torch.Tensor) -> torch.Tensor:
    """x with a NaN and rows of +0.0 and -0.0."""
    x[0, 1], x[1], x[2] = float("nan"), 0.0, -0.0
    return x


CASES = {
    "relu_add": (lambda x, y: torch.relu(x) + y + 1, lambda: (torch.randn(100, 33), torch.randn(33))),
    # lanes (codegen/triton_lanes.py) at an odd size: whole blocks apart in each
    "sgd_lanes": (lambda *a: (_sgd_momentum_step(a[:2], a[2:4], a[4:]), a)[1],
                  lambda: [torch.randn(4100) for _ in range(6)]),
    # pointwise kernels of different sizes in one launch (codegen/triton_combos.py): a part in
    # lanes, an odd one, a part of one element
    "combo_sizes": (lambda a, b, c, d: (a * 2, b.sin(), c + 1, d.exp()),
                    lambda: (torch.randn(4100), torch.randn(4100), torch.randn(33), torch.randn(1))),
    "rmsnorm_bf16": (rmsnorm, lambda: (torch.randn(20, 50).bfloat16(), torch.randn(50).bfloat16())),
    "softmax": (lambda x: torch.softmax(x, -1), lambda: (torch.randn(9, 70),)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (40,), w, b),
                   lambda: (torch.randn(6, 40), torch.randn(40), torch.randn(40))),
    "giou": (padded_giou_loss, lambda: make_batch(4)[::2]),
    "argmax_max": (lambda x: (x.argmax(-1), x.max(0), x.argmin()), lambda: (torch.randn(7, 13),)),
    "var_sum_any": (lambda x: (x.var(), x.sum(), (x > 1).any(), x.prod(-1)), lambda: (torch.randn(7, 13),)),
    "ragged_giou": (ragged_giou_loss, lambda: (lambda p, t, _: (p, ragged.from_list(t)))(*make_batch(24))),
    "search_index": (lambda s, q, x: x[torch.searchsorted(s, q, right=True) - 1, 1:] * 2,
                     lambda: (torch.tensor([0, 2, 2, 7]), torch.arange(9), torch.randn(4, 3))),
    # a gather at a one-element index: the loaded index is a scalar, the load's mask a block
    "gather_one_element": (lambda x, i: torch.index_select(x, 0, i) * 2, lambda: (torch.randn(1), torch.tensor([0]))),
    # ... and at an index a tensor holds, read beside a reduction's rows: the index and the
    # gathered value are scalars, which Triton's compiler refuses to load under the rows' mask
    "gather_scalar_beside_rows": (lambda x, w, i: (x.sum(-1) * torch.index_select(w, 0, i),
                                                   (x.sum(-1) + torch.index_select(w, 0, i)).sum()),
                                  lambda: (torch.randn(6, 100), torch.randn(3), torch.tensor([2]))),
    # ... and a row gathered at such an index: the load varies along the row, so it keeps the
    # row's mask (without it, a softmax over row 0's 33 values read row 1's too, and a float16
    # layer_norm came out NaN: GPU fuzz seed 130891054576)
    "row_at_scalar_index": (lambda x, i: (torch.softmax(x[i], -1), F.layer_norm(x.t()[:, i].t(), (33,))),
                            lambda: (torch.randn(2, 33), torch.tensor([0]))),
    # a replicate pad cut to one row: that row's index is a constant, not an expression
    "replicate_pad_one_row": (lambda x: F.pad(x, (-2, -1, -4, 0), mode="replicate") * 2,
                              lambda: (torch.randn(3, 5, 5),)),
    # fp32 cross-entropy over short rows: online softmax's row max crashed Triton 3.6's compiler
    # in the small looped tiles the heuristic picks (the compile test below tries them)
    "cross_entropy_f32": (lambda x, t: F.cross_entropy(x, t), lambda: (torch.randn(4, 3), torch.randint(0, 3, (4,)))),
    "index_put": (lambda x, i, j, v: (x.index_put((i, j), v * 2, accumulate=True), x.index_add(0, j, x[i] * 3)),
                  lambda: (torch.randn(6, 6), torch.tensor([5, 0, 0, -2]), torch.tensor([1, 1, 1, 3]), torch.randn(4))),
    "stack_scatter": (lambda x, i: torch.zeros(5, 2).index_put((i,), torch.stack([x.sin(), x.cos()], -1), True),
                      lambda: (torch.randn(7), torch.tensor([0, 4, 4, 1, 0, 2, 2]))),
    # scatter_reduce's atomic amax/amin (NaNs win, signed zeros), over float, 16-bit and int dtypes
    "scatter_reduce": (lambda x, i, s: (x.scatter_reduce(0, i, s, "amax", include_self=False),
                                        x.double().scatter_reduce(1, i, s.double(), "amin"),
                                        x.bfloat16().scatter_reduce(0, i, s.bfloat16(), "amax"),
                                        (x.nan_to_num() * 4).long().scatter_reduce(
                                            0, i, (s.nan_to_num() * 4).long(), "amin", include_self=False),
                                        x.scatter_reduce(1, i, s, "mean", include_self=False)),
                       lambda: (_special(torch.randn(5, 6)), torch.randint(0, 5, (3, 4)), _special(torch.randn(4, 8)))),
    "segment_mean": (ragged.segment_mean,
                     lambda: (ragged.from_list([torch.randn(n, 6) for n in (3, 0, 5, 1)]),)),
    "segment_max_bf16": (ragged.segment_max,
                         lambda: (ragged.from_list([torch.randn(n, 3).bfloat16() for n in (2, 9, 0)]),)),
    "jagged_softmax": (lambda r: ragged.jagged_softmax(r).values,
                       lambda: (ragged.from_list([torch.randn(n) for n in (3, 0, 40, 1, 2)],
                                                 offsets_dtype=torch.int32),)),
    # pointwise kernels reading along one dim and writing along another run in 2D tiles
    "transpose": (lambda x: (x.t() * 2).contiguous(), lambda: (torch.randn(70, 33).bfloat16(),)),
    "batched_mT_add": (lambda x, b: x.mT + b, lambda: (torch.randn(3, 40, 17), torch.randn(17, 1))),
    "permute_021": (lambda x: (x.permute(0, 2, 1) * 2).contiguous(), lambda: (torch.randn(2, 19, 65),)),
    "int_ops": (lambda a, b: (a // b, a % b, (a * 3).sum(-1)),
                lambda: (torch.randint(-50, 50, (8, 9)), torch.randint(1, 7, (8, 9)))),
    # 8- and 16-bit integers through helpers (shifts, powers, floor division): their results
    # keep their type, so the next product wraps at 8 bits (uint8 >> 0 squared came out
    # unwrapped: GPU fuzz seed 456711204467) and a reduction's loop-carried type holds (an
    # int16 amin of shifts failed to compile: seed 1062043588507)
    "narrow_int_helpers": (lambda a, b: ((a >> 0).square() ^ b, (b >> (a & 3)).amin(0), torch.pow(a, 2) * 3,
                                         torch.div(b, 3, rounding_mode="floor") * 700),
                           lambda: (torch.randint(0, 256, (4, 33), dtype=torch.uint8),
                                    torch.randint(-300, 300, (4, 33), dtype=torch.int16))),
    # masks from comparisons of 0-d values beside masks of blocks (Triton's interpreter made the
    # former floats, which & refused: the kernel ran through ATen; CPU fuzz seeds 866159417107,
    # and 892227093424: a 0-d value's conversion to bool)
    "scalar_masks": (lambda x, t: ((torch.isfinite(t) & (x > 0)) | (t > 1), torch.where(t == t, x, 0.0),
                                   (x * (torch.isnan(t) ^ (x < 0.5))).sum(-1),
                                   torch.logical_and(t, t) | (x > 0), torch.logical_not(t) | (x < 0)),
                     lambda: (torch.randn(5, 33), torch.tensor(0.5))),
    # integer powers of a scalar base: the exponent's shape is the result's
    "int_pow_scalar_base": (lambda a: (torch.pow(2, a % 40), torch.pow(a, 3)),
                            lambda: (torch.randint(-50, 50, (8, 9), dtype=torch.int32),)),
}


@pytest.mark.parametrize("options", [TRITON, LOOPED], ids=["tuned", "looped"])
@pytest.mark.parametrize("name", list(CASES))
def test_fusion_patterns(name, options):
    fn, make = CASES[name]
    report = check(fn, *make(), options=options)
    assert report.kernels and all(k.backend == "triton" for k in report.kernels)
    assert all("@triton.jit" in k.source for k in report.kernels)
    if name in ("relu_add", "rmsnorm_bf16", "softmax", "layer_norm", "giou", "ragged_giou", "segment_mean",
                "jagged_softmax", "transpose", "batched_mT_add", "permute_021"):
        assert len(report.kernels) == 1
    tiled = [k for k in report.kernels if "tiles of XBLOCK rows x RBLOCK columns" in k.source]
    # (x.mT + b's output takes x's layout, as eager's, and its loops walk that memory
    # (schedule/loops.py): no access left transposed, so no tiles)
    assert len(tiled) == (name in ("transpose", "permute_021")), [k.source for k in tiled]


def test_transposed_tiles_cover_every_element_at_any_size():
    # symbolic rows and columns, tiles partly past either end, sizes 0 and 1 and odd ones
    f = lambda x, y: x.t() + y  # noqa: E731
    fast = ember.compile(f, options=TRITON, dynamic=True)
    for m, n in [(100, 50), (33, 77), (1, 20), (20, 1), (0, 5), (130, 129)]:
        x, y = torch.randn(m, n), torch.randn(n, m)
        torch.testing.assert_close(fast(x, y), f(x, y))
    (k,) = rendered(f, torch.randn(100, 50), torch.randn(50, 100), dynamic=True).kernels
    assert "xmask = (xindex < OUTER) & (rindex < INNER)" in k.source, k.source
    # a kernel that reads and writes along its last dim keeps 1D blocks; short dims too
    for g, args in ((lambda x: x * 2, (torch.randn(64, 64),)), (lambda x: x.t() * 2, (torch.randn(64, 8),))):
        (k,) = rendered(g, *args).kernels
        assert "tiles of XBLOCK" not in k.source, k.source


def _sgd_momentum_step(params, grads, bufs):
    torch._foreach_mul_(bufs, 0.9)
    torch._foreach_add_(bufs, grads)
    torch._foreach_add_(params, bufs, alpha=-0.01)


def _body_order(source: str) -> list[str]:
    """'load' / 'store' for each memory access of a kernel's source, in order."""
    return re.findall(r"tl\.(load|store)\(", source)


def _lanes(source: str) -> list[str]:
    """The branches of a kernel rendered in lanes (codegen/triton_lanes.py), in order."""
    return re.split(r"\n    (?:el)?if lane == \d+:\n", source)[1:]


@pytest.mark.parametrize("size", [1000, 1024])  # whole blocks apart from the last; every block whole
def test_pointwise_kernels_load_everything_before_their_first_store(size):
    # Triton keeps a load after a store in order (it cannot know they do not alias): a step
    # storing 6 outputs waited for each pair of loads in turn. All 9 inputs are loaded first, and
    # outputs stored over their inputs (the step writes in place) still read the old values.
    # (At these sizes the parameters share one body: lanes are for larger ones, below.)
    def make():
        g = torch.Generator().manual_seed(0)
        return [[torch.randn(size, generator=g) for _ in range(3)] for _ in range(3)]

    (k,) = rendered(_sgd_momentum_step, *make()).kernels
    body = k.source.split("else:")[0]  # (the first of the two branches where size is odd)
    order = _body_order(body)
    assert order == ["load"] * 9 + ["store"] * 6, k.source
    want, got = make(), make()
    _sgd_momentum_step(*want)
    report = ember.Report()
    step = ember.compile(_sgd_momentum_step, options=TRITON, report=report)
    step(*got)
    assert "stored in place" in report.graphs[0].wrapper
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("size", [4100, 4096])  # whole blocks apart from the last; every block whole
def test_stores_sharing_no_load_run_as_lanes_on_programs_of_their_own(size, monkeypatch):
    # An SGD step over 3 parameters: each program streams one parameter's 3 tensors (Inductor's
    # combo kernels do the same), not a block of all 9 (H200, 8 x 1M floats: 43.6 -> 40.9 us).
    # The grid is the blocks times the lanes; each lane loads before it stores, and its outputs
    # stored over its inputs read the old values.
    def make():
        g = torch.Generator().manual_seed(1)
        return [[torch.randn(size, generator=g) for _ in range(3)] for _ in range(3)]

    (k,) = rendered(_sgd_momentum_step, *make()).kernels
    lanes = _lanes(k.source)
    assert len(lanes) == 3, k.source
    for body in lanes:
        order = _body_order(body.split("else:")[0])  # (the first of the two branches where size is odd)
        assert order == ["load"] * 3 + ["store"] * 2, k.source
    grids = _recording_grids(monkeypatch)
    want, got = make(), make()
    _sgd_momentum_step(*want)
    report = ember.Report()
    ember.compile(_sgd_momentum_step, options=TRITON, report=report)(*got)
    assert "stored in place" in report.graphs[0].wrapper
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w)
    ((name, grid),) = [(n, g) for n, g in grids if n.startswith("fused_foreach")]
    xblock = tc.heuristic("pointwise", size, 1, tc.KernelHints())[0]["XBLOCK"]
    assert grid == (3 * -(-size // xblock),), (name, grid, xblock)


def test_lanes_are_groups_of_stores_sharing_no_loaded_value_or_stream():
    from ember.codegen.triton_lanes import MIN_ELEMENTS, lanes_of
    from ember.schedule.kernel_ir import Kernel

    x, y, z = (torch.randn(MIN_ELEMENTS) for _ in range(3))
    # two outputs from one load: one group, one body
    (k,) = rendered(lambda a: (a + 1, a * 2), x).kernels
    assert "lane ==" not in k.source
    # independent outputs: a lane each, and a constant both use is computed in each
    (k,) = rendered(lambda a, b, c: (a * 3, b * 3, (c + a) * 3), x, y, z).kernels
    lanes = _lanes(k.source)
    assert len(lanes) == 2, k.source  # (c + a) shares a's load with a * 3
    assert all("tl.full([1], 3.0, tl.float32)" in body for body in lanes), k.source
    # two slices of one buffer's rows (a q and a v out of qkv) read neighbouring memory: one body
    qkv = torch.randn(MIN_ELEMENTS // 16, 48)
    (k,) = rendered(lambda t: (t[:, :16] * 2, t[:, 32:] * 2), qkv).kernels
    assert "lane ==" not in k.source, k.source
    # fewer elements than MIN_ELEMENTS in all: latency, not bandwidth; one body
    (k,) = rendered(lambda a, b: (a * 3, b * 3), x[:64], y[:64]).kernels
    assert "lane ==" not in k.source, k.source
    # many small tensors, MIN_ELEMENTS or more in all: a lane each, not one program streaming
    # them in turn (an Adam step over a GPT's 74 LayerNorm parameters of 768 floats: 204 -> 4.9 us)
    small = [torch.randn(MIN_ELEMENTS // 8 + 3) for _ in range(9)]
    report = check(lambda *ts: [t * 3 for t in ts], *small, options=TRITON)
    (k,) = report.kernels
    assert len(_lanes(k.source)) == 9, k.source
    assert lanes_of(Kernel("empty", [], [], (), (), [])) is None


@pytest.mark.parametrize("n", [5000, 4096 * 3])
def test_lanes_at_symbolic_sizes_and_odd_sizes_match_eager(n):
    # a symbolic element count launches its lanes from the size argument; each lane masks its
    # last block
    def f(a, b, c):
        return a.sin() * 2, b + c.cos(), (c * 3).exp2()

    report = ember.Report()
    compiled = ember.compile(f, options=TRITON, dynamic=True, report=report)
    for m in (n, n + 7):
        args = [torch.randn(m) for _ in range(3)]
        for got, want in zip(compiled(*args), f(*args)):
            torch.testing.assert_close(got, want)
    # (b + c.cos() and (c * 3).exp2() stream c in common: one lane; a.sin() * 2 the other)
    assert any(len(_lanes(k.source)) == 2 for k in report.kernels), [k.source for k in report.kernels]


def test_loads_move_ahead_of_stores_only_where_nothing_stored_is_read():
    from ember.codegen.triton import loads_first
    from ember.ir import dtypes as dt
    from ember.schedule.kernel_ir import Access, Value

    o0 = sympy.Symbol("o0", integer=True)
    ind = sympy.Symbol("ind0", integer=True)
    f32 = dt.float32

    def load(buf, *srcs):
        return Value("load", f32, srcs, Access(buf, ind if srcs else o0, (ind,) if srcs else ()))

    def store(buf, v, accumulate=False):
        return Value("store", f32, (v,), Access(buf, o0, (), accumulate))

    a, i = load("a"), load("idx")
    clamped = Value("alu", dt.int64, (i,), "clamp")
    b = load("b", clamped)  # a gather: its index's computation moves with it
    values = [a, store("out0", a), i, clamped, b, store("out1", b)]
    assert [v.kind for v in loads_first(values)] == ["load", "load", "alu", "load", "store", "store"]
    # a buffer the kernel stores and reads again, or adds into, keeps the IR's order
    reread = [a, store("a2", a), load("a2"), store("out1", a)]
    assert loads_first(reread) == reread
    added = [a, store("out0", a, accumulate=True), load("c"), store("out1", a)]
    assert loads_first(added) == added


def test_online_softmax_reads_rows_once():
    def softmax(x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)

    x = torch.randn(6, 70)
    x[2] = float("-inf")           # a row of -inf: NaN, as eager
    x[3, 5] = float("nan")         # NaN propagates
    x[4, :30] = float("-inf")      # a running max that starts at -inf
    report = check(softmax, x, options=LOOPED)
    src = report.kernels[0].source
    assert "m_new" in src  # max and sum accumulate in one loop
    assert "eh.exp_ftz(chunk - m_use[:, None])" in src  # one exp instruction per element on the GPU
    assert "row_maxv" in src and "tl.full([XBLOCK], float('-inf')" in src  # per-row values: once per row
    assert src.split("else:")[1].count("for roffset") == 2  # (max+sum), then the store loop
    logits, target = torch.randn(6, 70) * 10, torch.randint(0, 70, (6,))
    check(lambda a, t: F.cross_entropy(a, t), logits, target, options=LOOPED)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_softmax_written_out_computes_exp_once(dtype):
    # the sum reads exp(x - max) rounded to 16 bits, as eager holds it, the quotient unrounded:
    # rounding the sum's input once rounded the chain under it op by op too, a second exp per
    # element (H200, bf16 16384 x 4096: 75.8 against 63 us)
    def softmax(x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)

    report = check(softmax, torch.randn(6, 70, dtype=dtype) * 4, options=TRITON)
    persistent = report.kernels[0].source.split("if PERSISTENT:")[1].split("else:")[0]
    assert persistent.count("tl.exp(") == 1, persistent
    # looped, the sum's loop takes its terms without the subnormal fix-up (a term below 2^-126
    # is lost next to the max's 1), the store loop's exp keeps it
    x = torch.randn(6, 70, dtype=dtype) * 4
    x[1, :10] = -200.0  # exp(-200 - max) is 0 in both forms; eager's too
    x[2, :10] = -80.0  # 16-bit subnormal probabilities where dtype is bfloat16, stored as eager's
    src = check(softmax, x, options=LOOPED).kernels[0].source
    sum_loop, store_loop = src.split("else:")[1].split("for roffset")[2:4]
    assert "eh.exp_ftz(" in sum_loop and "tl.exp(" not in sum_loop, sum_loop
    assert "tl.exp(" in store_loop and "exp_ftz" not in store_loop, store_loop


def test_online_sums_sharing_a_max_each_accumulate():
    """A softmax and a logsumexp of one x: two sums (logsumexp's guard subtracts 0 for an
    infinite max) against one running max. The second sum used to stay 0 (logsumexp -inf)."""
    x = torch.randn(6, 70)
    x[2, 3] = float("inf")
    x[4] = float("-inf")
    report = check(lambda x: (torch.softmax(x, -1), torch.logsumexp(x, -1)), x, options=LOOPED)
    src = report.kernels[0].source
    assert src.count("m_new = eh.maximum") == 1 and len(re.findall(r"row_sumv\d+ = row_sumv\d+ \*", src)) == 2


@pytest.mark.parametrize("options", [TRITON, LOOPED], ids=["persistent", "looped"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reductions_of_loads_take_the_neutral_from_the_load(options, dtype):
    """A row max of x loads x with other=-inf and selects nothing per element; a sum of the same
    load (which reads -inf in masked-off lanes) keeps its own select, and so does a max of a
    computed value. Row lengths that leave masked lanes in every chunk (70, RBLOCK 16 or 128)."""
    def stats(x):
        return x.amax(-1), x.sum(-1), (x * 2).amin(-1), torch.softmax(x, -1)

    x = torch.randn(5, 70, dtype=dtype)
    x[1] = float("-inf")
    x[2, 3] = float("nan")
    x[3, 60:] = float("inf")
    report = check(stats, x, options=options)
    src = report.kernels[0].source
    loads = {line.strip() for line in src.splitlines() if "tl.load(arg0_1" in line}
    assert loads and all("xmask & rmask, other=float('-inf'))" in line for line in loads)
    assert re.search(r"tl.reduce\(v\d+, 1, eh.maximum\)|chunk = v\d+\n", src)  # the max: no select
    assert not re.search(r"tl.where\(xmask & rmask, v\d+, float\('-inf'\)\)", src)
    assert re.search(r"tl.where\(xmask & rmask, v\d+, 0\)", src)  # the sum of the same load selects 0
    assert re.search(r"tl.where\(xmask & rmask, v\d+, float\('inf'\)\)", src)  # min of x * 2 selects +inf
    # a sum or a column max straight over a load: the load's other is the neutral, no select
    report = check(lambda a: (a.sum(-1), a.amax(0)), torch.randn(9, 33, dtype=dtype), options=options)
    sources = "".join(k.source for k in report.kernels)
    assert "tl.where(" not in sources.replace("tl.where(m_new", "")
    assert "xmask & rmask, other=0)" in sources and "xmask & rmask, other=float('-inf'))" in sources


def test_full_reduction_combines_partials_from_many_programs():
    pred, _, padded = make_batch(8)  # (8 x 256 boxes: 32 programs of RBLOCK 64)
    report = check(padded_giou_loss, pred, padded, options={"target": "triton", "triton_launch": {"RBLOCK": 64}})
    src = report.kernels[0].source
    assert "atomic_add(COUNTER" in src and "if done == nprog - 1:" in src
    # integer partials travel as int64, every bit kept (a float64 slot would round these sums)
    big = torch.randint(2**53, 2**54, (300,))  # sums to ~2**62
    report = check(lambda a: (a.sum(), (a % 7).amax()), big,
                   options={"target": "triton", "triton_launch": {"RBLOCK": 16}})
    assert "tl.pointer_type(tl.int64)" in report.kernels[0].source


def _recording_grids(monkeypatch) -> list[tuple[str, tuple[int, ...]]]:
    """The (kernel, grid) of every first launch of a Triton kernel under the interpreter."""
    from triton.runtime.interpreter import InterpretedFunction

    grids: list[tuple[str, tuple[int, ...]]] = []
    original = InterpretedFunction.__getitem__

    def record(self, grid):
        grids.append((self.fn.__name__, tuple(grid)))
        return original(self, grid)

    monkeypatch.setattr(InterpretedFunction, "__getitem__", record)
    return grids


def test_short_full_reductions_spread_over_programs(monkeypatch):
    """A full reduction of a few thousand elements is latency, not bandwidth: 16 programs
    (triton_configs.FULL_PROGRAMS), not one, each combining into the last; the GIoU study's
    ragged loss (a search and gathers per box) among them."""
    grids = _recording_grids(monkeypatch)
    check(lambda a: (a * 2).sum(), torch.randn(2000), options={"target": "triton"})
    assert [g for _, g in grids] == [(16,)], grids
    grids.clear()
    pred, targets, _ = make_batch(256)
    boxes = ragged.from_list(targets)
    check(ragged_giou_loss, pred, boxes, options={"target": "triton"})
    (grid,) = [g for name, g in grids if "row_ids" in name]
    assert grid[0] == min(16, -(-boxes.total_length // 128)), (grid, boxes.total_length)


def layer_norm_with_grads(x, w, b, g):
    y = F.layer_norm(x, (x.shape[-1],), w, b)
    return torch.autograd.grad(y, (x, w, b), g)


@pytest.mark.parametrize("split", [2, 3, 8])
@pytest.mark.parametrize("case", ["column_sums", "int_columns", "bf16_max_nan", "few_long_rows", "layer_norm_grads",
                                  "logsumexp_online", "cross_entropy_online", "cross_entropy_mean",
                                  "column_sums_of_stored", "row_sums_of_stored"])
def test_rows_split_over_programs(case, split, monkeypatch):
    """Reductions split over several programs per row block (a weight gradient's column sums):
    partials, then the last program of the block combines them; counters reset for the next call."""
    grids = _recording_grids(monkeypatch)
    options = {"target": "triton", "triton_launch": {"SPLIT": split, "RBLOCK": 8, "XBLOCK": 4, "PERSISTENT": False}}
    if case == "column_sums":
        fn, args = (lambda x: (x.sum(0), (x * x).mean(0))), (torch.randn(203, 9),)
    elif case == "int_columns":
        fn, args = (lambda x: (x.sum(0), x.amin(0))), (torch.randint(-2**40, 2**40, (150, 6)),)
    elif case == "bf16_max_nan":
        x = torch.randn(77, 5).bfloat16()
        x[40, 2] = float("nan")
        fn, args = (lambda x: x.amax(0)), (x,)
    elif case == "few_long_rows":
        fn, args = (lambda x: x.sum(-1) * 2), (torch.randn(3, 500),)
    elif case == "column_sums_of_stored":
        # gelu's backward and its bias gradient: each slice stores its own elements as it sums them
        fn = lambda g, y: (lambda d: (d, d.sum(0)))(torch.ops.aten.gelu_backward(g * 3, y))  # noqa: E731
        args = (torch.randn(203, 9), torch.randn(203, 9))
    elif case == "row_sums_of_stored":
        fn, args = (lambda x: (lambda e: (e, e.sum(-1)))(torch.exp(x))), (torch.randn(3, 500),)
    elif case in ("logsumexp_online", "cross_entropy_online"):
        # online softmax split: each slice's (max, sum of exp), rescaled to the row's max
        x = torch.randn(6, 200) * 20
        x[0] = float("-inf")               # every slice empty of values
        x[1, :160] = float("-inf")         # slices with nothing above -inf, then values
        x[2, 7] = float("inf")             # logsumexp's guard: inf, as eager
        x[3, 120] = float("nan")
        if case == "logsumexp_online":
            fn, args = (lambda x: torch.logsumexp(x, -1)), (x,)
        else:
            fn, args = (lambda a, t: F.cross_entropy(a, t, reduction="none")), (x[1:], torch.randint(0, 200, (5,)))
    elif case == "cross_entropy_mean":
        # a mean over all rows after the split rows: the program finishing each row block adds
        # its share (the ignored target counts nothing)
        x, t = torch.randn(11, 200) * 5, torch.randint(0, 200, (11,))
        t[4] = -100
        fn, args = (lambda a, t: F.cross_entropy(a, t)), (x, t)
    else:
        # (32 rows: 4 chunks of RBLOCK 8 for the weight's column sums, slices past them empty at SPLIT 8)
        x, w, b = torch.randn(32, 12), torch.randn(12), torch.randn(12)
        fn, args = layer_norm_with_grads, (x.requires_grad_(), w.requires_grad_(), b.requires_grad_(),
                                           torch.randn(32, 12))
        options["triton_launch"]["only"] = "backward"
    report = ember.Report()
    fast = ember.compile(fn, options=options, report=report)
    for _ in range(2):  # the second call finds the counters the first one left
        torch.testing.assert_close(fast(*args), fn(*args), equal_nan=True, rtol=1e-5, atol=1e-5)
    assert any(grid[1:] == (split,) for _, grid in grids), grids
    if case.endswith("_online") or case == "cross_entropy_mean":  # one pass over each slice
        (k,) = report.kernels
        assert k.source.split("elif NPROG_BLOCK > 1:")[1].split("else:")[0].count("for roffset") == 1


def test_split_is_the_heuristics_choice_for_few_long_column_sums():
    from ember.runtime import triton_configs as tc

    hints = tc.KernelHints(itemsize=2, columns=True, splittable=True)
    (first, _) = tc.heuristic("rows", 4096, 16384, hints, sms=132)  # a (16384, 4096) weight gradient
    assert first["SPLIT"] >= 4 and -(-4096 // first["XBLOCK"]) * first["SPLIT"] >= 4 * 132
    (unsplit, _) = tc.heuristic("rows", 4096, 16384, tc.KernelHints(itemsize=2, columns=True), sms=132)
    assert "SPLIT" not in unsplit
    (many, _) = tc.heuristic("rows", 65536, 256, hints, sms=132)  # enough row blocks already
    assert "SPLIT" not in many


def test_few_long_rows_split_into_about_eight_programs_per_sm():
    from ember.runtime import triton_configs as tc
    hints = tc.KernelHints(itemsize=2, splittable=True)
    for rows, width in ((8, 4 << 20), (4, 16 << 20), (64, 1 << 20)):
        (first, _) = tc.heuristic("rows", rows, width, hints, sms=132)
        assert first["num_warps"] == 4 and first["num_stages"] == 3, first
        assert 4 * 132 <= rows * first["SPLIT"] <= 16 * 132, first
        assert width // first["SPLIT"] >= 4 * first["RBLOCK"], first  # every slice 4+ chunks long
    (many, _) = tc.heuristic("rows", 8192, 32000, hints, sms=132)  # a cross-entropy: rows enough
    assert "SPLIT" not in many


def test_few_wide_rows_take_one_warp_slices_or_wide_chunks():
    """Few wide rows only reduced split into 1-warp slices (no barrier per chunk for the online
    max and sum); few wide rows read and written (a softmax) take a row per program in wide
    chunks; many rows keep their tiles."""
    from ember.runtime import triton_configs as tc
    reduced = tc.KernelHints(itemsize=2, splittable=True, reduces=True)
    for rows, width in ((8, 128256), (64, 128256), (256, 32000)):
        (first, _) = tc.heuristic("rows", rows, width, reduced, sms=132)
        assert (first["num_warps"], first["RBLOCK"]) == (1, 512) and first["SPLIT"] >= 8, first
    written = tc.KernelHints(itemsize=2, writes_rows=True, reads_rows=True, reduces=True)
    for rows, width in ((8, 128256), (256, 32000)):
        (first, _) = tc.heuristic("rows", rows, width, written, sms=132)
        assert (first["XBLOCK"], first["RBLOCK"], first["num_warps"]) == (1, 8192, 16), first
    (many, _) = tc.heuristic("rows", 8192, 32000, written, sms=132)
    assert (many["RBLOCK"], many["num_warps"]) == (512, 8), many


def test_symbolic_sizes():
    report = ember.Report()
    fast = ember.compile(rmsnorm, dynamic=True, options=TRITON, report=report)
    for rows, cols in [(3, 8), (5, 40), (2, 129)]:
        x, w = torch.randn(rows, cols), torch.randn(cols)
        torch.testing.assert_close(fast(x, w), rmsnorm(x, w))
    assert len(report.graphs) == 1


def test_a_power_of_two_and_the_sizes_past_it_are_launched_alike():
    # A launch configuration serves the sizes up to one power of two: a persistent row block of
    # 512 holds rows of 257..512. The launches were bucketed by bit_length(), which puts 512 with
    # 513..1023, so rows of 515 after rows of 512 ran in 512-wide blocks: 3 columns never read,
    # silently wrong (a GPT's causal softmax came out NaN on a GPU).
    report = ember.Report()
    fast = ember.compile(lambda x: torch.softmax(x, -1) * 2, dynamic=True, options=TRITON, report=report)
    for rows, cols in [(3, 512), (3, 515), (64, 33), (65, 33)]:
        x = torch.randn(rows, cols)
        torch.testing.assert_close(fast(x), torch.softmax(x, -1) * 2)
    assert len(report.graphs) == 1


def test_a_float_read_with_item_is_a_double_argument(tmp_path):
    # Triton types a bare float argument as fp32: on a GPU, a float64 x.clamp(min=x.sum().item())
    # clamped to the sum rounded to float. The parameter is annotated, which Triton's launcher types as fp64.
    import importlib.util

    report = ember.Report()
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        fast = ember.compile(lambda a: a.clamp(min=a.sum().item()) * 3, options=TRITON, report=report)
        a = torch.full((8,), -0.0123456789012345, dtype=torch.float64)
        assert torch.equal(fast(a), a.clamp(min=a.sum().item()) * 3)
    kernel = report.kernels[-1]
    path = tmp_path / "item_kernel.py"
    path.write_text("import triton\nimport triton.language as tl\nfrom ember.runtime import triton_helpers as eh\n\n"
                    + kernel.source)
    spec = importlib.util.spec_from_file_location("item_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, kernel.name)  # (the interpreter's wrapper: its launcher's view is JITFunction's)
    types = {p.name: p.annotation_type for p in triton.runtime.jit.JITFunction(getattr(fn, "fn", fn)).params}
    floats = [name for name, t in types.items() if t == "fp64"]
    assert len(floats) == 1 and floats[0].startswith("zuf"), types


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiles Triton kernels for a GPU")
def test_new_specializations_compile_in_the_background():
    # Sizes of another alignment, or of another shape bucket, need another compiled kernel. After
    # a kernel's first compile, those compile in a background thread while the call runs through
    # ATen: no call waits seconds for Triton as the sequence length changes.
    report = ember.Report()
    fast = ember.compile(lambda x: torch.softmax(x, -1) * 2, dynamic=True, report=report,
                         options={"gpu_backend": "triton", "background_compile": True})
    before = ember.stats()["calls_while_compiling"]
    for cols, in_background in [(512, False), (515, True), (515, False), (520, True), (528, True), (1000, False)]:
        x = torch.randn(64, cols, device="cuda")
        torch.testing.assert_close(fast(x), torch.softmax(x, -1) * 2)
        now = ember.stats()["calls_while_compiling"]
        assert now - before == int(in_background), cols
        before = now
        assert ember.wait_for_kernels(timeout=60)
    assert len(report.graphs) == 1 and all(k.built for k in report.kernels)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiles Triton kernels for a GPU")
def test_training_graphs_compile_new_specializations_at_the_call():
    # ... except in training: there a group run through ATen rounds otherwise than the kernel
    # recomputing it (a max and the backward's recomputed input matched nowhere: NaN gradients)
    fn = lambda x: ragged.segment_max(ragged.Ragged(F.normalize(x.values, dim=-1), x.offsets))  # noqa: E731
    fast = ember.compile(fn, dynamic=True, options={"gpu_backend": "triton", "background_compile": True})
    before = ember.stats()["calls_while_compiling"]
    for lengths in ([3, 9, 1], [30, 0, 200, 7, 64], [1000, 3]):
        parts = [torch.randn(n, 17, device="cuda", requires_grad=True) for n in lengths]
        x = ragged.from_list(parts)
        values = x.values.detach().requires_grad_(True)
        x = ragged.Ragged(values, x.offsets)
        up = torch.randn(len(lengths), 17, device="cuda")
        (got,) = torch.autograd.grad((fast(x) * up).sum(), values)
        ref = values.detach().clone().requires_grad_(True)
        (expected,) = torch.autograd.grad((fn(ragged.Ragged(ref, x.offsets)) * up).sum(), ref)
        torch.testing.assert_close(got, expected)
    assert ember.stats()["calls_while_compiling"] == before


def test_training_graphs_build_without_background_compiles(monkeypatch):
    from ember import driver
    seen = []
    original = driver.get_backend

    def spy(name):
        backend = original(name)

        class Spy:
            def build(self, kernels, cfg, fallbacks=None):
                seen.append(cfg.background_compile)
                return backend.build(kernels, cfg, fallbacks)
        return Spy()
    monkeypatch.setattr(driver, "get_backend", spy)
    x = torch.randn(4, 8, requires_grad=True)
    fast = ember.compile(lambda x: (x.exp() / x.sum(-1, keepdim=True)).amax(-1), options={"background_compile": True})
    fast(x).sum().backward()
    assert seen == [False, False]  # the forward's and the backward's
    seen.clear()
    with torch.no_grad():
        ember.compile(lambda x: x.exp() * 3, options={"background_compile": True})(x)
    assert seen == [True]  # inference keeps compiling new variants in the background


OPS = ["abs", "exp", "log1p", "tanh", "sigmoid", "erf", "round", "trunc", "sign", "nn.functional.gelu",
       "add", "mul", "div", "floor_divide", "remainder", "pow", "maximum", "where", "clamp", "bitwise_xor",
       "sum", "amax", "argmin", "var", "softmax", "log_softmax", "nn.functional.layer_norm", "any",
       "index_put", "index_add", "scatter_add"]


@pytest.mark.parametrize("op", [o for o in op_db if o.name in OPS and not o.variant_test_name],
                         ids=lambda o: o.name)
def test_opinfo_samples_through_triton(op):
    dtypes = [d for d in (torch.float32, torch.bfloat16, torch.int64) if d in op.supported_dtypes("cpu")]
    check_op(op, dtypes, options=TRITON)


def test_explain_renders_gpu_kernels_on_a_cpu_machine():
    report = ember.explain(rmsnorm, torch.randn(8, 32), torch.randn(32), target="triton")
    (k,) = report.kernels
    assert k.backend == "triton" and "def fused_" in k.source and "tl.reduce(" in k.source


def test_launch_failure_falls_back_once(monkeypatch):
    from ember.runtime import triton_backend

    def broken(self, *args, **kwargs):
        raise RuntimeError("simulated Triton compile error")

    monkeypatch.setattr(triton_backend.Launcher, "candidates", broken)
    x = torch.randn(5, 6)
    fast = ember.compile(lambda a: a.exp() * 2, options=TRITON)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(fast(x), x.exp() * 2)
        torch.testing.assert_close(fast(x), x.exp() * 2)
    assert len([w for w in caught if "failed to compile or launch" in str(w.message)]) == 1


# ---- every generated kernel must compile for the GPU, not only run in the interpreter -----------

_SHORT = {"f32": "*fp32", "f64": "*fp64", "bf16": "*bf16", "f16": "*fp16", "i64": "*i64", "i32": "*i32",
          "i16": "*i16", "i8": "*i8", "u8": "*u8", "b8": "*i1"}

_KERNELS = """
import importlib.util, json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


def kernels(jobs):
    for job in jobs:
        spec = importlib.util.spec_from_file_location(job["module"], job["path"])
        module = importlib.util.module_from_spec(spec)
        sys.modules[job["module"]] = module
        spec.loader.exec_module(module)
        for kernel in job["kernels"]:
            yield getattr(module, kernel["name"]), kernel
"""

_COMPILER = _KERNELS + """
done = 0
for fn, kernel in kernels(json.load(open(sys.argv[1]))):
    for variant in kernel["variants"]:
        options = {k: variant.pop(k) for k in ("num_warps", "num_stages") if k in variant}
        triton.compile(ASTSource(fn=fn, signature=kernel["signature"], constexprs=variant),
                       target=GPUTarget("cuda", 90, 32), options=options)
        done += 1
print(done)
"""


def _compile_jobs(report, tmp_path, tag):
    """Describe each kernel of ``report`` for the sm_90 compile: argument types and every launch
    variant (persistent and looped rows, many-program full reductions)."""
    source = "import triton\nimport triton.language as tl\nfrom ember.runtime import triton_helpers as eh\n\n"
    source += "\n\n".join(k.source for k in report.kernels)
    path = tmp_path / f"kernels_{tag}.py"
    path.write_text(source)
    kernels = []
    for k in report.kernels:
        header = k.kernel_ir.splitlines()[0]
        params = dict(p.replace("out ", "").split(": ") for p in header.split("(", 1)[1].split(";")[0].split(", ") if p)
        signature = {name: _SHORT[dtype] for name, dtype in params.items()}
        for size in header.split("; sizes ", 1)[1].rstrip(")").split(", "):
            if size != "-":
                signature[size] = "fp64" if size.startswith("zuf") else "i32"  # (a float .item())
        signature.update(OUTER="i32", INNER="i32", WORKSPACE="*fp64", COUNTER="*i32", BIG="constexpr",
                         XBLOCK="constexpr", RBLOCK="constexpr", PERSISTENT="constexpr", NPROG_BLOCK="constexpr")
        kind = k.source.splitlines()[1].rsplit(", ", 1)[-1]
        if kind == "rows":
            variants = [dict(BIG=False, XBLOCK=2, RBLOCK=128, PERSISTENT=p, NPROG_BLOCK=1) for p in (True, False)]
            if "elif NPROG_BLOCK > 1:" in k.source:  # rows split over programs
                variants.append(dict(BIG=False, XBLOCK=2, RBLOCK=128, PERSISTENT=False, NPROG_BLOCK=4))
            if "row_max" in k.source:  # online softmax in small looped tiles, as the heuristic
                # picks for short rows: these crashed Triton 3.6's thread-locality pass (fp32)
                variants += [dict(BIG=False, XBLOCK=1, RBLOCK=16, PERSISTENT=False, NPROG_BLOCK=1,
                                  num_warps=4, num_stages=1),
                             dict(BIG=False, XBLOCK=4, RBLOCK=4, PERSISTENT=False, NPROG_BLOCK=1,
                                  num_warps=8, num_stages=2)]
        elif kind == "full":
            variants = [dict(BIG=True, XBLOCK=1, RBLOCK=1024, PERSISTENT=False, NPROG_BLOCK=64)]
        elif kind == "tiles":
            variants = [dict(BIG=False, XBLOCK=64, RBLOCK=64, PERSISTENT=False, NPROG_BLOCK=1, num_warps=8)]
        else:
            variants = [dict(BIG=False, XBLOCK=1024, RBLOCK=1, PERSISTENT=False, NPROG_BLOCK=1)]
        # symbolic sizes: launched divided by their power-of-two divisors, 1 and 8 here
        aligns = re.findall(r"(ALIGN_\w+): tl.constexpr", k.source)
        signature.update((name, "constexpr") for name in aligns)
        if aligns:
            variants = [v | {name: a for name in aligns} for v in variants for a in (1, 8)]
        kernels.append({"name": k.name, "signature": signature, "variants": variants})
    return {"module": f"ember_sm90_{tag}", "path": str(path), "kernels": kernels}


def test_every_kernel_compiles_for_sm90(tmp_path):
    """The interpreter runs kernels on the CPU; this compiles the same sources for Hopper with
    Triton's compiler (in a process without TRITON_INTERPRET, so libdevice math is used).
    Kernels identical but for their names, with the same signature and variants, compile once."""
    import json
    import os
    import subprocess
    import sys

    jobs, seen = [], set()

    def add(report, tag):
        job, kept = _compile_jobs(report, tmp_path, tag), []
        for k, kernel in zip(report.kernels, job["kernels"]):
            key = json.dumps([re.sub(rf"\b{k.name}\b", "K", k.source), kernel["signature"], kernel["variants"]])
            if key not in seen:
                seen.add(key)
                kept.append(kernel)
        jobs.append(job | {"kernels": kept})
    for i, (name, (fn, make)) in enumerate(CASES.items()):
        add(rendered(fn, *make()), f"{i}_{name}")
    # and the kernels of the OpInfo sweep above, in every dtype it runs
    for i, op in enumerate(o for o in op_db if o.name in OPS and not o.variant_test_name):
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.bool):
            if dtype not in op.supported_dtypes("cpu"):
                continue
            samples = _samples(op, dtype)[:2]  # (two samples a dtype: the kernels of the rest are alike)
            tensors = [flat[p] for flat, _, positions, _ in samples for p in positions]
            report = rendered(_program(op, samples), *tensors)
            if report.kernels:
                add(report, f"op{i}_{dtype}".replace("torch.", ""))
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    script = tmp_path / "compile.py"
    script.write_text(_COMPILER)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "jobs.json")], capture_output=True,
                          text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert int(proc.stdout.strip().splitlines()[-1]) >= sum(len(j["kernels"]) for j in jobs)


_VECTOR_LOADS = _KERNELS + """
for fn, kernel in kernels([json.load(open(path)) for path in sys.argv[1:]]):
    variant = kernel["variants"][0]
    options = {k: variant.pop(k, 4 if k == "num_warps" else 1) for k in ("num_warps", "num_stages")}
    names = list(kernel["signature"])
    # as launched: 16-byte aligned tensors; sizes that are no multiple of 16 get no hint
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if kernel["signature"][n].startswith("*")}
    ptx = triton.compile(ASTSource(fn=fn, signature=kernel["signature"], constexprs=variant, attrs=attrs),
                         target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
    print(kernel["name"], len(re.findall(r"ld\\.global\\.v4\\.b32", ptx)), len(re.findall(r"ld\\.global\\.b16", ptx)),
          len(re.findall(r"@%p\\d+ ld\\.global", ptx)))
"""


def _ptx_loads(tmp_path, *cases: tuple) -> list[tuple[int, int, int]]:
    """Compile the one kernel of each ``(report, tag, variant)`` case for sm_90 (no GPU needed)
    at launch ``variant`` and count its global loads in the PTX: 16-byte ones, 2-byte ones, and
    those behind a predicate. One process compiles them all (starting one costs seconds)."""
    import json
    import os
    import subprocess
    import sys

    paths = []
    for report, tag, variant in cases:
        (k,) = report.kernels
        job = _compile_jobs(report, tmp_path, tag)
        aligns = {name: 8 for name in re.findall(r"(ALIGN_\w+): tl.constexpr", k.source)}  # 1000 = 8 * 125
        for kernel in job["kernels"]:
            kernel["variants"] = [variant | dict(BIG=False, NPROG_BLOCK=1) | aligns]
        paths.append(tmp_path / f"job_{tag}.json")
        paths[-1].write_text(json.dumps(job))
    (tmp_path / "vectors.py").write_text(_VECTOR_LOADS)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(tmp_path / "vectors.py"), *map(str, paths)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.split("\n")
    counts = [tuple(int(n) for n in line.split()[1:]) for line in lines if line.strip()]
    assert len(counts) == len(cases), proc.stdout
    return counts


def test_odd_sizes_still_load_16_bytes_at_a_time(tmp_path):
    """Triton vectorizes a masked load only as far as it can prove the mask constant: rows of
    1000 bf16 and a tensor of 4095 elements were read 2 bytes an instruction. A static row length
    is now a literal in the mask, and a pointwise kernel's whole blocks run unmasked. A transpose
    in 1D blocks read 2 bytes a lane from a different row; in 2D tiles it reads 16. Symbolic sizes
    arrive divided by their power-of-two divisors, which the kernel multiplies back."""
    bf16 = torch.bfloat16
    cases = [(lambda x: torch.softmax(x, -1), (torch.randn(64, 1000, dtype=bf16),)),
             (torch.add, (torch.randn(4095, dtype=bf16), torch.randn(4095, dtype=bf16))),
             (lambda x: (x.t() * 2).contiguous(), (torch.randn(256, 256, dtype=bf16),)),
             (lambda x: torch.softmax(x, -1), (torch.randn(64, 1000, dtype=bf16),))]
    variants = [dict(XBLOCK=4, RBLOCK=1024, PERSISTENT=True, num_warps=4),  # the heuristic's tiles
                dict(XBLOCK=1024, RBLOCK=1, PERSISTENT=False, num_warps=4),
                dict(XBLOCK=64, RBLOCK=64, PERSISTENT=False, num_warps=8),
                dict(XBLOCK=4, RBLOCK=1024, PERSISTENT=True, num_warps=4)]
    compiles = []
    for i, (fn, args) in enumerate(cases):
        report = rendered(fn, *args, dynamic=i == 3)
        expected = ("rmask = eh.below(rindex, 1000, RBLOCK)", "xmask = tl.full([XBLOCK], 1, tl.int1)", "tile = ",
                    "* ALIGN_INNER")[i]
        assert expected in report.kernels[0].source, report.kernels[0].source
        compiles.append((report, f"vec{i}", variants[i]))
    counts = [c[:2] for c in _ptx_loads(tmp_path, *compiles)]
    # softmax: 4 rows x 1024 lanes over 128 threads, 32 elements a thread in 16-byte loads
    assert counts[0] == (4, 0), counts
    # the add: two inputs, 8 elements a thread, each one 16-byte load in whole blocks, and
    # 2-byte loads only in the last block's branch
    assert counts[1][0] == 2 and counts[1][1] == 16, counts
    # the transpose: a 64 x 64 tile over 256 threads, 16 elements a thread; read along its rows,
    # written along its columns, both 16 bytes at a time (Triton transposes through shared memory)
    assert counts[2] == (2, 0), counts
    # the softmax with a symbolic width and row stride: launched as quotients by 8, 16-byte loads
    assert counts[3] == (4, 0), counts


@triton.jit
def _masks(out, BOUND: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + i, eh.below(i, BOUND, BLOCK).to(tl.int8))


def test_exact_block_masks_keep_empty_extents_masked():
    """eh.below drops a mask only where the grid's cdiv(bound, block) blocks tile the bound
    exactly; a bound of 0 (a mean over no rows still launches a program) masks everything."""
    for bound in (0, 64, 100):
        out = torch.full((128,), 7, dtype=torch.int8)
        programs = max(1, -(-bound // 64))
        _masks[(programs,)](out, bound, 64)
        assert out.tolist() == [1] * bound + [0] * (64 * programs - bound) + [7] * (128 - 64 * programs)


def test_row_kernels_mask_only_what_may_fall_outside(tmp_path):
    """A norm's weight is the same for every row of a tile: it loads once, [1, RBLOCK], not once
    per row. Rows and blocks that tile their static extents exactly carry no mask at all."""
    bf16 = torch.bfloat16

    def layer_norm(x, w, b):
        return F.layer_norm(x, (x.shape[-1],), w, b)

    odd = rendered(layer_norm, torch.randn(64, 999, dtype=bf16), torch.randn(999, dtype=bf16),
                   torch.randn(999, dtype=bf16))
    assert re.search(r"tl\.load\(arg1_1 \+ \(r0\), rmask, ", odd.kernels[0].source), odd.kernels[0].source
    exact = rendered(layer_norm, torch.randn(64, 4096, dtype=bf16), torch.randn(4096, dtype=bf16),
                     torch.randn(4096, dtype=bf16))
    assert "xmask = eh.below(xindex, 64, XBLOCK)" in exact.kernels[0].source
    (v4, scalar, _), exact_counts, partial = _ptx_loads(
        tmp_path, (odd, "odd", dict(XBLOCK=4, RBLOCK=1024, PERSISTENT=True, num_warps=4)),
        (exact, "exact", dict(XBLOCK=1, RBLOCK=4096, PERSISTENT=True, num_warps=8)),
        (exact, "partial", dict(XBLOCK=128, RBLOCK=32, PERSISTENT=False, num_warps=4)))
    # rows of 999 start at odd addresses: 2-byte loads, 32 a thread for x (4 rows x 1024 lanes
    # over 128 threads) and 8 each for the weight and the bias, where each took 32 as x does
    assert (v4, scalar) == (0, 48), (v4, scalar)
    # 16 elements a thread for x, the weight and the bias: 2 16-byte loads each, none predicated
    assert exact_counts == (6, 0, 0), exact_counts
    # a block past the rows (64 rows in blocks of 128) keeps its mask
    assert partial[2] > 0


def test_symbolic_sizes_launch_as_quotients_by_their_power_of_two_divisors():
    from ember.runtime.triton_backend import _align

    assert [_align(v) for v in (1000, 48, 7, 2, 0, 1 << 20)] == [8, 16, 1, 2, 16, 16]
    assert _align((1 << 31) + 8) == 1  # a quotient Triton could type as int32 would overflow


def test_strided_views_reaching_past_2_to_the_31_take_64_bit_offsets():
    from ember.runtime.triton_matmul import needs_int64_offsets

    # (meta tensors: the shapes and strides of 8 GiB bases, no memory)
    wide = torch.empty(2**20, 4096, device="meta")
    # 2^21 elements, but the last one is 2^32 - 4095 elements past the first: int32 offsets
    # (row * 4096) wrapped negative, as the launch looked at the element count alone
    assert needs_int64_offsets(wide[:, :2])
    assert needs_int64_offsets(wide.t()[:3])
    assert needs_int64_offsets(torch.empty(2**31, device="meta"))
    assert not needs_int64_offsets(wide[:2**19 - 1, :1])  # its last offset, 2^31 - 8192, fits
    assert not needs_int64_offsets(torch.empty(2**20, device="meta").expand(1024, 2**20))
    assert not needs_int64_offsets(wide[:0])


@pytest.mark.parametrize("fn, make, options", [
    (lambda x: x.argmax(0), lambda: torch.randn(1, 5).expand(4, 5), TRITON),
    (lambda x: x.max(1), lambda: torch.randn(5, 1).expand(5, 6), TRITON),
    (lambda v: (v[:, None] + torch.zeros(1, 5)).argmin(1), lambda: torch.randn(4), TRITON),
    (lambda x: torch.zeros_like(x).argmax(1), lambda: torch.randn(3, 7), TRITON),
    # (rows of 50 in 4 chunks of 16, the last masked; the tuned launch of rows of 5000 was
    # persistent, an 8192-wide tile, as expanded_columns', and took 40 s interpreted)
    (lambda x: x.expand(3, 50).argmin(1), lambda: torch.randn(3, 1), LOOPED),
], ids=["expanded_rows", "expanded_columns", "broadcast_sum", "constant", "looped"])
def test_argmax_of_values_constant_along_the_reduction(fn, make, options):
    # the positions were broadcast to the source's shape, one column where it does not vary along
    # the reduction, while the masked values fill the tile: Triton refused the kernel
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="ember", category=RuntimeWarning)  # (no fallback)
        check(fn, make(), options=options)


def test_bitwise_not_of_unsigned_bytes():
    # ~a of a uint8 made the interpreter build -1 in uint8 (OverflowError): the kernel fell back
    a = torch.tensor([0, 1, 200, 255], dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check(lambda a: (~a) + 1, a, options={"target": "triton"})


def test_negative_zero_keeps_its_sign():
    # tl.full(-0.0) is a null constant (+0.0) and Triton's unary minus is 0 - x: -0.0 constants
    # and -x of +0.0 lost their sign
    x = torch.tensor([0.0, -0.0, 1.5, float("nan"), -float("inf")])
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        fn = lambda x: (x * -0.0, torch.full_like(x, -0.0), torch.where(x > 0, x, -0.0), -x)  # noqa: E731
        out, ref = ember.compile(fn, options=TRITON)(x.to(dtype)), fn(x.to(dtype))
        for o, r in zip(out, ref):
            assert torch.equal(o.signbit() & ~o.isnan(), r.signbit() & ~r.isnan()), (dtype, o, r)


def test_aranges_past_int32():
    # an arange's values were computed from the int32 index: past 2**31 they wrapped negative,
    # and a start past int32 failed to compile (the kernel fell back to ATen)
    fn = lambda x: (torch.arange(2**31 - 2, 2**31 + 3) + x, torch.arange(0, 5 * 2**30, 2**30) * 1.0,  # noqa: E731
                    torch.arange(-2**40, -2**40 + 5) - x)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="ember", category=RuntimeWarning)  # (no fallback)
        check(fn, torch.zeros(5, dtype=torch.int64), options=TRITON)
