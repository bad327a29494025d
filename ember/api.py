"""ember's public API: compile, explain, stats, and the Dynamo backend behind them."""

from __future__ import annotations

import dataclasses
import functools
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
from .frontend.dtype_refusals import eager_kernel_refusal, traceback_frames
from .frontend.dynamo import make_backend
from .frontend.fma_rewrites import restore_inplace_updates
from .frontend.guard_profile import without_guard_profiling
from .frontend.input_sharing import eager_where_inputs_newly_share_memory
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
    own (``_unwrap_errors``), also after ``copy.deepcopy`` or unpickling (which rebuild it)."""

    def _initialize(self) -> None:
        super()._initialize()
        own_frame_per_class(self.forward, type(self._orig_mod))
        self.forward = _unwrap_errors(self.forward)

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
    its numel in Python). The user's program runs, with one warning; an error the graph's ops
    raise, eager raises when it runs them. So do graphs writing in place to tensors whose elements
    share memory, or whose result type eager cannot cast to the tensor written (``ints.mul_(floats)``),
    which functionalization gets wrong (``frontend/overlap.py``), as it does writes through an
    ``unfold`` view with gaps between its windows, calls with
    forward-mode AD dual tensors, whose tangents ember's kernels drop, and training graphs over
    inference tensors that save or return them (``frontend/autograd_inputs.py``). With
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
            if isinstance(e, torch._dynamo.exc.TorchDynamoException) or not _in_torch_tracing(e):
                raise
            return _eagerly(gm, f"torch could not trace a graph for compiling ({type(e).__name__}: "
                                f"{str(e).splitlines()[0] if str(e) else ''})")
    return compile_or_eager


def _eagerly(gm: torch.fx.GraphModule, why: str | None = None, ending: str = "; it runs eagerly") -> Any:
    """Dynamo's graph ``gm`` as it is (run eagerly), counted as a graph fallback; with one warning
    saying ``why`` where there is one."""
    if why is not None:
        warnings.warn(f"ember: {why}{ending}", RuntimeWarning, stacklevel=3)
    stats_module.bump("graph_fallbacks")
    return gm.forward


def _in_torch_tracing(e: BaseException) -> bool:
    """Did ``e`` come from torch's tracing code (AOTAutograd, decompositions, fake tensors), not
    from ember's (whose failures fall back inside ``compile_graph``)?"""
    frames = [f.filename for f in traceback.extract_tb(e.__traceback__)]
    ours = os.path.dirname(os.path.abspath(__file__))
    deepest = next((f for f in reversed(frames) if "torch" in f or f.startswith(ours)), "")
    return bool(deepest) and not deepest.startswith(ours)


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
    return _unwrap_errors(compiled)


def _type_name(kind: type) -> str:
    return "None" if kind is type(None) else kind.__name__


def _check_callable(fn: Any, api: str) -> None:
    if not callable(fn):  # (torch.compile's AssertionError: "A callable function is expected")
        raise TypeError(f"{api} takes a function or an nn.Module, got {type(fn).__name__} {fn!r:.80}")


def _unwrap_errors(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """Dynamo reports an op's error (wrong shapes, dtypes, devices) as TorchRuntimeError while
    tracing; re-raise the op's own exception, as eager would, with the op named."""

    # (the name and docstring, not the attributes: Dynamo marks the compiled function with its
    # own, and compiling this wrapper again, ember.explain(fast, x), asserted on finding them)
    @functools.wraps(compiled, updated=())
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return compiled(*args, **kwargs)
        except IndexError as e:
            if refusal := _argmax_of_bools(e):
                raise refusal from None
            if meta := _rank_unchecked_by_meta(e):
                # the meta function sized a dim of a tensor of too few dims before checking its
                # rank; eager's kernel checks the rank first and raises RuntimeError
                raise RuntimeError(f"{_RANK_CHECKED_FIRST[meta]} ({e})") from None
            prims = [name for x in _exception_chain(e) for f, name in zip(_frames(x), _function_names(x))
                     if "/torch/_prims/" in f]
            if not any("cat" in name for name in prims):  # (torch 2.11 raises it otherwise: left as it is)
                # (Dynamo lets an op's IndexError through unwrapped: named here, "sum: Dimension out of range")
                raise _named(e, f"call_function {op}(*" if (op := _function_run(e)) else "") from None
            # prims.cat's meta indexes the shape of a 0-d tensor (Dynamo lets its IndexError
            # through); eager's cat checks its tensors first and raises RuntimeError
            raise RuntimeError(f"torch.cat: zero-dimensional tensors cannot be concatenated ({e})") from None
        except torch._dynamo.exc.TorchRuntimeError as e:
            chain = _exception_chain(e)
            original = chain[-1]
            if original is e or isinstance(original, torch._dynamo.exc.TorchDynamoException):
                raise
            if type(original) in (ValueError, TypeError) and (refusal := eager_kernel_refusal(original)):
                # leaky_relu or softshrink of integers: eager's kernels have no such dtype
                original = refusal
            elif (type(original) is AssertionError and not _raised_in(original, "/torch/nn/functional.py")
                    or type(original) in (ValueError, OverflowError) and _raised_in_refs(original)):
                # a check in one of torch's Python decompositions (cross_entropy's weight length,
                # a view's size against its strides) or a bound it converts (hardtanh's int(inf) of
                # an integer tensor); the eager op's own check raises RuntimeError
                original = RuntimeError(str(original))
            elif (type(original) in (ValueError, OverflowError) and _raised_in(original, "/torch/__init__.py")
                    and not _checked_as_value(original)):
                # a Python number torch converts while tracing (masked_fill of an int tensor with
                # NaN or inf: sym_int); eager's kernel refuses the value with a RuntimeError
                original = RuntimeError(str(original))
            elif type(original) is RuntimeError and _eager_index_error(original, _op_from_dynamo_message(str(e))):
                original = IndexError(str(original))
            elif type(original) is RuntimeError and _rank_unchecked_by_eager(original):
                original = IndexError(str(original))
            elif type(original) is RuntimeError and _one_running_stat_in_training(original):
                original = ValueError(str(original))
            elif type(original) is RuntimeError and (refusal := _scan_to_bools(original)):
                original = refusal
            elif type(original) is RuntimeError and (refusal := _argmax_of_bools(original)):
                original = refusal
            elif type(original) is RuntimeError and _empty_reduction(original):
                # amax/argmax/aminmax over an empty dim: eager's check is an IndexError
                original = IndexError(str(original))
            elif type(original) is ZeroDivisionError and _through_torch_op_code(original):
                # a size or factor of 0 divided by in a decomposition or meta function
                # (interpolate to no pixels, pixel_shuffle by 0; with symbolic sizes the
                # division itself is a SymInt's): eager's kernel checks first, RuntimeError
                original = RuntimeError(f"{original} (a size of 0)")
            elif type(original) is RuntimeError and (refusal := eager_kernel_refusal(original)):
                # shifts of bools or floats, floor division or lcm of bools: eager's kernels
                # have no such dtype
                original = refusal
            elif type(original) is RuntimeError and _no_kernel_for_dtype(original):
                # randn/normal_/log_normal_ of integers: eager finds no kernel for the dtype
                original = NotImplementedError(str(original))
            elif type(original) is RuntimeError and (dtype := _float_input_without_kernel(original)):
                original = NotImplementedError(f"no kernel for {dtype} inputs ({original})")
            raise _named(original, "\n".join(str(c) for c in chain)) from None

    return run


def _frames(e: BaseException) -> list[str]:
    """The files of ``e``'s traceback, outermost first, with forward slashes."""
    files, tb = [], e.__traceback__
    while tb is not None:
        files.append(tb.tb_frame.f_code.co_filename.replace("\\", "/"))
        tb = tb.tb_next
    return files


def _function_names(e: BaseException) -> list[str]:
    """The functions of ``e``'s traceback, outermost first."""
    names, tb = [], e.__traceback__
    while tb is not None:
        names.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return names


def _raised_in_refs(e: BaseException) -> bool:
    """Whether ``e`` was raised in torch's Python references of ATen ops (torch/_refs, _prims),
    not by a Python-level function that raises ValueError in eager too (F.interpolate's)."""
    return any(_raised_in(e, part) for part in _REFS)


_REFS = ("/torch/_refs/", "/torch/_prims")
_OP_CODE = (*_REFS, "/torch/_decomp/", "/torch/_meta_registrations")


def _through_torch_op_code(e: BaseException) -> bool:
    """Whether any frame of ``e`` is in torch's Python implementations of ATen ops (references,
    decompositions, meta functions): an error eager's C++ kernel would raise otherwise."""
    return any(part in f for f in _frames(e) for part in _OP_CODE)


# meta functions that read a dim of their input before checking its rank (an IndexError for a
# 1-d or 2-d input), with the check eager's kernel makes first (a RuntimeError)
_RANK_CHECKED_FIRST = {
    "max_pool2d_checks_and_compute_shape": "non-empty 3D or 4D (batch mode) tensor expected for input",
}


# decompositions that check their input's rank, where eager's kernel reads a dim it lacks first
# (an IndexError): the least rank eager reads without one
_EAGER_READS_DIMS_FIRST = {"im2col": 3}


def _rank_unchecked_by_eager(e: BaseException) -> bool:
    """A rank check of a decomposition in ``_EAGER_READS_DIMS_FIRST`` that failed on an input of
    fewer dims than eager's kernel reads (``F.unfold`` of a 2-d tensor): eager's IndexError."""
    for frame in traceback_frames(e):
        code = frame.f_code
        least = _EAGER_READS_DIMS_FIRST.get(code.co_name)
        x = frame.f_locals.get("input")
        if (least is not None and "/torch/_decomp/" in code.co_filename.replace("\\", "/")
                and isinstance(x, torch.Tensor) and x.dim() < least):
            return True
    return False


def _rank_unchecked_by_meta(e: BaseException) -> str | None:
    """The function of ``_RANK_CHECKED_FIRST`` in whose own frame ``e`` (an IndexError that
    Dynamo let through) was raised, if any."""
    for x in _exception_chain(e):
        names = [n for f, n in zip(_frames(x), _function_names(x)) if "/torch/_meta_registrations" in f]
        if names and names[-1] in _RANK_CHECKED_FIRST:
            return names[-1]
    return None


# torch's references whose torch._check_value failures eager's kernels raise as ValueError too
# (others, split's sizes, are eager's RuntimeError)
_EAGER_VALUE_CHECKS = frozenset({"arange"})  # (an int64 step truncated to 0)


def _checked_as_value(e: BaseException) -> bool:
    """Whether ``e`` is a ``torch._check_value`` failure in one of ``_EAGER_VALUE_CHECKS``."""
    names = _function_names(e)
    return names[-2:] == ["_check_value", "_check_with"] and len(names) > 2 and names[-3] in _EAGER_VALUE_CHECKS


def _raised_in(e: BaseException, path: str) -> bool:
    """Whether ``e``'s innermost frame is in ``path`` (F.embedding's own asserts: eager raises
    those AssertionErrors too)."""
    return path in (_frames(e) or [""])[-1]


# index checks that torch's meta functions and references make with torch._check (RuntimeError)
# where eager's kernels raise IndexError
_INDEX_CHECKS = ("tensors used as indices must be long, int, byte or bool tensors",
                 "should be equal to source.size(dim)",  # (index_copy's number of indices)
                 # index_copy's source of another rank than self, a scalar at several indices
                 "When source and destination are not scalars, their dimensionality must match",
                 "When source is scalar, index should have one element")
_INDEXING_OPS = ("getitem", "setitem", "aten.index", "aten.index_put", "aten._unsafe_index")
# an index of rank 2 or more: eager's IndexError in index_copy and index_add (its
# RuntimeError in index_fill, whose reference makes the same check)
_INDEX_RANK_CHECK, _INDEX_RANK_OPS = "Index should have dimension 1 or 0", ("index_copy", "index_add")


def _eager_index_error(e: BaseException, op: str) -> bool:
    """An index check eager's kernels make with an IndexError, raised by a fake tensor's meta
    function as a RuntimeError: an index tensor of another dtype, index tensors that do not
    broadcast together, index_copy's index and source of different lengths."""
    if not any(part in f for f in _frames(e) for part in (*_REFS, "/torch/_meta_registrations", "/torch/_decomp/")):
        return False
    text = str(e)
    if any(check in text for check in _INDEX_CHECKS):
        return True
    if _INDEX_RANK_CHECK in text:
        return any(op in name for name in _function_names(e) for op in _INDEX_RANK_OPS)
    return "Attempting to broadcast a dimension" in text and op.startswith(_INDEXING_OPS)


def _checked_in_refs(e: BaseException) -> bool:
    """Whether any frame of ``e`` is in torch's references (a ``torch._check`` they call)."""
    return any(part in f for f in _frames(e) for part in _REFS)


def _no_kernel_for_dtype(e: BaseException) -> bool:
    """A dtype refused by a check in torch's references (sampling integers from a normal or
    log-normal distribution) or meta functions (histc of integers: '"histogram_cpu" not
    implemented for ...', eager's dispatch macro's words), where eager has no kernel for it:
    NotImplementedError."""
    text = str(e)
    if "\" not implemented for '" in text:
        return any("/torch/_meta_registrations" in f for f in _frames(e)) or _checked_in_refs(e)
    return _checked_in_refs(e) and ("expected a floating-point or complex dtype" in text
                                    or text.startswith("log_normal not implemented"))


# the norms' and losses' functions (torch.nn.functional's, torch's references and
# decompositions) whose operands eager's kernels take only as real floating-point numbers (a
# loss's input and target promoted together), by the operands' names; the references refuse
# another dtype with a RuntimeError from an op inside them (a mean of integers, bools subtracted
# or negated). The loss's own frames come after nn.functional's, whose names differ.
_FLOAT_OPERANDS = {**dict.fromkeys(("batch_norm", "instance_norm", "group_norm", "layer_norm",
                                    "native_batch_norm_helper", "native_group_norm", "native_layer_norm",
                                    "_native_batch_norm_legit_no_training"), ("input",)),
                   **dict.fromkeys(("mse_loss", "smooth_l1_loss", "binary_cross_entropy",
                                    "binary_cross_entropy_with_logits"), ("self", "target")),
                   "huber_loss": ("input", "target"), "_log_softmax": ("x",)}
_DTYPE_REFUSALS = ("could not infer output dtype", "with two bool tensors is not supported",
                   "on a bool tensor is not supported", "does not support complex inputs")


def _float_input_without_kernel(e: BaseException) -> torch.dtype | None:
    """The dtype of a norm's or loss's operands that is not real floating-point, where torch's
    references refuse it with a RuntimeError while eager has no kernel for it
    (NotImplementedError); None for other errors (a shape check fails first in both)."""
    if not any(refusal in str(e) for refusal in _DTYPE_REFUSALS):
        return None
    for frame in traceback_frames(e):
        names = _FLOAT_OPERANDS.get(frame.f_code.co_name)
        operands = [frame.f_locals.get(n) for n in names or ()]
        if (names and "/torch/" in frame.f_code.co_filename.replace("\\", "/")
                and all(isinstance(x, torch.Tensor) for x in operands)):
            dtype = operands[0].dtype if len(operands) == 1 else torch.result_type(*operands)
            if not dtype.is_floating_point:
                return dtype
    return None


def _one_running_stat_in_training(e: BaseException) -> bool:
    """torch's decomposition of native_batch_norm refusing a running_mean without a
    running_var (or the reverse) with a RuntimeError: in training eager's kernel raises
    ValueError ("running_mean and running_var must either both be None or neither be None"); in
    evaluation its RuntimeError ("running_var must be defined in evaluation mode") is kept."""
    frames = traceback_frames(e)
    if not frames:
        return False
    raised_in = frames[-1]  # (the decomposition raises it itself)
    return (raised_in.f_code.co_name == "native_batch_norm_decomposition"
            and "/torch/_decomp/" in raised_in.f_code.co_filename.replace("\\", "/")
            and raised_in.f_locals.get("training") is True)


def _empty_reduction(e: BaseException) -> bool:
    """A reduction without identity over an empty dim it names, refused by torch's references or
    meta functions with a RuntimeError, where eager's own check raises IndexError. (Over every
    dim, ``amin()``, eager's error is a RuntimeError too: "Expected reduction dim to be
    specified"; ``argmax()``'s an IndexError.) kthvalue's meta function checks only k against
    the dim's size, where eager checks first that the dim is not empty."""
    text = str(e)
    if text.startswith("kthvalue(): selected number k out of range"):
        return any(frame.f_code.co_name == "kthvalue_meta" and frame.f_locals.get("dimSize") == 0
                   for frame in traceback_frames(e))
    if not ("zero-size dimension" in text or "Expected reduction dim" in text):
        return False
    if not any("/torch/_refs/" in f or "/torch/_meta_registrations" in f for f in _frames(e)):
        return False
    tb, caller = e.__traceback__, None
    while tb is not None:  # the refs' _reduction: did its caller (amax, amin) name dims?
        code = tb.tb_frame.f_code
        if code.co_name == "_reduction" and "/torch/_refs/" in code.co_filename.replace("\\", "/"):
            dims = caller.f_locals.get("dim", ()) if caller is not None else ()
            return dims is not None and not (isinstance(dims, (list, tuple)) and len(dims) == 0)
        caller, tb = tb.tb_frame, tb.tb_next
    return True


# scans that eager's kernels compute in no bool dtype (their dispatch macros lack it)
_NO_BOOL_SCANS = ("cumsum", "cumprod")


def _scan_to_bools(e: BaseException) -> NotImplementedError | None:
    """cumsum or cumprod with ``dtype=torch.bool`` of a tensor that requires grad: the fake
    tensor's meta function computes it and autograd then refuses the bool result (RuntimeError),
    where eager's kernel has no bool version and raises NotImplementedError first. None for
    other errors."""
    if str(e) != "Autograd not support dtype: Bool":
        return None
    for frame in traceback_frames(e):
        node = frame.f_locals.get("node") if frame.f_code.co_name == "run_node" else None
        target = getattr(node, "target", None)
        name = target if isinstance(target, str) else getattr(target, "__name__", "")
        if name.rstrip("_") in _NO_BOOL_SCANS:
            return NotImplementedError(f"{name.rstrip('_')}: no kernel for a bool result ({e})")
    return None


def _argmax_of_bools(e: BaseException) -> RuntimeError | None:
    """argmax or argmin of an empty bool tensor: the meta function checks the reduced dim's size
    first (IndexError; over every dim a RuntimeError), where eager's kernel refuses the dtype
    first, with a RuntimeError. None for other errors."""
    for x in _exception_chain(e):
        frames = traceback_frames(x)
        meta = next((f for f in frames if f.f_code.co_name == "argmax_argmin_meta"), None)
        operand = meta.f_locals.get("self") if meta is not None else None
        if isinstance(operand, torch.Tensor) and operand.dtype == torch.bool:
            # (the meta function serves both, and names both argmax: the dispatched op tells)
            ops = [f.f_locals.get("func") for f in frames]
            name = next((op.__name__.split(".")[0] for op in ops if isinstance(op, torch._ops.OpOverload)), "argmax")
            return RuntimeError(f"{name}(): does not support bool input")
    return None


def _exception_chain(e: BaseException) -> list[BaseException]:
    """Dynamo re-raises an op's error inside its own; the op's error is the innermost one.
    Past Dynamo's own exceptions only explicit causes count: an op's error raised while handling
    another (a missing meta kernel, then fake_quantize's argument check) is the op's."""
    chain: list[BaseException] = []
    while e is not None and e not in chain:
        chain.append(e)
        inside_dynamo = isinstance(e, torch._dynamo.exc.TorchDynamoException)
        e = e.__cause__ or (e.__context__ if inside_dynamo or len(chain) == 1 else None)
    return chain


def _named(error: Exception, dynamo_message: str) -> Exception:
    op = _op_from_dynamo_message(dynamo_message)
    if "<locals>" in op:  # (a wrapper's qualified name, F.max_pool2d's "boolean_dispatch.<locals>.fn")
        op = _function_run(error) or ""
    # (a message that names its op already: ember's own ops' checks, "segment_reduce: ...")
    if not op or str(error).startswith((f"{op}:", f"{op.rsplit('.', 1)[-1]}:")):
        return error
    try:
        renamed = type(error)(f"{op}: {error}")
    except Exception:  # noqa: BLE001 -- exotic exception signatures keep their own message
        return error
    return renamed.with_traceback(error.__traceback__)


def _function_run(e: BaseException) -> str | None:
    """The name of the function or method whose FX node Dynamo ran when ``e`` was raised."""
    for frame in traceback_frames(e):
        node = frame.f_locals.get("node") if frame.f_code.co_name == "run_node" else None
        target = getattr(node, "target", None)
        name = target if isinstance(target, str) else getattr(target, "__name__", None)  # (a method's: its name)
        if isinstance(name, str):
            return name
    return None


def _op_from_dynamo_message(message: str) -> str:
    # "... Dynamo failed to run FX node with fake tensors: call_function <built-in function add>(...",
    # or "call_method view(*(FakeTensor(...), 5, 3)..." for a tensor's method
    marker = next((m for m in ("call_function ", "call_method ") if m in message), None)
    if marker is None:
        return ""
    rest = message.split(marker, 1)[1]
    target = rest.split("(*", 1)[0].strip()
    if target.startswith("<built-in function ") or target.startswith("<built-in method "):
        target = target.split(" ", 2)[-1].rstrip(">").split(" of ")[0]
    elif target.startswith("<function "):
        target = target.split(" ")[1]
    return target


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
    compiled = _unwrap_errors(torch.compile(fn, backend=backend, dynamic=dynamic))
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
    return wait(timeout)
