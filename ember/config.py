"""Every ember setting in one typed place.

Environment variables set the defaults when ember is imported; ``ember.compile(fn, options={...})``
overrides any field for one compiled function.

  EMBER_DEBUG      0 quiet; 1 what compiled and how long it took; 2 + IR after each pass;
                   3 + kernel and wrapper sources; 4 + time of every kernel call
  EMBER_CACHE_DIR  where built kernels live (default ~/.cache/ember; where it cannot be written,
                   a temporary directory of the process, with a warning: runtime/cache_dirs.py)
  EMBER_CXX        the C++ compiler for CPU kernels (default g++, else c++, else clang++)
  EMBER_GPU_BACKEND  'triton' or 'cuda'
  EMBER_TRITON_TUNING  'heuristic' (one launch configuration per kernel and shape, from the
                   shape) or 'full' (compile and time every candidate; slower first call)
  EMBER_GRAD_IN_FORWARD  0 turns off computing a scalar loss's gradient in the forward graph
  EMBER_SKIP_MASKED  1 skips the masked-out elements of x * mask (see skip_masked below)
  EMBER_CPU_EMBEDDING_BAG  1 generates embedding_bag on the CPU too (see cpu_embedding_bag below)
  EMBER_AOT_CACHE  0 turns off keeping compiled graphs in torch's AOTAutograd cache
  EMBER_ROW_CHUNKS  runs of rows a row kernel splits into to also sum columns (see row_chunks)
  EMBER_PROFILE_GUARDS  1 lets Dynamo time the guards of ember's frames (see profile_guards)
  EMBER_PASSES_OFF  comma-separated names of middle-end passes not to run (see passes_off)
  EMBER_MATMUL_EPILOGUES  'auto', 'all' or 'off': which 16-bit matmuls ember generates with the
                   pointwise ops that read them (see matmul_epilogues)
  EMBER_COMBO_KERNELS  0 launches each pointwise kernel of a foreach step on its own on the GPU
                   (see combo_kernels)
  EMBER_CHECK_INPUT_SHARING  0 drops the per-call check of inputs that newly share memory with
                   one the graph writes (see check_input_sharing)
  EMBER_BACKGROUND_COMPILE  0 compiles matmul kernels and new Triton variants at the call that
                   needs them, not in a background thread (see background_compile)
  EMBER_CUDA_COMPILE_TIMEOUT  seconds a CUDA C++ module may take to compile before its kernels
                   run through ATen instead (default 120; see cuda_compile_timeout)
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        return int(raw) if raw else default
    except ValueError:
        print(f"[ember] ignoring {name}={raw!r}: not an integer", file=sys.stderr)
        return default


def _env_count(name: str, default: int | None = None) -> int | None:
    """An integer >= 0 from the environment; ``default`` when unset, or not one (with a message:
    EMBER_DEBUG=-1 failed every compile as "ember option 'debug' is a count >= 0")."""
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        print(f"[ember] ignoring {name}={raw!r}: not a count >= 0", file=sys.stderr)
        return default
    return value


def _env_seconds(name: str, default: float) -> float:
    """A positive number of seconds from the environment; ``default`` when unset or not one."""
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:  # (NaN too)
        print(f"[ember] ignoring {name}={raw!r}: not a number of seconds > 0", file=sys.stderr)
        return default
    return value


def _env_names(name: str) -> tuple[str, ...]:
    """A comma-separated list of names from the environment."""
    return tuple(part.strip() for part in os.environ.get(name, "").split(",") if part.strip())


def _env_choice(name: str, choices: tuple[str, ...]) -> str:
    """The environment's value of ``name`` if it is one of ``choices``, else the first choice."""
    value = os.environ.get(name, choices[0])
    if value not in choices:
        print(f"[ember] ignoring {name}={value!r}: not one of {choices}", file=sys.stderr)
        return choices[0]
    return value


GPU_BACKENDS = ("triton", "cuda")
TRITON_TUNINGS = ("heuristic", "full")
TARGETS = ("cpp", *GPU_BACKENDS)
MATMUL_EPILOGUES = ("auto", "all", "off")
DEFAULT_CUDA_COMPILE_TIMEOUT = 120.0  # seconds


@dataclass
class Config:
    debug: int = field(default_factory=lambda: _env_count("EMBER_DEBUG", 0) or 0)
    # (~ is the home directory: "~/cache" made a directory named "~" in the working directory;
    # a relative path is made absolute once, so that an os.chdir later moves no cache)
    cache_dir: Path = field(default_factory=lambda: Path(
        os.environ.get("EMBER_CACHE_DIR") or Path.home() / ".cache" / "ember").expanduser().absolute())
    cxx: str = field(default_factory=lambda: os.environ.get("EMBER_CXX", ""))
    # The compiler's optimization and math flags for CPU kernels (an option replaces them all;
    # runtime/cpp_build.py always adds -shared -fPIC -fopenmp -std=c++17). -march=native is part
    # of the cache key through the host CPU. -ffp-contract=off: no a * b + c fused into one
    # rounding (a * b - c * d of equal products is 0 in eager, and was 1e-8 with FMA; inf - inf
    # was inf, not NaN). -fno-tree-pre: GCC's partial redundancy elimination rewrote the NaN test
    # of a select (relu(x) != relu(x) as c ? x != x : false), a select of masks its vectorizer
    # refuses; relu + max pooling ran scalar, 3.8x slower (bench/RESULTS.md, sixty-third session).
    # -fno-thread-jumps: GCC 12's jump threading, with -fno-trapping-math, miscompiled an omp simd
    # loop reducing a row max beside a bfloat16 store of two chained selects: wrong maxima, other
    # reductions' results overwritten, crashes (bench/RESULTS.md, ninety-fourth session).
    cxx_flags: tuple[str, ...] = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math",
                                  "-ffp-contract=off", "-fwrapv", "-fno-tree-pre", "-fno-thread-jumps")
    gpu_backend: str = field(default_factory=lambda: _env_choice("EMBER_GPU_BACKEND", GPU_BACKENDS))
    # Render kernels for this backend ('cpp', 'cuda', 'triton') whatever the device; a target
    # the device cannot run (CUDA kernels on a CPU-only machine) is rendered but not built, and
    # the graph runs through ATen. ember.explain(fn, *args, target=...) sets it.
    target: str | None = None
    # On the GPU backends, launch small independent pointwise kernels of different static sizes
    # (an optimizer's foreach step over parameters of several shapes) as one kernel, each on
    # programs (blocks) of its own (codegen/triton_combos.py, cuda_combos.py). False: a launch each.
    combo_kernels: bool = field(default_factory=lambda: _env_int("EMBER_COMBO_KERNELS", 1) != 0)
    # Fix some Triton launch parameters instead of tuning them, e.g. {"PERSISTENT": False,
    # "RBLOCK": 16} (tests use it to run every code path under the interpreter); "SPLIT": n
    # splits the rows of a reduction over n programs; "only": "name" fixes them only for the
    # kernels whose name contains it.
    triton_launch: dict | None = None
    # How Triton launch configurations are chosen: 'heuristic' compiles one per kernel and shape
    # bucket, picked from the shape, the dtype and the SM count (cold compile ~0.2 s per kernel);
    # 'full' compiles and times 4-25 candidates once (seconds per kernel) and remembers the
    # fastest in the cache directory, where later 'heuristic' runs find and use it too.
    triton_tuning: str = field(default_factory=lambda: _env_choice("EMBER_TRITON_TUNING", TRITON_TUNINGS))
    # Check each call of a graph that writes an input for tensor inputs that newly share memory
    # with it (views of one buffer where the graph was compiled for tensors apart), and run such
    # calls eagerly (frontend/input_sharing.py): about 0.1 us an input a call. Dynamo guards one
    # tensor passed twice, not two views of one memory; without the check (and in Inductor), a
    # kernel may read what it has already overwritten.
    check_input_sharing: bool = field(default_factory=lambda: _env_int("EMBER_CHECK_INPUT_SHARING", 1) != 0)
    # Fuse at all (False: every op its own kernel, useful to bisect a wrong result).
    fusion: bool = True
    # Pointwise subtrees larger than this are stored once rather than recomputed in each kernel
    # that needs them.
    max_recompute_ops: int = 8
    # Pointwise subtrees that several kernels recompute and that read more than this many
    # buffers of their own size are stored once (a residual stream's sum of every block's
    # output): each recomputing kernel would read them all again.
    max_recompute_reads: int = 3
    # Pointwise values of two transcendental ops or more (or one and four others) that a CPU
    # pointwise kernel reads broadcast, at this many times their own number of elements or more,
    # are stored once rather than recomputed at every element (a rotary embedding's cos and sin
    # tables: schedule/fusion.py's costly_broadcast).
    max_broadcast_recompute: int = 8
    # CPU outputs of at least this many bytes are advised onto transparent huge pages before the
    # kernel writes them: a fresh 64 MB buffer takes 16k page faults otherwise.
    huge_page_bytes: int = 4 << 20
    # Training: where a scalar loss's gradient can be computed in the forward graph (saved, and
    # scaled by the incoming gradient in a one-kernel backward), do so when it moves no more
    # bytes than min-cut rematerialization (frontend/partition.py). False: always min-cut.
    grad_in_forward: bool = field(default_factory=lambda: _env_int("EMBER_GRAD_IN_FORWARD", 1) != 0)
    # Treat x * mask, where mask is a 0/1 tensor made from a comparison (padded code's
    # (targets[..., 3] > 0).to(dtype)), as torch.where(mask, x, 0): kernels then neither load nor
    # compute x where the mask is 0 (passes/masks.py). What is computed from the product is 0
    # there too: ember differs from eager only where eager's masked-out value is NaN (an inf or
    # NaN in x, or a 0/0 downstream) and in the sign of zeros. Selects (torch.where) skip their
    # untaken branch always; that is exact.
    skip_masked: bool = field(default_factory=lambda: _env_int("EMBER_SKIP_MASKED", 0) != 0)
    # Generate embedding_bag (sum and mean) on the CPU too (frontend/bag_decomps.py). Off: training
    # steps beat Inductor's there, but a float32 forward takes 2.4-5x eager's time (2 cores,
    # bench/embedding_bag.py --device cpu); GPUs generate it.
    cpu_embedding_bag: bool = field(default_factory=lambda: _env_int("EMBER_CPU_EMBEDDING_BAG", 0) != 0)
    # Keep compiled graphs in torch's AOTAutograd cache (under torch's cache directory,
    # TORCHINDUCTOR_CACHE_DIR): a warm start, after torch._dynamo.reset() or in a new process,
    # then skips AOTAutograd's tracing and partitioning and ember's planning, and only loads the
    # kernels from cache_dir (aot_cache.py). Off while a report or debug >= 2 asks to see
    # the pipeline run.
    aot_cache: bool = field(default_factory=lambda: _env_int("EMBER_AOT_CACHE", 1) != 0)
    # Column sums beside row reductions of the same rows (a norm's dw beside its dx): row kernels
    # split their rows into this many runs and add up each run's columns as they go, so the
    # inputs are read once (passes/chunks.py). None: 2 runs per SM with Triton (4 for a column
    # sum alone beside its row sums), 4 with CUDA C++, 4 per thread on the CPU; 0 (or 1, a
    # single run): off, a kernel of their own reads the inputs again.
    row_chunks: int | None = field(default_factory=lambda: _env_count("EMBER_ROW_CHUNKS"))
    # With the Triton backend, 16-bit matmuls (aten.mm, aten.addmm) whose results feed pointwise
    # ops can be generated by ember, with those ops computed on their tiles before anything is
    # stored (passes/matmul.py): 'auto' does it for matmuls sharing their first operand (a gated
    # MLP's two projections: one kernel reads x once for both and stores neither product), and on
    # Hopper GPUs for a lone matmul, except where the kernel would store two tensors (a training
    # forward saving the product beside the epilogue's result), and times such a graph's kernels
    # against the graph built with 'off' on its first calls, keeping the faster
    # (runtime/choice.py); 'all' for every matmul with an epilogue, never timed (slower than
    # cuBLAS plus an epilogue kernel for a lone matmul on an H200: bench/RESULTS.md); 'off' for
    # none.
    matmul_epilogues: str = field(default_factory=lambda: _env_choice("EMBER_MATMUL_EPILOGUES", MATMUL_EPILOGUES))
    # Compile matmul kernels (Triton's 0.5-3 s each, the Hopper template's 0.3-0.7 s with NVRTC)
    # and the new specializations of other Triton kernels (sizes of another alignment or shape
    # bucket, once the kernel has compiled for some size) in a background thread: until one is
    # ready, calls run its group through ATen, so no call waits for a compiler as sizes change.
    # ember.wait_for_kernels() blocks until every such compile is done. False: the call compiles
    # them. Training graphs always do (driver._build: ATen's roundings are not the kernels').
    background_compile: bool = field(default_factory=lambda: _env_int("EMBER_BACKGROUND_COMPILE", 1) != 0)
    # Seconds a CUDA C++ module may take to compile (NVRTC, or nvcc where NVRTC is missing). Past
    # them its kernels run through ATen, with one warning, and the cache directory remembers it,
    # so that later processes do not wait again (with this limit or a lower one). Modules take
    # 0.1-1 s (when a whole module runs out of time, each kernel is built alone to keep the
    # others: twice the limit at most); NVVM once spun for over 10 minutes on one kernel's index
    # arithmetic (bench/RESULTS.md, hundred-and-eleventh session), and in-process NVRTC cannot
    # be stopped: the compile goes on in a daemon thread, its result dropped.
    cuda_compile_timeout: float = field(
        default_factory=lambda: _env_seconds("EMBER_CUDA_COMPILE_TIMEOUT", DEFAULT_CUDA_COMPILE_TIMEOUT))
    # Let Dynamo time each new set of guards for its compile metrics, as it does for other
    # backends: it evicts the CPU caches first, 18-26 ms per compiled frame (frontend/guard_profile.py).
    profile_guards: bool = field(default_factory=lambda: _env_int("EMBER_PROFILE_GUARDS", 0) != 0)
    # Middle-end passes not to run, by name (passes/pipeline.py: PIPELINE; EMBER_DEBUG=2 prints
    # the IR after each): to see what one does to a graph, or what it is worth, by comparison.
    # Every pass is an optimization; the IR stays valid without any of them.
    passes_off: tuple[str, ...] = field(default_factory=lambda: _env_names("EMBER_PASSES_OFF"))
    # Check the IR after every pass (on whenever debug > 0).
    verify: bool = False

    def __setattr__(self, name: str, value: Any) -> None:
        # (ember.config.debg = 2, a misspelt setting, was kept and silently ignored; torch's
        # configs raise AttributeError for a name they do not have, too)
        if name not in self.__dataclass_fields__:
            raise AttributeError(f"ember.config has no setting {name!r}; known: {sorted(self.__dataclass_fields__)}")
        object.__setattr__(self, name, value)

    def replace(self, **overrides: Any) -> Config:
        known = {f.name for f in dataclasses.fields(self)}
        unknown = set(overrides) - known
        if unknown:
            raise TypeError(f"unknown ember option(s) {sorted(unknown)}; known: {sorted(known)}")
        if "cache_dir" in overrides:
            if not isinstance(overrides["cache_dir"], (str, os.PathLike)):
                raise TypeError(f"ember option 'cache_dir' is a path, got {overrides['cache_dir']!r}")
            if not os.fspath(overrides["cache_dir"]):  # ("" was the working directory; as EMBER_CACHE_DIR="")
                raise ValueError("ember option 'cache_dir' is an empty path; leave it out for the default")
            overrides["cache_dir"] = Path(overrides["cache_dir"]).expanduser().absolute()
        if "cxx" in overrides and not isinstance(overrides["cxx"], str):  # (choices: ValueError below)
            raise TypeError(f"ember option 'cxx' is a string, got {overrides['cxx']!r}")
        if "cxx_flags" in overrides:
            flags = overrides["cxx_flags"]
            if isinstance(flags, str) or not isinstance(flags, (list, tuple)) or not all(
                    isinstance(f, str) for f in flags):
                # ("-O2" was split into its characters: every build failed)
                raise TypeError(f"ember option 'cxx_flags' is a list of strings, got {flags!r}")
            overrides["cxx_flags"] = tuple(flags)
        if overrides.get("triton_launch") is not None:
            _check_triton_launch(overrides["triton_launch"])
        types = {f.name: f.type for f in dataclasses.fields(self)}
        for name, value in list(overrides.items()):
            # switches and counts by their declared types ("debug": "1" failed later as
            # "'<' not supported between instances of 'str' and 'int'")
            if types[name] == "bool":
                if value not in (True, False) or not isinstance(value, (bool, int)):
                    raise TypeError(f"ember option {name!r} is a switch (True or False), got {value!r}")
                overrides[name] = bool(value)
            elif types[name] == "int" and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"ember option {name!r} takes an int, got {value!r}")
            elif types[name] == "int" and value < 0:
                raise ValueError(f"ember option {name!r} is a count >= 0, got {value!r}")
        for name in ("gpu_backend", "triton_tuning", "matmul_epilogues", "target"):  # (None: target's default)
            value = overrides.get(name, "")
            if not isinstance(value, str) and not (name == "target" and value is None):
                raise TypeError(f"ember option {name!r} is a string, got {value!r}")
        if overrides.get("gpu_backend", "triton") not in GPU_BACKENDS:
            raise ValueError(f"gpu_backend must be one of {GPU_BACKENDS}, got {overrides['gpu_backend']!r}")
        if overrides.get("triton_tuning", "heuristic") not in TRITON_TUNINGS:
            raise ValueError(f"triton_tuning must be one of {TRITON_TUNINGS}, got {overrides['triton_tuning']!r}")
        chunks = overrides.get("row_chunks")
        if chunks is not None and (isinstance(chunks, bool) or not isinstance(chunks, int)):
            raise TypeError(f"ember option 'row_chunks' is None or an int, got {chunks!r}")
        if chunks is not None and chunks < 0:
            raise ValueError(f"row_chunks must be None (automatic), 0 (off) or a positive count, got {chunks!r}")
        if overrides.get("matmul_epilogues", "auto") not in MATMUL_EPILOGUES:
            raise ValueError(f"matmul_epilogues must be one of {MATMUL_EPILOGUES}, "
                             f"got {overrides['matmul_epilogues']!r}")
        if "passes_off" in overrides:
            from .passes.pipeline import check_pass_names  # (the passes import this module)
            names = overrides["passes_off"]
            if not isinstance(names, (str, list, tuple)) or not all(isinstance(n, str) for n in names):
                raise TypeError(f"ember option 'passes_off' is a pass name or a list of them, got {names!r}")
            names = (names,) if isinstance(names, str) else tuple(names)
            check_pass_names(names, "passes_off")
            overrides["passes_off"] = names
        if "cuda_compile_timeout" in overrides:
            seconds = overrides["cuda_compile_timeout"]
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
                raise TypeError(f"ember option 'cuda_compile_timeout' takes seconds (a number), got {seconds!r}")
            if not seconds > 0:
                raise ValueError(f"ember option 'cuda_compile_timeout' must be > 0 seconds, got {seconds!r}")
            overrides["cuda_compile_timeout"] = float(seconds)
        if overrides.get("target") not in (None, *TARGETS):
            raise ValueError(f"target must be one of {TARGETS}, got {overrides['target']!r}")
        return dataclasses.replace(self, **overrides)

    @property
    def verifying(self) -> bool:
        return self.verify or self.debug > 0


_LAUNCH_POWERS = ("XBLOCK", "RBLOCK", "num_warps")  # powers of two
# (and the matmul kernels' tiles and programs: a tile Triton cannot take fails to build and falls
# back, which tests use)
_LAUNCH_COUNTS = ("num_stages", "SPLIT", "BM", "BN", "BK", "PROGRAMS")
_LAUNCH_SWITCHES = ("PERSISTENT", "TMA")


def _check_triton_launch(launch: Any) -> None:
    """``triton_launch``'s keys and values, as the launcher and Triton take them."""
    if not isinstance(launch, dict):
        raise TypeError(f"ember option 'triton_launch' is a dict or None, got {launch!r}")
    for key, value in launch.items():
        if key in _LAUNCH_POWERS + _LAUNCH_COUNTS:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (
                    key in _LAUNCH_POWERS and value & (value - 1)):
                what = "a power of two" if key in _LAUNCH_POWERS else "a positive int"
                raise ValueError(f"ember option 'triton_launch': {key} must be {what}, got {value!r}")
        elif key in _LAUNCH_SWITCHES:
            if not isinstance(value, int) or value not in (0, 1):  # (bench/launch_sweep.py passes 0/1)
                raise TypeError(f"ember option 'triton_launch': {key} is True or False, got {value!r}")
        elif key == "only":
            if not isinstance(value, str):
                raise TypeError(f"ember option 'triton_launch': only is a kernel name part, got {value!r}")
        else:
            known = _LAUNCH_POWERS + _LAUNCH_COUNTS + _LAUNCH_SWITCHES + ("only",)
            raise ValueError(f"ember option 'triton_launch': unknown key {key!r}; known: {known}")


config = Config()


def _source_digest() -> str:
    """A hash of every ember source file: what a cache entry kept across processes is checked
    against (a changed ember never loads another's entries)."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


# at import, so that the digest describes the code this process runs
SOURCE_DIGEST = _source_digest()


def log(level: int, message: str, cfg: Config | None = None) -> None:
    """Print ``message`` to stderr when the debug level is at least ``level``."""
    if (cfg or config).debug >= level:
        print(f"[ember] {message}", file=sys.stderr, flush=True)
