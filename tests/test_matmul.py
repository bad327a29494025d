"""Matmuls with fused epilogues (passes/matmul.py, codegen/triton_matmul.py): the passes against
the graphs they should produce, the Triton kernels, run under the interpreter, against eager, and
the launcher's background compile with a stand-in kernel.

Float16 on the CPU: Triton 3.6's interpreter computes bfloat16 ``tl.dot`` wrongly (numpy has no
bfloat16), so bfloat16 is checked on the GPU (test_bfloat16_on_the_gpu, and bench/gpu_fusion.py).
"""

from __future__ import annotations

import os
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.ir import ArgRef, ExternCall, GraphBuilder, Op, dtypes, structurally_equal, verify
from ember.ir.node import make
from ember.passes.matmul import fold_matmul_adds, matmul_epilogues
from ember.runtime import cuda_matmul as runtime_matmul

from .helpers import assert_same, check, on_the_interpreter

# fused matmul kernels are the Triton backend's: the CUDA C++ backend leaves products to cuBLAS
TRITON_MATMULS = pytest.mark.skipif(os.environ.get("EMBER_GPU_BACKEND") == "cuda",
                                    reason="fused matmul kernels are the Triton backend's")

aten = torch.ops.aten
F16 = torch.float16
# every matmul with an epilogue ('auto', the default, takes only matmuls sharing an operand)
TRITON = {"target": "triton", "matmul_epilogues": "all"}
# small tiles, two programs walking them all, K not a multiple of BK: every edge and the tile loop
SMALL_TILES = {**TRITON, "triton_launch": {"BM": 32, "BN": 32, "BK": 16, "PROGRAMS": 2}}
POINTERS = {**TRITON, "triton_launch": {"TMA": False, "BM": 32, "BN": 64, "BK": 16}}
LAUNCHES = {"default": TRITON, "small_tiles": SMALL_TILES, "pointers": POINTERS}
# Triton kernels on CPU tensors run through Triton's interpreter, which only the CPU run sets up
# (conftest.py); a GPU run (EMBER_TEST_DEVICE=cuda) runs the GPU tests below instead


def _mm(b: GraphBuilder, x, w, target=aten.mm.default, extra=(), kwargs=None, dtype=dtypes.float16):
    inputs = (*extra, x, w)
    args = tuple(ArgRef(i) for i in range(len(inputs)))
    call = ExternCall(target, args, kwargs or {})
    return b._add(make(Op.EXTERN, inputs, call, dtype=dtype, shape=(x.shape[0], w.shape[1])))


def test_pass_makes_matmuls_with_pointwise_users_ember_nodes():
    b = GraphBuilder()
    x, w, bias = b.input((64, 32), dtypes.float16), b.input((32, 48), dtypes.float16), b.input((48,), dtypes.float16)
    before = b.build(b.relu(_mm(b, x, w, aten.addmm.default, extra=(bias,))))
    e = GraphBuilder()
    x, w, bias = e.input((64, 32), dtypes.float16), e.input((32, 48), dtypes.float16), e.input((48,), dtypes.float16)
    wide = e.cast(e.expand(e.reshape(bias, (1, 48)), (64, 48)), dtypes.float32)
    total = e.cast(e.add(e.op(Op.MATMUL, x, w), wide), dtypes.float16)
    expected = e.build(e.relu(total))
    verify(before)
    after = matmul_epilogues(before, target="triton", mode="all")
    verify(after)
    assert structurally_equal(after, expected), f"got:\n{after}\n\nexpected:\n{expected}"


@pytest.mark.parametrize("case", ["no_pointwise_user", "float32", "cpp_target", "tiny_k", "beta_2"])
@pytest.mark.parametrize("target", ["triton", "cuda"])
def test_pass_leaves_other_matmuls_to_cublas(case, target):
    b = GraphBuilder()
    dtype = dtypes.float32 if case == "float32" else dtypes.float16
    x, w = b.input((64, 8 if case == "tiny_k" else 32), dtype), b.input((8 if case == "tiny_k" else 32, 48), dtype)
    if case == "beta_2":
        bias = b.input((48,), dtype)
        y = _mm(b, x, w, aten.addmm.default, extra=(bias,), kwargs={"beta": 2}, dtype=dtype)
    else:
        y = _mm(b, x, w, dtype=dtype)
    before = b.build(y if case == "no_pointwise_user" else b.relu(y))
    after = matmul_epilogues(before, target="cpp" if case == "cpp_target" else target, mode="all")
    assert not [n for n in after.nodes if n.op is Op.MATMUL]


def test_pass_follows_the_device_without_a_target():
    b = GraphBuilder(device="cpu")
    x, w = b.input((64, 32), dtypes.float16), b.input((32, 48), dtypes.float16)
    g = b.build(b.relu(_mm(b, x, w)))
    assert not [n for n in matmul_epilogues(g, mode="all").nodes if n.op is Op.MATMUL]  # the CPU keeps its BLAS


def test_auto_takes_matmuls_sharing_their_first_operand():
    b = GraphBuilder()
    x, wg, wu, w3 = (b.input(s, dtypes.float16) for s in ((64, 32), (32, 48), (32, 48), (32, 40)))
    gate, up, other = _mm(b, x, wg), _mm(b, x, wu), _mm(b, x, w3)
    g = b.build(b.mul(b.sigmoid(gate), up), b.relu(other))
    after = matmul_epilogues(g, target="triton")
    matmuls = [n for n in after.nodes if n.op is Op.MATMUL]
    assert len(matmuls) == 2 and {m.inputs[1] for m in matmuls} == {after.inputs[1], after.inputs[2]}
    assert len([n for n in after.nodes if n.op is Op.EXTERN]) == 1  # x @ w3 (40 columns): cuBLAS


def _kept_by_auto(target: str, outputs: str) -> bool:
    """Does 'auto' rewrite p = x @ W in a graph returning ``outputs`` of h = p + bias,
    e = exp(h), the row sums s of h and r = h / s?"""
    b = GraphBuilder()
    x, w, bias = b.input((64, 32), dtypes.float16), b.input((32, 48), dtypes.float16), b.input((64, 48), dtypes.float16)
    h = b.add(_mm(b, x, w), bias)
    e, s = b.exp(h), b.sum(h, (1,))
    r = b.div(h, b.expand(b.reshape(s, (64, 1)), (64, 48)))
    g = b.build(*(dict(h=h, e=e, s=s, r=r)[name] for name in outputs.split(",")))
    return any(n.op is Op.MATMUL for n in matmul_epilogues(g, target=target).nodes)


@pytest.mark.parametrize("mode", ["auto", "all"])
def test_an_epilogue_of_casts_alone_stays_cublas(mode):
    # a language model's logits cast to float32 for the loss, whose softmax (x - max) waits for a
    # reduction: the kernel would only store them wider; the loss kernel casts as it reads
    b = GraphBuilder()
    x, w = b.input((64, 32), dtypes.bfloat16), b.input((32, 48), dtypes.bfloat16)
    logits = b.cast(_mm(b, x, w, dtype=dtypes.bfloat16), dtypes.float32)
    top = b.expand(b.reshape(b.amax(logits, (1,)), (64, 1)), (64, 48))
    g = b.build(b.sum(b.exp(b.sub(logits, top)), (1,)))
    assert not [n for n in matmul_epilogues(g, target="cuda", mode=mode).nodes if n.op is Op.MATMUL]
    scaled = b.build(b.mul(logits, b.full(0.5, (64, 48))))  # a computing epilogue: fused
    assert [n for n in matmul_epilogues(scaled, target="cuda", mode=mode).nodes if n.op is Op.MATMUL]


@pytest.mark.parametrize("target", ["triton", "cuda"])
def test_auto_leaves_a_kernel_of_two_stores_to_cublas(target):
    # a training forward's gelu(x @ W + b) that saves x @ W + b: its kernel would store both
    # ('auto' with target 'cuda' renders for Hopper, where a lone matmul is the template's)
    assert _kept_by_auto(target, "e") == (target == "cuda")  # (the Triton backend: lone matmuls only on Hopper)
    assert not _kept_by_auto(target, "h,e")
    # r needs a reduction of h: another kernel's, so the matmul's stores h alone
    assert _kept_by_auto(target, "s,r") == (target == "cuda")
    b = GraphBuilder()
    x, wg, wu = (b.input(s, dtypes.float16) for s in ((64, 32), (32, 48), (32, 48)))
    gate, up = _mm(b, x, wg), _mm(b, x, wu)
    inference = b.build(b.mul(b.sigmoid(gate), up))
    training = b.build(b.mul(b.sigmoid(gate), up), gate, up)  # the gated MLP's saved products
    assert len([n for n in matmul_epilogues(inference, target=target).nodes if n.op is Op.MATMUL]) == 2
    assert not [n for n in matmul_epilogues(training, target=target).nodes if n.op is Op.MATMUL]
    assert len([n for n in matmul_epilogues(training, target=target, mode="all").nodes if n.op is Op.MATMUL]) == 2


def gelu_linear(x, w, b):
    return F.gelu(F.linear(x, w, b))


def gelu_matmul(x, w, b):
    return F.gelu(x @ w + b)


def swiglu(x, wg, wu):
    return F.silu(x @ wg) * (x @ wu)


def the_matmul_kernel(report, dots=1):
    (kernel,) = report.kernels
    assert kernel.kernel_ir.count("= dot ") == dots, kernel.kernel_ir
    # (one product, or two sharing A, on a Hopper GPU: the CUDA ping-pong kernel, tests/test_cuda_matmul.py)
    assert kernel.source.count("tl.dot(") == dots or dots <= 2 and "ember_wgmma" in kernel.source, kernel.source
    assert not report.fallbacks, report.fallbacks
    return kernel


@on_the_interpreter
@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_linear_gelu_is_one_kernel(launch):
    x, w, b = torch.randn(70, 50, dtype=F16), torch.randn(96, 50, dtype=F16) * 0.2, torch.randn(96, dtype=F16)
    kernel = the_matmul_kernel(check(gelu_linear, x, w, b, options=LAUNCHES[launch]))
    assert kernel.name.startswith("fused_addmm_gelu"), kernel.name


@on_the_interpreter
@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_swiglu_is_one_kernel_with_two_dots(launch):
    x = torch.randn(40, 64, dtype=F16)
    wg, wu = torch.randn(64, 90, dtype=F16) * 0.2, torch.randn(64, 90, dtype=F16) * 0.2
    the_matmul_kernel(check(swiglu, x, wg, wu, options=LAUNCHES[launch]), dots=2)


@on_the_interpreter
@pytest.mark.parametrize("layout", ["a_transposed", "b_transposed", "both", "sliced"])
def test_operand_layouts(layout):
    x, w, b = torch.randn(48, 64, dtype=F16), torch.randn(48, 80, dtype=F16) * 0.2, torch.randn(80, dtype=F16)
    if layout == "a_transposed":
        fn = lambda x, w, b: torch.relu(x.t() @ w[:, :64] + b[:64])  # noqa: E731
    elif layout == "b_transposed":
        fn = lambda x, w, b: torch.tanh(x @ w.t()[:64, :48])  # noqa: E731
    elif layout == "both":
        fn = lambda x, w, b: torch.sigmoid(x.t() @ w.t()[:48, :])  # noqa: E731
    else:
        fn = lambda x, w, b: (x[::2, 16:] @ w[:48, 16:] + 1.5) * 2  # noqa: E731
    for options in (TRITON, POINTERS):
        torch._dynamo.reset()
        the_matmul_kernel(check(fn, x, w, b, options=options))


@on_the_interpreter
def test_a_broadcast_operand_is_read_with_pointers(monkeypatch):
    # a weight's one row expanded over K has a row stride of 0: 16-byte aligned, but no row for
    # TMA's copy engine to step over. The launcher takes the kernel's pointer loads for it
    from ember.runtime import triton_matmul
    chosen, tma = [], triton_matmul.MatmulLauncher._tma
    monkeypatch.setattr(triton_matmul.MatmulLauncher, "_tma",
                        lambda self, *args: chosen.append(tma(self, *args)) or chosen[-1])
    x, b = torch.randn(40, 64, dtype=F16), torch.randn(48, dtype=F16)
    for w, readable in ((torch.randn(64, 48, dtype=F16) * 0.2, True),
                        ((torch.randn(1, 48, dtype=F16) * 0.2).expand(64, 48), False)):
        torch._dynamo.reset()
        chosen.clear()
        out = ember.compile(gelu_matmul, options=TRITON)(x, w, b)  # (check() would clone w dense)
        assert_same(out, gelu_matmul(x, w, b))
        assert chosen == [readable]


@on_the_interpreter
def test_epilogue_of_the_transposed_product():
    # read at (n, m), the product cannot be the epilogue's tile: a kernel of its own stores it
    x, w = torch.randn(40, 64, dtype=F16), torch.randn(64, 48, dtype=F16) * 0.2
    report = check(lambda x, w: torch.sigmoid(x @ w).t().contiguous(), x, w, options=TRITON)
    assert len(report.kernels) == 2 and not report.fallbacks


def test_symbolic_rows_compile_once():
    w, b = torch.randn(96, 50, dtype=F16) * 0.2, torch.randn(96, dtype=F16)
    report = ember.Report()
    compiled = ember.compile(gelu_linear, dynamic=True, options=SMALL_TILES, report=report)
    for rows in (33, 70, 129, 16):
        x = torch.randn(rows, 50, dtype=F16)
        assert_same(compiled(x, w, b), gelu_linear(x, w, b))
    assert len(report.graphs) == 1
    assert "dot" in report.kernels[0].kernel_ir


@on_the_interpreter
def test_operand_computed_by_another_kernel():
    # gelu(x) is an operand: stored by a kernel of its own, then read by the matmul's
    x, w = torch.randn(40, 64, dtype=F16), torch.randn(64, 48, dtype=F16) * 0.2
    report = check(lambda x, w: torch.relu(F.gelu(x) @ w), x, w, options=TRITON)
    assert len(report.kernels) == 2 and sum("= dot " in k.kernel_ir for k in report.kernels) == 1


@on_the_interpreter
def test_matmul_result_also_returned():
    # the product is an output too: the kernel stores it and its epilogue's result
    x, w = torch.randn(40, 64, dtype=F16), torch.randn(64, 48, dtype=F16) * 0.2
    the_matmul_kernel(check(lambda x, w: (lambda y: (y, torch.exp(y)))(x @ w), x, w, options=TRITON))


def test_training_step_matches_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 32)).half()
    ref_model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 32)).half()
    ref_model.load_state_dict(model.state_dict())
    x = torch.randn(48, 64, dtype=F16)
    report = ember.Report()
    compiled = ember.compile(model, options=TRITON, report=report)
    compiled(x).float().square().mean().backward()
    ref_model(x).float().square().mean().backward()
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert_same(p.grad, q.grad)
    assert any("= dot " in k.kernel_ir for k in report.kernels)


@on_the_interpreter
@pytest.mark.parametrize("mode", ["auto", "off"])
def test_lone_matmul_keeps_cublas_unless_all(mode):
    x, w, b = torch.randn(70, 50, dtype=F16), torch.randn(96, 50, dtype=F16) * 0.2, torch.randn(96, dtype=F16)
    report = check(gelu_linear, x, w, b, options={"target": "triton", "matmul_epilogues": mode})
    assert report.fallbacks == ["aten.addmm"] and not any("= dot " in k.kernel_ir for k in report.kernels)


@on_the_interpreter
def test_auto_fuses_the_gated_mlp():
    x = torch.randn(40, 64, dtype=F16)
    wg, wu = torch.randn(64, 90, dtype=F16) * 0.2, torch.randn(64, 90, dtype=F16) * 0.2
    the_matmul_kernel(check(swiglu, x, wg, wu, options={"target": "triton"}), dots=2)


@on_the_interpreter
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_gated_mlp_after_a_norm_in_inference(dynamic):
    # a Llama block's MLP: the normalized x feeds both projections; computed in their two-dot
    # kernel it would put the norm's reduction under the matmuls, so it gets a buffer of its own
    # (the plan did not converge before: the block's inference graph ran through ATen, after 40 s)
    def mlp(x, w, wg, wu, wd):
        xf = x.float()
        h = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x) * w
        return x + F.linear(F.silu(F.linear(h, wg)) * F.linear(h, wu), wd)

    w = torch.rand(64, dtype=F16) + 0.5
    wg, wu, wd = (torch.randn(96, 64, dtype=F16) * 0.2, torch.randn(96, 64, dtype=F16) * 0.2,
                  torch.randn(64, 96, dtype=F16) * 0.1)
    report = ember.Report()
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = ember.compile(mlp, dynamic=dynamic, options={"target": "triton"}, report=report)
        for tokens in (20, 9):  # (2 x 9 rows: above a tile's smallest side, as statically compiled)
            x = torch.randn(2, tokens, 64, dtype=F16)
            # (products of magnitude ~5, rounded to float16 in eager before the multiply)
            assert_same(compiled(x, w, wg, wu, wd), mlp(x, w, wg, wu, wd), rtol=1e-2, atol=1e-2)
    assert not [w for w in caught if "ember" in str(w.message)], [str(w.message) for w in caught]
    assert not [g.error for g in report.graphs if g.error]
    dots = [k.kernel_ir.count("= dot ") for k in report.kernels]
    assert 2 in dots and report.fallbacks == ["aten.mm"] * len(report.graphs), (dots, report.fallbacks)


def test_bad_option_value_is_refused():
    with pytest.raises(ValueError, match="matmul_epilogues"):
        ember.compile(swiglu, options={"matmul_epilogues": "some"})
    with pytest.raises(TypeError, match="matmul_epilogues"):  # (not a string)
        ember.compile(swiglu, options={"matmul_epilogues": True})


@on_the_interpreter
def test_kernel_that_fails_to_build_falls_back_with_one_warning():
    x, w, b = torch.randn(70, 50, dtype=F16), torch.randn(96, 50, dtype=F16) * 0.2, torch.randn(96, dtype=F16)
    compiled = ember.compile(gelu_linear, options={**TRITON, "triton_launch": {"BM": 24}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(x, w, b)
        out2 = compiled(x, w, b)
    assert len([c for c in caught if "matmul kernel" in str(c.message)]) == 1
    assert_same(out, gelu_linear(x, w, b))
    assert_same(out2, out)


def test_explain_renders_tma_and_pointer_paths(monkeypatch):
    # (on a Hopper GPU a lone product renders as the CUDA ping-pong kernel: tests/test_cuda_matmul.py)
    monkeypatch.setattr(runtime_matmul, "on_hopper", lambda kernel: False)
    x, w, b = torch.randn(64, 64, dtype=F16), torch.randn(96, 64, dtype=F16), torch.randn(96, dtype=F16)
    report = ember.explain(gelu_linear, x, w, b, target="triton", options={"matmul_epilogues": "all"})
    source = report.kernels[0].source
    assert "tl.make_tensor_descriptor" in source and "tl.load(" in source and "tl.num_programs(0)" in source


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bfloat16 matmul kernels need a GPU (see the docstring)")
@TRITON_MATMULS
@pytest.mark.parametrize("shape", [(256, 512, 384), (1000, 72, 200), (17, 4096, 24)])
def test_bfloat16_on_the_gpu(shape):
    m, k, n = shape
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.05
    b = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    # (compiled at the first call: in the background it would run through ATen, unchecked)
    every, auto = ({"matmul_epilogues": mode, "background_compile": False} for mode in ("all", "auto"))
    the_matmul_kernel(check(gelu_linear, x, w, b, options=every))
    torch._dynamo.reset()
    wg, wu = (torch.randn(k, n, dtype=torch.bfloat16, device="cuda") * 0.05 for _ in range(2))
    the_matmul_kernel(check(swiglu, x, wg, wu, options=auto), dots=2)
    torch._dynamo.reset()
    xt = x.t().contiguous()  # the first operand transposed: (k, m) in memory
    the_matmul_kernel(check(lambda xt, w: torch.relu(xt.t() @ w.t()), xt, w, options=every))


@on_the_interpreter
@pytest.mark.parametrize("dynamic", [False, True])
def test_linear_over_tokens_fuses_through_the_reshape(dynamic):
    # (batch, tokens, features): the linear layer's rows are batch * tokens; the epilogue (gelu,
    # then a residual add of a (batch, tokens, N) tensor) sees them as (batch, token)
    x, w, b = torch.randn(3, 10, 64, dtype=F16), torch.randn(48, 64, dtype=F16) * 0.2, torch.randn(48, dtype=F16)
    res = torch.randn(3, 10, 48, dtype=F16)
    fn = lambda x, w, b, res: F.gelu(F.linear(x, w, b)) + res  # noqa: E731
    the_matmul_kernel(check(fn, x, w, b, res, options=SMALL_TILES, dynamic=dynamic))
    if dynamic:
        x, res = torch.randn(2, 7, 64, dtype=F16), torch.randn(2, 7, 48, dtype=F16)
        assert_same(ember.compile(fn, dynamic=True, options=SMALL_TILES)(x, w, b, res), fn(x, w, b, res))


class _SlowKernel:
    """Stands in for a Triton kernel whose compile (warmup) waits for ``release``."""

    def __init__(self, fail: bool = False):
        self.release, self.fail, self.launches = threading.Event(), fail, []

    def warmup(self, *args, grid, **constexprs):
        assert self.release.wait(10)
        if self.fail:
            raise RuntimeError("out of resource: shared memory")

    def __getitem__(self, grid):
        return lambda *args, **constexprs: self.launches.append(grid)


def _background_launcher(monkeypatch, kernel, calls):
    from ember.runtime import triton_matmul as tm
    meta = {"params": ["a", "b", "out"], "sizes": [], "m": "64", "n": "48", "k": "32", "dots": 1, "tma": None}
    launcher = tm.MatmulLauncher("fused_mm_relu_0", kernel, meta, "src", None, lambda *a: calls.append(a), None,
                                 "heuristic", ember.config.replace(background_compile=True))
    monkeypatch.setattr(launcher, "_can_background", lambda args: True)  # (a GPU's tensors, on the GPU)
    monkeypatch.setattr("ember.runtime.triton_matmul.FIRST_WAIT_S", 0.0)
    return launcher


def test_background_compile_runs_calls_through_aten_until_the_kernel_is_ready(monkeypatch):
    kernel, calls = _SlowKernel(), []
    launcher = _background_launcher(monkeypatch, kernel, calls)
    args = (torch.zeros(64, 32), torch.zeros(32, 48), torch.zeros(64, 48))
    before = ember.stats()["calls_while_compiling"]
    launcher(*args)
    launcher(*args)
    assert len(calls) == 2 and not kernel.launches
    assert not ember.wait_for_kernels(timeout=0.05)  # still compiling
    kernel.release.set()
    assert ember.wait_for_kernels(timeout=10)
    launcher(*args)
    assert len(calls) == 2 and len(kernel.launches) == 1
    assert ember.stats()["calls_while_compiling"] - before == 2


def test_background_compile_failure_falls_back_with_one_warning(monkeypatch):
    kernel, calls = _SlowKernel(fail=True), []
    launcher = _background_launcher(monkeypatch, kernel, calls)
    args = (torch.zeros(64, 32), torch.zeros(32, 48), torch.zeros(64, 48))
    launcher(*args)
    kernel.release.set()
    assert ember.wait_for_kernels(timeout=10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        launcher(*args)
        launcher(*args)
    assert len([c for c in caught if "matmul kernel" in str(c.message)]) == 1
    assert len(calls) == 3 and not kernel.launches


def test_gated_mlp_trains_like_eager_by_default():
    # 'auto': the gate and up projections share x, so in inference they are one kernel with two
    # dots. A training forward saves both products for the backward: that kernel would store
    # three tensors, so cuBLAS computes them and one kernel the epilogue (passes/matmul.py)
    torch.manual_seed(0)

    class GatedMLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate, self.up = torch.nn.Linear(64, 96, bias=False), torch.nn.Linear(64, 96, bias=False)
            self.down = torch.nn.Linear(96, 64, bias=False)

        def forward(self, x):
            return self.down(F.silu(self.gate(x)) * self.up(x))

    model = GatedMLP().half()
    ref_model = GatedMLP().half()
    ref_model.load_state_dict(model.state_dict())
    x = torch.randn(2, 24, 64, dtype=F16)  # (batch, tokens, features)
    report = ember.Report()
    compiled = ember.compile(model, options={"target": "triton"}, report=report)
    compiled(x).float().square().mean().backward()
    ref_model(x).float().square().mean().backward()
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert_same(p.grad, q.grad)
    (forward,) = [g for g in report.graphs if g.kind == "forward"]
    assert not any("= dot " in k.kernel_ir for k in report.kernels), [k.kernel_ir for k in report.kernels]
    assert forward.wrapper.count("aten_mm") + forward.wrapper.count("aten_addmm") == 3
    report = ember.Report()
    with torch.no_grad():
        assert_same(ember.compile(model, options={"target": "triton"}, report=report)(x), ref_model(x))
    assert [k.kernel_ir.count("= dot ") for k in report.kernels] == [2]


def test_fold_matmul_adds_pass():
    b = GraphBuilder()
    x, w, y, v = (b.input(s, dtypes.bfloat16) for s in ((64, 32), (32, 48), (64, 16), (16, 48)))
    before = b.build(b.add(_mm(b, x, w, dtype=dtypes.bfloat16), _mm(b, y, v, dtype=dtypes.bfloat16)))
    after = fold_matmul_adds(before, target="triton")
    verify(after)
    (out,) = after.outputs
    assert out.op is Op.EXTERN and out.arg.name == "aten.addmm"
    assert out.inputs[0].op is Op.EXTERN and out.inputs[0].arg.name == "aten.mm" and out.inputs[1:] == (
        after.inputs[0], after.inputs[1])
    def addmms(g):
        return [n for n in g.nodes if n.op is Op.EXTERN and n.arg.name == "aten.addmm"]
    assert not addmms(fold_matmul_adds(before, target="cpp"))  # the CPU's kernels add
    # a product that is also an output is stored anyway: the other one folds, adding it
    first = before.outputs[0].inputs[0]
    kept = fold_matmul_adds(before.with_nodes(before.inputs, [before.outputs[0], first], before.nodes), target="triton")
    (addmm,) = addmms(kept)
    assert addmm.inputs[0] is kept.outputs[1] and addmm.inputs[1:] == (kept.inputs[2], kept.inputs[3])


def test_sum_of_two_products_is_one_addmm():
    # a backward's dx = dg @ Wg.T + du @ Wu.T: cuBLAS adds the first product as it stores the second
    a, b = torch.randn(64, 32, dtype=torch.bfloat16), torch.randn(32, 48, dtype=torch.bfloat16)
    c, d = torch.randn(64, 16, dtype=torch.bfloat16), torch.randn(16, 48, dtype=torch.bfloat16)
    fn = lambda a, b, c, d: a @ b + c @ d  # noqa: E731
    report = ember.Report()
    out = ember.compile(fn, options={"target": "triton"}, report=report)(a, b, c, d)
    assert sorted(report.fallbacks) == ["aten.addmm", "aten.mm"] and not report.kernels
    # rounded once where eager rounds the product, then the sum: never further from the exact sum
    exact = fn(*(t.double() for t in (a, b, c, d)))
    eager = fn(a, b, c, d)
    assert out.dtype == eager.dtype and (out.double() - exact).abs().max() <= (eager.double() - exact).abs().max()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bfloat16 matmul kernels need a GPU (see the docstring)")
@TRITON_MATMULS
@pytest.mark.parametrize("mode", ["auto", "all"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gated_mlp_on_the_gpu(dtype, mode):
    # the default ('auto') path users get: (batch, tokens, features) inputs with a varying token
    # count (symbolic rows, no recompile), an unaligned K (pointer loads) and an aligned one (TMA),
    # forward and backward against eager. The forward saves both products for the backward, so
    # 'auto' leaves them to cuBLAS; 'all' computes them in the two-product kernel, which stores them
    for k in (100, 256):
        torch._dynamo.reset()
        wg = (torch.randn(k, 72, dtype=dtype, device="cuda") * 0.05).requires_grad_()
        wu = (torch.randn(k, 72, dtype=dtype, device="cuda") * 0.05).requires_grad_()
        report = ember.Report()
        compiled = ember.compile(swiglu, dynamic=True, report=report, options={"matmul_epilogues": mode})
        for tokens in (40, 77):
            x = torch.randn(2, tokens, k, dtype=dtype, device="cuda", requires_grad=True)
            out = compiled(x, wg, wu)
            ember.wait_for_kernels()
            out2 = compiled(x, wg, wu)  # the kernel, ready now (the first call may run through ATen)
            ref = swiglu(x, wg, wu)
            assert_same(out, ref)
            assert_same(out2, ref)
            # gradients: sums over the rows of 16-bit products, rounded differently by ember (in
            # one kernel) and eager (op by op), so both are compared with float64
            grads = torch.autograd.grad(out2.float().square().sum(), (x, wg, wu))
            eager = torch.autograd.grad(ref.float().square().sum(), (x, wg, wu))
            leaves = [t.detach().double().requires_grad_() for t in (x, wg, wu)]
            exact = torch.autograd.grad(swiglu(*leaves).square().sum(), leaves)
            for g, e, r in zip(grads, eager, exact):
                mine, theirs = (((t.double() - r).norm() / r.norm()).item() for t in (g, e))
                assert g.dtype == dtype and mine <= 2 * theirs + 1e-3, (mine, theirs)
        assert len([g for g in report.graphs if g.kind in ("forward", "inference")]) == 1
        assert any(k.kernel_ir.count("= dot ") == 2 for k in report.kernels) == (mode == "all")
        assert not report.fallbacks or set(report.fallbacks) <= {"aten.mm", "aten.addmm"}
