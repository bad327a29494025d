"""bench/fuzz.py --ragged (bench/fuzz_ragged.py) run for a few seeds, so that the mode keeps
working, and what it found: a scan along a ragged tensor's packed rows, or a sum over each
token's features, beside a segment kernel (planning was stuck: the graph ran through ATen); a
16-bit segment max whose backward found no maxima (NaN gradients)."""

from __future__ import annotations

import argparse
import re

import pytest
import torch

import ember
from ember import ragged

from .helpers import assert_clean, assert_same, check, compile_checked, on_the_interpreter


def test_the_ragged_generator_writes_ragged_programs(fuzz):
    _, fr = fuzz
    progs = [fr.RaggedGenerator(seed, "cpu", "cpp", ["fp32", "bf16", "fp16"], seed % 2 == 0, True).build()
             for seed in range(60)]
    text = "\n".join(p.source for p in progs)
    for piece in ("ragged.segment_", "jagged_softmax", "to_padded", ".row_ids(), r0.positions()]",
                  "[r0.row_ids()]", "validate=False"):
        assert piece in text, piece
    specs = [p.specs[0] for p in progs]
    assert {s["offsets_dtype"] for s in specs} == {"int32", "int64"}
    assert any(0 in s["lengths"][0] for s in specs) and any(len(s["lengths"][0]) == 1 for s in specs)
    small = [fr.RaggedGenerator(seed, "cpu", "triton", ["fp32"], False, True).build() for seed in range(20)]
    assert max(sum(p.specs[0]["lengths"][0]) for p in small) <= 24 * 16
    for p in progs[:10]:  # every batch builds, and a partner is as wide as the longest row
        for v in fr.VARIANTS:
            xs = fr.make_inputs(p.specs, "cpu", False, v)
            for x, s in zip(xs, p.specs):
                if s["kind"] == "partner":
                    assert x.shape[0] == xs[0].batch_size and x.shape[1] >= xs[0].max_length


@pytest.mark.parametrize("train, dynamic, seeds", [(False, False, [0, 1]), (True, False, [3]),
                                                   (False, True, [5])], ids=["plain", "train", "dynamic"])
def test_ragged_fuzz_seeds_pass(fuzz, train, dynamic, seeds, tmp_path):
    fz, fr = fuzz
    args = argparse.Namespace(device="cpu", backend="cpp", train=train, dynamic=dynamic, ragged=True)
    for seed in seeds:
        prog = fr.RaggedGenerator(seed, "cpu", "cpp", ["fp32", "bf16", "fp16"], train, dynamic).build()
        torch._dynamo.reset()
        findings = [f for f in fz.check_program(prog, args, {}) if not f[0].startswith("note")]
        assert findings == [], (prog.source, findings)
        path = tmp_path / f"repro-{seed}.py"
        fz.write_repro(prog, args, {}, "mismatch", "a test", path)
        compile(path.read_text(), str(path), "exec")  # (a script that parses)


def test_the_judge_leaves_cancellation_noise_and_flags_a_wrong_element(fuzz):
    # (seed 353220689365: a normalize's gradient cancels to ~0; ember's rounding lands on other
    # elements than eager's, but its worst element is no further from float64 than eager's)
    fz, _ = fuzz
    ref = torch.linspace(-1e-7, 1e-7, 64, dtype=torch.float64)
    eager = ref.float().clone()
    eager[3] += 5e-8
    noisy, wrong = ref.float().clone(), ref.float().clone()
    noisy[40] += 4e-8
    wrong[40] += 2e-7
    assert fz.compare_tensor(noisy, eager, lambda nocast=False: ref, False) is None
    why = fz.compare_tensor(wrong, eager, lambda nocast=False: ref, False)
    assert why is not None and why.startswith("1/64 differ; first at flat 40"), why
    # (seed 811051431437: a jagged softmax's row means, whose gradient cancels to exactly 0 in
    # float64 and in eager; ember keeps float32 rounding of its ~0.1 terms)
    zero = torch.zeros(40, dtype=torch.float64)
    runs = [{"outs": [], "inputs": [], "grads": [g]} for g in (zero.float() + 3e-9, zero.float(), zero)]
    assert fz.compare_runs(*runs[:2], lambda nocast=False: runs[2], False, torch.float32) is None
    runs[0]["grads"][0][7] = 1e-4
    assert fz.compare_runs(*runs[:2], lambda nocast=False: runs[2], False, torch.float32) is not None


@pytest.mark.parametrize("options", [None, pytest.param({"target": "triton"}, marks=on_the_interpreter)])
@pytest.mark.parametrize("feature", [(), (3,)])
def test_a_scan_over_packed_rows_beside_a_segment_reduction(options, feature):
    # the cumsum, a (T, ..) value reading the row ids, was planned into the segment kernel of the
    # segment sum as a row-wise value; a scan computes only in a scan kernel, so it asked for a
    # buffer it had already: "fusion planning is stuck", and the graph ran through ATen
    def f(r):
        scaled = r.values / r.lengths().clamp(min=1)[r.row_ids()].view(-1, *[1] * len(feature))
        return torch.cumsum(scaled, 0), torch.cumsum(r.values * 2, 0).flip(0), ragged.segment_sum(r)

    r = ragged.from_list([torch.randn(n, *feature) for n in [4, 0, 22, 1]])
    report = check(f, r, options=options)
    assert report.fallbacks == []

    def g(r):  # a jagged softmax and a reversed scan of the same rows
        x = r.values * r.row_ids()
        return ragged.jagged_softmax(r).values, torch.flip(torch.cumsum(torch.flip(x, [0]), 0), [0])

    assert check(g, ragged.from_list([torch.randn(n) for n in [5, 3, 0, 9]]), options=options).fallbacks == []


@pytest.mark.parametrize("options", [None, pytest.param({"target": "triton"}, marks=on_the_interpreter)])
def test_a_sum_over_each_tokens_features_beside_a_segment_reduction(options):
    # likewise a (T, 1) sum over the features of a value reading the row ids, beside a segment
    # kernel over (B,): the sum was planned into the segment kernel, which cannot compute it
    def f(r, x):
        segments = ragged.segment_max(ragged.Ragged(r.values[:, 0], r.offsets, validate=False))
        return segments, (r.values * r.row_ids()[:, None]).sum(-1), x[r.row_ids(), r.positions()].norm(dim=-1)

    r = ragged.from_list([torch.randn(n, 17) for n in [22, 2, 3, 0, 2]])
    assert check(f, r, torch.randn(5, 39, 17), options=options).fallbacks == []


@pytest.mark.parametrize("options", [None, pytest.param({"target": "triton"}, marks=on_the_interpreter)])
def test_a_mean_beside_a_softmax_over_an_empty_batch_builds(options):
    # over a batch of no tokens the softmax's max over each segment is a kernel of no inner
    # loop, which took the mean of the per-row tensor as a reduction across its rows: there
    # was no loop to reduce in (an undeclared variable, the kernel failed to build, and its
    # ATen fallback raised; CPU ragged fuzz seed 773207913000)
    def f(r, x):
        rows = x.index_select(0, r.row_ids())
        return ragged.jagged_softmax(ragged.Ragged(rows, r.offsets, validate=False)).values, (x * x).mean()

    r = ragged.from_list([torch.randn(0, 8)])
    assert check(f, r, torch.randn(1, 8), options=options).fallbacks == []


@on_the_interpreter
def test_a_tiled_kernel_over_a_ragged_total_stores_only_its_rows():
    # (fuzz seed 300667428358, interpreted Triton, which then crashed with heap corruption) the
    # backward's softmax over transposed values is a tiled kernel: rows of the ragged total T by
    # 17 columns. Its device-size prologue set OUTER to T * 17, so rows past T passed the mask
    def f(r):
        soft = ragged.Ragged(torch.softmax(r.values, -1), r.offsets, validate=False)
        return ragged.segment_sum(soft), ragged.segment_max(r)

    g = torch.Generator().manual_seed(0)
    values = torch.randn(17, 34, generator=g).half()  # (transposed below: (34, 17), stride (1, 34))
    ups = [torch.randn(2, 17, generator=g).half() for _ in range(2)]
    offsets = torch.tensor([0, 11, 34], dtype=torch.int32)
    mine, ref = (values.clone().requires_grad_() for _ in range(2))
    fast, report = compile_checked(f, options={"target": "triton"})
    outs = fast(ragged.Ragged(mine.t(), offsets, max_length=23))
    wants = f(ragged.Ragged(ref.t(), offsets, max_length=23))
    assert_same(outs, wants)
    torch.autograd.backward(outs, ups)
    torch.autograd.backward(wants, ups)
    assert_same(mine.grad, ref.grad)
    assert_clean(report)
    tiled = [k.source for k in report.kernels if "tiles of XBLOCK rows" in k.source and "ragged total" in k.source]
    assert tiled and all(re.search(r"\n +OUTER = s\d+\n", src) for src in tiled), tiled


@pytest.mark.parametrize("options", [None, pytest.param({"target": "triton"}, marks=on_the_interpreter)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_16_bit_segment_max_of_computed_values_has_eager_gradients(dtype, options):
    # a training forward's segment max leaves the graph: its backward compares it with the values
    # (x == max) to find the maxima. It was the max of the unrounded float32 chain, rounded once,
    # an ulp off the values as eager holds them (rounded op by op): no value equalled it in some
    # rows, which counted 0 maxima and gave NaN gradients. (amax's case already held it as eager)
    def f(r, x):
        v = torch.reciprocal(x[r.row_ids(), r.positions()].abs() + 0.5)
        return ragged.segment_max(ragged.Ragged(v, r.offsets, validate=False))

    g = torch.Generator().manual_seed(0)
    lengths = [21, 1, 0, 17]
    r = ragged.from_list(list(torch.randn(sum(lengths), 3, generator=g).to(dtype).split(lengths)))
    x = torch.randn(4, 28, 3, generator=g).to(dtype)
    up = torch.randn(4, 3, generator=g).to(dtype)
    mine, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    (ember.compile(f, options=options)(r, mine) * up).sum().backward()
    (f(r, ref) * up).sum().backward()
    assert not mine.grad.isnan().any()
    # (against float64, as eager's own error allows: the backward's chain of 16-bit products
    # rounds where eager's ops do only in part, a bfloat16 ulp or two from eager's gradient)
    exact = x.double().requires_grad_()
    (f(ragged.Ragged(r.values.double(), r.offsets), exact) * up.double()).sum().backward()
    error, eager_error = ((g.double() - exact.grad).abs().max() for g in (mine.grad, ref.grad))
    assert error <= 2 * eager_error + 1e-3, (error, eager_error)
