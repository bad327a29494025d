"""One ATen graph through the whole pipeline:

    frontend (lower) -> passes (pipeline) -> schedule (fusion, kernel IR) -> codegen (kernels,
    host wrapper) -> runtime (build, load, run)

Any failure in here is ember's, never the user's: the graph then runs through ATen, with one
warning, and ``ember.stats()['graph_fallbacks']`` counts it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import os
import time
import traceback
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import report as rp
from .codegen import cuda_combos
from .codegen.triton_combos import combine_kernels
from .codegen.wrapper import KernelCall, write_wrapper
from .config import GPU_BACKENDS, SOURCE_DIGEST, Config, log
from .frontend.autograd_inputs import drop_leaf_mutation_grads
from .frontend.context import ShapeDisagreement, shape_env_of
from .frontend.dynamo import donated_inputs
from .frontend.lowering import lower_graph
from .ir.node import Graph
from .ir.ops import Op
from .passes.fold import unit_reductions
from .passes.pipeline import run_pipeline
from .runtime import capture, stats
from .runtime.backend import BuiltKernels, backend_name, get_backend
from .runtime.choice import CudaClock, HostClock, Program, TimedChoice, saved_choices
from .runtime.program import CompiledProgram, boxed, eager_for_batched_calls, group_fallback, tangent_positions
from .runtime.triton_matmul import wait_for_kernels
from .schedule.fusion import plan
from .schedule.steps import KernelStep, Schedule

_graph_ids = itertools.count()
_warned: set[str] = set()
_planned: OrderedDict[str, tuple[Graph, Schedule, dict[str, Callable[..., None]]]] = OrderedDict()
_PLANNED_MAX = 256
# The traced values (fake tensors) a forward returns that fell back to ATen over a shape its
# lowering and the fake kernel disagree on: AOTAutograd hands the same objects to the backward
# as the saved values it takes, which the ATen forward may then give in other shapes.
# (by id: a WeakSet compares its tensors with ==, which is elementwise)
_saved_by_disagreeing_forwards: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()


def warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], kind: str, cfg: Config,
                  sink: list[rp.GraphReport] | None = None) -> Callable[..., Any]:
    name = f"{kind}_{next(_graph_ids)}"
    if kind == "backward":
        drop_leaf_mutation_grads(gm)  # (zeros eager never gives a leaf written under no_grad)
    report = rp.GraphReport(name, kind)
    start = time.perf_counter()
    if _on_meta(gm):
        # meta tensors hold no data: ATen's meta kernels compute their shapes, all a compiled
        # program could (no kernel backend has the device; this is no failure to warn of)
        log(1, f"{name}: a graph of meta tensors runs through ATen's meta kernels", cfg)
        if sink is not None:
            sink.append(report)
        return boxed(gm)
    if kind == "backward" and any(_saved_by_disagreeing_forwards.get(id(v)) is v for v in _input_values(gm)):
        # its kernels would read the saved values in their traced shapes, which the forward's
        # ATen ops may not have given (torch 2.11's fake linalg_vector_norm kept a dim the op
        # drops: an IndexError in the backward). ATen's ops take them as they come, as in aot_eager.
        report.error = "its forward ran through ATen over a shape the trace disagrees on"
        stats.bump("graph_fallbacks")
        log(1, f"{name}: {report.error}: it runs through ATen too", cfg)
        if sink is not None:
            sink.append(report)
        return boxed(gm)
    try:
        # what only a report shows (the IR after each pass, each kernel's source) is skipped
        # when nobody asked for one: it is most of ember's own time on a warm start
        program = _compile(gm, name, cfg, report, detail=sink is not None or cfg.debug > 0)
    except Exception as e:  # noqa: BLE001 -- any ember failure falls back, never the user's program
        report.error = f"{type(e).__name__}: {e}"
        stats.bump("graph_fallbacks")
        log(1, f"{name}: falling back to ATen:\n{traceback.format_exc()}", cfg)
        warn_once(f"{type(e).__name__}:{e}", f"ember could not compile graph {name} ({report.error}); "
                  "it runs through ATen. Set EMBER_DEBUG=1 for details.")
        program = boxed(gm)
        if kind == "forward" and isinstance(e, ShapeDisagreement):
            _saved_by_disagreeing_forwards.update((id(v), v) for v in _output_values(gm) if isinstance(v, torch.Tensor))
    if kind == "backward" and isinstance(program, (CompiledProgram, TimedChoice)):
        # (vmap's batched gradients: ATen batches them)
        eager_for_batched_calls(program, lambda: boxed(gm), tangent_positions(gm))
    report.compile_ms = (time.perf_counter() - start) * 1e3
    stats.add_time("compile_seconds", report.compile_ms / 1e3)
    if sink is not None:
        sink.append(report)
    rendered_only = report.kernels and all(k.not_built.startswith("rendered for") for k in report.kernels)
    aten = "runs through ATen (kernels rendered only)" if rendered_only else f"{len(report.fallbacks)} ATen call(s)"
    log(1, f"{name}: {len(report.kernels)} kernel(s), {aten}, {report.compile_ms:.0f} ms", cfg)
    return program


def _input_values(gm: torch.fx.GraphModule) -> list[Any]:
    return [node.meta.get("val") for node in gm.graph.nodes if node.op == "placeholder"]


def _output_values(gm: torch.fx.GraphModule) -> list[Any]:
    outputs = [node for node in gm.graph.nodes if node.op == "output"][0].args[0]
    return [getattr(node, "meta", {}).get("val") for node in outputs]


def _on_meta(gm: torch.fx.GraphModule) -> bool:
    """Does the graph take or make meta tensors (shapes without data)?"""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.device.type == "meta":
            return True
    return False


def _fingerprint(gm: torch.fx.GraphModule, kind: str, cfg: Config, donated: frozenset[int] = frozenset()) -> str | None:
    """What lowering, the passes and planning read: every FX node (op, target, arguments) with
    its shape, stride, dtype and device, the donated inputs and the settings. None for graphs
    with tensor constants (their values are not hashed)."""
    # lowerings also read torch's deterministic-algorithms flag (no atomics under it)
    parts = [kind, repr(cfg), str(_triton_interpreting()), str(torch.are_deterministic_algorithms_enabled()),
             str(sorted(donated))]
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            return None
        parts.append(f"{node.op}|{node.name}|{node.target}|{node.args!r}|{node.kwargs!r}|"
                     f"{_meta(node.meta.get('val'))}")
    parts.append(_shape_facts(gm))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _shape_facts(gm: torch.fx.GraphModule) -> str:
    """What Dynamo's guards say of the symbolic sizes, which lowering reads (``Context.known``):
    one FX graph over ``x[:, ::2]`` and ``x[:, 1::2]`` is traced under sizes that are equal (an
    even width) or under ``s // 2 == 1`` (a width of 3, where one broadcasts)."""
    env = shape_env_of(node.meta.get("val") for node in gm.graph.nodes)
    if env is None:
        return ""
    return repr(([str(g.expr) for g in env.guards], sorted(map(str, env.replacements.items())),
                 sorted((str(k), str(v)) for k, v in env.var_to_range.items())))


def _meta(val: Any) -> str:
    if isinstance(val, torch.Tensor):
        return (f"{tuple(val.shape)}/{val.stride()}/{val.storage_offset()}/{val.dtype}/{val.device}/"
                f"{val.requires_grad}/{val.is_neg()}")
    if isinstance(val, (list, tuple)):
        return "(" + ",".join(_meta(v) for v in val) + ")"
    return repr(val)


def _triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _devices(graph: Graph) -> set[str]:
    devices = {n.device for n in graph.nodes if n.shape is not None and n.op is not Op.INPUT}
    return devices | {n.device for n in graph.inputs if n.arg.kind == "tensor"}


def cuda_index(graph: Graph) -> int | None:
    """The CUDA device a graph runs on, where its tensors name one (``cuda:1``)."""
    indices = {int(d.split(":", 1)[1]) for d in _devices(graph) if d.startswith("cuda:")}
    return indices.pop() if len(indices) == 1 else None


def _graph_device(graph: Graph) -> str:
    devices = _devices(graph)
    if not devices:
        return "cpu"
    if len(devices) > 1:
        raise NotImplementedError(f"graph spans devices {sorted(devices)}")
    (device,) = devices
    return "cuda" if device.startswith("cuda") else device


def _compile(gm: torch.fx.GraphModule, name: str, cfg: Config, report: rp.GraphReport,
             detail: bool = True) -> Callable[..., Any]:
    kind = name.rsplit("_", 1)[0]
    donated = donated_inputs(gm) if kind == "backward" else frozenset()
    graph, schedule, fallbacks, key = _planned_graph(gm, name, cfg, donated, report.passes if detail else None)
    program = _build(graph, schedule, fallbacks, name, cfg, report, detail)
    if program is None:
        return boxed(gm)
    plans = [(graph, schedule)]
    if _times_matmuls(schedule, cfg):
        # the same graph with cuBLAS computing the products; the calls choose (runtime/choice.py)
        off = dataclasses.replace(cfg, matmul_epilogues="off")
        graph_off, schedule_off, fallbacks_off, _ = _planned_graph(gm, name, off, donated, None)
        unfused = _build(graph_off, schedule_off, fallbacks_off, f"{name}_cublas", off,
                         rp.GraphReport(f"{name}_cublas", kind), detail=False, counted=False)
        if unfused is not None:
            program = _choice(name, [program, unfused], cfg, graph, key)
            plans.append((graph_off, schedule_off))
    # the plan goes to torch's AOTAutograd cache (aot_cache.py); only graphs without tensor
    # constants carry it: a constant's values are not part of any cache key (see _fingerprint)
    if key is not None and cfg.aot_cache:
        program.plan = plans if isinstance(program, TimedChoice) else plans[0]
    return program


def _planned_graph(gm: torch.fx.GraphModule, name: str, cfg: Config, donated: frozenset[int],
                   passes: list[Any] | None) -> tuple[Graph, Schedule, dict[str, Callable[..., None]], str | None]:
    """(IR graph after the passes, its schedule, the kernels' ATen fallbacks, the plan's key).
    A graph planned before in this process (the same FX code over the same shapes, strides and
    dtypes, e.g. after torch._dynamo.reset()) skips lowering, passes and planning, unless a
    report asks to see the passes. Kernels are still built afresh (from the disk cache), so
    launch state is never shared."""
    key = _fingerprint(gm, name.rsplit("_", 1)[0], cfg, donated)
    hit = _planned.get(key) if key is not None and passes is None else None
    if hit is not None:
        _planned.move_to_end(key)
        return (*hit, key)
    graph = lower_graph(gm, name, donated)
    graph = run_pipeline(graph, cfg, passes)
    graph = unit_reductions(graph)  # (the planner's need, not a pass: runs with any passes off)
    start = time.perf_counter()
    schedule = plan(graph, cfg, gpu=_gpu_target(graph, cfg), hints=_size_hints(gm))
    target = _target(graph, cfg) if cfg.combo_kernels else None
    if target == "triton":
        schedule = combine_kernels(schedule)
    elif target == "cuda":
        schedule = combine_kernels(schedule, cuda_combos.combinable)
    log(1, f"{name}: planned {len(schedule.kernels)} kernel(s) for {len(graph.nodes)} nodes in "
        f"{(time.perf_counter() - start) * 1e3:.0f} ms ({schedule.attempts} attempt(s), "
        f"{schedule.reused} kernel build(s) reused)", cfg)
    fallbacks = _fallbacks(schedule)
    if key is not None:
        _planned[key] = (graph, schedule, fallbacks)
        while len(_planned) > _PLANNED_MAX:
            _planned.popitem(last=False)
    return graph, schedule, fallbacks, key


def _size_hints(gm: torch.fx.GraphModule) -> dict[Any, int]:
    """The sizes of this compile's example inputs, by symbol: the planner's guesses at how long
    a symbolic row is (which plan is faster, never which is right: any size runs either plan)."""
    env = shape_env_of(node.meta.get("val") for node in gm.graph.nodes)
    if env is None:
        return {}
    try:
        # (renamed in torch 2.13; the old name warns there)
        values = env.backed_var_to_val if hasattr(env, "backed_var_to_val") else env.var_to_val
        return {s: int(v) for s, v in values.items()}
    except (AttributeError, TypeError):  # (a hint that is no integer: guessed instead)
        return {}


def _target(graph: Graph, cfg: Config) -> str | None:
    """The backend ``graph``'s kernels are rendered for (None for a graph over two devices:
    _build reports it)."""
    try:
        return cfg.target or backend_name(_graph_device(graph), cfg)
    except NotImplementedError:
        return None


def _gpu_target(graph: Graph, cfg: Config) -> bool:
    """Are ``graph``'s kernels rendered for a GPU (the plan splits passes over few long rows)?"""
    return _target(graph, cfg) in GPU_BACKENDS


def _times_matmuls(schedule: Schedule, cfg: Config) -> bool:
    """Does this plan fuse matmuls that 'auto' chose (GPU kernels: Triton's or the Hopper
    template; their products then get timed against cuBLAS's)? Not under deterministic
    algorithms: the two compute the sums in different orders, and the calls that time them
    would take turns."""
    return (cfg.matmul_epilogues == "auto" and any(k.dots for k in schedule.kernels)
            and not torch.are_deterministic_algorithms_enabled())


def _choice(name: str, programs: list[Program], cfg: Config, graph: Graph, fingerprint: str | None) -> TimedChoice:
    """A timed choice between ``programs``; on a GPU, with its choices kept on disk under the
    graph's ``fingerprint`` (None: a graph with tensor constants, not kept), the device and the
    versions of torch and ember (timings of another GPU, cuBLAS or ember's kernels do not hold)."""
    saved = key = None
    if _graph_device(graph) == "cuda":
        clock: CudaClock | HostClock = CudaClock(cuda_index(graph))
        if fingerprint is not None:
            device = torch.cuda.get_device_name(cuda_index(graph))
            key = hashlib.sha256("\n".join((fingerprint, device, torch.__version__, str(torch.version.cuda),
                                            SOURCE_DIGEST)).encode()).hexdigest()[:32]
            saved = saved_choices(cfg.cache_dir)
    else:
        clock = HostClock()
    choice = TimedChoice(name, programs, cfg, clock, ready=lambda: wait_for_kernels(0),
                         labels=["ember's fused matmul kernels", "cuBLAS and epilogue kernels"], saved=saved, key=key)
    choice.fingerprint = fingerprint
    return choice


def rebuild_graph(graph: Graph, schedule: Schedule, kind: str, cfg: Config, counted: bool = True) -> CompiledProgram:
    """A graph planned by an earlier compile (kept in torch's AOTAutograd cache), built again: its
    kernels load from the disk cache. Raises on any failure; the caller then compiles afresh."""
    name = f"{kind}_{next(_graph_ids)}"
    start = time.perf_counter()
    report = rp.GraphReport(name, kind)
    program = _build(graph, schedule, _fallbacks(schedule), name, cfg, report, detail=False, counted=counted)
    if program is None:
        raise RuntimeError(f"{name}: the cached plan is for a target this machine does not build")
    ms = (time.perf_counter() - start) * 1e3
    stats.add_time("compile_seconds", ms / 1e3)
    log(1, f"{name}: rebuilt from torch's AOTAutograd cache, {len(report.kernels)} kernel(s), "
           f"{len(report.fallbacks)} ATen call(s), {ms:.0f} ms", cfg)
    return program


def rebuild(plan: tuple[Graph, Schedule] | list[tuple[Graph, Schedule]], kind: str,
            cfg: Config, fingerprint: str | None = None) -> CompiledProgram | TimedChoice:
    """``rebuild_graph`` of a cached plan, or of the plans of a timed choice (its fused matmul
    kernels and cuBLAS's), which then chooses again, or serves the choices saved under the
    graph's ``fingerprint``. Only the first is built now; the others at the first call that needs
    them (to time them, or chosen before)."""
    if isinstance(plan, tuple):
        return rebuild_graph(*plan, kind, cfg)
    fused, *others = plan
    off = dataclasses.replace(cfg, matmul_epilogues="off")
    programs: list[Program] = [rebuild_graph(*fused, kind, cfg)]
    programs += [functools.partial(rebuild_graph, g, s, kind, off, counted=False) for g, s in others]
    return _choice(programs[0].name, programs, cfg, fused[0], fingerprint)


def _fallbacks(schedule: Schedule) -> dict[str, Callable[..., None]]:
    return {s.kernel.name: group_fallback(s, schedule) for s in schedule.steps if isinstance(s, KernelStep)}


def _runs_on(target: str, device: str) -> bool:
    """Can ``target``'s kernels run on ``device``? explain(fn, target="cuda") on a CPU-only
    machine renders the GPU kernels and runs the graph through ATen. Either GPU backend runs on
    a GPU, whichever gpu_backend is (target="triton" under gpu_backend="cuda" ran through ATen,
    silently); under TRITON_INTERPRET=1 Triton kernels run on CPU tensors (how the tests check
    them)."""
    if device.startswith("cuda"):
        return target in GPU_BACKENDS
    return target == "cpp" or target == "triton" and _triton_interpreting()


def _build(graph: Graph, schedule: Schedule, fallbacks: dict[str, Callable[..., None]], name: str,
           cfg: Config, report: rp.GraphReport, detail: bool, counted: bool = True) -> CompiledProgram | None:
    """Build a planned graph's kernels and its host program; None when the target is only
    rendered here (the graph then runs through ATen). ``counted``: in ``ember.stats()`` (not a
    timed choice's second program of the same graph)."""
    device = _graph_device(graph)
    natural = backend_name(device, cfg)
    target = cfg.target or natural
    backend = get_backend(target)
    render_only = not _runs_on(target, device)
    report.target = target
    if counted:
        stats.bump("graphs_compiled")
        stats.bump("kernels_generated", len(schedule.kernels))
    if report.kind in ("forward", "backward") and cfg.background_compile:
        # A training graph's kernels compile at the call that needs them. Run through ATen while
        # a kernel compiled in the background, a group computes what another kernel recomputes
        # with other roundings (ATen's IEEE division, Triton's 2-ulp one): the forward's max and
        # the backward's recomputed input then matched nowhere, and the max's gradient, divided
        # by that count of 0, was NaN (the GPU fuzzer, segment_max of normalized rows)
        cfg = dataclasses.replace(cfg, background_compile=False)
    built = BuiltKernels() if render_only else backend.build(schedule.kernels, cfg, fallbacks)

    calls: dict[str, KernelCall] = {}
    namespace: dict[str, Any] = {}
    for step in schedule.steps:
        if not isinstance(step, KernelStep):
            continue
        k = step.kernel
        ok = k.name in built.functions
        why = f"rendered for {target}, not built on this {device} machine" if render_only else "failed to build"
        source = (built.sources.get(k.name) or backend.render(k)) if detail else ""
        report.kernels.append(rp.KernelReport(k.name, backend.name, source,
                                              list(k.origins), str(k) if detail else "", built=ok,
                                              not_built="" if ok else why))
        if ok:
            namespace[k.name] = built.functions[k.name]
            calls[k.name] = KernelCall(k.name, uses_error_flag=backend.uses_error_flag(k),
                                       pass_tensors=backend.passes_tensors(k))
        else:
            namespace[f"aten_{k.name}"] = fallbacks[k.name]
            calls[k.name] = KernelCall(f"aten_{k.name}", fallback=True, why_aten=why)
            if not render_only:
                report.fallbacks.extend(k.origins)
    namespace["__ember_keepalive__"] = built.keepalive
    for node in graph.nodes:
        if node.op is Op.EXTERN and not node.arg.host_check:
            report.fallbacks.append(node.arg.name)
    stats.bump("fallbacks", len(report.fallbacks))

    wrapper = write_wrapper(schedule, calls, timed=cfg.debug >= 4, huge_page_bytes=cfg.huge_page_bytes)
    report.wrapper = wrapper.source
    if render_only:
        log(1, f"{name}: rendered {len(schedule.kernels)} {target} kernel(s) without building them; "
               "the graph runs through ATen here", cfg)
        if cfg.debug >= 3:  # (what explain's report holds: the sources, for reading)
            sources = "\n\n".join(k.source for k in report.kernels)
            log(3, f"{name} kernels ({target}, not built):\n{sources}\n{name} host program:\n{wrapper.source}", cfg)
        return None
    namespace.update(wrapper.constants)
    if cfg.debug >= 3:
        log(3, f"{name} kernels:\n{built.module_source}\n{name} host program:\n{wrapper.source}", cfg)
    failed = {n for n, c in calls.items() if c.fallback}
    host_sizes, opaque = capture.host_size_inputs(graph, capture.host_symbols(graph, schedule, failed))
    return CompiledProgram(name, wrapper.source, namespace, cfg, cuda_index(graph), host_sizes, opaque)
