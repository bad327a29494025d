"""The CUDA backend's vector loops (codegen/cuda_vectors.py), without a GPU: which accesses load
and store a group of consecutive elements at once, under which run-time conditions, the scalar
loop kept beside them, the launch sized by the group, and the PTX nvcc makes of them (16-byte
loads). Running them needs a GPU: ``EMBER_TEST_DEVICE=cuda EMBER_GPU_BACKEND=cuda pytest
tests/test_ops.py``, and ``bench/gpu_fusion.py --backends cuda``."""

from __future__ import annotations

import re
import subprocess

import pytest
import sympy
import torch
import torch.nn.functional as F

import ember
from ember.codegen import cuda
from ember.codegen.cuda_vectors import _multiple_of
from ember.runtime import cuda_backend, cuda_launch
from ember.schedule.kernel_ir import inner_var, outer_var

from .conftest import DEVICE
from .helpers import assert_same, check, record_rendered
from .test_cuda import NVCC, explain, needs_nvcc, sources
from .test_cuda_matmul import _sass


def kernel_sources(fn, *args, dynamic=None) -> list[str]:
    return [k.source for k in explain(fn, *args, dynamic=dynamic).kernels]


def vector_loads(source: str) -> list[str]:
    """The buffers of the source's vector loads (one entry per load site)."""
    return re.findall(r"ember_load_vec<[^>]*>\((\w+) \+", source)


def vector_stores(source: str) -> list[str]:
    return re.findall(r"ember_store_vec<[^>]*>\((\w+) \+", source)


def conditions(source: str) -> list[str]:
    return re.findall(r"// vector form where every group of \d+ is aligned: .*\n\s*if \((.*)\) \{", source)


def softmax(x):
    return torch.softmax(x, -1)


def relu_add(x, y):
    return torch.relu(x) + y + 1


def test_softmax_rows_load_and_store_eight_bf16_at_once():
    (src,) = kernel_sources(softmax, torch.randn(64, 4096, dtype=torch.bfloat16))
    # its three loops (max, sum, store) each read x a vector at a time; the last writes one
    assert vector_loads(src) == ["arg0_1"] * 3
    assert vector_stores(src) == ["buf0"]
    assert src.count("EmberVec<unsigned short, 8>") == 5  # 3 loaded, 1 stored, the kept groups
    # 4096 is a multiple of 8 and the indices' other terms too: only the addresses are tested
    conds = conditions(src)
    assert len(conds) == 3
    assert all(re.fullmatch(r"[()\w &=]*", c) and "%" not in c for c in conds), conds
    assert "& 15ull) == 0" in conds[0]
    # the scalar loop stays beside each vector loop, for addresses that are not aligned
    assert src.count("} else {") == 3 and src.count("arg0_1[4096*o0 + r0]") == 3
    # a group's bf16 elements are read from their 32-bit words (a shift, or a mask: one instruction)
    assert src.count("ember_bf16_at(v0_vec, ember_k)") == 3 and "ember_bf16_to_f32(v0_vec" not in src
    (half,) = kernel_sources(softmax, torch.randn(64, 4096, dtype=torch.float16))
    assert src.replace("bf16", "f16") == half.replace("bf16", "f16")  # (float16: HADD2.F32 reads either half)


def test_later_loops_of_a_row_take_its_groups_from_registers():
    (src,) = kernel_sources(softmax, torch.randn(64, 4096, dtype=torch.bfloat16))
    # where a block's one iteration covers the row and every loop's buffers are aligned
    flag = re.search(r"const bool ember_cached = \(I\)blockDim.x \* EMBER_UNROLL \* 8 >= ember_inner && (.*);", src)
    assert flag and "arg0_1) & 15ull" in flag.group(1) and "buf0) & 15ull" in flag.group(1)
    assert src.count("EmberVec<unsigned short, 8> ember_cache0[EMBER_UNROLL];") == 1
    # the max loop loads and keeps; the sum and the store loops read the kept groups
    assert src.count("if (ember_cached) ember_cache0[ember_u] = v0_vec;") == 1
    assert src.count("v0_vec = ember_cached ? ember_reread<2>(ember_cache0[ember_u]) : ember_load_vec") == 1
    assert src.count("v0_vec = ember_cached ? ember_reread<3>(ember_cache0[ember_u]) : ember_load_vec") == 1
    # RMSNorm: the sum of squares keeps x for the scaling loop; the weight is read once anyway
    def rms(x, w):
        return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w
    (src,) = kernel_sources(rms, torch.randn(8, 1024, dtype=torch.bfloat16), torch.randn(1024, dtype=torch.bfloat16))
    assert src.count("ember_cached ? ember_reread<2>(ember_cache0[ember_u])") == 1 and "ember_cache1" not in src
    # rows longer than 512 threads x 4 groups of 8 cover are never kept: no registers spent on it
    (src,) = kernel_sources(softmax, torch.randn(4, 20480, dtype=torch.bfloat16))
    assert "ember_load_vec" in src and "ember_cached" not in src
    # rows of a symbolic length may fit: the kernel decides at run time
    (src,) = kernel_sources(softmax, torch.randn(4, 20480, dtype=torch.bfloat16), dynamic=True)
    assert "const bool ember_cached = (I)blockDim.x * EMBER_UNROLL * 8 >= ember_inner" in src
    # one loop: nothing to keep
    (src,) = kernel_sources(lambda x: x.sum(-1), torch.randn(8, 1024))
    assert "ember_cached" not in src and "EmberVec<float, 4>" in src


def test_a_row_keeps_at_most_four_groups_in_registers_its_own_first():
    """A LayerNorm over six summed bf16 inputs (a GPT's last residual sum): keeping all six in
    registers took 3x as long on an H200, so a row keeps 64 bytes a step (MOST_KEPT_BYTES). The
    row's own inputs are kept before the weight and bias, whose groups every row shares."""
    def ln_of_sum(a, b, c, d, e, f, w, bias):
        return F.layer_norm(a + b + c + d + e + f, (768,), w, bias)
    xs = [torch.randn(16, 768, dtype=torch.bfloat16) for _ in range(6)]
    w, bias = torch.randn(768, dtype=torch.bfloat16), torch.randn(768, dtype=torch.bfloat16)
    (src,) = kernel_sources(ln_of_sum, *xs, w, bias)
    kept = re.findall(r"EmberVec<unsigned short, 8> (ember_cache\d+)\[EMBER_UNROLL\];", src)
    assert len(kept) == 4
    kept_buffers = re.findall(r"(\w+)_vec = ember_cached \? ember_reread<2>", src)
    stores = dict(re.findall(r"if \(ember_cached\) (ember_cache\d+)\[ember_u\] = (\w+)_vec;", src))
    assert len(kept_buffers) == 4 and sorted(stores.values()) == sorted(kept_buffers)
    # the two rows not kept are read again with plain vector loads, and so are w and bias
    loads = re.findall(r"(\w+)_vec = ember_load_vec<unsigned short, 8>\((\w+) \+", src)
    assert {buf for _, buf in loads} >= {"arg6_1", "arg7_1"}
    assert not any(buf in ("arg6_1", "arg7_1") for name, buf in loads if name in stores.values())
    # four inputs: every one kept
    (src,) = kernel_sources(lambda a, b, c, d: F.layer_norm(a + b + c + d, (768,)), *xs[:4])
    assert len(re.findall(r"ember_cache\d+\[EMBER_UNROLL\];", src)) == 4
    # the six bf16 inputs add up in float32, rounded once where LayerNorm converts the sum
    # (docs/architecture.md, Numerics); eager rounds each partial sum, and LayerNorm scales
    # that ulp up where the sum is near its row's mean
    args = [t.to(DEVICE) for t in (*xs, w, bias)]
    out = ember.compile(ln_of_sum)(*args)
    summed = sum(t.float() for t in args[:6]).to(torch.bfloat16)
    assert_same(out, F.layer_norm(summed, (768,), args[6], args[7]))
    assert_same(out, ln_of_sum(*args), atol=0.05)


def test_norm_backward_keeps_its_run_partials_in_registers():
    """RMSNorm's backward: one chunked row kernel adds dx's rows and dw's column partials. Its
    loops take groups, and where a block covers a row each thread's share of dw's partial sums
    stays in registers for the run, stored once at its end."""
    def step(x, w, g):
        y = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w
        y.backward(g)
    x = torch.randn(512, 1024, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(1024, dtype=torch.bfloat16, requires_grad=True)
    # 16 runs of rows, whatever GPU the test machine has (by default: 4 per SM)
    sources = [k.source for k in ember.explain(step, x, w, torch.randn(512, 1024, dtype=torch.bfloat16),
                                               target="cuda", options={"row_chunks": 16}).kernels]
    (src,) = [s for s in sources if "ember_chunk" in s]
    # zeroed in the scalar loop's order: a barrier, since the run's end stores in groups
    zero = src.index("the run's partial sums start at zero")
    assert src.index("__syncthreads();", zero) < src.index("for (I ember_row = blockIdx.x", zero)
    assert "float ember_part0[EMBER_UNROLL][8] = {};" in src
    # the loop's vector form runs only where the partials can stay in registers
    vector = src[src.index("if (ember_cached) {"):src.index("} else {", src.index("if (ember_cached) {"))]
    assert re.search(r"ember_part0\[ember_u\]\[ember_k\] \+= v\d+;", vector)
    assert "ember_chunk + r0] = " not in vector
    # elsewhere the scalar loop adds in memory; the run's end stores the registers' sums
    added = re.findall(r"(buf\d+)\[1024\*ember_chunk \+ r0\] = \1\[1024\*ember_chunk \+ r0\] \+ v\d+;", src)
    assert len(added) == 1, src
    tail = src[src.index("if (ember_cached) {  // the run's partials, from registers"):]
    assert f"{added[0]}[1024*ember_chunk + r0] = ember_part0[ember_u][ember_k];" in tail
    # rows too long for a block's one iteration: the adding loop stays scalar, partials in memory
    x = torch.randn(64, 20480, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(20480, dtype=torch.bfloat16, requires_grad=True)
    sources = [k.source for k in ember.explain(step, x, w, torch.randn(64, 20480, dtype=torch.bfloat16),
                                               target="cuda", options={"row_chunks": 16}).kernels]
    (src,) = [s for s in sources if "ember_chunk" in s]
    assert "ember_part" not in src and "ember_cached" not in src
    assert len(re.findall(r"ember_chunk \+ r0\] = \w+\[20480\*ember_chunk \+ r0\] \+", src)) == 1


def test_chunked_loops_of_mixed_widths_keep_their_partials_in_registers():
    """A residual add, LayerNorm and its backward under a float32 loss: one loop's loads are all
    bf16 (groups of 8), another's are float32 (groups of 4). The loops take one width, the
    narrowest, so a thread's groups are the same in every loop and the weight gradients' run
    partials add up in registers; the loops adding run partials had gone scalar, adding every
    row into memory (a GPT's kernel of this kind took 7x Triton's time on an H100)."""
    def step(x, r, w, b, g):
        h = x + r
        (F.layer_norm(h, (h.shape[-1],), w, b).float() * g).sum().backward()

    def bf16(*shape):
        return torch.randn(*shape, dtype=torch.bfloat16, requires_grad=True)

    report = ember.explain(step, bf16(512, 1024), bf16(512, 1024), bf16(1024), bf16(1024), torch.randn(512, 1024),
                           target="cuda", options={"row_chunks": 16})
    (src,) = [k.source for k in report.kernels if "ember_chunk" in k.source]
    assert re.findall(r"float ember_part\d\[EMBER_UNROLL\]\[(\d)\] = \{\};", src) == ["4", "4"], src
    groups = set(re.findall(r"EmberVec<[^,]*, (\d)>", src))
    assert groups == {"4"}, groups
    vector = src[src.index("if (ember_cached) {"):src.index("} else {", src.index("if (ember_cached) {"))]
    assert re.search(r"ember_part\d\[ember_u\]\[ember_k\] \+= v\d+;", vector)


def test_pointwise_float32_groups_of_four():
    x, y = torch.randn(1 << 12), torch.randn(1 << 12)
    (src,) = kernel_sources(relu_add, x, y)
    assert sorted(vector_loads(src)) == ["arg0_1", "arg1_1"] and vector_stores(src) == ["buf0"]
    assert "EmberVec<float, 4>" in src and "ember_i_groups = ember_n / 4" in src


def test_mixed_widths_take_the_widest_element():
    # bf16 input, float32 weight: groups of 4 (16 bytes of float32, 8 of bf16)
    def scale(x, w):
        return x.float() * w
    (src,) = kernel_sources(scale, torch.randn(32, 64, dtype=torch.bfloat16), torch.randn(64))
    assert "EmberVec<unsigned short, 4>" in src and "EmberVec<float, 4>" in src
    assert "& 7ull) == 0" in src and "& 15ull) == 0" in src  # each buffer at its own vector size


def test_unaligned_starts_and_rows_keep_scalar_accesses():
    # x[:, 1:] starts one element in: its load stays scalar, the weight and the output vectorize
    def shifted(x, w):
        return torch.softmax(x[:, 1:] * w, -1)
    (src,) = kernel_sources(shifted, torch.randn(16, 4097, dtype=torch.bfloat16),
                            torch.randn(4096, dtype=torch.bfloat16))
    assert "arg0_1" not in vector_loads(src) and "arg1_1" in vector_loads(src)
    assert re.search(r"arg0_1\[4097\*o0 \+ r0 \+ 1\]", src)
    assert "ember_r_head" not in src  # (peeling x's rows would give up the weight's groups)


def test_odd_rows_peel_a_head_and_a_tail():
    """Rows of 999: most start mid-vector. Each row's groups start where it is aligned; the
    elements before (its head) and after the last whole group (its tail) go one at a time, by the
    same thread in every loop, so they are kept in registers with the groups."""
    (src,) = kernel_sources(softmax, torch.randn(64, 999, dtype=torch.bfloat16))
    assert vector_loads(src) == ["arg0_1"] * 3 and vector_stores(src) == ["buf0"]
    assert src.count("const I ember_r_head_at = (I)((8 - (999*o0) % 8) % 8);") == 3
    assert src.count("const I ember_r_first = ember_r_head + ember_r_group * 8;") == 3
    assert src.count("ember_r_rest_at < ember_r_head ? ember_r_rest_at : ember_r_rest_at + ember_r_groups * 8") == 3
    assert conditions(src) == ["(((unsigned long long)arg0_1) & 15ull) == 0"] * 2 + [
        "(((unsigned long long)arg0_1) & 15ull) == 0 && (((unsigned long long)buf0) & 15ull) == 0"]
    # the first loop keeps the head and tail elements too; the later two read them back
    assert "unsigned short ember_tail0[EMBER_UNROLL];" in src
    assert src.count("if (ember_cached) ember_tail0[ember_u] = v0_e;") == 1
    assert src.count("v0_e = ember_cached ? ember_tail0[ember_u] : arg0_1[999*o0 + r0];") == 2
    assert "(I)blockDim.x * EMBER_UNROLL >= 14;" in src  # one iteration covers a head and a tail
    # LayerNorm: x and the output move with the row, the weight and bias do not: x's alignment
    # decides the groups, and the weight and bias are read an element at a time within them
    x, w, b = torch.randn(64, 999, dtype=torch.bfloat16), torch.randn(999, dtype=torch.bfloat16), \
        torch.randn(999, dtype=torch.bfloat16)
    (src,) = kernel_sources(lambda x, w, b: F.layer_norm(x, (999,), w, b), x, w, b)
    assert set(vector_loads(src)) == {"arg0_1"} and vector_stores(src) == ["buf0"]
    assert re.search(r"ember_bf16_to_f32\(arg1_1\[r0\]\)", src)
    # a row length known only at run time: groups from the row's start where it is a multiple
    # of 8 (aligned rows run faster so), the scalar loop elsewhere
    (src,) = kernel_sources(softmax, torch.randn(8, 1000, dtype=torch.bfloat16), dynamic=True)
    assert "ember_r_head_at" not in src and all("% 8) == 0" in c for c in conditions(src))
    # cross-entropy over GPT-2's 50257 classes: rows too long to keep, read in groups all the same
    (src,) = kernel_sources(lambda x, t: F.cross_entropy(x, t), torch.randn(4, 50257, dtype=torch.bfloat16),
                            torch.randint(0, 50257, (4,)))
    assert vector_loads(src) and "ember_r_head_at" in src and "ember_tail" not in src
    # rows shorter than 8 groups are not peeled: their head and tail would cost more than groups save
    (src,) = kernel_sources(lambda x, t: F.cross_entropy(x, t), torch.randn(64, 10), torch.randint(0, 10, (64,)))
    assert "EmberVec" not in src
    (src,) = kernel_sources(softmax, torch.randn(64, 65, dtype=torch.bfloat16))
    assert "ember_r_head_at" in src


def test_transposed_gathered_and_column_accesses_stay_scalar():
    # a transposed operand steps by its row length along the loop. The output takes x.t()'s
    # layout, as eager's does, and the loops walk the output's memory (schedule/loops.py): x and
    # the output go in vectors, y steps by 8. Rows this short (8) run in the pointwise loop,
    # longer ones in tiles (codegen/cuda_tiles.py)
    (src,) = kernel_sources(lambda x, y: x.t() + y, torch.randn(8, 64), torch.randn(64, 8))
    assert vector_loads(src) == ["arg0_1"] and vector_stores(src) == ["buf0"]
    assert "arg1_1[8*o1 + o0]" in src and "buf0[64*o0 + o1] = " in src
    (src,) = kernel_sources(lambda x, y: x.t() + y, torch.randn(64, 64), torch.randn(64, 64))
    assert "// strategy: tiles" in src and "EmberVec" not in src
    # a gather along the row (its index differs within a group) stays scalar
    (src,) = kernel_sources(lambda w, i: w[:, i] * 2, torch.randn(8, 64), torch.randint(0, 64, (64,)))
    assert "arg0_1" not in vector_loads(src) and vector_stores(src) == ["buf0"]  # (the indices go in groups)
    assert re.search(r"arg0_1\[64\*o0 \+ v\d+\]", src)
    # x.sum(0): lanes take adjacent rows (the column strategy), no groups along a row
    (src,) = kernel_sources(lambda x: x.sum(0), torch.randn(256, 64))
    assert "EmberVec" not in src


def test_whole_rows_gathered_and_scattered_go_in_groups():
    """An embedding's rows start at data, but every element of a group is in the same row: the
    row index is computed once a group and the row's elements are a vector load; its backward's
    float32 additions into the weight's rows are one vector atomic a group."""
    (src,) = kernel_sources(lambda w, i: w[i] * 2, torch.randn(10, 64), torch.randint(0, 10, (8,)))
    assert vector_loads(src) == ["arg0_1"] and vector_stores(src) == ["buf0"]
    group = src[src.index("once a group"):src.index("#pragma unroll\n", src.index("once a group"))]
    assert re.search(r"ember_load_vec<float, 4>\(arg0_1 \+ \(64\*v\d+ \+ o1_g\)\)", group)

    def backward(g, i, w):
        return torch.ops.aten.embedding_dense_backward(g * w[:, None], i, 1000, -1, False)

    (src,) = [s for s in kernel_sources(backward, torch.randn(300, 128), torch.randint(0, 1000, (300,)),
                                        torch.randn(300)) if "atomic" in s]
    assert re.search(r"ember_atomic_add_vec<float, 4>\(buf0 \+ \(128\*v\d+ \+ o1_g\), v\d+_vec\)", src)
    assert src.count("ember_atomic_add(") == 1  # (the scalar loop's, where a group is not aligned)
    # float64 additions keep an atomic an element (no vector atomic adds them)
    (src,) = kernel_sources(lambda x, i, g: x.index_put((i,), g, accumulate=True),
                            torch.zeros(1000, 128, dtype=torch.float64), torch.randint(0, 1000, (300,)),
                            torch.randn(300, 128, dtype=torch.float64))
    assert "ember_atomic_add(" in src and "ember_atomic_add_vec" not in src


def test_guarded_loads_go_in_groups_and_their_work_stays_guarded():
    # where(x > 0, exp(y) * 2, 0): y is only needed where x > 0. Its index is affine, so every
    # address of a group is valid: the group is loaded whole, the exp stays under the guard.
    # (A causal softmax's masked scores, loaded one at a time, took 2.3x Triton's time.)
    def masked(x, y):
        return torch.where(x > 0, torch.exp(y) * 2, 0.0).sum(-1)
    (src,) = kernel_sources(masked, torch.randn(8, 1024), torch.randn(8, 1024))
    assert sorted(set(vector_loads(src))) == ["arg0_1", "arg1_1"], src
    vector = src[src.index("// vector form"):src.index("} else {", src.index("// vector form"))]
    guarded = re.search(r"if \(v\d+\) \{\n\s*const float v\d+ = v\d+_vec\.v\[ember_k\];\n\s*.*ember_exp", vector)
    assert guarded is not None, vector
    # a gathered load's address is data: it stays one at a time, under its guard
    def gathered(x, y, i):
        return torch.where(x > 0, y.gather(-1, i).exp(), 0.0).sum(-1)
    (src,) = kernel_sources(gathered, torch.randn(8, 1024), torch.randn(8, 1024), torch.randint(0, 1024, (8, 1024)))
    assert "arg1_1" not in vector_loads(src)


def test_symbolic_sizes_are_tested_at_run_time():
    # a weight read by every row lines up with x's groups only where the row length is a multiple
    x, w = torch.randn(8, 1024, dtype=torch.bfloat16), torch.randn(1024, dtype=torch.bfloat16)
    (src,) = kernel_sources(lambda x, w: x * w + 1, x, w, dynamic=True)
    conds = conditions(src)
    assert conds and all(re.search(r"\(\(s\d+\) % 8\) == 0", c) for c in conds), conds
    (src,) = kernel_sources(lambda x, w: torch.softmax(x * w, -1), x, w, dynamic=True)
    conds = conditions(src)
    assert conds and all(re.search(r"\(\(s\d+\) % 8\) == 0", c) for c in conds), conds
    assert "ember_r_head" not in src


def test_index_terms_that_must_be_multiples():
    o, r, s = outer_var(0), inner_var(0), sympy.Symbol("s0", integer=True, positive=True)
    loop_vars = {o, r}
    assert _multiple_of(sympy.Integer(0), 8, loop_vars) == []
    assert _multiple_of(4096 * o, 8, loop_vars) == []
    assert _multiple_of(4097 * o, 8, loop_vars) is None
    assert _multiple_of(4096 * o + 3, 8, loop_vars) is None
    assert _multiple_of(o * s, 8, loop_vars) == ["((s0) % 8) == 0"]
    assert _multiple_of(3 * o * s + 16, 8, loop_vars) == ["((3*s0) % 8) == 0"]
    assert _multiple_of(8 * sympy.floor(o / s), 8, loop_vars) == []  # any integer times 8
    assert _multiple_of(sympy.floor(o / s), 8, loop_vars) is None      # loop position and size mixed


def test_launch_geometry_counts_the_group():
    sms, plan = 132, cuda_launch.plan_launch
    # a 4096-wide bf16 row in groups of 8: 128 threads, each one iteration of 4 groups (so that
    # the loops after the first take the row from registers), a block per row
    assert plan("rows", 16384, 4096, sms, 1024, vector=8) == (False, 16384, 128)
    assert plan("rows", 16384, 32000, sms, 1024, vector=8) == (False, 16384, 512)  # rows too long for it
    assert plan("rows", 16384, 4096, sms, 1024) == (False, 16384, 512)
    # pointwise: a block's iteration covers 256 x 4 x 4 float32 elements
    assert plan("pointwise", 4096 * 10, 1, sms, 1024, vector=4) == (False, 10, 256)
    # full reductions: a block's iteration takes 512 x 4 groups, so fewer blocks have partials
    assert plan("full", 1, 1 << 20, sms, 1024, vector=8) == (False, 64, 512)
    assert plan("full", 1, 1 << 20, sms, 1024) == (False, 512, 512)


def test_grids_count_what_the_device_runs_at_once(monkeypatch):
    """Grids are sized by the blocks a kernel's registers let the SMs hold at once (the driver's
    occupancy), asked once per block size; 0 where the driver fails (the plan counts threads)."""
    asked = []

    class Driver:
        class CUresult:
            CUDA_SUCCESS = 0

        @staticmethod
        def cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, block, smem):
            asked.append((fn, block))
            return (0, 9) if fn == "i32" else (1, 0)

    monkeypatch.setattr(cuda_backend, "_driver", lambda: Driver)
    state = {"functions": ("i32", "i64"), "sms": 132, "resident": {}}
    resident = cuda_backend.CudaKernel._resident
    assert resident(None, state, False, 128) == 132 * 9
    assert resident(None, state, False, 128) == 132 * 9 and asked == [("i32", 128)]  # asked once
    assert resident(None, state, True, 128) == 0  # a driver error


def test_launch_meta_carries_the_width(monkeypatch):
    seen = record_rendered(monkeypatch, cuda_backend.CudaBackend)
    for fn, args, width in ((softmax, (torch.randn(64, 4096, dtype=torch.bfloat16),), 8),
                            (softmax, (torch.randn(64, 4095, dtype=torch.bfloat16),), 8),  # peeled
                            # a gathered row: its index is the same along the row
                            (lambda w, i: w[i].sum(-1), (torch.randn(10, 64), torch.randint(0, 10, (8,))), 4),
                            # gathered along the row: the gather scalar, the int64 indices in groups of 2
                            (lambda w, i: w[:, i].sum(-1), (torch.randn(10, 64), torch.randint(0, 64, (64,))), 2),
                            (lambda x: x.sum(0), (torch.randn(256, 64),), 1)):  # columns
        seen.clear()
        explain(fn, *args)
        assert [cuda.launch_meta(k)["vector"] for k in seen] == [width]


@needs_nvcc
@pytest.mark.parametrize("case", ["softmax_bf16", "relu_add_f32", "layer_norm_f16_dynamic", "layer_norm_999_bf16"])
def test_ptx_has_16_byte_loads_and_stores(case, tmp_path):
    if case == "softmax_bf16":
        report = explain(softmax, torch.randn(64, 4096, dtype=torch.bfloat16))
    elif case == "layer_norm_999_bf16":  # peeled rows
        x, w, b = torch.randn(8, 999, dtype=torch.bfloat16), torch.randn(999, dtype=torch.bfloat16), \
            torch.randn(999, dtype=torch.bfloat16)
        report = explain(lambda x, w, b: F.layer_norm(x, (999,), w, b), x, w, b)
    elif case == "relu_add_f32":
        report = explain(relu_add, torch.randn(1 << 12), torch.randn(1 << 12))
    else:
        x, w, b = torch.randn(8, 512, dtype=torch.float16), torch.randn(512, dtype=torch.float16), \
            torch.randn(512, dtype=torch.float16)
        report = explain(lambda x, w, b: F.layer_norm(x, (512,), w, b), x, w, b, dynamic=True)
    path = tmp_path / f"{case}.cu"
    path.write_text(cuda.PRELUDE + "\n" + "\n\n".join(sources(report, "t")) + "\n")
    proc = subprocess.run([NVCC, "-ptx", "-arch=sm_90", "-std=c++17", "-o", str(path.with_suffix(".ptx")), str(path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "warning" not in proc.stderr, proc.stderr[-4000:]
    ptx = path.with_suffix(".ptx").read_text()
    # one 16-byte load per vector load site and entry point (32- and 64-bit indices), at least
    sites = sum(len(vector_loads(k.source)) for k in report.kernels)
    assert sites and len(re.findall(r"ld\.global\.nc\.v4\.(u32|f32|b32)", ptx)) >= 2 * sites
    assert len(re.findall(r"st\.global\.v4\.(u32|f32|b32)", ptx)) >= 2 * sum(
        len(vector_stores(k.source)) for k in report.kernels)


@needs_nvcc
def test_norm_backward_stores_stay_16_bytes_wide(tmp_path):
    """LayerNorm's backward (dx and the weight gradients' run partials in one chunked kernel):
    when each block walked a run of consecutive rows, NVVM split every group's 16-byte store of
    dx into eight 2-byte stores (eight times the L2 write traffic: 358 us against Triton's 179
    on an H100). The runs now stride by the grid, and the stores stay whole."""
    def step(x, w, b, g):
        F.layer_norm(x, (4096,), w, b).backward(g)
    x = torch.randn(64, 4096, dtype=torch.bfloat16, requires_grad=True)
    w, b = (torch.randn(4096, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    report = ember.explain(step, x, w, b, torch.randn(64, 4096, dtype=torch.bfloat16), target="cuda",
                           options={"row_chunks": 16})
    (chunked,) = [k for k in report.kernels if "ember_chunk" in k.source]
    path = tmp_path / "backward.cu"
    path.write_text(cuda.PRELUDE + "\n" + chunked.source + "\n")
    ptx = subprocess.run([NVCC, "-ptx", "-arch=sm_90", "-std=c++17", "-o", "-", str(path)],
                         capture_output=True, text=True, timeout=600)
    assert ptx.returncode == 0, ptx.stderr[-4000:]
    (dx,) = vector_stores(chunked.source)  # dx's, the bf16 buffer (the partials are float)
    assert f"unsigned short* __restrict__ {dx}" in chunked.source
    assert len(re.findall(r"st\.global\.v4\.(u32|b32)", ptx.stdout)) >= cuda.UNROLL  # one a group
    assert len(re.findall(r"st\.global\.u16", ptx.stdout)) <= cuda.UNROLL  # the scalar loop's alone


@needs_nvcc
def test_row_kernels_take_few_instructions_and_registers(tmp_path):
    """The CUDA C++ row kernels were bound by instruction issue (ncu on an H100: the softmax over
    4096 issued on 82% of cycles at 54% of DRAM bandwidth). A bf16 store is one cvt, exp is
    ex2.approx (a softmax sum's terms without the subnormal fix-up), float32 division div.full's
    scaled reciprocal, a NaN-propagating max one instruction, a loaded bf16 one shift or mask of
    its 32-bit word (no byte permute, PRMT, in the SASS). Later loops
    re-read the cached row through an asm that keeps the compiler from holding a LayerNorm's 32
    x - mean values across the block reduction (86 registers a thread where 40 do); the loads
    keep their read-only path."""
    x, w, b = (torch.randn(64, 4096, dtype=torch.bfloat16), torch.randn(4096, dtype=torch.bfloat16),
               torch.randn(4096, dtype=torch.bfloat16))
    kernels = sources(explain(softmax, x), "softmax") + sources(
        explain(lambda x, w, b: F.layer_norm(x, (4096,), w, b), x, w, b), "layer_norm")
    path = tmp_path / "rows.cu"
    path.write_text(cuda.PRELUDE + "\n" + "\n\n".join(kernels) + "\n")
    ptx = subprocess.run([NVCC, "-ptx", "-arch=sm_90", "-std=c++17", "-o", "-", str(path)],
                         capture_output=True, text=True, timeout=600)
    assert ptx.returncode == 0, ptx.stderr[-4000:]
    for instruction in ("cvt.rn.bf16.f32", "ex2.approx.f32", "ex2.approx.ftz.f32", "rcp.approx.ftz.f32",
                        "max.NaN.f32", "ld.global.nc.v4"):
        assert instruction in ptx.stdout, instruction
    assert "div.rn.f32" not in ptx.stdout and "div.full.f32" not in ptx.stdout and "ld.global.v4" not in ptx.stdout
    proc = subprocess.run([NVCC, "-cubin", "-arch=sm_90", "-std=c++17", "-Xptxas", "-v", "-o",
                           str(path.with_suffix(".cubin")), str(path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    registers = dict(re.findall(r"entry function '(\w+)'.*?Used (\d+) registers", proc.stderr, re.S))
    narrow = {name: int(n) for name, n in registers.items() if not name.endswith("_i64")}
    assert len(narrow) == 2 and max(narrow.values()) <= 48, registers
    sass = _sass(path.with_suffix(".cubin"))
    if sass is not None:
        assert "PRMT" not in sass and sass.count("LOP3.LUT") >= 8, sass[:2000]

# ---- on a GPU (EMBER_TEST_DEVICE=cuda): both forms against eager ------------------------------

@pytest.mark.skipif(DEVICE != "cuda", reason="runs CUDA kernels: EMBER_TEST_DEVICE=cuda on a GPU machine")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_vector_and_scalar_forms_match_eager_on_the_gpu(dtype):
    def norm_scale(x, w):  # a row reduction and a pointwise store, each in groups
        return torch.softmax(x * w, -1) + x.float().square().mean(-1, keepdim=True).to(x.dtype)
    options = {"gpu_backend": "cuda"}
    # multiples of 8 and 4 (one iteration covers the row), of 8 too long for that, then of
    # neither (16-bit rows: peeled; the shifted views too)
    for width in (4096, 4104, 4100, 20480, 8, 7):
        base = torch.randn(33, width + 1, dtype=dtype, device="cuda")
        w = torch.randn(width, dtype=dtype, device="cuda")
        aligned = base[:, :width].contiguous()
        shifted = base.flatten()[1:1 + 33 * width].view(33, width)  # 2 or 4 bytes past an aligned address
        for x in (aligned, shifted):
            check(norm_scale, x, w, options=options)
            check(norm_scale, x, w, options=options, dynamic=True)
    x = torch.randn(1 << 20, device="cuda", dtype=dtype)
    check(relu_add, x, x.flip(0), options=options)
    check(relu_add, x[1:], x[:-1], options=options)  # misaligned: the scalar loop


@pytest.mark.skipif(DEVICE != "cuda", reason="runs CUDA kernels: EMBER_TEST_DEVICE=cuda on a GPU machine")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_peeled_rows_match_eager_on_the_gpu(dtype):
    """Rows whose groups start where each row is aligned: a head and a tail of single elements
    around them, kept in registers with the groups where a block covers the row (999, 2051),
    read again where it does not (20483, 50257), in row groups of a few lanes (33-130, the
    shortest peeled), rows too short to peel (1-17); views starting mid-vector."""
    def rows(x, w, b):
        return torch.softmax(x, -1), F.layer_norm(x, (x.shape[-1],), w, b), x.float().square().sum(-1)

    def loss(x, t):
        return F.cross_entropy(x, t), F.cross_entropy(x.float(), t, reduction="none")

    options = {"gpu_backend": "cuda"}
    for width in (1, 5, 9, 15, 17, 33, 65, 71, 130, 999, 2051, 20483):
        base = torch.randn(37 * width + 3, dtype=dtype, device="cuda")
        w, b = torch.randn(width, dtype=dtype, device="cuda"), torch.randn(width, dtype=dtype, device="cuda")
        for shift in (0, 1, 3):
            x = base[shift:shift + 37 * width].view(37, width)
            t = torch.randint(0, width, (37,), device="cuda")
            check(rows, x, w, b, options=options)
            check(loss, x, t, options=options)
        check(rows, x, w, b, options=options, dynamic=True)
    x = torch.randn(64, 50257, dtype=dtype, device="cuda")
    check(loss, x, torch.randint(0, 50257, (64,), device="cuda"), options=options)


@pytest.mark.skipif(DEVICE != "cuda", reason="runs CUDA kernels: EMBER_TEST_DEVICE=cuda on a GPU machine")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_norm_gradients_with_partials_in_registers_match_eager_on_the_gpu(dtype):
    """LayerNorm's and RMSNorm's backward: chunked row kernels whose weight gradients' partial
    sums stay in registers where the block covers a row, in memory elsewhere."""
    def layer_norm(x, w, b):
        return F.layer_norm(x, (x.shape[-1],), w, b)

    def rms_norm(x, w, b):
        return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w + b

    def residual_layer_norm_float(x, w, b):  # a float32 gradient in: loops of two group widths
        y = F.layer_norm(x + x.flip(0), (x.shape[-1],), w, b)
        return y if y.dtype == torch.float64 else y.float()

    for fn in (layer_norm, rms_norm, residual_layer_norm_float):
        compiled = ember.compile(fn, options={"gpu_backend": "cuda"})
        for rows, width, shift in ((1000, 4096, 0), (1000, 4096, 1), (300, 20480, 0), (1000, 1000, 0)):
            base = torch.randn(rows * width + shift, dtype=dtype, device="cuda")
            x = base[shift:].view(rows, width)  # shift 1: not aligned, the scalar loops
            w, b = torch.randn(width, dtype=dtype, device="cuda"), torch.randn(width, dtype=dtype, device="cuda")
            g = torch.randn(rows, width, dtype=dtype, device="cuda")
            grads = []
            for f, kind in ((fn, torch.float64), (fn, dtype), (compiled, dtype)):  # reference, eager, ember
                leaves = [t.detach().to(kind).requires_grad_() for t in (x, w, b)]
                if shift and kind == dtype:  # keep x misaligned: a leaf viewing the shifted storage
                    leaves[0] = base.detach().clone()[shift:].view(rows, width).requires_grad_()
                out = f(*leaves)
                out.backward(g.to(out.dtype))
                grads.append([t.grad.double() for t in leaves])
            # the weights' gradients sum 1000 rows of 16-bit products: no worse than eager's
            for i, (ref, eager, got) in enumerate(zip(*grads)):
                assert _error(got, ref) <= 2 * _error(eager, ref) + 1e-6, (fn.__name__, rows, width, shift, i)


def _error(t: torch.Tensor, ref: torch.Tensor) -> float:
    return ((t - ref).norm() / ref.norm()).item()


@pytest.mark.skipif(DEVICE != "cuda", reason="runs CUDA kernels: EMBER_TEST_DEVICE=cuda on a GPU machine")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_short_rows_in_row_groups_match_eager_on_the_gpu(dtype):
    """Rows shorter than a warp's iteration go a group of lanes each, 256 threads a block: widths
    giving groups of 1 to 32 lanes and blocks whose last rows are past the end, in both forms,
    with static and symbolic sizes; cross-entropy's mean (a reduction over all rows, combined
    across the block's groups), an ignored target included."""
    def rows(x, w):
        return torch.softmax(x, -1) * w, x.float().square().sum(-1), x.amax(-1)

    def loss(x, t):
        return F.cross_entropy(x.float(), t, ignore_index=0), F.cross_entropy(x, t, reduction="sum")

    options = {"gpu_backend": "cuda"}
    for width in (1, 3, 8, 16, 33, 64, 130, 500):
        for n in (1, 255, 1000):
            x = torch.randn(n, width, dtype=dtype, device="cuda")
            w = torch.randn(width, dtype=dtype, device="cuda")
            t = torch.randint(0, width, (n,), device="cuda")
            for dynamic in (False, True):
                check(rows, x, w, options=options, dynamic=dynamic)
                check(loss, x, t, options=options, dynamic=dynamic)
        if width > 1:
            check(rows, x[:, 1:], w[1:], options=options)  # a view: its rows not aligned to groups
