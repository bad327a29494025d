"""The on-disk kernel cache: a second process with the same programs builds nothing, and loads
the compiled graph from torch's AOTAutograd cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

# Every test of a later process runs in one pair of processes (each takes seconds to start,
# importing torch): the first compiles every scenario's program into empty caches (ember's, and
# torch's), the fixture copies the caches and damages the copy as each scenario says, and the
# second runs every program again from the copy. Each scenario has a program of its own (another
# constant: another kernel, library, Triton module and graph), so no scenario's kernels are in
# memory when another one's are loaded; each reports its own counters and error.
SCRIPT = textwrap.dedent("""
    import json, sys, traceback, torch, ember
    from pathlib import Path
    from torch._dynamo.utils import counters
    phase, scenarios = sys.argv[1], json.loads(sys.argv[2])
    cache = Path(ember.config.cache_dir)

    def files(pattern):
        return {p.name for p in cache.glob(pattern)}

    def cpp_program(c):
        def f(x, y):
            return torch.relu(x) + y + c, torch.softmax(x, -1)
        return f

    def triton_program(c):
        return lambda x: (x * 2.5).sigmoid() + c

    for name, (kind, c, cache_dir) in scenarios.items():
        print(f"{phase}: scenario {name}", file=sys.stderr, flush=True)  # (names one that crashes)
        torch._dynamo.reset()
        before, hits = ember.stats(), counters["aot_autograd"]["autograd_cache_hit"]
        libs, modules = files("cpp/*.so"), files("triton/k*.py")
        error = None
        try:
            if kind == "cpp":
                f, args, options = cpp_program(c), (torch.randn(8, 16), torch.randn(8, 16)), None
            else:
                f, args = triton_program(c), (torch.randn(64, generator=torch.Generator().manual_seed(0)),)
                options = {"target": "triton", **({"cache_dir": cache_dir} if cache_dir else {})}
            out, ref = ember.compile(f, options=options)(*args), f(*args)
            for a, b in zip(*((out, ref) if kind == "cpp" else ((out,), (ref,)))):
                assert torch.allclose(a, b, rtol=1e-5, atol=1e-6 if kind == "triton" else 1e-8), (a, b)
        except Exception:
            error = traceback.format_exc()
        after = ember.stats()
        print(json.dumps({name: {**{k: after[k] - before[k] for k in after if isinstance(after[k], int)},
                                 "aot_hits": counters["aot_autograd"]["autograd_cache_hit"] - hits, "error": error,
                                 "libs": sorted(files("cpp/*.so") - libs),
                                 "modules": sorted(files("triton/k*.py") - modules)}}), flush=True)
""")

LIBRARY_DAMAGE = {"headers_cut": lambda b: b[:100], "cut_after_headers": lambda b: b[:1000]}
MODULE_DAMAGE = {"cut": lambda s: s[:len(s) // 2], "empty": lambda s: ""}
TUNING_FILES = ["[]", "1", '"text"']


def _run(cache_dir, torch_cache, phase, scenarios) -> dict:
    """Each scenario's counters and error (a line of JSON each). A scenario that kills the process
    (a damaged library can, inside dlopen) is that scenario's error; the ones after it run in
    another process."""
    env = dict(os.environ, EMBER_CACHE_DIR=str(cache_dir), TORCHINDUCTOR_CACHE_DIR=str(torch_cache),
               TRITON_INTERPRET="1")
    results: dict = {}
    while len(results) < len(scenarios):
        rest = {k: v for k, v in scenarios.items() if k not in results}
        proc = subprocess.run([sys.executable, "-c", SCRIPT, phase, json.dumps(rest)], capture_output=True,
                              text=True, env=env, timeout=300)
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                results |= json.loads(line)
        if proc.returncode != 0:
            died = next((k for k in rest if k not in results), None)
            assert died is not None, proc.stderr[-3000:]
            results[died] = {"error": f"the {phase} process died (exit {proc.returncode}):\n{proc.stderr[-3000:]}"}
    return results


@pytest.fixture(scope="module")
def processes(tmp_path_factory):
    """Both processes, and the caches: the first's under root/"first", the damaged copy the
    second ran from under root/"again" (a cache copied elsewhere still hits)."""
    root = tmp_path_factory.mktemp("processes")
    scenarios = {name: ["cpp", k, None] for k, name in enumerate(["intact", *LIBRARY_DAMAGE], 1)}
    scenarios |= {f"triton {name}": ["triton", k, None] for k, name in enumerate(MODULE_DAMAGE, 1)}
    # a tuning file of another shape in a cache directory of its own (the option), in the first
    for k, content in enumerate(TUNING_FILES):
        (root / f"tuning{k}" / "triton").mkdir(parents=True)
        (root / f"tuning{k}" / "triton" / "tuning.json").write_text(content)
        scenarios[f"tuning {content}"] = ["triton", 10 + k, str(root / f"tuning{k}")]
    first = _run(root / "first" / "ember", root / "first" / "torch", "first", scenarios)
    shutil.copytree(root / "first", root / "again")
    cache = root / "again" / "ember"
    for name, damage in LIBRARY_DAMAGE.items():
        for lib in first[name]["libs"]:
            (cache / "cpp" / lib).write_bytes(damage((cache / "cpp" / lib).read_bytes()))
    for name, damage in MODULE_DAMAGE.items():
        for module in first[f"triton {name}"]["modules"]:
            (cache / "triton" / module).write_text(damage((cache / "triton" / module).read_text()))
    again = {k: v for k, v in scenarios.items() if not k.startswith("tuning")}
    second = _run(cache, root / "again" / "torch", "again", again)
    return root, first, second


def test_second_process_builds_nothing(processes):
    root, first, second = processes
    first, second = first["intact"], second["intact"]
    assert first["error"] is None and second["error"] is None, first["error"] or second["error"]
    assert first["kernels_built"] >= 1 and first["cache_hits"] == 0
    assert second["kernels_built"] == 0
    assert second["cache_hits"] == first["kernels_built"]
    # torch's AOTAutograd cache held the compiled graph too
    assert first["aot_hits"] == 0 and second["aot_hits"] == 1
    # one library, its source beside it; the second process wrote none
    (lib,) = first["libs"]
    assert second["libs"] == [] and (root / "again" / "ember" / "cpp" / lib).with_suffix(".cpp").exists()


def test_cache_key_covers_flags(tmp_path):
    import ember
    from ember.runtime import cpp_build

    cfg = ember.config.replace(cache_dir=tmp_path)
    source = 'extern "C" void k() {}\n'
    other_flags = cfg.replace(cxx_flags=("-O1", "-shared", "-fPIC"))
    assert cpp_build.cache_key(source, cfg) != cpp_build.cache_key(source, other_flags)
    assert cpp_build.cache_key(source, cfg) != cpp_build.cache_key(source + " ", cfg)


def test_cache_key_covers_the_flags_every_build_gets(tmp_path, monkeypatch):
    # the flags ember adds to every build were not in the key: an ember building with other ones
    # loaded the libraries built with the old
    import ember
    from ember.runtime import cpp_build

    cfg = ember.config.replace(cache_dir=tmp_path)
    source = 'extern "C" void k() {}\n'
    key = cpp_build.cache_key(source, cfg)
    monkeypatch.setattr(cpp_build, "BUILD_FLAGS", (*cpp_build.BUILD_FLAGS, "-fno-strict-aliasing"))
    assert cpp_build.cache_key(source, cfg) != key



def test_a_library_whose_bytes_changed_is_not_loaded(tmp_path):
    import ember
    from ember.runtime import cpp_build

    cfg = ember.config.replace(cache_dir=tmp_path)
    source = 'extern "C" int answer() { return 42; }\n'
    path, cached = cpp_build.build(source, cfg)
    assert not cached and cpp_build.build(source, cfg) == (path, True)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit in the middle: loading it may crash or mislead
    path.write_bytes(bytes(data))
    assert cpp_build.build(source, cfg) == (path, False)
    assert cpp_build.load(path).answer() == 42


@pytest.mark.parametrize("damage", list(LIBRARY_DAMAGE))
def test_a_damaged_cached_library_is_built_again(processes, damage):
    """A cached .so damaged outside ember (truncated) failed to load in every later process, and
    every graph ran through ATen; cut after its headers it crashed the process inside dlopen
    (SIGBUS). Its checksum no longer matches: it is built again."""
    _, first, second = processes
    assert first[damage]["error"] is None and len(first[damage]["libs"]) == 1, first[damage]  # (one damaged)
    again = second[damage]
    assert again["error"] is None, again["error"]
    assert again["graph_fallbacks"] == 0 and again["kernels_built"] >= 1


@pytest.mark.parametrize("damage", list(MODULE_DAMAGE))
def test_a_damaged_cached_triton_module_is_written_again(processes, damage):
    """A cut-short Triton module was a cache hit in every later process, whose graph then ran
    through ATen (the module had no LAUNCH table). Its text is checked against the source."""
    root, first, second = processes
    made = first[f"triton {damage}"]
    assert made["error"] is None and len(made["modules"]) == 1, made  # (the one the fixture damaged)
    again = second[f"triton {damage}"]
    assert again["error"] is None, again["error"]
    assert again["graph_fallbacks"] == 0 and again["kernels_built"] >= 1
    assert not list((root / "again" / "ember" / "triton").glob("*.tmp"))


def test_cxx_flags_option_replaces_the_tuning_flags_only(tmp_path):
    # the option replaced -shared -fPIC -fopenmp too: every kernel failed to link ("undefined
    # reference to main") and ran through ATen
    import torch

    import ember
    before = ember.stats()["build_failures"]
    x = torch.randn(8)
    out = ember.compile(lambda x: x.sin() * 2, options={"cxx_flags": ["-O2"], "cache_dir": tmp_path})(x)
    assert torch.allclose(out, x.sin() * 2) and ember.stats()["build_failures"] == before
    assert list((tmp_path / "cpp").glob("*.so"))


@pytest.mark.parametrize("content", TUNING_FILES)
def test_a_tuning_file_of_another_shape_is_ignored(processes, content):
    # valid JSON that is not a dict of launch configurations (a damaged or hand-edited
    # triton/tuning.json) failed every Triton kernel of that cache directory to ATen
    _, first, _ = processes
    stats = first[f"tuning {content}"]
    assert stats["error"] is None, stats["error"]
    assert stats["build_failures"] == 0 and stats["graph_fallbacks"] == 0 and stats["kernels_built"] >= 1, stats


def test_a_cache_dir_that_cannot_be_written_builds_in_a_temporary_one(tmp_path):
    # a cache_dir (or EMBER_CACHE_DIR) naming a file, or read-only, sent every graph through ATen
    # with a warning per graph naming '<dir>/cpp' and neither setting: now one warning, and the
    # kernels are built in a temporary directory
    import warnings

    import torch

    import ember
    blocker = tmp_path / "a file"
    blocker.write_text("not a directory")
    x = torch.randn(6, 5)
    before = ember.stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for f in (lambda x: x.cos() * 3, lambda x: x.sum(-1).exp()):
            torch.testing.assert_close(ember.compile(f, options={"cache_dir": blocker})(x), f(x))
    after = ember.stats()
    assert after["graph_fallbacks"] == before["graph_fallbacks"]
    assert after["kernels_built"] + after["cache_hits"] >= before["kernels_built"] + before["cache_hits"] + 2
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "cache_dir option" in messages[0] and str(blocker) in messages[0], messages
    assert blocker.read_text() == "not a directory"


def test_tuning_choices_of_two_processes_are_both_kept(tmp_path):
    # each process wrote the choices it had read at start plus its own, dropping those another
    # process saved meanwhile (timed for seconds per kernel on a GPU), through one temporary name
    # for all (tuning.tmp), where two writers' bytes could interleave
    from ember.runtime.triton_tuner import Tuner

    path = tmp_path / "triton" / "tuning.json"
    first, second = Tuner(path), Tuner(path)  # two processes, each reading the file as it starts
    first.pick("k1:8x8", [{"XBLOCK": 8}], lambda c: None)
    second.pick("k2:8x8", [{"XBLOCK": 16}], lambda c: None)
    assert Tuner(path).best == {"k1:8x8": {"XBLOCK": 8}, "k2:8x8": {"XBLOCK": 16}}
    assert [p.name for p in path.parent.iterdir()] == ["tuning.json"]


def test_a_damaged_bytecode_file_beside_a_triton_module_is_not_read(tmp_path):
    # Python read the module's .pyc from triton/__pycache__ (the source is checked against the
    # kernels, its bytecode was not): one cut short failed the import in every later process
    # (EOFError) and sent the module's kernels to ATen
    import importlib.util
    import struct
    from pathlib import Path

    from ember.runtime import triton_backend

    module = tmp_path / "kdamagedbytecode.py"
    module.write_text("LAUNCH = {'k': 1}\n")
    pyc = Path(importlib.util.cache_from_source(str(module)))
    pyc.parent.mkdir()
    stat = module.stat()
    header = struct.pack("<III", 0, int(stat.st_mtime) & 0xFFFFFFFF, stat.st_size & 0xFFFFFFFF)
    pyc.write_bytes(importlib.util.MAGIC_NUMBER + header + b"\xe3")  # (a code object, cut short)
    try:
        assert triton_backend._import(module).LAUNCH == {"k": 1}
    finally:
        sys.modules.pop("ember_triton_kdamagedbytecode", None)


def test_a_build_whose_directory_another_process_cleared_is_done_again(tmp_path, monkeypatch):
    # `ember cache clear` in another process while this one built a kernel: the build failed
    # (its directory vanished) and the graph ran through ATen for the rest of the process
    import shutil

    import ember
    from ember.runtime import cpp_build

    cfg = ember.config.replace(cache_dir=tmp_path)
    source = 'extern "C" int answer() { return 41; }\n'
    real_run = cpp_build.subprocess.run
    cleared = []

    def clear_first(cmd, *args, **kwargs):
        if "-o" in cmd and not cleared:  # (the build, not the compiler's --version)
            cleared.append(True)
            shutil.rmtree(tmp_path / "cpp")
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(cpp_build.subprocess, "run", clear_first)
    path, cached = cpp_build.build(source, cfg)
    assert cleared and not cached and cpp_build.load(path).answer() == 41
    assert cpp_build.build(source, cfg) == (path, True)


def test_a_cache_dir_under_home_is_expanded(monkeypatch):
    # "~/cache" (an option, or EMBER_CACHE_DIR quoted in a shell) made a directory named "~" in
    # the working directory
    from pathlib import Path

    from ember.config import Config

    assert Config().replace(cache_dir="~/ember-kernels").cache_dir == Path.home() / "ember-kernels"
    monkeypatch.setenv("EMBER_CACHE_DIR", "~/ember-kernels")
    assert Config().cache_dir == Path.home() / "ember-kernels"


def test_a_relative_cache_dir_stays_where_it_was_given(tmp_path, monkeypatch):
    # a relative EMBER_CACHE_DIR or cache_dir was looked up again in each new working directory,
    # so an os.chdir after the compile built (and looked up) kernels somewhere else
    from ember.config import Config

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EMBER_CACHE_DIR", "env-cache")
    from_env = Config()
    from_option = Config().replace(cache_dir="option-cache")
    monkeypatch.chdir("/")
    assert from_env.cache_dir == tmp_path / "env-cache"
    assert from_option.cache_dir == tmp_path / "option-cache"


@pytest.mark.parametrize("where", ["our write", "the linker"])
def test_a_cache_dir_on_a_full_disk_builds_in_a_temporary_one(tmp_path, monkeypatch, where):
    # the directory could be created and probed (an empty file fits), the library could not be
    # written: every graph went through ATen (OSError: No space left on device)
    import errno
    import warnings

    import ember
    from ember.runtime import cache_dirs, cpp_build
    from ember.runtime.backend import BuildError

    cfg = ember.config.replace(cache_dir=tmp_path / "full")
    source = 'extern "C" int answer() { return 42; }\n'
    real_copy, real_run = cpp_build.shutil.copyfile, cpp_build.run_compiler

    def copy(src, dst, *args, **kwargs):
        if str(dst).startswith(str(tmp_path)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_copy(src, dst, *args, **kwargs)

    def link(cmd, *args, **kwargs):
        if str(tmp_path) in " ".join(cmd):
            raise BuildError(f"{' '.join(cmd)} failed:\nld: final link failed: {os.strerror(errno.ENOSPC)}")
        return real_run(cmd, *args, **kwargs)

    if where == "our write":
        monkeypatch.setattr(cpp_build.shutil, "copyfile", copy)
    else:
        monkeypatch.setattr(cpp_build, "run_compiler", link)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path, cached = cpp_build.build(source, cfg)
    assert not cached and cpp_build.load(path).answer() == 42
    assert path.parent == cache_dirs.stand_in_for(cfg.cache_dir) / "cpp"
    assert [str(w.message) for w in caught if "No space left" in str(w.message)], [str(w.message) for w in caught]


def test_a_kernel_that_does_not_compile_is_compiled_once(tmp_path, monkeypatch):
    # every failed build ran three times (the check for a build directory removed by another
    # process asked after leaving the block that removes it): a graph's failing kernel three
    # compiles for the module and three alone
    import ember
    from ember.runtime import cpp_build
    from ember.runtime.backend import BuildError

    calls = []
    real_run = cpp_build.run_compiler
    monkeypatch.setattr(cpp_build, "run_compiler", lambda cmd, *a, **k: calls.append(cmd) or real_run(cmd, *a, **k))
    with pytest.raises(BuildError):
        cpp_build.build('extern "C" int broken( { return; }\n', ember.config.replace(cache_dir=tmp_path))
    assert len(calls) == 1
