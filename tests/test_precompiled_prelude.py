"""The C++ prelude is compiled once, as a precompiled header, and each module after it: the
prelude's headers took 0.9 s of a typical module's 1.1 s build (runtime/cpp_build.py)."""

from __future__ import annotations

import ctypes
import subprocess

import pytest
import torch

import ember
from ember.runtime import cpp_build
from ember.runtime.backend import BuildError

from .helpers import assert_same

# (small, so these tests precompile it fast; ember's own prelude is the same mechanism)
PRELUDE = '#include <cmath>\nstatic inline double twice(double x) { return 2.0 * std::sqrt(x * x); }\n'


def _clang() -> bool:
    try:
        return "clang" in cpp_build._compiler_id(cpp_build.find_compiler()).lower()
    except BuildError:  # (no C++ compiler: every build here fails the same way, named)
        return False


gcc_only = pytest.mark.skipif(_clang(), reason="clang reads precompiled headers only through -include-pch")


def module(value: int) -> str:
    return PRELUDE + f'extern "C" double answer(void) {{ return twice({value}); }}\n'


def answer(library) -> float:
    function = cpp_build.load(library).answer
    function.restype = ctypes.c_double
    return function()


@pytest.fixture
def compiles(monkeypatch):
    """The compiler command lines run from now on, each with what GCC's -H printed: the headers
    it read, a precompiled one marked with '!'."""
    seen: list[tuple[list[str], str]] = []

    def run(cmd: list[str], timeout: float) -> None:
        proc = subprocess.run([*cmd, "-H"], capture_output=True, text=True, timeout=timeout)
        seen.append((cmd, proc.stderr))
        if proc.returncode != 0:
            raise BuildError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")

    monkeypatch.setattr(cpp_build, "run_compiler", run)
    return seen


def prelude_builds(seen) -> int:
    return sum("c++-header" in cmd for cmd, _ in seen)


@gcc_only
def test_modules_read_the_prelude_precompiled_once(tmp_path, compiles):
    cfg = ember.config.replace(cache_dir=tmp_path)
    first, _ = cpp_build.build(module(20), cfg, prelude=PRELUDE)
    second, _ = cpp_build.build(module(21), cfg, prelude=PRELUDE)
    assert prelude_builds(compiles) == 1
    assert (answer(first), answer(second)) == (40.0, 42.0)
    module_builds = [err for cmd, err in compiles if "c++-header" not in cmd]
    assert len(module_builds) == 2
    for err in module_builds:
        assert f"! {tmp_path}" in err and f"{cpp_build.PRELUDE_HEADER}.gch" in err, err
    # the cache keeps the whole source beside each library, prelude and all
    assert first.with_suffix(".cpp").read_text() == module(20)


def test_a_compile_error_names_the_line_of_the_whole_source(tmp_path):
    cfg = ember.config.replace(cache_dir=tmp_path)
    broken = PRELUDE + 'extern "C" double answer(void) {\n  return twice(;\n}\n'
    with pytest.raises(BuildError, match=rf"kernels\.cpp:{PRELUDE.count(chr(10)) + 2}:"):
        cpp_build.build(broken, cfg, prelude=PRELUDE)


@gcc_only
def test_a_damaged_precompiled_prelude_is_built_again(tmp_path, compiles):
    cfg = ember.config.replace(cache_dir=tmp_path)
    cpp_build.build(module(1), cfg, prelude=PRELUDE)
    (gch,) = tmp_path.glob(f"cpp/prelude-*/{cpp_build.PRELUDE_HEADER}.gch")
    gch.write_bytes(gch.read_bytes()[: gch.stat().st_size // 2])  # (a cache copied in part)
    cpp_build._prelude_headers.clear()  # (as a new process finds it)
    cpp_build.build(module(2), cfg, prelude=PRELUDE)
    assert prelude_builds(compiles) == 2 and cpp_build.intact(gch)


def test_modules_build_whole_where_the_prelude_does_not_precompile(tmp_path, monkeypatch):
    # a compiler that cannot write precompiled headers: each module from its whole source
    real_run = cpp_build.run_compiler
    refused = []

    def no_headers(cmd, timeout):
        if "c++-header" in cmd:
            refused.append(cmd)
            raise BuildError("c++-header: precompiled headers are not supported")
        return real_run(cmd, timeout)

    monkeypatch.setattr(cpp_build, "run_compiler", no_headers)
    cfg = ember.config.replace(cache_dir=tmp_path)
    for value in (3, 4):
        lib, cached = cpp_build.build(module(value), cfg, prelude=PRELUDE)
        assert not cached and answer(lib) == 2.0 * value
    assert len(refused) <= 1  # (asked once per process and cache directory)
    assert not list(tmp_path.glob("cpp/prelude-*"))


@gcc_only
def test_compiled_graphs_use_the_precompiled_prelude(tmp_path, compiles):
    # ember's own CPU modules: the prelude precompiled at the toolchain's probe, then read by each
    def f(x, y):
        return torch.relu(x) * y + 1, (x - y).exp().sum(-1)

    x, y = torch.randn(5, 7), torch.randn(5, 7)
    compiled = ember.compile(f, options={"cache_dir": str(tmp_path)})
    assert_same(compiled(x, y), f(x, y))
    assert prelude_builds(compiles) == 1
    modules = [err for cmd, err in compiles if "c++-header" not in cmd]
    assert modules and all(f"{cpp_build.PRELUDE_HEADER}.gch" in err for err in modules)
