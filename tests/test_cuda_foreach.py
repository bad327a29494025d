"""Foreach steps on the CUDA backend. Pointwise kernels in lanes: a kernel's independent groups
of stores (codegen/triton_lanes.py), each on a row of blocks of its own (gridDim.y picks the
lane), each with the vector form its own buffers allow. Combo kernels: small independent
kernels of parameters of different sizes in one launch (codegen/cuda_combos.py). Rendered on the
CPU and compiled for sm_90 with nvcc; run against eager with ``EMBER_TEST_DEVICE=cuda`` on a GPU
machine."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

import ember
from ember.codegen import cuda, cuda_combos
from ember.codegen.triton_combos import MAX_PART_ELEMENTS
from ember.codegen.triton_lanes import MIN_ELEMENTS
from ember.runtime import cuda_backend, cuda_launch

from .conftest import DEVICE
from .helpers import record_rendered
from .test_cuda import compile_batches, explain, needs_nvcc, sources

# a GPT's parameters in miniature: sizes of one, several and odd numbers of 16-byte groups
SIZES = (768, 768 * 96, 3072, 50 * 768, 5, 4099, 768, 5)


def sgd_momentum(params, grads, bufs):
    torch._foreach_mul_(bufs, 0.9)
    torch._foreach_add_(bufs, grads)
    torch._foreach_add_(params, bufs, alpha=-0.1)


def tensors(n: int, count: int, dtype=torch.float32, device="cpu"):
    return [[torch.randn(n, dtype=dtype, device=device) for _ in range(count)] for _ in range(3)]


def sized(sizes, dtype=torch.float32, device="cpu"):
    return [[torch.randn(n, dtype=dtype, device=device) for n in sizes] for _ in range(3)]


@pytest.fixture
def kernels_of(monkeypatch):
    """fn, *args -> the kernel IR objects the CUDA backend rendered for them, and the report."""
    seen = record_rendered(monkeypatch, cuda_backend.CudaBackend)

    def kernels(fn, *args, dynamic=None):
        seen.clear()
        report = explain(fn, *args, dynamic=dynamic)
        return list(seen), report

    return kernels


def cases(line: str) -> list[str]:
    """A lane switch's cases: a body each, or (lanes of one form, codegen/cuda_lanes.py) the
    pointers each picks."""
    return re.findall(r"^\s*case (\d+): ", line, re.M)


def test_a_foreach_step_runs_a_lane_a_parameter(kernels_of):
    (kernel,), report = kernels_of(sgd_momentum, *tensors(5000, 4))
    src = report.kernels[0].source
    assert "switch (blockIdx.y) {" in src
    assert cases(src) == ["0", "1", "2", "3"]
    assert cuda.launch_meta(kernel)["lanes"] == 4
    # the lanes are one computation: each picks its parameter's tensors (param, grad, buf
    # loaded; param, buf stored), then one body runs over them (codegen/cuda_lanes.py)
    picks = [re.findall(r"ember_lane_p(\d+) = (\w+);", line)
             for line in re.findall(r"^\s*case \d+: (.*)$", src, re.M)]
    assert all([k for k, _ in pick] == ["0", "1", "2", "3", "4"] for pick in picks)
    assert len({name for pick in picks for _, name in pick}) == 4 * 5  # no tensor in two lanes
    assert src.count("// vector form where every group of 4 is aligned") == 1
    aligned = re.search(r"// vector form where every group of 4 is aligned: (.*)", src)[1].split(", ")
    loads = set(re.findall(r"ember_load_vec<float, 4>\((\w+) \+", src))
    assert len(aligned) == 5 and len(loads) == 3 and loads < set(aligned)
    assert set(aligned) == {f"ember_lane_p{k}" for k in range(5)}


def test_lanes_of_different_forms_keep_a_body_each(kernels_of):
    def two(x, y):  # two lanes (no load in common), not one computation
        return x.sin(), y.cos() * 2

    (kernel,), report = kernels_of(two, torch.randn(8192), torch.randn(8192))
    src = report.kernels[0].source
    assert cuda.launch_meta(kernel)["lanes"] == 2 and "ember_lane_p" not in src
    assert re.findall(r"^\s*case (\d+): \{", src, re.M) == ["0", "1"]
    assert src.count("// vector form where every group of 4 is aligned") == 2


def test_values_the_same_everywhere_are_computed_once_a_thread(kernels_of):
    # an optimizer's bias correction: a power of its step count, read at one fixed index
    def scaled(x, step):
        return x * (1 - 0.9 ** step).sqrt()

    (kernel,), report = kernels_of(scaled, torch.randn(8192), torch.tensor([3.0]))
    src = report.kernels[0].source
    once, loop = src.split("// the same at every position: once a thread", 1)[1].split("for (", 1)
    assert "powf(" in once and "sqrtf(" in once and "[0]" in once
    assert "powf(" not in loop and "sqrtf(" not in loop


def test_small_kernels_and_shared_loads_stay_one_body(kernels_of):
    # fewer elements than MIN_ELEMENTS in all lanes: latency, one body
    (kernel,), report = kernels_of(sgd_momentum, *tensors(MIN_ELEMENTS // 8, 4))
    assert "blockIdx.y" not in report.kernels[0].source and cuda.launch_meta(kernel)["lanes"] == 1
    # stores that share a load are one lane: nothing to split
    (kernel,), report = kernels_of(lambda x: (x.sin(), x.cos()), torch.randn(10000))
    assert "blockIdx.y" not in report.kernels[0].source and cuda.launch_meta(kernel)["lanes"] == 1


def test_geometry_gives_each_lane_a_row_of_blocks():
    sms, plan = 132, cuda_launch.plan_launch
    # one lane: the grid as before; six: a row of the same blocks each, sharing the device
    assert plan("pointwise", 5000, 1, sms, 1024) == (False, 5, 256)
    assert plan("pointwise", 5000, 1, sms, 1024, lanes=6) == (False, (5, 6), 256)
    # past WAVES waves of a lane's share of the device, several tiles a block
    tiles = -(-10**8 // 1024)
    _, (blocks, lanes), _ = plan("pointwise", 10**8, 1, sms, 1024, lanes=64)
    assert lanes == 64 and blocks == cuda_launch.balanced_grid(tiles, sms * 8 // 64) < tiles


def test_small_kernels_of_different_sizes_are_one_combo(kernels_of):
    (kernel,), report = kernels_of(sgd_momentum, *sized(SIZES))
    src = report.kernels[0].source
    assert len(kernel.parts) == len(set(SIZES)) == 6 and kernel.name.startswith("combo_of_6_")
    # block b runs the part whose blocks hold b: a branch a part, in both entry points
    assert len(re.findall(r"^  (?:\} else )?if \(b < \d+u\) \{", src, re.M)) == 2 * 6
    meta = cuda_combos.combo_meta(kernel)
    assert meta["strategy"] == "combo" and int(meta["outer"]) == sum(b * n for b, n in meta["parts"])
    # the sizes that two parameters share run in lanes inside their part: block and lane from b
    assert [lanes for _, lanes in meta["parts"]] == [2, 1, 1, 1, 2, 1]
    assert re.search(r"_body<uint32_t>\([^;]*\(uint32_t\)\(\(b\) % 1u\), \(uint32_t\)1, \(b\) / 1u\);", src)
    # a launch of the parts' blocks, whatever the sizes of the call
    assert cuda_launch.plan_launch("combo", int(meta["outer"]), 1, 132, 1024) == (False, int(meta["outer"]), 256)


@pytest.mark.parametrize("unroll", [1, 4])
def test_a_parts_blocks_take_one_unrolled_step_of_groups(kernels_of, monkeypatch, unroll):
    monkeypatch.setattr(cuda_combos, "COMBO_UNROLL", unroll)
    (kernel,), report = kernels_of(sgd_momentum, *sized(SIZES))
    src = report.kernels[0].source
    assert f"#define EMBER_COMBO_UNROLL {unroll}  //" in src and "blockDim.x * EMBER_COMBO_UNROLL" in src
    # each thread one 16-byte group of 4 floats an iteration, unroll times, 256 threads a block
    blocks = dict(zip((int(p.outer[0]) for p in kernel.parts), cuda_combos.combo_meta(kernel)["parts"]))
    assert blocks[768 * 96] == [-(-768 * 96 // (256 * unroll * 4)), 1]
    assert blocks[4099] == [-(-4099 // (256 * unroll)), 1]  # odd: no 16-byte groups, an element at a time


@needs_nvcc
def test_an_adam_combo_calls_powf_and_compiles(tmp_path):
    # each parameter's two bias corrections are powf of its step: called, not inlined, in a
    # combo (one function of every part: inlined, they took most of ptxas's time)
    params = [torch.nn.Parameter(torch.randn(n)) for n in SIZES]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.Adam(params, lr=1e-2, foreach=True)
    opt.step()  # (its state)
    combos = [k.source for k in explain(opt.step).kernels if "combo_of" in k.name]
    assert len(combos) == 1 and "ember_powf_call(" in combos[0] and not re.search(r"\bpowf\(", combos[0])
    compile_batches(combos, tmp_path, per_file=1)


@needs_nvcc
@pytest.mark.parametrize("n, short", [(768, True), (4096, False)])
def test_many_short_lanes_unroll_once_and_call_powf(tmp_path, n, short):
    # a GPT-2 Adam step's 74 parameters of 768 elements, a lane each: one block step covers a
    # lane, so the lanes unroll once and call powf (nvcc: 52 s unrolled 4 times, powf inlined);
    # long lanes keep EMBER_UNROLL and inline it
    params = [torch.nn.Parameter(torch.randn(n)) for _ in range(cuda.MANY_LANES + 2)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.Adam(params, lr=1e-2, foreach=True)
    opt.step()  # (its state)
    lanes = [k.source for k in explain(opt.step).kernels if len(cases(k.source)) == len(params)]
    assert len(lanes) == 1, [k.name for k in explain(opt.step).kernels]
    source = lanes[0]
    assert ("ember_u < 1;" in source and "EMBER_UNROLL" not in source) is short
    assert ("ember_powf_call(" in source and not re.search(r"\bpowf\(", source)) is short
    compile_batches(lanes, tmp_path, per_file=1)


def test_what_a_combo_leaves_alone(kernels_of):
    # a kernel too large to gain from sharing a launch, and sizes known only at the call
    (large, small), _ = kernels_of(sgd_momentum, *sized((MAX_PART_ELEMENTS + 1, 768)))
    assert not large.parts and not small.parts
    kernels, _ = kernels_of(sgd_momentum, *sized((7000, 768)), dynamic=True)
    assert len(kernels) == 2 and not any(k.parts for k in kernels)
    # and combos off: a kernel a size
    report = ember.explain(sgd_momentum, *sized(SIZES), target="cuda", options={"combo_kernels": False})
    assert len(report.kernels) == 6 and not any("combo_of" in k.name for k in report.kernels)


@needs_nvcc
def test_lanes_and_combos_compile_for_sm90(tmp_path):
    kernels = []
    # odd sizes (no vector form for some lanes), 16-bit floats, sizes known only at the call
    kernels += sources(explain(sgd_momentum, *tensors(4099, 3)), "odd")
    kernels += sources(explain(sgd_momentum, *tensors(8192, 5, torch.bfloat16)), "bf16")
    kernels += sources(explain(sgd_momentum, *tensors(6000, 2), dynamic=True), "dyn")
    assert sum("switch (blockIdx.y)" in s for s in kernels) >= 2
    # combos, with lanes in parts, in both float widths
    kernels += sources(explain(sgd_momentum, *sized(SIZES)), "combo")
    kernels += sources(explain(sgd_momentum, *sized(SIZES, torch.bfloat16)), "combo_bf16")
    assert sum("switch (ember_lane)" in s for s in kernels) >= 2
    compile_batches(kernels, tmp_path, per_file=len(kernels))


def check_step(params, grads, bufs, dynamic=None, backend="cuda"):
    """ember's SGD step updates parameters and buffers as eager's does. In 16-bit floats eager
    rounds each foreach op's result and a fused kernel rounds once, so they differ by an ulp
    (far more, relatively, where p - 0.1 * buf cancels): there the step is held to the exact
    result of the same inputs instead, within half an ulp of each value the kernel rounds."""
    def clones(ts, dtype=None):
        return [t.clone() if dtype is None else t.to(dtype) for t in ts]

    low = params[0].dtype in (torch.float16, torch.bfloat16)
    ref = (clones(params, torch.float64 if low else None), clones(bufs, torch.float64 if low else None))
    sgd_momentum(ref[0], clones(grads, torch.float64) if low else grads, ref[1])
    got = (clones(params), clones(bufs))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (a kernel that fell back to ATen warns)
        ember.compile(sgd_momentum, options={"gpu_backend": backend}, dynamic=dynamic)(got[0], grads, got[1])
    if not low:
        for a, b in zip(got[0] + got[1], ref[0] + ref[1]):
            torch.testing.assert_close(a, b)
        return
    half_ulp = torch.finfo(params[0].dtype).eps / 2  # of 1
    for i, (p, buf) in enumerate(zip(ref[0], ref[1])):
        # the stored buf's rounding; p's, and half an ulp of 0.1 * buf twice: buf as p reads it
        # (rounded or not, either is fair) and alpha -0.1 (rounded to p's dtype, as eager's CPU
        # add does); float32's arithmetic on operands near 4 (1e-6)
        bounds = (half_ulp * (p.abs() + 0.2 * buf.abs()) + 1e-6, half_ulp * buf.abs() + 1e-6)
        for name, a, b, bound in (("param", got[0][i], p, bounds[0]), ("buf", got[1][i], buf, bounds[1])):
            over = (a.double() - b).abs() / bound
            assert over.max() <= 1, f"{name} {i}: {over.max():.2f} times the bound at {over.argmax()}"


@pytest.mark.skipif(DEVICE != "cuda", reason="runs CUDA kernels: EMBER_TEST_DEVICE=cuda on a GPU machine")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lanes_match_eager_on_the_gpu(dtype):
    torch._dynamo.reset()
    for n, count in ((5000, 4), (4099, 3), (1 << 20, 9), (3, 40)):
        check_step(*tensors(n, count, dtype, "cuda"))
    # a misaligned lane (a view one element in) keeps the scalar loop; the others their vectors
    params, grads, bufs = tensors(8193, 4, dtype, "cuda")
    check_step([params[0][1:]] + [p[:-1] for p in params[1:]], [g[:-1] for g in grads], [b[:-1] for b in bufs])
    check_step(*tensors(7000, 5, dtype, "cuda"), dynamic=True)
    check_step(*sized(SIZES, dtype, "cuda"))  # a combo


@pytest.mark.skipif(DEVICE != "cuda", reason="runs CUDA kernels: EMBER_TEST_DEVICE=cuda on a GPU machine")
def test_an_adam_step_over_many_sizes_matches_eager_on_the_gpu():
    torch._dynamo.reset()

    def make():
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(n, device="cuda")) for n in SIZES * 3]
        for p in params:
            p.grad = torch.randn_like(p)
        return params, torch.optim.Adam(params, lr=1e-2, foreach=True)

    (ref, ref_opt), (got, opt) = make(), make()
    step = ember.compile(opt.step, options={"gpu_backend": "cuda"})
    for _ in range(3):
        ref_opt.step()
        step()
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b)
