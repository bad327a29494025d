"""Triton launch configurations: the shape heuristic (one compile per kernel and shape bucket),
full tuning behind ``triton_tuning="full"``, and the launcher's fallback to a safer configuration.
CPU-only: the heuristic is plain arithmetic, kernels come from ``explain``, and launches go to a
fake kernel."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
import torch.nn.functional as F

import ember
from ember import ragged
from ember.config import Config
from ember.runtime import triton_backend, triton_tuner
from ember.runtime import triton_configs as tc
from ember.workloads.giou import make_batch, ragged_giou_loss

from .conftest import DEVICE
from .helpers import compile_for_sm90, on_the_interpreter, record_rendered

ROWS = tc.KernelHints(itemsize=2)                        # norms, softmax, cross-entropy: reduce
ROWS_WRITTEN = tc.KernelHints(itemsize=2, writes_rows=True)  # and write the row
SMS = 132



def first(kind, outer, inner, hints, sms=SMS):
    return tc.heuristic(kind, outer, inner, hints, sms)[0]


def test_heuristic_matches_what_full_tuning_chose_on_an_h200():
    # bench/gpu_fusion.py shapes; full tuning's winners (or within 1%) on an H200, 2026-11-22
    assert first("pointwise", 64 << 20, 1, tc.KernelHints(itemsize=4)) == dict(
        XBLOCK=512, RBLOCK=1, num_warps=4, PERSISTENT=False, num_stages=1)
    assert first("pointwise", 128 << 20, 1, tc.KernelHints(itemsize=2))["XBLOCK"] == 1024
    # RMSNorm, LayerNorm, softmax 16384 x 4096 bf16 and their backward: whole rows in registers
    for hints in (ROWS, ROWS_WRITTEN):
        assert first("rows", 16384, 4096, hints) == dict(XBLOCK=1, RBLOCK=4096, num_warps=8, PERSISTENT=True,
                                                         num_stages=1)
    # cross-entropy 8192 x 32000: one warp per row looping over 1024-wide chunks, pipelined
    assert first("rows", 8192, 32000, ROWS) == dict(XBLOCK=1, RBLOCK=1024, num_warps=1, PERSISTENT=False,
                                                    num_stages=3)
    # ... and at 1024 rows (under 8 an SM), 4 warps of 16 elements each (lse_vocab_1024)
    assert first("rows", 1024, 32000, ROWS) == dict(XBLOCK=1, RBLOCK=2048, num_warps=4, PERSISTENT=False,
                                                    num_stages=3)
    # its backward reads each row once, from the row's saved statistics, and writes it: a row per
    # program in 8192-wide chunks (passes/onehot.py left it no reduction)
    assert first("rows", 8192, 32000, tc.KernelHints(itemsize=2, writes_rows=True, reduces=False)) == dict(
        XBLOCK=1, RBLOCK=8192, num_warps=8, PERSISTENT=False, num_stages=2)
    # rows read twice and written (a log-softmax backward that sums its rows): four rows per program
    assert first("rows", 8192, 32000, ROWS_WRITTEN) == dict(XBLOCK=4, RBLOCK=512, num_warps=8, PERSISTENT=False,
                                                            num_stages=2)
    # a softmax over many wide rows (its max and sum in one loop, then its store loop): a row
    # per program in 8192-wide chunks, 16 warps (H100, 2048 x 50257 and 8192 x 32000 bf16)
    assert first("rows", 2048, 50257, tc.KernelHints(itemsize=2, writes_rows=True, online=True)) == dict(
        XBLOCK=1, RBLOCK=8192, num_warps=16, PERSISTENT=False, num_stages=1)
    # its loss: one full reduction over 8192 rows
    assert first("full", 1, 8192, tc.KernelHints()) == dict(XBLOCK=1, RBLOCK=2048, num_warps=8,
                                                            PERSISTENT=False, num_stages=1)
    # a short one whose programs combine their partials: 16 programs (latency, not bandwidth)
    spread = tc.KernelHints(splittable=True)
    assert first("full", 1, 2000, spread) == dict(XBLOCK=1, RBLOCK=128, num_warps=2, PERSISTENT=False, num_stages=1)
    assert first("full", 1, 8192, spread)["RBLOCK"] == 512
    assert first("full", 1, 1 << 26, spread) == first("full", 1, 1 << 26, tc.KernelHints())
    # a bias gradient (sum over 16384 rows of 4096 columns): 16 columns per program
    assert first("rows", 4096, 16384, tc.KernelHints(itemsize=2, columns=True)) == dict(
        XBLOCK=16, RBLOCK=512, num_warps=8, PERSISTENT=False, num_stages=2)
    # split over programs where the rows are long (a weight's gradient over 16384 rows), not
    # into 2 or 4 slices (a norm's partial sums over 528 or 1056 runs: 16-column tiles)
    long_sums = tc.KernelHints(itemsize=4, columns=True, splittable=True)
    assert first("rows", 4096, 16384, long_sums)["SPLIT"] == 16
    assert first("rows", 4096, 2112, long_sums)["SPLIT"] == 8
    for runs in (264, 528, 1056):
        assert first("rows", 4096, runs, long_sums) == dict(
            XBLOCK=16, RBLOCK=512, num_warps=8, PERSISTENT=False, num_stages=2), runs
    # column sums over 256 x 768: columns to spare, so 128 per program
    assert first("rows", 256 * 768, 256, tc.KernelHints(itemsize=2, columns=True))["XBLOCK"] == 128
    # pooling 256 documents of 768 features (segment sums): 32 columns by 64 rows of the
    # segments, 2 warps, 64 bytes of loads in flight per thread (bench/launch_sweep.py RAGGED)
    segments = tc.KernelHints(itemsize=2, columns=True, segments=True, splittable=True)
    assert first("rows", 256 * 768, 512, segments) == dict(
        XBLOCK=32, RBLOCK=64, num_warps=2, PERSISTENT=False, num_stages=1)
    # four long documents: 48 row blocks, each split over 16 programs
    assert first("rows", 4 * 768, 16384, segments)["SPLIT"] == 16
    # scans over 4096-wide rows: a row per program in chunks of 2048 (16 bits) or 1024, 4 warps
    # (bench/scan_sweep.sh); narrow rows are packed as any rows', very long ones loop as any rows'
    scans = tc.KernelHints(itemsize=2, writes_rows=True, reduces=False, scans=True)
    assert first("rows", 16384, 4096, scans) == dict(XBLOCK=1, RBLOCK=2048, num_warps=4, PERSISTENT=False,
                                                     num_stages=1)
    assert first("rows", 4096, 4096, tc.KernelHints(writes_rows=True, reduces=False, scans=True))["RBLOCK"] == 1024
    assert first("rows", 1 << 20, 64, scans) == first("rows", 1 << 20, 64, ROWS_WRITTEN)
    assert first("rows", 8, 1 << 20, scans)["RBLOCK"] == 8192
    # rows as wide as a vocabulary: as a hidden size's where they fill the SMs, else long chunks
    assert first("rows", 1024, 32000, scans)["RBLOCK"] == 2048 and first("rows", 64, 32000, scans)["RBLOCK"] == 8192


def test_rows_of_a_hidden_size_take_programs_of_one_or_two_warps():
    # 512 to 2048 wide: programs of 1024-2048 padded elements, the row whole, a warp per 512 real
    # elements up to two (rows of 768, padded to 1024, take one; 1536 and 2048 take two)
    expected = {512: (2, 2), 768: (1, 1), 1000: (1, 1), 1024: (1, 2), 1536: (1, 2), 2048: (1, 2)}
    for width, (rows, warps) in expected.items():
        for hints in (ROWS, ROWS_WRITTEN, tc.KernelHints(itemsize=4, writes_rows=True)):
            config = first("rows", 65536, width, hints)
            assert (config["XBLOCK"], config["num_warps"], config["PERSISTENT"]) == (rows, warps, True), (width, config)
    # a chunked kernel (a norm's backward adding its weight gradient) keeps the tiles: its
    # programs hold their run's column partials too
    chunked = tc.KernelHints(itemsize=2, writes_rows=True, chunks=True)
    assert first("rows", 65536, 768, chunked) == dict(XBLOCK=4, RBLOCK=1024, num_warps=4, PERSISTENT=True,
                                                      num_stages=1)
    # fewer rows than two programs an SM: a row a program
    assert first("rows", 200, 512, ROWS)["XBLOCK"] == 1
    # narrower and wider rows keep the 4096-element tiles
    assert first("rows", 65536, 256, ROWS)["XBLOCK"] == 16 and first("rows", 16384, 4096, ROWS)["num_warps"] == 8


def test_heuristic_keeps_the_gpu_busy_and_rows_whole():
    # narrow rows are packed into one program, unless that leaves SMs idle
    assert first("rows", 1 << 20, 64, ROWS)["XBLOCK"] == 64
    assert first("rows", 300, 64, ROWS)["XBLOCK"] == 1
    assert first("rows", 65536, 256, ROWS)["XBLOCK"] == 16
    assert first("rows", 65536, 256, ROWS, sms=4096)["XBLOCK"] == 8
    assert first("rows", 300, 32000, ROWS_WRITTEN)["XBLOCK"] == 1
    # warps count a row's real elements, not its padding: rows of 5120 (padded to 8192) take 8
    # warps, as 4096 do
    assert first("rows", 16384, 5120, ROWS)["num_warps"] == first("rows", 16384, 4096, ROWS)["num_warps"] == 8
    # rows up to 16384 wide stay whole; wider rows loop
    assert first("rows", 4096, 16384, ROWS)["PERSISTENT"] and first("rows", 4096, 16384, ROWS)["num_warps"] == 32
    assert not first("rows", 4096, 16385, ROWS)["PERSISTENT"]
    # few wide rows: more warps per row, wider chunks
    few = first("rows", 64, 1 << 20, ROWS)
    assert few["num_warps"] == 16 and few["RBLOCK"] == 4096 and few["XBLOCK"] == 1
    # narrow rows reduced over all rows too (a loss's mean): 2-warp programs of 2048 elements
    over_rows = tc.KernelHints(itemsize=4, over_rows=True)
    assert first("rows", 1 << 20, 10, over_rows) == dict(XBLOCK=128, RBLOCK=16, num_warps=2, PERSISTENT=True,
                                                        num_stages=1)
    assert first("rows", 1 << 16, 1000, over_rows)["XBLOCK"] == 2 and first("rows", 1 << 16, 1000, ROWS)["XBLOCK"] == 1
    assert first("rows", 300, 100, over_rows)["XBLOCK"] == 1  # (every SM still gets programs)
    assert first("rows", 8192, 4096, over_rows) == first("rows", 8192, 4096, ROWS)  # wider: as any rows
    # tiny pointwise kernels get a tiny block
    assert first("pointwise", 10, 1, tc.KernelHints(itemsize=4)) == dict(XBLOCK=64, RBLOCK=1, num_warps=1,
                                                                         PERSISTENT=False, num_stages=1)


@pytest.mark.parametrize("kind", ["pointwise", "rows", "full", "tiles"])
def test_heuristic_configs_are_valid_for_any_shape(kind):
    sizes = [1, 2, 3, 7, 16, 100, 129, 1000, 4096, 5000, 16384, 32000, 65536, 1 << 20, 3 << 24]
    hints = [tc.KernelHints(itemsize=b, columns=c, writes_rows=s)
             for b, c, s in itertools.product((1, 2, 4, 8), (False, True), (False, True))]
    for outer, inner, h in itertools.product(sizes, sizes, hints):
        if kind == "full":
            outer = 1
        configs = tc.heuristic(kind, outer, inner, h, SMS)
        assert 1 <= len(configs) <= 2
        for c in configs:
            for k in ("XBLOCK", "RBLOCK", "num_warps"):
                assert c[k] >= 1 and c[k] & (c[k] - 1) == 0, (kind, outer, inner, h, c)
            # at most 16 elements per thread (compile time grows with them), except one-warp rows
            # and column sums (32, as full tuning chose), and rows in registers padded to a power
            # of two (their warps count the real elements: 16 to 32 a thread)
            padded = c["PERSISTENT"] and inner & (inner - 1) != 0
            per_thread = 32 if c["num_warps"] == 1 or (h.columns and kind == "rows") or padded else 16
            assert c["XBLOCK"] * c["RBLOCK"] <= 32 * c["num_warps"] * per_thread, (kind, outer, inner, h, c)
            assert c["num_warps"] <= 32 and c["XBLOCK"] * c["RBLOCK"] <= tc.MAX_PERSISTENT * 4
            if c["PERSISTENT"]:  # the whole row must fit the block
                assert c["RBLOCK"] >= inner and c["XBLOCK"] * c["RBLOCK"] <= tc.MAX_PERSISTENT
            if kind == "rows":
                assert c["XBLOCK"] <= tc.next_pow2(outer)
        assert not configs[-1]["PERSISTENT"]  # the fallback never needs a whole row in registers


def test_full_tuning_offers_every_candidate_heuristic_one():
    h = ROWS
    heuristic = tc.candidates("rows", 16384, 4096, h, "heuristic", SMS)
    full = tc.candidates("rows", 16384, 4096, h, "full", SMS)
    assert heuristic == tc.heuristic("rows", 16384, 4096, h, SMS)
    assert full[0] == heuristic[0] and len(full) >= 15
    assert len({tuple(sorted({"num_stages": 1, **c}.items())) for c in full}) == len(full)  # no duplicates
    # a kernel that adds into its output must run once per call: never timed, even with "full"
    adds = tc.KernelHints(accumulates=True)
    assert tc.candidates("pointwise", 1 << 20, 1, adds, "full", SMS) == tc.heuristic("pointwise", 1 << 20, 1, adds)
    # forced parameters (tests use them to reach every code path) filter or override
    forced = tc.candidates("rows", 64, 256, ROWS, "heuristic", SMS, {"PERSISTENT": False, "RBLOCK": 16})
    assert forced[0]["PERSISTENT"] is False and forced[0]["RBLOCK"] == 16
    # a forced XBLOCK past a kernel's rows is cut to them: a full reduction's one row failed
    # to compile with XBLOCK 4 (its stores are [1, 1])
    assert all(c["XBLOCK"] == 1 for c in tc.candidates("rows", 1, 256, ROWS, "heuristic", SMS, {"XBLOCK": 4}))


def test_large_pointwise_kernels_time_three_vector_widths():
    fp32, bf16 = tc.KernelHints(itemsize=4), tc.KernelHints(itemsize=2)
    big = tc.TIMED_POINTWISE
    choices = tc.candidates("pointwise", big, 1, fp32, "heuristic", SMS)
    # 16 bytes per thread and load (the heuristic), 32 bytes, 8 bytes with twice the warps
    assert [(c["XBLOCK"], c["num_warps"]) for c in choices[:3]] == [(512, 4), (1024, 4), (512, 8)]
    assert choices[0] == first("pointwise", big, 1, fp32)
    assert [(c["XBLOCK"], c["num_warps"]) for c in tc.pointwise_choices(big, bf16)] == [(1024, 4), (2048, 4),
                                                                                        (1024, 8)]
    assert tc.timed("pointwise", big, fp32, "heuristic")
    # smaller pointwise kernels, row kernels, forced configurations, accumulating stores: untimed
    assert not tc.timed("pointwise", big - 1, fp32, "heuristic")
    assert tc.candidates("pointwise", big - 1, 1, fp32, "heuristic", SMS) == tc.heuristic("pointwise", big - 1, 1,
                                                                                           fp32, SMS)
    assert not tc.timed("rows", big, ROWS, "heuristic")
    assert not tc.timed("pointwise", big, fp32, "heuristic", {"XBLOCK": 256})
    assert tc.candidates("pointwise", big, 1, fp32, "heuristic", SMS, {"XBLOCK": 1024})[0]["num_warps"] == 4
    adds = tc.KernelHints(accumulates=True)
    assert not tc.timed("pointwise", big, adds, "heuristic") and not tc.timed("pointwise", big, adds, "full")
    assert tc.timed("rows", 64, ROWS, "full") and tc.timed("rows", 64, ROWS, "full", {"RBLOCK": 16})


def test_tensors_sharing_memory_are_found_for_the_timing_to_restore():
    x = torch.randn(8, 4)
    assert triton_backend._sharing((x, torch.empty(8, 4))) == []
    out = x.view(32)                                            # an output written over its input
    assert [id(t) for t in triton_backend._sharing((x, torch.ones(3), out))] == [id(x), id(out)]
    assert len(triton_backend._sharing((x[1:], x))) == 2        # (any view of the same storage)
    assert triton_backend._sharing((torch.empty(0), torch.empty(0), x)) == []


def test_the_tuner_times_each_candidate_twice_and_skips_those_that_fail(tmp_path, monkeypatch):
    import triton.testing
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(triton_tuner, "interpreting", lambda: False)
    first_round_slow = {(512, 4): iter([3.0, 1.0]), (1024, 4): iter([2.0, 2.0])}
    ran = []

    def run(c):
        ran.append((c["XBLOCK"], c["num_warps"]))
        if c["num_warps"] == 8:
            raise RuntimeError("out of resource: registers")

    def do_bench(fn, **_):
        fn()
        return next(first_round_slow[ran[-1]])

    monkeypatch.setattr(triton.testing, "do_bench", do_bench)
    choices = tc.pointwise_choices(tc.TIMED_POINTWISE, tc.KernelHints())
    tuner = triton_tuner.Tuner(tmp_path / "tuning.json")
    assert tuner.pick("k", choices, run) == choices[0]  # its second round beat the other's both
    assert ran == [(512, 4), (1024, 4), (512, 8), (512, 4), (1024, 4)]  # the failed one only once
    assert json.loads((tmp_path / "tuning.json").read_text()) == {"k": choices[0]}


@on_the_interpreter
def test_a_launch_whose_timing_fails_takes_the_first_configuration_that_compiles(tmp_path, monkeypatch):
    fn = FakeKernel()
    tuner = triton_tuner.Tuner(tmp_path / "tuning.json")

    def out_of_memory(*_, **__):
        raise torch.OutOfMemoryError("CUDA out of memory (do_bench's buffer)")

    monkeypatch.setattr(tuner, "pick", out_of_memory)
    launcher = triton_backend.Launcher("k", fn, META, "h", tuner, None, hints=ROWS, tuning="full")
    launcher(torch.randn(64, 256), torch.empty(64))
    # untimed: the persistent choices do not compile (the fake's rule), the first other one ran
    c = next(c for c in launcher.candidates(64, 256) if not c["PERSISTENT"])
    assert fn.launched == [dict(XBLOCK=c["XBLOCK"], RBLOCK=c["RBLOCK"], num_warps=c["num_warps"],
                                grid=(64 // c["XBLOCK"],))]
    assert not launcher.failed


@on_the_interpreter
def test_large_pointwise_kernels_are_not_timed_without_a_gpu(tmp_path):
    fn = FakeKernel()
    tuner = triton_tuner.Tuner(tmp_path / "tuning.json")
    meta = {**META, "kind": "pointwise", "outer": str(tc.TIMED_POINTWISE), "inner": "1", "n_reductions": 0}
    launcher = triton_backend.Launcher("k", fn, meta, "h", tuner, None, hints=tc.KernelHints(), tuning="heuristic")
    launcher(torch.empty(1), torch.empty(1))  # (the fake kernel touches no memory)
    assert fn.launched == [dict(XBLOCK=512, RBLOCK=1, num_warps=4, grid=(tc.TIMED_POINTWISE // 512,))]
    assert not (tmp_path / "tuning.json").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="times kernels on a GPU")
def test_large_pointwise_kernels_pick_a_timed_choice_on_a_gpu(tmp_path):
    def relu_add(x, y):
        return torch.relu(x) + y + 1

    def linear_gelu(x, w, b):  # the epilogue writes over the product, which dies in it
        return F.gelu(x @ w + b)

    x, y = (torch.randn(tc.TIMED_POINTWISE, device="cuda") for _ in range(2))
    # (gpu_backend too: a run under EMBER_GPU_BACKEND=cuda built CUDA C++ kernels, no Triton tuning)
    options = {"target": "triton", "gpu_backend": "triton", "cache_dir": str(tmp_path), "aot_cache": False}
    fast = ember.compile(relu_add, options=options)
    torch.testing.assert_close(fast(x, y), relu_add(x, y))
    tuned = json.loads((tmp_path / "triton" / "tuning.json").read_text())
    (choice,) = tuned.values()
    assert choice in tc.pointwise_choices(tc.TIMED_POINTWISE, tc.KernelHints(itemsize=4))
    torch.testing.assert_close(fast(x, y), relu_add(x, y))
    # timed over memory it writes in place: the timing runs give the product back before the call's
    # own launch (else this would be gelu applied over and over)
    a, w, b = (torch.randn(*shape, device="cuda") for shape in ((4096, 256), (256, 2048), (2048,)))
    fast = ember.compile(linear_gelu, options=options)
    torch.testing.assert_close(fast(a, w, b), linear_gelu(a, w, b), rtol=1e-4, atol=1e-4)
    tuned = json.loads((tmp_path / "triton" / "tuning.json").read_text())
    assert any("gelu" in key for key in tuned), tuned


def test_triton_tuning_option():
    assert Config().triton_tuning in ("heuristic", "full")
    assert Config().replace(triton_tuning="full").triton_tuning == "full"
    with pytest.raises(ValueError, match="triton_tuning"):
        Config().replace(triton_tuning="exhaustive")


@pytest.fixture
def kernels_of(monkeypatch):
    """fn, *args -> the kernel IR objects the Triton backend rendered for them."""
    seen = record_rendered(monkeypatch, triton_backend.TritonBackend)

    def kernels(fn, *args, options=None):
        seen.clear()
        ember.explain(fn, *args, target="triton", options=options)
        return list(seen)

    return kernels


def test_hints_read_from_the_kernel_ir(kernels_of):
    def rmsnorm(x, w):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w

    x = torch.randn(8, 64, dtype=torch.bfloat16)
    (k,) = kernels_of(rmsnorm, x, torch.randn(64, dtype=torch.bfloat16))
    assert tc.hints_of(k) == tc.KernelHints(itemsize=2, columns=False, writes_rows=True)
    (k,) = kernels_of(lambda a: torch.logsumexp(a, -1), torch.randn(8, 64))
    assert tc.hints_of(k) == tc.KernelHints(itemsize=4, online=True)  # its max and sum may take one loop
    (k,) = kernels_of(lambda a, t: F.cross_entropy(a, t), torch.randn(8, 10), torch.randint(0, 10, (8,)))
    assert tc.hints_of(k) == tc.KernelHints(itemsize=4, over_rows=True, online=True)  # its mean: over all rows
    (k,) = kernels_of(lambda g, a: (g * a).sum(0), torch.randn(64, 8), torch.randn(64, 8))
    assert tc.hints_of(k).columns
    # a weight gradient reads per-row statistics too (contiguous in the reduced dim, the same for
    # every column): still a column sum
    (k,) = kernels_of(lambda g, a, m: ((a - m[:, None]) * g).sum(0), torch.randn(64, 8), torch.randn(64, 8),
                      torch.randn(64))
    assert tc.hints_of(k).columns
    (k,) = kernels_of(lambda a: a.cumsum(-1), torch.randn(8, 64, dtype=torch.bfloat16))
    assert tc.hints_of(k).scans and tc.hints_of(k).itemsize == 2
    (k,) = kernels_of(lambda a, b: F.relu(a) + b, torch.randn(4, 4, dtype=torch.float16),
                      torch.randn(4, 4, dtype=torch.float16))
    assert tc.hints_of(k).itemsize == 2 and not tc.hints_of(k).columns
    # segment kernels read rows from a loaded start: pooling (T, 16) rows is a column sum, a
    # jagged softmax over (T,) walks its rows contiguously
    pooled = ragged.from_list([torch.randn(n, 16, dtype=torch.bfloat16) for n in (3, 9, 2)])
    (k,) = kernels_of(ragged.segment_mean, pooled)
    assert tc.hints_of(k) == tc.KernelHints(itemsize=2, columns=True, segments=True)
    (k,) = kernels_of(lambda r: ragged.jagged_softmax(r).values, ragged.from_list([torch.randn(n) for n in (3, 9)]))
    assert not tc.hints_of(k).columns and tc.hints_of(k).writes_rows and tc.hints_of(k).segments
    # a mean's gradient stores each row's value down its (T, 16) rows: columns, written only
    values = pooled.values.clone().requires_grad_()
    forward, backward = kernels_of(ragged.segment_mean, ragged.Ragged(values, pooled.offsets))
    assert tc.hints_of(backward) == tc.KernelHints(itemsize=2, columns=True, writes_rows=True, reads_rows=False,
                                                   reduces=False, segments=True)
    assert tc.heuristic("rows", 256 * 768, 256, tc.hints_of(backward))[0] == dict(
        XBLOCK=128, RBLOCK=16, num_warps=2, PERSISTENT=False, num_stages=1)
    # a LayerNorm's backward adding its weight's gradient over runs of rows: chunked, so it keeps
    # the 4096-element tiles (its programs hold column partials too). (Runs given: on CPU tensors
    # their count follows the host's threads, and 64 rows did not split on a 16-core host.)
    x, w = torch.randn(16, 768, requires_grad=True), torch.randn(768, requires_grad=True)
    found = kernels_of(lambda x, w: F.layer_norm(x, (768,), w).square().sum().backward(), x, w,
                       options={"row_chunks": 4})
    chunked = [k for k in found if tc.hints_of(k).chunks]
    assert chunked and tc.heuristic("rows", 65536, 768, tc.hints_of(chunked[0]))[0]["XBLOCK"] == 4
    forward = kernels_of(lambda x, w: F.layer_norm(x, (768,), w), x.detach(), w, options={"row_chunks": 4})
    assert not any(tc.hints_of(k).chunks for k in forward)


def test_pointwise_kernels_of_gathers_and_strided_stores_only_take_small_programs(kernels_of):
    # the GIoU study's ragged gradient: each (image, place)'s 4 coordinates stored 4 apart, its
    # inputs gathered at the place's box; nothing to load 16 bytes at a time
    pred, targets, _ = make_batch(16, torch.bfloat16)
    boxes = ragged.from_list(targets)
    forward, backward = kernels_of(ragged_giou_loss, pred.requires_grad_(), boxes)
    assert tc.hints_of(backward).scattered and not tc.hints_of(forward).scattered
    assert first("pointwise", 1024 * 256, 1, tc.hints_of(backward)) == dict(
        XBLOCK=128, RBLOCK=1, num_warps=1, PERSISTENT=False, num_stages=1)
    # one contiguous access is enough to keep 16 bytes a thread: a gather of rows, a transpose
    # (its tiles), a strided read beside a contiguous store
    for fn, args in ((lambda x, i: x[i] * 2, (torch.randn(100, 64), torch.randint(0, 100, (50,)))),
                     (lambda x: x.t() + 1, (torch.randn(100, 64),)),
                     (lambda x: x[:, ::2] * 2, (torch.randn(100, 64),))):
        (k,) = kernels_of(fn, *args)
        assert not tc.hints_of(k).scattered, k.name


class FakeKernel:
    """Stands for a Triton JITFunction: records launches; persistent configurations fail to
    compile, as a kernel with too many live values would."""

    def __init__(self):
        self.launched: list[dict] = []

    def __getitem__(self, grid):
        def launch(*args, XBLOCK, RBLOCK, PERSISTENT, num_warps, num_stages, **_):
            if PERSISTENT:
                raise RuntimeError("out of resource: shared memory")
            self.launched.append(dict(XBLOCK=XBLOCK, RBLOCK=RBLOCK, num_warps=num_warps, grid=grid))
            return object()
        return launch


META = {"kind": "rows", "params": ["x", "out"], "sizes": [], "outer": "64", "inner": "256",
        "multi_program": False, "n_reductions": 1}


@on_the_interpreter
def test_launcher_falls_back_to_a_safer_configuration(tmp_path):
    fn = FakeKernel()
    tuner = triton_tuner.Tuner(tmp_path / "tuning.json")
    launcher = triton_backend.Launcher("k", fn, META, "h", tuner, None, hints=ROWS, tuning="heuristic")
    x, out = torch.randn(64, 256), torch.empty(64)
    launcher(x, out)
    # the persistent choice failed to compile; the looped fallback ran, once, with nothing timed
    assert fn.launched == [dict(XBLOCK=1, RBLOCK=256, num_warps=4, grid=(64,))]
    assert not (tmp_path / "tuning.json").exists()


@on_the_interpreter
def test_launcher_prefers_a_configuration_tuned_earlier(tmp_path):
    (tmp_path / "tuning.json").write_text(
        '{"h:k:64x256": {"XBLOCK": 8, "RBLOCK": 64, "num_warps": 2, "PERSISTENT": false, "num_stages": 2}}')
    fn = FakeKernel()
    tuner = triton_tuner.Tuner(tmp_path / "tuning.json")
    launcher = triton_backend.Launcher("k", fn, META, "h", tuner, None, hints=ROWS, tuning="heuristic")
    launcher(torch.randn(64, 256), torch.empty(64))
    assert fn.launched == [dict(XBLOCK=8, RBLOCK=64, num_warps=2, grid=(8,))]


@pytest.mark.parametrize("tuning", ["heuristic", "full"])
def test_both_tunings_compile_and_run(tuning):
    def rmsnorm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    x, w = torch.randn(33, 70), torch.randn(70)
    fast = ember.compile(rmsnorm, options={"target": "triton", "triton_tuning": tuning})
    torch.testing.assert_close(fast(x, w), rmsnorm(x, w))


# ---- launching compiled kernels through the driver (runtime/triton_direct.py) -----------------

def test_direct_launch_argument_layout_follows_tritons_abi():
    import ctypes

    from ember.runtime.triton_direct import argument_layout
    signature = {"x": "*bf16", "out": "*fp32", "n": "i32", "one": "constexpr", "big": "i64", "BLOCK": "constexpr"}
    assert argument_layout(signature) == [(0, ctypes.c_void_p), (1, ctypes.c_void_p), (2, ctypes.c_int32),
                                          (4, ctypes.c_int64)]
    assert argument_layout({"d": "tensordesc<fp32[16, 16]>"}) is None  # not ours to pass: Triton's launcher


def test_kernels_with_scratch_or_clusters_keep_tritons_launcher():
    from collections import namedtuple
    from types import SimpleNamespace

    from ember.runtime.triton_direct import direct_launcher
    Meta = namedtuple("Meta", "global_scratch_size profile_scratch_size num_ctas launch_cooperative_grid "
                              "launch_pdl shared num_warps")
    src = SimpleNamespace(signature={"x": "*fp32"})
    for meta in (Meta(64, 0, 1, False, False, 0, 4), Meta(0, 0, 2, False, False, 0, 4),
                 Meta(0, 0, 1, False, True, 0, 4)):
        assert direct_launcher(SimpleNamespace(metadata=meta, src=src, name="k"), 0) is None


def test_direct_launch_passes_addresses_to_torchs_static_launcher(monkeypatch):
    # torch's C++ launcher, where it exists: tensors go as their addresses (it would query the
    # driver for a tensor's), the letters follow the layout, two scratch pointers end the list;
    # an error there (another device's kernel in a thread without a context) retries through
    # cuda-python with the kernel's device current
    import ctypes

    from ember.runtime import triton_direct
    from ember.runtime.triton_direct import DirectLauncher, argument_layout
    layout = argument_layout({"x": "*bf16", "n": "i32", "B": "constexpr", "s": "fp32", "big": "i64"})
    launcher = DirectLauncher.__new__(DirectLauncher)
    launcher.layout = [(i, ctypes.c_void_p is kind) for i, kind in layout]
    launcher.argument_letters = "".join(triton_direct._TYPE_LETTERS[kind] for _, kind in layout) + "OO"
    launcher.function_handle, launcher.num_warps, launcher.shared, launcher.device = 1234, 4, 512, 0
    calls, fallbacks = [], []
    launcher._static = lambda *a: calls.append(a)
    launcher._launch_through_cuda_python = lambda *a: fallbacks.append(a)
    x = torch.zeros(4)
    launcher(3, 1, 77, (x, 10, 64, 0.5, 2**40))
    assert calls == [(1234, 3, 1, 1, 4, 512, "OiflOO", (x.data_ptr(), 10, 0.5, 2**40, None, None), 77)]
    assert not fallbacks

    def fails(*a):
        raise RuntimeError("CUDA driver error: invalid resource handle")

    made_current = []
    launcher._static = fails
    monkeypatch.setattr(triton_direct, "make_context_current", made_current.append)
    launcher(3, 1, 77, (x, 10, 64, 0.5, 2**40))
    assert made_current == [0] and fallbacks == [(3, 1, 77, (x, 10, 64, 0.5, 2**40))]


def test_tiles_of_fewer_elements_than_threads_take_fewer_warps():
    # a bias gradient's 8 x 3 column sum, written over the saved value it reads, got 8 warps
    # for its 4 x 8 tile: each element on 8 warps, one warp's store before another's load
    assert tc.fitted_warps({"XBLOCK": 4, "RBLOCK": 8, "num_warps": 8}) == 1
    assert tc.fitted_warps({"XBLOCK": 2, "RBLOCK": 4, "num_warps": 4}) == 1
    assert tc.fitted_warps({"XBLOCK": 16, "RBLOCK": 16, "num_warps": 8}) == 8
    assert tc.fitted_warps({"XBLOCK": 8, "RBLOCK": 16, "num_warps": 8}) == 4
    assert tc.fitted_warps({"XBLOCK": 1024, "RBLOCK": 1, "num_warps": 4}) == 4


def _warp_copies(ttgir: str, tile: tuple[int, int]) -> int:
    """How many warps hold each element of a [XBLOCK, RBLOCK] tile, at most, over the blocked
    layouts of a kernel's Triton GPU IR."""
    import re

    worst = 1
    for layout in re.findall(r"#ttg\.blocked<\{([^}]*)\}>", ttgir):
        field = {k: [int(n) for n in v.split(",")] for k, v in re.findall(r"(\w+) = \[([\d, ]+)\]", layout)}
        if len(field["warpsPerCTA"]) != 2:
            continue
        copies = 1
        for d in range(2):
            per_warp = field["sizePerThread"][d] * field["threadsPerWarp"][d]
            warps = field["warpsPerCTA"][d]
            copies *= max(1, per_warp * warps // max(tile[d], per_warp))  # warps beyond the tile's extent
        worst = max(worst, copies)
    return worst


def test_a_small_column_sum_launch_holds_each_element_on_one_warp(kernels_of, tmp_path):
    # Triton's layout of the race's 4 x 8 tile in 8 warps: threadsPerWarp [4, 8], warpsPerCTA
    # [1, 8], so all 8 warps held every element (and loaded it, where one stores it)
    pytest.importorskip("triton")
    (k,) = kernels_of(lambda g, a: (g * a).sum(0), torch.randn(8, 3), torch.randn(8, 3))
    from ember.codegen.triton import launch_meta, render_kernel

    meta = launch_meta(k)
    config = tc.candidates(meta["kind"], 3, 8, tc.hints_of(k), "heuristic")[0]
    tile = (config["XBLOCK"], config["RBLOCK"])
    assert config["num_warps"] > 1 and tile[0] * tile[1] <= 32  # (what the heuristic gives it)
    source = render_kernel(k)
    params = source.split(f"def {k.name}(")[1].split(")")[0]
    types = {p: "*fp32" for p in params.split(", ") if p.startswith(("arg", "buf"))}
    types |= {"WORKSPACE": "*fp64", "COUNTER": "*i32"}
    constexprs = {"BIG": False, "XBLOCK": tile[0], "RBLOCK": tile[1], "PERSISTENT": False, "NPROG_BLOCK": 1}
    compile_for_sm90(tmp_path, source, k.name, types, constexprs, num_warps=config["num_warps"])
    assert _warp_copies((tmp_path / "k.ttgir").read_text(), tile) > 1  # the heuristic's warps alone
    (tmp_path / "fitted").mkdir()
    compile_for_sm90(tmp_path / "fitted", source, k.name, types, constexprs, num_warps=tc.fitted_warps(config))
    assert _warp_copies((tmp_path / "fitted" / "k.ttgir").read_text(), tile) == 1


# GPU fuzz seed 37301731762 (Triton, --train): the program, its inputs and its upstream gradients
_SPECS = [{"name": "x0", "shape": [8, 1], "kind": "float", "dtype": "float32", "seed": 1503978462, "layout": "offset",
           "special": False, "scale": 3.0, "dyn": True},
          {"name": "x1", "shape": [8, 1], "kind": "int", "dtype": "int32", "seed": 204470796, "layout": "contig",
           "special": False, "scale": 3.0, "wide": False},
          {"name": "x2", "shape": [8, 1], "kind": "perm", "dtype": "float32", "seed": 1749352467, "layout": "contig",
           "special": False, "scale": 1.0},
          {"name": "x3", "shape": [3, 1], "kind": "float", "dtype": "float32", "seed": 737349287, "layout": "contig",
           "special": False, "scale": 1.0},
          {"name": "x4", "shape": [3], "kind": "float", "dtype": "float32", "seed": 1291208033, "layout": "contig",
           "special": False, "scale": 1.0}]


def _fuzzed(x0, x1, x2, x3, x4):
    v1 = torch.hypot(torch.sub(x0, x0.flip(-1), alpha=2), x0)
    v4 = F.leaky_relu(v1, 0.1)
    v5 = torch.zeros([8, 1], device=v4.device, dtype=v4.dtype).scatter_add_(1, torch.argsort(x2, dim=1) // 2, v4)
    return v1, torch.sign(x1), torch.chunk(v1, 2, dim=1)[0], v5, torch.special.log_ndtr(F.linear(v4, x3, x4))


def test_an_input_written_over_by_a_small_column_sum_kernel_matches_eager(fuzz):
    # (the race above, on an H100 before the change: the bias gradient wrong in all 3 elements,
    # by up to 3.9 of 37, the same in 4 runs)
    from fuzz_programs import make_inputs

    compiled = ember.compile(_fuzzed)
    for _ in range(2):
        got = fuzz[0].run_program(compiled, make_inputs(_SPECS, DEVICE, True), 37301731763)
        want = fuzz[0].run_program(_fuzzed, make_inputs(_SPECS, DEVICE, True), 37301731763)
        for a, b in zip(got["grads"], want["grads"]):
            if b is not None:
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
