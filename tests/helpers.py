"""Compare ember with eager PyTorch, and read what ember compiled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten

import ember

# Loose enough for fused float32 math (ember keeps intermediates in registers, eager rounds per
# op), tight enough to catch a wrong formula. 16-bit floats compute in float32 inside kernels.
# Triton runs kernels on CPU tensors (and launches the fake kernels that stand in for compiled
# ones) only through its interpreter, which the CPU test run sets up (conftest.py); a GPU run
# (EMBER_TEST_DEVICE=cuda) runs the GPU tests of the same files instead
on_the_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                        reason="needs Triton's interpreter (the CPU test run)")

TOLERANCES = {
    # float16: eager rounds every intermediate, fused kernels do not; with cancellation (x*y + x)
    # the results differ by up to an ulp of the operands, ~1e-3 at magnitude 1
    torch.float16: (5e-3, 2e-3), torch.bfloat16: (1.6e-2, 1e-2),
    torch.float32: (2e-5, 1e-6), torch.float64: (1e-7, 1e-9),
}


class Slot:
    """A place for the k-th tensor argument of a function built from OpInfo samples."""

    def __init__(self, k: int):
        self.k = k


def with_slots(flat: list[Any], spec: Any, positions: list[int], first: int = 0) -> Any:
    """A sample's (input, args, kwargs), rebuilt from its flattened leaves with Slot(first),
    Slot(first + 1), ... at the tensors' ``positions``."""
    leaves = list(flat)
    for i, p in enumerate(positions):
        leaves[p] = Slot(first + i)
    return tree_unflatten(leaves, spec)


def flat_samples(samples: list[Any]) -> list[tuple[list[Any], Any, list[int]]]:
    """OpInfo samples as ``program_of_samples`` takes them: each one's flattened (input, args,
    kwargs), its tree spec and where its tensors are."""
    out = []
    for sample in samples:
        flat, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
        out.append((flat, spec, [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]))
    return out


def program_of_samples(function: Callable[..., Any], samples: list[tuple[list[Any], Any, list[int]]],
                       name: str = "program") -> Callable[..., Any]:
    """f(*t) returning ``[function(input, *args, **kwargs) for each sample]``, where a sample is
    the flattened (input, args, kwargs) of an OpInfo sample, its tree spec and where its tensors
    are; ``t`` is every sample's tensors in turn. Written out as Python source, each tensor as
    ``t[k]`` and every other argument a constant. Dynamo traces such straight-line code at up to
    twice the speed of a loop filling the slots (pytree's unflatten inside the function took 2.8x
    as long again): minutes of the CPU suite."""
    constants: list[Any] = []

    def spelled(x: Any) -> str:
        if isinstance(x, Slot):
            return f"t[{x.k}]"
        if type(x) is list:
            return "[" + ", ".join(spelled(y) for y in x) + "]"
        if type(x) is tuple:
            return "(" + "".join(spelled(y) + ", " for y in x) + ")"
        if type(x) is dict:
            return "{" + ", ".join(f"{spelled(k)}: {spelled(v)}" for k, v in x.items()) + "}"
        if isinstance(x, tuple) and hasattr(x, "_fields"):  # a named tuple, rebuilt by its type
            constants.append(type(x))
            return f"c[{len(constants) - 1}](" + ", ".join(spelled(y) for y in x) + ")"
        if any(isinstance(leaf, Slot) for leaf in tree_leaves(x)):
            raise TypeError(f"{name}: cannot spell a {type(x).__name__} holding tensors as Python source")
        constants.append(x)
        return f"c[{len(constants) - 1}]"

    lines, k = [], 0
    for flat, spec, positions in samples:
        inp, args, kwargs = with_slots(flat, spec, positions, k)
        k += len(positions)
        arguments = [spelled(inp), *(spelled(a) for a in args)] + ([f"**{spelled(kwargs)}"] if kwargs else [])
        lines.append(f"        function({', '.join(arguments)}),")
    source = "def program(*t):\n    return [\n" + "\n".join(lines) + "\n    ]\n"
    scope = {"function": function, "c": tuple(constants)}
    exec(compile(source, f"<{name}>", "exec"), scope)
    return scope["program"]


def flatten(x: Any) -> list[Any]:
    if isinstance(x, (tuple, list)):
        return [y for item in x for y in flatten(item)]
    return [x]


def assert_same(out: Any, ref: Any, rtol: float | None = None, atol: float | None = None) -> None:
    outs, refs = flatten(out), flatten(ref)
    assert len(outs) == len(refs), f"{len(outs)} outputs, eager gives {len(refs)}"
    for i, (o, r) in enumerate(zip(outs, refs)):
        if not isinstance(r, torch.Tensor):
            assert o == r or (o != o and r != r), f"output {i}: {o!r} != {r!r}"
            continue
        assert isinstance(o, torch.Tensor), f"output {i}: got {type(o).__name__}, eager gives a tensor"
        assert o.dtype == r.dtype, f"output {i}: dtype {o.dtype}, eager {r.dtype}"
        assert o.shape == r.shape, f"output {i}: shape {tuple(o.shape)}, eager {tuple(r.shape)}"
        if r.dtype.is_floating_point:
            rt, at = TOLERANCES.get(r.dtype, (1e-5, 1e-6))
            torch.testing.assert_close(o, r, rtol=rtol or rt, atol=atol if atol is not None else at,
                                       equal_nan=True, msg=lambda m, i=i: f"output {i}: {m}")
        else:
            assert torch.equal(o, r), f"output {i}: values differ from eager:\n{o}\n{r}"


def run(fn: Callable[..., Any], *args: Any, dynamic: bool | None = None, options: dict | None = None,
        **kwargs: Any) -> tuple[Any, ember.Report]:
    """Run ``fn`` compiled by ember; returns (result, report of what was compiled)."""
    report = ember.Report()
    compiled = ember.compile(fn, dynamic=dynamic, options=options, report=report)
    run.last_compiled = compiled
    return compiled(*args, **kwargs), report


def check(fn: Callable[..., Any], *args: Any, dynamic: bool | None = None, options: dict | None = None,
          rtol: float | None = None, atol: float | None = None, expect_built: bool = True) -> ember.Report:
    """ember(fn)(*args) equals fn(*args), every graph compiled and (unless ``expect_built`` is
    False) every kernel built; returns the report. Inputs are cloned for each side."""
    ref = fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    failures = ember.stats()["build_failures"]
    out, report = run(fn, *[a.clone() if isinstance(a, torch.Tensor) else a for a in args],
                      dynamic=dynamic, options=options)
    assert_same(out, ref, rtol, atol)
    assert not [g.error for g in report.graphs if g.error], [g.error for g in report.graphs]
    if expect_built:
        assert all(k.built for k in report.kernels), [k.name for k in report.kernels if not k.built]
        # (a Triton kernel compiles at its first launch: one that failed there ran through ATen)
        assert ember.stats()["build_failures"] == failures, "a kernel fell back to ATen at its first launch"
    return report


def compile_checked(fn: Callable[..., Any], **kwargs: Any) -> tuple[Callable[..., Any], ember.Report]:
    """ember.compile plus a report, for tests that call the compiled function several times;
    ``assert_clean(report)`` afterwards checks nothing fell back silently."""
    report = ember.Report()
    return ember.compile(fn, report=report, **kwargs), report


def record_rendered(monkeypatch: Any, backend: type) -> list[Any]:
    """The kernel IR objects ``backend`` renders from now on, once each (the list fills as it
    renders: a module it builds, whose sources a report then shows, or a kernel it only renders)."""
    seen: list[Any] = []
    original_render, original_build = backend.render, backend.build_module

    def note(kernel: Any) -> None:
        if not any(k is kernel for k in seen):
            seen.append(kernel)

    def render(self: Any, kernel: Any) -> str:
        note(kernel)
        return original_render(self, kernel)

    def build_module(self: Any, kernels: list[Any], *args: Any, **kwargs: Any) -> Any:
        for k in kernels:
            note(k)
        return original_build(self, kernels, *args, **kwargs)

    monkeypatch.setattr(backend, "render", render)
    monkeypatch.setattr(backend, "build_module", build_module)
    return seen


def every_exponent(low: float, high: float, seed: int = 0) -> torch.Tensor:
    """float32 values in [low, high] with every exponent and 2^12 mantissas each (the low 11 bits
    random), both signs: up to 2M values, subnormals and the largest floats among them."""
    gen = torch.Generator().manual_seed(seed)
    hi = torch.arange(0, 1 << 21, dtype=torch.int64) << 11
    bits = (hi | torch.randint(0, 1 << 11, hi.shape, generator=gen)).to(torch.int32)
    x = bits.view(torch.float32)
    return x[(x >= low) & (x <= high)]


def ulps(got: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """|got - exact| in units of the last place of the float32 nearest ``exact`` (the smallest
    subnormal's below 2^-126)."""
    near = exact.float().double().abs().clamp(min=2.0 ** -126)
    ulp = torch.exp2(torch.floor(torch.log2(near)) - 23)
    return (got.double() - exact).abs() / ulp


def assert_gradients_match(fn: Callable[..., Any], *inputs: torch.Tensor) -> None:
    """ember's fn and its input gradients (under a random output gradient) equal eager's."""
    xs = [x.detach().clone().requires_grad_() for x in inputs]
    refs = [x.detach().clone().requires_grad_() for x in inputs]
    out, ref = ember.compile(fn)(*xs), fn(*refs)
    grad = torch.randn_like(ref)
    out.backward(grad)
    ref.backward(grad)
    assert_same(out, ref)
    assert_same([x.grad for x in xs], [r.grad for r in refs])


def assert_clean(report: ember.Report) -> None:
    assert report.graphs, "nothing was compiled"
    assert not [g.error for g in report.graphs if g.error], [g.error for g in report.graphs]
    assert all(k.built for k in report.kernels), [k.name for k in report.kernels if not k.built]


def kernel_count(report: ember.Report) -> int:
    return len(report.kernels)


_COMPILE_FOR_SM90 = """
import importlib.util, json, sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
spec = importlib.util.spec_from_file_location("kernel_under_test", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
r = json.loads(sys.argv[2])
aligned = {(i,): [["tt.divisibility", 16]] for i in r["aligned"]}
binary = triton.compile(ASTSource(getattr(mod, r["name"]), r["signature"], constexprs=r["constexprs"], attrs=aligned),
                        target=GPUTarget("cuda", 90, 32), options={"num_warps": r["num_warps"], **r["options"]})
open(sys.argv[3] + ".ptx", "w").write(binary.asm["ptx"])
open(sys.argv[3] + ".ttgir", "w").write(binary.asm["ttgir"])
open(sys.argv[3] + ".cubin", "wb").write(binary.kernel)
"""


def compile_for_sm90(tmp_path: Path, source: str, name: str, types: dict[str, str], constexprs: dict[str, Any],
                     num_warps: int = 4, options: dict[str, Any] | None = None) -> tuple[str, bytes]:
    """(PTX, cubin) of the Triton kernel ``name`` in ``source`` (an ember kernel's), compiled for
    sm_90 without a GPU, in a process of its own (this one runs Triton interpreted). Its
    parameters are typed by ``types`` (pointers 16-byte aligned, as Triton's launcher finds
    torch's), else ``constexprs``, else 32-bit ints; ``options`` are Triton's compile options
    (``debug``). A compile error fails the test with Triton's. Its Triton GPU IR (the
    layouts) is left in ``tmp_path / "k.ttgir"``."""
    module = tmp_path / "kernel_under_test.py"
    module.write_text("import triton\nimport triton.language as tl\nfrom ember.runtime import triton_helpers as eh\n\n"
                      + source + "\n")
    params = [p.split(":")[0].strip() for p in source.split(f"def {name}(")[1].split(")")[0].split(",")]
    signature = {p: "constexpr" if p in constexprs else types.get(p, "i32") for p in params}
    pointers = [i for i, t in enumerate(signature.values()) if t.startswith("*")]
    spec = json.dumps({"name": name, "signature": signature, "constexprs": constexprs, "aligned": pointers,
                       "num_warps": num_warps, "options": options or {}})
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": str(tmp_path / "tc")}
    done = subprocess.run([sys.executable, "-c", _COMPILE_FOR_SM90, str(module), spec, str(tmp_path / "k")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return (tmp_path / "k.ptx").read_text(), (tmp_path / "k.cubin").read_bytes()


def cuda_ptx(path: Path, report: ember.Report) -> str:
    """The sm_90 PTX nvcc makes of the report's CUDA kernels (source written to ``path``)."""
    from ember.codegen import cuda

    path.write_text(cuda.PRELUDE + "\n" + "\n\n".join(k.source for k in report.kernels) + "\n")
    done = subprocess.run(["nvcc", "-ptx", "-arch=sm_90", "-std=c++17", "-o", str(path.with_suffix(".ptx")),
                           str(path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return path.with_suffix(".ptx").read_text()
