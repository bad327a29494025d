"""ember's public API: compile, explain, stats, and the Dynamo backend behind them."""

from __future__ import annotations

import dataclasses
import functools
import numbers
import os
import traceback
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._dynamo.eval_frame import OptimizedModule

from . import config as config_module
from .aot_cache import cached_backend
from .config import Config
from .driver import compile_graph
from .frontend.autograd_inputs import (
    autograd_refuses_an_inference_tensor,
    eager_for_dual_tensors,
    inference_inputs,
    returns_a_view_of,
    takes_fake_tensors,
    with_normal_copies,
)
from .frontend.dynamo import make_backend
from .frontend.eager_errors import unwrap_errors
from .frontend.fma_rewrites import restore_inplace_updates
from .frontend.guard_profile import without_guard_profiling
from .frontend.input_sharing import (
    eager_where_inputs_newly_share_memory,
    returns_a_written_input_that_overlaps_another,
)
from .frontend.module_frames import own_frame_per_class
from .frontend.overlap import refuses_inplace_cast, writes_overlapping_memory, writes_through_a_gapped_unfold
from .passes.pipeline import check_pass_names
from .report import GraphReport, Report
from .runtime import stats as stats_module


def _config(options: dict[str, Any] | None) -> Config:
    # (a list, or a dict with keys not names, failed as "'list' object is not a mapping")
    if options is not None and (not isinstance(options, dict) or not all(isinstance(k, str) for k in options)):
        raise TypeError(f"ember options are a dict of option names to values, or None; got {options!r}")
    base = config_module.config
    if base.passes_off and isinstance(base.passes_off, tuple):  # (an unknown name fails here, not per graph)
        check_pass_names(base.passes_off, "EMBER_PASSES_OFF" if os.environ.get("EMBER_PASSES_OFF")
                         else "ember.config.passes_off")
    # ember.config's values, which a program may set as attributes, are checked as options are
    values = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    return base.replace(**{**values, **(options or {})})


def ember_backend(gm: torch.fx.GraphModule, example_inputs: list[Any],
                  options: dict[str, Any] | None = None, mode: str | None = None) -> Callable[..., Any]:
    """The Dynamo backend ``torch.compile(fn, backend="ember")`` uses.

    ``options`` are ember settings (see ``ember.config.Config``), as in
    ``torch.compile(fn, backend="ember", options={"debug": 2})``. ``mode`` (Inductor's
    "max-autotune", "reduce-overhead") is accepted and ignored, as other backends do: ember's
    tuning is ``triton_tuning``, its CUDA graphs ``ember.cuda_graph``. A mode that is none of
    torch's raises Inductor's RuntimeError (a typo, "max-autotun", was ignored silently).
    """
    modes = _torch_compile_modes()
    if mode is not None and modes and mode not in modes:
        raise RuntimeError(f"Unrecognized mode={mode!r}, should be one of: {', '.join(modes)}")
    return _backend(_config(options), None)(gm, example_inputs)


def _torch_compile_modes() -> list[str]:
    """torch.compile's modes (Inductor's list), or none where this torch has no such list."""
    try:
        from torch._inductor import list_mode_options
        return list(list_mode_options())
    except Exception:  # noqa: BLE001 -- a private API: without it, any mode is accepted
        return []


_SHARED_BACKENDS: dict[str, Callable[..., Any]] = {}


class EmberBackend:
    """ember's Dynamo backend for one configuration. An object rather than a closure so that a
    compiled module pickles (``torch.save``) and deep-copies. ``sink``: a report's list of graphs,
    which each compile appends to. ``options``: the ones given to ``ember.compile``; a copy or an
    unpickled module gets the shared backend of those options over the ember.config of the
    process it is in (the saver's cache directory, compiler and debug level stay behind), with
    no report (a report collects one process's compiles)."""

    def __init__(self, cfg: Config, sink: list[GraphReport] | None = None,
                 options: dict[str, Any] | None = None) -> None:
        self.cfg = cfg
        self.sink = sink
        self.options = dict(options or {})
        self._compile: Callable[..., Any] | None = None

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        if self._compile is None:
            self._compile = _backend(self.cfg, self.sink)
        return self._compile(gm, example_inputs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_backend_with_options, (self.options,))

    def __setstate__(self, state: dict[str, Any]) -> None:  # (modules pickled before __reduce__)
        self.cfg, self.sink, self.options, self._compile = state["cfg"], None, {}, None


def _backend_with_options(options: dict[str, Any]) -> EmberBackend:
    """The backend of a copied or unpickled compiled module: shared, as ``ember.compile`` gives
    (copies of a module share their graphs: past Dynamo's limit of 8 entries the rest ran
    eagerly)."""
    return _shared_backend(_config(options or None), options)


def _shared_backend(cfg: Config, options: dict[str, Any] | None = None) -> EmberBackend:
    """One backend per configuration. Dynamo keeps a frame's compiled entries per backend, and
    the instances of a module class share their code: with a new backend per ``ember.compile``
    call, each instance compiled separately was another entry of that code, and past Dynamo's
    limit of 8 the rest ran eagerly. A shared one lets them share a graph, as a named backend
    (``torch.compile(m, backend="ember")``) does."""
    key = repr((cfg, sorted((options or {}).items())))  # (the options are what a copy keeps)
    backend = _SHARED_BACKENDS.get(key)
    if backend is None:
        backend = _SHARED_BACKENDS[key] = EmberBackend(cfg, options=options)
    return backend


class EmberModule(OptimizedModule):
    """What ``ember.compile(module)`` returns: torch's compiled module, whose errors are the op's
    own (``unwrap_errors``), also after ``copy.deepcopy`` or unpickling (which rebuild it)."""

    def _initialize(self) -> None:
        super()._initialize()
        own_frame_per_class(self.forward, type(self._orig_mod))
        self.forward = unwrap_errors(self.forward)

    # The state of the module it compiles, with that module's keys (torch's compiled module adds
    # "_orig_mod." to each): a checkpoint saved from either loads into either.
    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, *args: Any, **kwargs: Any) -> Any:
        prefix = "_orig_mod."
        if state_dict and all(k.startswith(prefix) for k in state_dict):  # (saved by torch.compile's)
            state_dict = {k[len(prefix):]: v for k, v in state_dict.items()}
        return self._orig_mod.load_state_dict(state_dict, *args, **kwargs)

    # A parent module's load_state_dict loads its children through this, not through the method
    # above, and then hands each key under prefix + "_orig_mod." to the module compiled: the
    # keys state_dict() gave (prefix + "weight") were unexpected there, and a model holding a
    # compiled submodule could not load its own checkpoint. (The dict is the loading's own copy.)
    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        inner = prefix + "_orig_mod."
        for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(inner)]:
            state_dict[inner + key[len(prefix):]] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def _backend(cfg: Config, sink: list[GraphReport] | None) -> Callable[..., Any]:
    def compile_one(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], kind: str) -> Callable[..., Any]:
        return compile_graph(gm, example_inputs, kind, cfg, sink)
    # a report shows every graph going through the whole pipeline: no cached graphs there
    backend = cached_backend(compile_one, cfg) if sink is None else make_backend(compile_one, cfg)
    backend = _eager_where_torch_cannot_trace(backend, cfg.check_input_sharing)
    return backend if cfg.profile_guards else without_guard_profiling(backend)


def _eager_where_torch_cannot_trace(backend: Callable[..., Any],
                                    check_input_sharing: bool = True) -> Callable[..., Any]:
    """``backend``, or Dynamo's graph run eagerly where AOTAutograd cannot trace it before ember
    sees it (torch's own decompositions: a mean loss's gradient over an empty batch divides by
    its numel in Python). The user's program runs, with one warning on the graph's first call
    that returns; an error the graph's ops raise, eager raises when it runs them, alone. So do
    graphs writing in place to tensors whose elements share memory, or whose result type eager
    cannot cast to the tensor written (``ints.mul_(floats)``),
    which functionalization gets wrong (``frontend/overlap.py``), as it does writes through an
    ``unfold`` view with gaps between its windows, calls with
    forward-mode AD dual tensors, whose tangents ember's kernels drop, and training graphs over
    inference tensors that save or return them (``frontend/autograd_inputs.py``), and graphs
    returning the memory of an input they write that overlaps another input
    (``frontend/input_sharing.py``). With
    ``check_input_sharing``, so do the calls of a compiled graph whose inputs newly overlap one it
    writes (``frontend/input_sharing.py``)."""
    def compile_or_eager(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        if restore_inplace_updates(gm):
            # (no warning: an update eager refuses (an add_'s tensor alpha) raises eager's error)
            return _eagerly(gm)
        if writes_overlapping_memory(gm):
            return _eagerly(gm, "a graph writes in place to a tensor whose elements share memory, or that "
                                "overlaps one the write reads (an expand, a shifted view)")
        if writes_through_a_gapped_unfold(gm):
            return _eagerly(gm, "a graph writes in place through an unfold view whose windows do not cover "
                                "its dim, which torch's functionalization zeroes between them")
        if refuses_inplace_cast(gm):
            # (no warning: eager's error follows, raised by the op when the graph runs it)
            return _eagerly(gm)
        if takes_fake_tensors(gm):
            # (no warning: fake tensors hold no data for kernels; eager's ops make fake results)
            return gm.forward
        if returns_a_written_input_that_overlaps_another(gm, example_inputs):
            return _eagerly(gm, "a graph writes in place to an input that overlaps another input and returns "
                                "that memory, whose views torch's AOTAutograd rebuilds wrongly")
        inference = inference_inputs(example_inputs)
        if inference and (autograd_refuses_an_inference_tensor(gm, example_inputs) or returns_a_view_of(gm, inference)):
            # (eager's autograd refuses the first, which the graph raises when it runs; the
            # compiled graph reads normal copies of inference tensors: a write would go to the
            # copy, lost, and a view would be one of the copy)
            return _eagerly(gm, "a training graph over inference tensors that saves one for the backward, "
                                "writes one in place or returns a view of one", ending=" runs eagerly")
        if (not inference and not torch.is_inference_mode_enabled()
                and any(isinstance(t, torch.Tensor) and t.is_inference() for t in example_inputs)
                and autograd_refuses_an_inference_tensor(gm, example_inputs)):
            # (no warning: eager's error follows, an inference tensor written outside inference
            # mode, raised by the op when the graph runs it; a kernel storing into the tensor
            # would not check)
            return _eagerly(gm)
        try:
            compiled = backend(gm, example_inputs)
            if check_input_sharing:
                compiled = eager_where_inputs_newly_share_memory(compiled, gm, example_inputs)
            return eager_for_dual_tensors(with_normal_copies(compiled, inference) if inference else compiled, gm)
        except Exception as e:  # noqa: BLE001 -- any failure to trace: eager runs the graph
            if isinstance(e, torch._dynamo.exc.TorchDynamoException) or not (
                    _in_torch_tracing(e) or _saved_tensor_modified(e)):
                raise
            return _eagerly(gm, f"torch could not trace a graph for compiling ({type(e).__name__}: "
                                f"{str(e).splitlines()[0] if str(e) else ''})")
    return compile_or_eager


def _eagerly(gm: torch.fx.GraphModule, why: str | None = None, ending: str = "; it runs eagerly") -> Any:
    """Dynamo's graph ``gm`` as it is (run eagerly), counted as a graph fallback; with one warning
    saying ``why`` where there is one, on its first call that returns. A call whose ops raise
    shows eager's error alone: torch's trace fails on the checks eager's ops make (an
    interpolation to a width of 0), and the warning would blame the compiler for the input."""
    stats_module.bump("graph_fallbacks")
    if why is None:
        return gm.forward
    warned = False

    def run_eagerly(*args: Any) -> Any:
        nonlocal warned
        out = gm.forward(*args)
        if not warned:
            warned = True
            warnings.warn(f"ember: {why}{ending}", RuntimeWarning, stacklevel=2)
        return out
    return run_eagerly


def _in_torch_tracing(e: BaseException) -> bool:
    """Did ``e`` come from torch's tracing code (AOTAutograd, decompositions, fake tensors), not
    from ember's (whose failures fall back inside ``compile_graph``)?"""
    frames = [f.filename for f in traceback.extract_tb(e.__traceback__)]
    ours = os.path.dirname(os.path.abspath(__file__))
    deepest = next((f for f in reversed(frames) if "torch" in f or f.startswith(ours)), "")
    return bool(deepest) and not deepest.startswith(ours)


def _saved_tensor_modified(e: BaseException) -> bool:
    """Is ``e`` autograd's refusal of a saved tensor the function then wrote in place? Eager's
    backward raises it; tracing the backward of one of ember's autograd functions
    (``frontend/prod_grad.py``) raised it while compiling, where eager's forward succeeds."""
    return isinstance(e, RuntimeError) and "modified by an inplace operation" in str(e)


def compile(model: Callable[..., Any] | None = None, *, options: dict[str, Any] | None = None,
            dynamic: bool | None = None, fullgraph: bool = False, report: Report | None = None) -> Any:
    """Compile a function or ``nn.Module`` with ember (``torch.compile`` with ember's backend).

    ``options`` override ember settings for this function, e.g. ``{"debug": 2}`` or
    ``{"cache_dir": "/tmp/k"}``; ``dynamic`` and ``fullgraph`` are torch.compile's. Pass a
    ``Report()`` as ``report`` to collect what each graph compiled into, as it compiles. Usable
    as a decorator, with or without arguments.
    """
    cfg = _config(options)
    # torch.compile asserts on these, or takes any truthy value: fullgraph="no" was fullgraph=True
    for name, value, kinds in (("dynamic", dynamic, (bool, type(None))), ("fullgraph", fullgraph, (bool,)),
                               ("report", report, (Report, type(None)))):
        if not isinstance(value, kinds):
            raise TypeError(f"ember.compile: {name}= takes {' or '.join(_type_name(k) for k in kinds)}, got {value!r}")
    if model is None:
        return functools.partial(compile, options=options, dynamic=dynamic, fullgraph=fullgraph, report=report)
    _check_callable(model, "ember.compile")
    backend = (EmberBackend(cfg, report.graphs, options) if report is not None
               else _shared_backend(cfg, options))
    compiled = torch.compile(model, backend=backend, dynamic=dynamic, fullgraph=fullgraph)
    if isinstance(compiled, OptimizedModule):  # stays a module (parameters, state_dict, train/eval)
        return EmberModule(compiled._orig_mod, compiled.dynamo_ctx)
    return unwrap_errors(compiled)


def _type_name(kind: type) -> str:
    return "None" if kind is type(None) else kind.__name__


def _check_callable(fn: Any, api: str) -> None:
    if not callable(fn):  # (torch.compile's AssertionError: "A callable function is expected")
        raise TypeError(f"{api} takes a function or an nn.Module, got {type(fn).__name__} {fn!r:.80}")


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def explain(fn: Callable[..., Any], *args: Any, options: dict[str, Any] | None = None,
            dynamic: bool | None = None, target: str | None = None, **kwargs: Any) -> Report:
    """Compile ``fn`` for ``args`` and report what ember did: the IR after every pass, the kernels
    (name, backend, source, fused ATen ops) and the ops that run through ATen. ``fn`` runs once.
    It clears Dynamo's caches before and after (so that ``fn`` is captured afresh): functions
    already compiled in this process, by ember or by torch.compile, trace and compile again at
    their next call. Call it beside a training loop, not inside one.

    ``target`` ('cpp', 'cuda' or 'triton') renders kernels for that backend; GPU kernels render
    on any machine (a CPU-only laptop too), built and run only where a GPU is present.
    ``options``, ``dynamic`` and ``target`` are explain's own: a ``fn`` with arguments of those
    names gets them through ``functools.partial`` (or a lambda)."""
    for name, value, kind in (("options", options, dict), ("dynamic", dynamic, bool), ("target", target, str)):
        if value is not None and not isinstance(value, kind):
            raise TypeError(f"ember.explain: {name}= is explain's own ({kind.__name__} or None), got "
                            f"{type(value).__name__}; to pass {_fn_name(fn)} an argument named {name!r}, "
                            f"bind it first: ember.explain(functools.partial(fn, {name}=...), ...)")
    _check_callable(fn, "ember.explain")
    cfg = _config({**(options or {}), **({"target": target} if target is not None else {})})
    report = Report()
    backend = _backend(cfg, report.graphs)
    torch._dynamo.reset()
    # (an op's own error, as ember.compile raises it, not Dynamo's wrapper of it)
    compiled = unwrap_errors(torch.compile(fn, backend=backend, dynamic=dynamic))
    try:
        compiled(*args, **kwargs)
    finally:
        torch._dynamo.reset()
    return report


def stats() -> dict[str, float]:
    """Counters since the process started (or since ``reset_stats()``)."""
    return stats_module.snapshot()


def reset_stats() -> None:
    stats_module.reset()


def wait_for_kernels(timeout: float | None = None) -> bool:
    """Block until the kernels compiling in the background (matmul kernels, see the
    ``background_compile`` option) are ready; False if ``timeout`` seconds passed first. Calls
    made meanwhile are correct, through ATen; benchmarks call this before timing."""
    from .runtime.triton_matmul import wait_for_kernels as wait
    # (checked here, not where a job is pending: timeout="10" passed while nothing compiled and
    # failed deep in threading when something did)
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
            raise TypeError(f"ember.wait_for_kernels: timeout= takes seconds (a number) or None, "
                            f"got {type(timeout).__name__}")
        if not timeout >= 0:  # (negative or NaN)
            raise ValueError(f"ember.wait_for_kernels: timeout= must be >= 0 seconds, got {timeout!r}")
        if timeout == float("inf"):  # (no limit: threading's wait raises OverflowError for inf)
            timeout = None
    return wait(timeout)
