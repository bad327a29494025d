"""The Hopper matmul template (codegen/cuda_matmul.py, runtime/cuda_matmul.py): which matmuls the
pass gives it, the kernels it renders for each operand layout, compiled for sm_90a with nvcc on
the CPU, the launcher's tensor-map arguments, and on a Hopper GPU (``EMBER_TEST_DEVICE=cuda``)
every layout, edge and fallback against eager with both GPU backends."""

from __future__ import annotations

import re
import subprocess
import threading
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.codegen import cuda_matmul
from ember.ir import GraphBuilder, Op, dtypes
from ember.passes import matmul as matmul_pass

from .helpers import check, on_the_interpreter
from .test_cuda import NVCC, needs_nvcc
from .test_matmul import _mm

BF16, F16 = torch.bfloat16, torch.float16


def gelu_matmul(x, w, b):
    return F.gelu(x @ w + b)


def relu_linear(x, w, b):
    return torch.relu(F.linear(x, w, b))


def silu_transposed(xt, w):  # A M-major (x stored transposed), B N-major
    return F.silu(xt.t() @ w)


def scaled_both_transposed(xt, wt):  # A M-major, B K-major
    return (xt.t() @ wt.t()).float() * 0.5


def product_and_relu(x, w):  # the product is an output too: the epilogue stores both
    y = x @ w
    return y, torch.relu(y)


def swiglu(x, wg, wu):  # two products sharing A: one kernel, B N-major
    return F.silu(x @ wg) * (x @ wu)


def linear_swiglu(x, wg, wu):  # nn.Linear's (N, K) weights: B K-major
    return F.silu(F.linear(x, wg)) * F.linear(x, wu)


# name -> (fn, (M, K, N), dtype, expected (A M-major, B N-major))
CASES = {
    "x @ W + b, gelu": (gelu_matmul, (256, 64, 128), BF16, (0, 1)),
    "linear, relu": (relu_linear, (200, 72, 136), F16, (0, 0)),
    "x.t() @ W, silu": (silu_transposed, (128, 96, 256), BF16, (1, 1)),
    "x.t() @ W.t(), scaled": (scaled_both_transposed, (64, 128, 64), F16, (1, 0)),
    "product and relu": (product_and_relu, (96, 32, 80), BF16, (0, 1)),
    "swiglu": (swiglu, (200, 136, 144), BF16, (0, 1)),
    "linear swiglu": (linear_swiglu, (96, 64, 200), F16, (0, 0)),
}


def inputs(name: str, device: str = "cpu") -> tuple[torch.Tensor, ...]:
    fn, (m, k, n), dtype, _ = CASES[name]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g, dtype=torch.float32).to(dtype)
    if fn in (silu_transposed, scaled_both_transposed):
        x = x.t().contiguous()  # stored (K, M): the function multiplies its transpose
    w = (torch.randn(k, n, generator=g) * 0.1).to(dtype)
    if fn in (relu_linear, linear_swiglu):
        w = w.t().contiguous()  # nn.Linear's (N, K) weight
    if fn is scaled_both_transposed:
        w = w.t().contiguous()
    b = torch.randn(n, generator=g).to(dtype)
    if fn in (swiglu, linear_swiglu):  # b: the second weight, as w
        b = (torch.randn(k, n, generator=g) * 0.1).to(dtype)
        b = b.t().contiguous() if fn is linear_swiglu else b
    args = (x, w, b) if fn in (gelu_matmul, relu_linear, swiglu, linear_swiglu) else (x, w)
    return tuple(a.to(device) for a in args)


def case_options(name: str) -> dict:
    """A product that is an output too stays cuBLAS's by default ('auto': its kernel would store
    it anyway, passes/matmul.py); 'all' asks for the template, which then stores both."""
    return {"matmul_epilogues": "all"} if CASES[name][0] is product_and_relu else {}


def explain(name: str, dynamic: bool | None = None) -> ember.Report:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ember.explain(CASES[name][0], *inputs(name), target="cuda", dynamic=dynamic,
                             options=case_options(name))


def the_kernel(report: ember.Report) -> ember.report.KernelReport:
    (kernel,) = [k for k in report.kernels if "= dot " in k.kernel_ir]
    return kernel


@pytest.mark.parametrize("name", list(CASES))
def test_one_kernel_per_layout(name):
    report = explain(name)
    assert not [g.error for g in report.graphs if g.error]
    assert not [f for f in report.fallbacks if "mm" in f], report.fallbacks  # cuBLAS no longer computes it
    kernel = the_kernel(report)
    ta, tb = CASES[name][3]
    src = kernel.source
    assert src.count('extern "C" __global__') == 1 and f"ember_wgmma<{ta}, {tb}>" in src
    assert "setmaxnreg.inc" in src and "ember_tma_load" in src
    assert len(report.kernels) == 1, [k.name for k in report.kernels]  # the epilogue is in it


@needs_nvcc
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_kernels_compile_for_sm90a(tmp_path, dynamic):
    sources = []
    for i, name in enumerate(CASES):
        kernel = the_kernel(explain(name, dynamic=dynamic))
        sources.append(re.sub(rf"\b{kernel.name}\b", f"{kernel.name}_{i}", kernel.source))
    path = tmp_path / "matmuls.cu"
    path.write_text(cuda_matmul.PRELUDE + cuda_matmul.hopper_helpers() + "\n\n".join(sources))
    cmd = [NVCC, "-cubin", f"-arch={cuda_matmul.ARCH}", "-std=c++17", "-Xptxas", "-v", "-o",
           str(tmp_path / "m.cubin"), str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "spill" in proc.stderr and not re.search(r"[1-9]\d* bytes spill", proc.stderr), proc.stderr
    assert "warning" not in proc.stderr, proc.stderr  # (an unused variable, say)
    sass = _sass(tmp_path / "m.cubin")
    if sass is not None:
        _products_read_uniform_registers(sass, len(CASES))
        _epilogue_stores_without_branches(sass)


def _sass(cubin) -> str | None:
    """The cubin's SASS, by the cuobjdump that Triton's package carries (None without it)."""
    try:
        import triton
    except ImportError:
        return None
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return None
    return subprocess.run([str(tool), "-sass", str(cubin)], capture_output=True, text=True, timeout=120,
                          check=True).stdout


def _products_read_uniform_registers(sass: str, kernels: int) -> None:
    """Between two wgmma products of a stage, no descriptor moves from vector to uniform
    registers (R2UR): the stage and descriptor arithmetic is uniform, which halved the mainloop's
    instructions (117 to 57 a stage) and made the kernel 7% faster (bench/RESULTS.md)."""
    functions = sass.split("Function : ")[1:]
    assert len(functions) == kernels
    for text in functions:
        lines = [line for line in text.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", line)]
        products = [i for i, line in enumerate(lines) if "HGMMA" in line]
        assert len(products) >= 8, text[:200]
        for first, second in zip(products, products[1:]):
            if second - first < 40:  # (one stage's products)
                between = lines[first + 1:second]
                assert not any("R2UR" in line for line in between), "\n".join(between)


def _epilogue_stores_without_branches(sass: str) -> None:
    """The epilogue's stores are predicated, with no branch (and no reconvergence barrier, BSSY)
    around each pair's: the branches made gelu(x @ W + b) at K = 1024 8% slower (147 against 135
    µs on an H200, bench/RESULTS.md). One BSSY a kernel is the consumers' loop's."""
    for text in sass.split("Function : ")[1:]:
        assert text.count("BSSY") <= 2, (text.split()[0], text.count("BSSY"))


def test_dynamic_rows_are_a_kernel_argument():
    kernel = the_kernel(explain("x @ W + b, gelu", dynamic=True))
    assert re.search(r"int64_t s\d+", kernel.source)  # M comes in as a size, not a constant


def test_launch_meta_describes_each_operand():
    meta = cuda_matmul.launch_meta(_kernel_ir("linear, relu"))
    a, b = meta["operands"]
    assert (a["rows"], a["cols"], a["stride"], a["box"]) == ("200", "72", "72", (64, 128))
    assert (b["rows"], b["cols"], b["stride"], b["box"]) == ("136", "72", "72", (64, 128))  # W (N, K): K-major
    meta = cuda_matmul.launch_meta(_kernel_ir("x.t() @ W, silu"))
    a, b = meta["operands"]
    assert (a["rows"], a["cols"], a["box"]) == ("96", "128", (64, 64))   # x stored (K, M)
    assert (b["rows"], b["cols"], b["box"]) == ("96", "256", (64, 64))   # W (K, N): N-major
    assert meta["smem"] <= 227 * 1024 and meta["threads"] == 384 and meta["tile"] == (128, 128)


def test_two_products_are_one_wgmma_over_both_weights():
    # each B's 64 columns of a tile side by side: one tensor map each, an output tile 64 wide
    meta = cuda_matmul.launch_meta(_kernel_ir("linear swiglu"))  # Wg, Wu (N, K): K-major
    a, wg, wu = meta["operands"]
    assert a["box"] == (64, 128) and wg["box"] == wu["box"] == (64, 64) and meta["tile"] == (128, 64)
    assert wg["param"] != wu["param"] and wg["rows"] == wu["rows"] == "200"
    source = the_kernel(explain("swiglu")).source
    assert "EmberTensorMap b1_map" in source and source.count("ember_wgmma<0, 1>(") == 2
    assert "acc[h][e + p]" in source and "acc[h][e + 32 + p]" in source  # the gate's, the up projection's


def _kernel_ir(name: str):
    kernels = []
    from ember.runtime.cuda_backend import CudaBackend
    original = CudaBackend.render

    def render(self, kernel):
        kernels.append(kernel)
        return original(self, kernel)

    CudaBackend.render = render
    try:
        explain(name)
    finally:
        CudaBackend.render = original
    (kernel,) = [k for k in kernels if k.dots]
    return kernel


def _matmuls_rewritten_for_cuda(n_products: int, shared_a: bool = True, meet: bool = True) -> int:
    b = GraphBuilder()
    xs = [b.input((64, 32), dtypes.bfloat16) for _ in range(1 if shared_a else n_products)]
    products = [_mm(b, xs[i % len(xs)], b.input((32, 48), dtypes.bfloat16), dtype=dtypes.bfloat16)
                for i in range(n_products)]
    if meet:  # one epilogue reads them all: one kernel
        total = b.sigmoid(products[0])
        for p in products[1:]:
            total = b.mul(total, p)
        g = b.build(total)
    else:
        g = b.build(*(b.relu(p) for p in products))
    after = matmul_pass.matmul_epilogues(g, target="cuda")
    return len([n for n in after.nodes if n.op is Op.MATMUL])


def test_pass_gives_the_template_what_it_computes():
    assert _matmuls_rewritten_for_cuda(2) == 2  # silu(x @ Wg) * (x @ Wu): one kernel of two products
    assert _matmuls_rewritten_for_cuda(2, meet=False) == 2  # two kernels of one product
    assert _matmuls_rewritten_for_cuda(2, shared_a=False) == 0  # two A operands: cuBLAS computes both
    assert _matmuls_rewritten_for_cuda(3) == 0  # three products in one kernel
    assert _matmuls_rewritten_for_cuda(3, meet=False) == 3


def test_a_product_stored_anyway_stays_cublas_by_default():
    # a training forward saves x @ W + b for gelu's backward: the kernel would store it beside
    # gelu's result, slower than cuBLAS and an epilogue kernel (passes/matmul.py)
    x, w, b = inputs("x @ W + b, gelu")

    def saved(x, w, b):
        y = x @ w + b
        return y, F.gelu(y)

    report = ember.explain(saved, x, w, b, target="cuda")
    assert report.fallbacks == ["aten.mm"] and len(report.kernels) == 1
    assert "= dot " not in report.kernels[0].kernel_ir
    report = ember.explain(saved, x, w, b, target="cuda", options={"matmul_epilogues": "all"})
    assert not report.fallbacks and "ember_wgmma" in the_kernel(report).source


def test_template_refuses_two_products_of_two_layouts():
    def mixed(x, wg, wu_t):  # Wg (K, N): N-major; wu_t (N, K): K-major
        return F.silu(x @ wg) * F.linear(x, wu_t)
    x, wg, wu = torch.randn(64, 32, dtype=BF16), torch.randn(32, 48, dtype=BF16), torch.randn(48, 32, dtype=BF16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = ember.explain(mixed, x, wg, wu, target="cuda")
    assert "second operands of two layouts" in the_kernel(report).source


def test_operands_with_no_contiguous_dim_stay_cublas():
    # x @ w[:, ::2] (and its transpose in the backward): no dim of unit stride, no TMA. The pass
    # gave the CUDA backend such products, whose template refused them at build time (a warning,
    # the whole kernel through ATen; GPU fuzz seeds 920653352593, 1005992672181, 612274410113)
    x, wide = torch.randn(64, 32, dtype=BF16), torch.randn(32, 96, dtype=BF16)
    for w, strided in ((wide[:, ::2], True), (wide[:, :48], False), (wide[:, ::2].t().contiguous().t(), False)):
        report = ember.explain(lambda x, w: torch.relu(x @ w), x, w, target="cuda")
        products = [k for k in report.kernels if "= dot " in k.kernel_ir]
        assert len(products) == (0 if strided else 1), [k.name for k in report.kernels]
        assert report.fallbacks == (["aten.mm"] if strided else [])
        assert all("runs through ATen" not in k.source for k in report.kernels)
    # a transpose of such an operand (a gradient's w.T) neither; on the Triton backend, which
    # loads tiles with pointers, it is a kernel
    for target, fused in (("cuda", False), ("triton", True)):
        report = ember.explain(lambda x, w: torch.relu(x @ w.t()), x, wide[:, ::2].t(), target=target,
                               options={"matmul_epilogues": "all"})
        assert bool([k for k in report.kernels if "= dot " in k.kernel_ir]) == fused, target



@pytest.mark.parametrize("case", ["linear_of_sliced_3d", "computed_then_sliced", "reshape_not_a_view", "broadcast"])
def test_operands_tma_cannot_read_through_views_stay_cublas(case):
    # the layout a kernel reads an operand in follows the views down to a buffer: an input's
    # strides, a kernel's result contiguous. A training step's F.linear over a (33, 1, 17) slice
    # with a step of 2 (flattened to (33, 17), still strided 2) reached the template, which
    # refused it at build time (GPU fuzz seed 102556773008); a broadcast row (stride 0) sent
    # every call to ATen
    w = torch.randn(32, 48, dtype=BF16)
    args, fn = {
        "linear_of_sliced_3d": ((torch.randn(33, 1, 34, dtype=BF16)[..., ::2].requires_grad_(),
                                 torch.randn(17, 17, dtype=BF16, requires_grad=True), torch.randn(17, dtype=BF16)),
                                lambda x, w, b: F.gelu(F.linear(x, w, b))),
        "computed_then_sliced": ((torch.randn(64, 64, dtype=BF16), w),
                                 lambda x, w: torch.relu(torch.relu(x)[:, ::2] @ w)),
        "reshape_not_a_view": ((torch.randn(16, 64, 32, dtype=BF16), w),
                               lambda x, w: torch.relu((x * 2).permute(1, 0, 2).reshape(1024, 32) @ w)),
        "broadcast": ((torch.randn(1, 32, dtype=BF16), w), lambda x, w: torch.relu(x.expand(64, 32) @ w)),
    }[case]
    report = ember.explain(fn, *args, target="cuda", options={"matmul_epilogues": "all"})
    assert not [k for k in report.kernels if "= dot " in k.kernel_ir], [k.name for k in report.kernels]
    assert report.fallbacks and set(report.fallbacks) <= {"aten.mm"}, report.fallbacks
    assert all("runs through ATen" not in k.source for k in report.kernels)
    # the transposed product of a kernel's result is the template's (TMA reads its columns)
    report = ember.explain(lambda x, w: torch.relu(torch.relu(x).t() @ w), torch.randn(32, 64, dtype=BF16), w,
                           target="cuda")
    assert "ember_wgmma" in the_kernel(report).source


def test_products_of_two_first_operands_are_kernels_apart():
    # a CLIP loss's gradients: G @ b and G.T @ a have one shape, and the planner put both in one
    # kernel, which the template refused (bf16, batch 2 with dynamic sizes: both ran through
    # ATen with a warning, a RuntimeWarning failing the graph under -W error)
    def clip_loss(a, b, s):
        logits = s.exp().clamp(max=100) * F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T
        y = torch.arange(a.shape[0])
        return (F.cross_entropy(logits, y) + F.cross_entropy(logits.T, y)) / 2

    a, b = (torch.randn(2, 32, dtype=BF16, requires_grad=True) for _ in range(2))
    report = ember.explain(clip_loss, a, b, torch.tensor(2.0, requires_grad=True), target="cuda", dynamic=True)
    products = [k for k in report.kernels if "= dot " in k.kernel_ir]
    assert len(products) >= 2, [k.name for k in report.kernels]
    for k in products:
        assert k.kernel_ir.count("= dot ") == 1 or "ember_wgmma" in k.source, k.kernel_ir
        assert "runs through ATen" not in k.source, k.source


@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_pass_takes_a_lone_matmul_on_hopper(monkeypatch, backend):
    b = GraphBuilder(device="cuda:0")
    x, w = b.input((64, 32), dtypes.float16), b.input((32, 48), dtypes.float16)
    g = b.build(b.relu(_mm(b, x, w)))
    monkeypatch.setattr(matmul_pass, "_hopper_gpu", lambda device: False)
    assert not [n for n in matmul_pass.matmul_epilogues(g, gpu_backend=backend).nodes if n.op is Op.MATMUL]
    monkeypatch.setattr(matmul_pass, "_hopper_gpu", lambda device: True)
    assert [n for n in matmul_pass.matmul_epilogues(g, gpu_backend=backend).nodes if n.op is Op.MATMUL]


@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_pass_leaves_operands_tma_cannot_read_to_cublas_on_hopper(monkeypatch, backend):
    # the Triton backend hands a Hopper GPU's lone matmul kernels to the template too, which sent
    # every call with a broadcast operand (``w.expand``: a stride of 0) or one of no unit stride
    # to ATen, counted in ``matmuls_through_aten``; now the pass leaves those to cuBLAS, with
    # their epilogues fused apart, as it does for the CUDA backend
    monkeypatch.setattr(matmul_pass, "_hopper_gpu", lambda device: True)
    for x_strides in [(0, 1), (64, 2)]:
        b = GraphBuilder(device="cuda:0")
        x, w = b.input((64, 32), dtypes.float16, strides=x_strides), b.input((32, 48), dtypes.float16)
        g = b.build(b.relu(_mm(b, x, w)))
        assert not [n for n in matmul_pass.matmul_epilogues(g, gpu_backend=backend).nodes if n.op is Op.MATMUL]
    b = GraphBuilder(device="cuda:0")
    x, w = b.input((64, 32), dtypes.float16, strides=(1, 64)), b.input((32, 48), dtypes.float16)
    g = b.build(b.relu(_mm(b, x, w)))  # a transposed operand: TMA reads its columns
    assert [n for n in matmul_pass.matmul_epilogues(g, gpu_backend=backend).nodes if n.op is Op.MATMUL]


# ---- on a Hopper GPU ---------------------------------------------------------------------------

def on_gpu(backend: str) -> dict:
    """Options for the GPU tests: the first call runs the kernel, not ATen while it compiles."""
    return {"gpu_backend": backend, "background_compile": False}


ON_HOPPER = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                               reason="the Hopper matmul kernels run on compute capability 9.0 GPUs")


@ON_HOPPER
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_eager_on_hopper(backend, name):
    report = check(CASES[name][0], *inputs(name, "cuda"), options={**on_gpu(backend), **case_options(name)})
    assert "ember_wgmma" in the_kernel(report).source


@ON_HOPPER
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("shape", [(1000, 520, 264), (17, 4096, 24), (8, 16, 16), (4096, 1024, 2048)])
def test_edges_on_hopper(backend, shape):
    m, k, n = shape
    x = torch.randn(m, k, dtype=BF16, device="cuda")
    w = torch.randn(k, n, dtype=BF16, device="cuda") * 0.05
    b = torch.randn(n, dtype=BF16, device="cuda")
    check(gelu_matmul, x, w, b, options=on_gpu(backend))


@ON_HOPPER
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("fn", [swiglu, linear_swiglu])
@pytest.mark.parametrize("shape", [(1000, 520, 264), (17, 4096, 24), (300, 4104, 200)])
def test_two_products_on_hopper(backend, fn, shape):
    # partial tiles at every edge, a K tail; one kernel of both products
    m, k, n = shape
    x = torch.randn(m, k, dtype=BF16, device="cuda")
    wg, wu = (torch.randn(k, n, dtype=BF16, device="cuda") * 0.05 for _ in range(2))
    if fn is linear_swiglu:
        wg, wu = wg.t().contiguous(), wu.t().contiguous()
    report = check(fn, x, wg, wu, options=on_gpu(backend))
    assert len(report.kernels) == 1 and "ember_wgmma" in report.kernels[0].source


@ON_HOPPER
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_kernels_compile_in_the_background(monkeypatch, backend, tmp_path):
    # a module not in the cache: calls run through ATen until NVRTC is done (held here until the
    # test lets it finish: the rest of a compile can outlast NVRTC's 0.3 s), then the kernel
    from ember.runtime import cuda_matmul as runtime_matmul
    release, compile_module = threading.Event(), runtime_matmul.compile_module

    def held(*args, **kwargs):
        assert release.wait(60)
        return compile_module(*args, **kwargs)

    monkeypatch.setattr(runtime_matmul, "compile_module", held)
    x = torch.randn(300, 520, dtype=BF16, device="cuda")
    wg, wu = (torch.randn(520, 264, dtype=BF16, device="cuda") * 0.05 for _ in range(2))
    fn = ember.compile(swiglu, options={"gpu_backend": backend, "background_compile": True, "cache_dir": tmp_path})
    before, failures = ember.stats()["calls_while_compiling"], ember.stats()["build_failures"]
    torch.testing.assert_close(fn(x, wg, wu), swiglu(x, wg, wu), rtol=1.6e-2, atol=1e-2)
    assert ember.stats()["calls_while_compiling"] == before + 1 and not ember.wait_for_kernels(timeout=0.05)
    release.set()
    assert ember.wait_for_kernels(timeout=60)
    torch.testing.assert_close(fn(x, wg, wu), swiglu(x, wg, wu), rtol=1.6e-2, atol=1e-2)
    assert ember.stats()["calls_while_compiling"] == before + 1 and ember.stats()["build_failures"] == failures


@ON_HOPPER
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("fn", [gelu_matmul, swiglu])
def test_rows_that_change_reuse_the_kernel(backend, fn):
    w = torch.randn(96, 128, dtype=BF16, device="cuda") * 0.1
    b = torch.randn(128, dtype=BF16, device="cuda") if fn is gelu_matmul else torch.randn_like(w) * 0.1
    compiled = ember.compile(fn, dynamic=True, options=on_gpu(backend))
    for m in (40, 300, 1, 129):
        x = torch.randn(m, 96, dtype=BF16, device="cuda")
        torch.testing.assert_close(compiled(x, w, b), fn(x, w, b), rtol=1.6e-2, atol=1e-2)


@ON_HOPPER
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("operands", ["unaligned", "broadcast"])
def test_operands_tma_cannot_read_run_through_aten(backend, operands):
    if operands == "unaligned":
        # rows of 40 bf16 (80 bytes, not a multiple of 16) sliced one element in: not 16-byte aligned
        x = torch.randn(64, 41, dtype=BF16, device="cuda")[:, 1:]
        w = torch.randn(40, 32, dtype=BF16, device="cuda") * 0.1
    else:
        # a weight's one row expanded over K (a row stride of 0): TMA cannot step over rows of 0 bytes
        x = torch.randn(64, 40, dtype=BF16, device="cuda")
        w = torch.randn(1, 32, dtype=BF16, device="cuda").expand(40, 32)
    b = torch.randn(32, dtype=BF16, device="cuda")
    before = ember.stats()["matmuls_through_aten"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # through ATen by design: no fallback warning
        out = ember.compile(gelu_matmul, options=on_gpu(backend))(x, w, b)  # (check() would clone x)
    torch.testing.assert_close(out, gelu_matmul(x, w, b), rtol=1.6e-2, atol=1e-2)
    # (a broadcast operand goes to cuBLAS at compile time, with either backend: the pass's test
    # above; an unaligned one only the call can see)
    assert (ember.stats()["matmuls_through_aten"] > before) == (operands == "unaligned")


@on_the_interpreter
def test_hopper_build_failure_falls_back_to_tritons_kernel(monkeypatch):
    # a Hopper GPU whose template does not build (faked on the CPU: Triton's interpreter runs the
    # Triton kernel it falls back to): one warning, and Triton's fused kernel computes the group
    from ember.runtime import cuda_matmul as runtime_matmul
    from ember.runtime.backend import BuildError

    def no_build(*args, **kwargs):
        raise BuildError("no NVRTC here")

    monkeypatch.setattr(runtime_matmul, "on_hopper", lambda kernel: bool(kernel.dots))
    monkeypatch.setattr(runtime_matmul, "build", no_build)
    x, w, b = torch.randn(70, 50, dtype=F16), torch.randn(50, 96, dtype=F16) * 0.2, torch.randn(96, dtype=F16)
    compiled = ember.compile(gelu_matmul, options={"target": "triton", "matmul_epilogues": "all"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(x, w, b)
        ember.wait_for_kernels()
        out2 = compiled(x, w, b)
    assert len([c for c in caught if "Hopper matmul kernels" in str(c.message)]) == 1
    torch.testing.assert_close(out, gelu_matmul(x, w, b), rtol=5e-3, atol=2e-3)
    torch.testing.assert_close(out2, out)
