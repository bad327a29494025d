"""Build C++ kernel modules with the system compiler, cached on disk by source hash.

The cache key covers the source, the compiler's identity, the flags and the host CPU (kernels
are built with -march=native), so a second process with the same graphs builds nothing. Files
are written to a temporary name and renamed, so concurrent processes never see half a library.
Each library has its SHA-256 beside it (``.sha256``): a cached library whose bytes differ (a
cache copied in part, a full disk, a damaged file) is built again, never loaded: a truncated
library crashed the process inside dlopen (SIGBUS), where no Python error can be caught.

The prelude every module starts with (codegen/cpp_prelude.py's PRELUDE: <cmath>, <algorithm>, ember's
helpers) took 0.9 s of a typical module's 1.1 s build. With GCC it is compiled once per cache
directory, compiler and flags into a precompiled header (``prelude-<key>/``), and each module
is compiled as an #include of it followed by the module's own code. Anything wrong with that
header (a compiler without precompiled headers, a damaged or vanished one) only costs the time:
the module is then compiled from its whole source.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from ..config import Config, log
from . import cache_dirs
from .backend import BuildError, run_compiler


@functools.cache
def find_compiler(preferred: str = "") -> str:
    if preferred:  # asked for by name (EMBER_CXX, options={"cxx": ...}): that one, or an error
        path = shutil.which(preferred)
        if path is None:
            raise BuildError(f"the C++ compiler {preferred!r} (EMBER_CXX or the cxx option) is not on PATH")
        return path
    for name in ("g++", "c++", "clang++"):
        path = shutil.which(name)
        if path:
            return path
    raise BuildError("no C++ compiler found (set EMBER_CXX, or install g++)")


@functools.cache
def _compiler_id(compiler: str) -> str:
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.splitlines()[0] if out.stdout else compiler
    except (OSError, subprocess.SubprocessError):
        return compiler


@functools.cache
def _host_cpu() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return os.uname().machine
    model = flags = ""
    for line in text.splitlines():
        if line.startswith("model name") and not model:
            model = line.split(":", 1)[1].strip()
        if line.startswith("flags") and not flags:
            flags = line.split(":", 1)[1].strip()
    return f"{os.uname().machine}|{model}|{hashlib.sha256(flags.encode()).hexdigest()[:16]}"


# what every build needs whatever the options: a loadable library, OpenMP, the language level
BUILD_FLAGS = ("-fopenmp", "-fPIC", "-shared", "-std=c++17")


def cache_key(source: str, cfg: Config) -> str:
    compiler = find_compiler(cfg.cxx)
    h = hashlib.sha256()
    # (BUILD_FLAGS too: an ember that builds with other ones never loads the older libraries)
    for part in (source, _compiler_id(compiler), " ".join(cfg.cxx_flags), " ".join(BUILD_FLAGS), _host_cpu()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def library_path(source: str, cfg: Config) -> Path:
    return Path(cfg.cache_dir) / "cpp" / f"{cache_key(source, cfg)}.so"


def build(source: str, cfg: Config, again: bool = False, prelude: str = "") -> tuple[Path, bool]:
    """Compile ``source`` to a shared library; returns (path, came_from_cache). ``again``: build
    it even where a cached one is intact (one that failed to load). ``prelude``: the text every
    module starts with, compiled once as a precompiled header where ``source`` starts with it."""
    target = library_path(source, cfg)
    if not again and intact(target):
        return target, True
    compiler = find_compiler(cfg.cxx)
    for attempt in range(3):
        # (a temporary directory of this process where cache_dir cannot be written: cache_dirs.py)
        target = cache_dirs.writable_part(cfg.cache_dir, "cpp") / target.name
        if not again and intact(target):
            return target, True
        try:
            shared = prelude if prelude and source.startswith(prelude) else ""
            if _compile(source, cfg, compiler, target, last=attempt == 2, prelude=shared):
                return target, False
        except (OSError, BuildError) as e:
            # a full disk (or quota) under cache_dir sent the whole graph through ATen: the cache
            # is a speed-up, never a condition, so build in this process's stand-in instead
            if attempt == 2 or not _out_of_space(e) or cache_dirs.stand_in_for(cfg.cache_dir) is not None:
                raise
            code = e.errno if isinstance(e, OSError) else errno.ENOSPC
            cache_dirs.stand_in_after(cfg.cache_dir, OSError(code, os.strerror(code), str(target.parent)))
    raise AssertionError("unreachable")  # (the last attempt returns or raises)


def _out_of_space(error: OSError | BuildError) -> bool:
    """Whether a build failed for want of disk space: our own writes (an OSError), or the
    compiler's or linker's (a BuildError whose output holds the system's message for it)."""
    codes = (errno.ENOSPC, errno.EDQUOT)
    if isinstance(error, OSError):
        return error.errno in codes
    return any(os.strerror(code) in str(error) for code in codes)


def _compile(source: str, cfg: Config, compiler: str, target: Path, last: bool, prelude: str = "") -> bool:
    """Builds ``target`` through a directory beside it; False where that directory vanished
    meanwhile (`ember cache clear` in another process: the build failed, and its graph ran
    through ATen for the rest of the process), unless ``last``."""
    try:
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
            build_dir = Path(tmp)
            src = build_dir / "kernels.cpp"
            out = build_dir / "kernels.so"
            src.write_text(source)
            compiled = src
            header = _precompiled_prelude(prelude, cfg, compiler) if prelude else None
            if header is not None and _place_beside(header, build_dir):
                # (#line: the compiler's messages give the lines of the whole source, kernels.cpp)
                compiled = build_dir / "kernels-after-prelude.cpp"
                compiled.write_text(f'#include "{PRELUDE_HEADER}"\n#line {prelude.count(chr(10)) + 1} "kernels.cpp"\n'
                                    + source[len(prelude):])
            run_compiler([compiler, *cfg.cxx_flags, *BUILD_FLAGS, str(compiled), "-o", str(out)], timeout=300)
            if not out.is_file():  # (a compiler that succeeds writing nothing: not a missing directory)
                raise BuildError(f"{compiler} exited without an error but wrote no library ({out})")
            shutil.copyfile(src, target.with_suffix(".cpp"))
            stamp = build_dir / "kernels.sha256"
            stamp.write_text(_sha256(out))
            os.replace(stamp, stamp_path(target))
            os.replace(out, target)
    except (OSError, BuildError):
        # (whether the build directory itself vanished cannot be asked: leaving the with block
        # removed it whatever failed, and every failed build, a kernel's own compile error too,
        # ran three times)
        if last or target.parent.is_dir():
            raise
        return False
    return True


PRELUDE_HEADER = "ember_prelude.h"
# (cache directory, key) -> the precompiled-header directory this process checked; and those
# whose header failed to build
_prelude_headers: dict[tuple[str, str], Path] = {}
_prelude_failures: set[tuple[str, str]] = set()


def _precompiled_prelude(prelude: str, cfg: Config, compiler: str) -> Path | None:
    """The directory holding ``prelude`` as PRELUDE_HEADER and its precompiled form (built here
    where it is not yet), or None where there is none to use."""
    if "clang" in _compiler_id(compiler).lower():
        return None  # (clang reads its own precompiled headers only when given -include-pch)
    digest = cache_key(prelude, cfg)  # (the same ingredients as a library's: prelude, compiler, flags, host)
    key = (str(cfg.cache_dir), digest)
    if key in _prelude_failures:
        return None
    known = _prelude_headers.get(key)
    if known is not None and known.is_dir():
        return known
    try:
        parent = cache_dirs.writable_part(cfg.cache_dir, "cpp")
        place = parent / f"prelude-{digest}"
        if not intact(place / f"{PRELUDE_HEADER}.gch"):
            _build_prelude(prelude, cfg, compiler, parent, place)
    except (OSError, BuildError) as e:
        # (compiled from the whole source from now on in this process: slower, the same library)
        _prelude_failures.add(key)
        log(1, f"no precompiled C++ prelude ({str(e).splitlines()[0]}); modules are compiled whole", cfg)
        return None
    _prelude_headers[key] = place
    return place


def _build_prelude(prelude: str, cfg: Config, compiler: str, parent: Path, place: Path) -> None:
    """Precompiles ``prelude`` into ``place``, through a directory renamed into place whole, so
    that no process sees a header without its precompiled form."""
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=".build-prelude-"))
    try:
        header = tmp / PRELUDE_HEADER
        header.write_text(prelude)
        gch = tmp / f"{PRELUDE_HEADER}.gch"
        # (the modules' own flags, or GCC ignores the header: -shared is the link's, not the compile's)
        flags = [f for f in BUILD_FLAGS if f != "-shared"]
        run_compiler([compiler, *cfg.cxx_flags, *flags, "-x", "c++-header", str(header), "-o", str(gch)], timeout=300)
        stamp_path(gch).write_text(_sha256(gch))
        if intact(place / gch.name):
            return  # (another process put its own there meanwhile: in use, left as it is)
        shutil.rmtree(place, ignore_errors=True)  # (a damaged one: its stamp did not match)
        try:
            os.rename(tmp, place)
        except OSError:
            if not intact(place / f"{PRELUDE_HEADER}.gch"):  # (else another process put its own there first)
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(1, f"precompiled the C++ prelude in {time.perf_counter() - started:.2f} s ({place})", cfg)


def _place_beside(header_dir: Path, build_dir: Path) -> bool:
    """Links (or copies) the prelude header and its precompiled form into ``build_dir``, so that a
    build does not depend on the header's directory lasting (`ember cache clear` elsewhere)."""
    try:
        for name in (PRELUDE_HEADER, f"{PRELUDE_HEADER}.gch"):
            try:
                os.link(header_dir / name, build_dir / name)
            except OSError:
                shutil.copyfile(header_dir / name, build_dir / name)
    except OSError:
        _prelude_headers.clear()  # (gone: built again by the next module)
        return False
    return True


def stamp_path(library: Path) -> Path:
    return library.with_suffix(".sha256")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def intact(library: Path) -> bool:
    """Whether a cached build product (a library here, a cubin in cuda_backend) holds the bytes
    its build wrote (its stamp; one without a stamp, from an older ember, is built again once)."""
    try:
        return stamp_path(library).read_text().strip() == _sha256(library)
    except OSError:
        return False


def load(path: Path) -> ctypes.CDLL:
    """The library at ``path``, loaded. One built with -ffast-math or -Ofast among cxx_flags
    carries GCC's crtfastmath, whose constructor turns on flush-to-zero and denormals-are-zero
    for the thread that loads it: that thread's eager float math then flushed subnormals to zero
    for the rest of the process. The thread's setting is put back as it was."""
    flushed = _flushes_denormals()
    library = ctypes.CDLL(str(path))
    if _flushes_denormals() != flushed:
        torch.set_flush_denormal(flushed)
    return library


def _flushes_denormals() -> bool:
    # a subnormal float32 made from its bits (no arithmetic to flush), times one: zero where
    # flush-to-zero or denormals-are-zero is on in this thread
    subnormal = torch.tensor(1 << 16, dtype=torch.int32).view(torch.float32)
    return bool((subnormal * 1.0).item() == 0.0)
