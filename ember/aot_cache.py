"""Compiled graphs in torch's AOTAutograd cache, so that a warm start skips AOTAutograd.

Without this, a fresh compile of a program ember compiled before (after ``torch._dynamo.reset()``
or in a new process) traces and partitions it with AOTAutograd again, which costs more than
ember's own work. Torch caches AOTAutograd's result on disk for backends whose compilers return
an ``OutputCode`` that pickles ("bundled" entries, the mechanism of ``aot_eager`` and regional
Inductor); on a hit it rebuilds the runtime wrappers around the unpickled forward and backward.

ember's ``OutputCode`` pickles the graph's *plan*: its IR graph and schedule, the input to
kernel building. A hit rebuilds the program from the plan (kernels load from ember's disk cache)
without lowering, passes or planning. What never enters the cache: graphs ember could not compile,
graphs with tensor constants (their values are in no cache key), plans that do not pickle; these
are compiled as before (torch counts a bypass), never an error. A cached entry that fails to load
is a miss.

Cache keys are torch's (the Dynamo graph, input metadata, torch and AOTAutograd settings, the
deterministic-algorithms flag) plus a tag of ember's own: its source, the ``Config`` repr (the
target backend included) and whether Triton is interpreted. Entries never mix with Inductor's:
the tag and the bundled flag are part of every ember key and of no Inductor key. The tag, the
bundled flag and an eager backward compile are torch settings patched for the duration of one
AOTAutograd call: the backward is compiled with the forward (as torch does for dynamic shapes)
because torch saves the entry when the backward is compiled, and only inside that call are the
settings ours.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import io
import os
import pickle
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake
from torch.fx.experimental.symbolic_shapes import guard_scalar, is_concrete_float

from . import driver
from .config import SOURCE_DIGEST, Config
from .frontend.dynamo import GraphCompiler, make_backend
from .frontend.lowering import storage_of
from .runtime import capture
from .runtime.choice import TimedChoice
from .runtime.program import CompiledProgram, boxed, eager_for_batched_calls, tangent_positions

try:  # private torch API: without it (or any piece below), ember compiles as it did before
    from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache
    from torch._functorch.aot_autograd import SerializableAOTDispatchCompiler
    from torch._inductor.output_code import OutputCode
except ImportError:  # pragma: no cover - depends on the torch version
    BypassAOTAutogradCache = SerializableAOTDispatchCompiler = None
    OutputCode = object

Backend = Callable[[torch.fx.GraphModule, list[Any]], Any]


def _supported() -> bool:
    """Whether this torch has every piece the cache needs (bundled entries, eager backward
    lowering, a cache-key tag)."""
    return (SerializableAOTDispatchCompiler is not None
            and all(hasattr(torch._functorch.config, name) for name in
                    ("bundled_autograd_cache", "force_non_lazy_backward_lowering", "enable_autograd_cache"))
            and hasattr(torch.compiler.config, "cache_key_tag"))


SUPPORTED = _supported()


def cached_backend(compile_graph: GraphCompiler, cfg: Config) -> Backend:
    """The Dynamo backend of ``make_backend``, with compiled graphs kept in torch's AOTAutograd
    cache where this torch supports it and nothing turns it off."""
    plain = make_backend(compile_graph, cfg)
    if not (SUPPORTED and cfg.aot_cache and cfg.debug < 2):
        return plain

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        scalars = _scalar_values(gm, example_inputs)
        if not _torch_caches_on() or scalars is None:
            return plain(gm, example_inputs)
        # a fresh AOTAutograd per graph: it wraps the backward compiler it is given in place
        made: list[EmberOutputCode] = []
        floats = _scalar_floats(gm)
        aot = make_backend(compile_graph, cfg,
                           wrap=functools.partial(_serializable, cfg=cfg, made=made, floats=floats))
        baked: set[int] = set()  # (filled by the entries a hit loads)
        loading, loaded_baked = _loading_cfg.set(cfg), _loaded_baked.set(baked)
        try:
            with _settings(cache_tag(cfg) + _aliasing(example_inputs) + scalars):
                compiled = aot(gm, example_inputs)
        finally:
            _loading_cfg.reset(loading)
            _loaded_baked.reset(loaded_baked)
        # A float the entry's graph holds as a constant: guard on its value, as compiling it did.
        # Torch's entry restores the guards of sizes only: the entry compiled for a == 1.5 served
        # a == 2.5 in a later process (the key holds the value, the guards did not).
        for i, value in floats:
            if i in baked:
                guard_scalar(value)
        # the entry is saved by now (the backward was compiled with the forward), or never will
        # be: the IR need not stay alive with the program
        for code in made:
            code._plan = code._eager = None
        return compiled

    return backend


# The inputs (Dynamo's placeholder positions) whose float values the entries that the compile under
# way loaded hold as constants (EmberOutputCode._baked).
_loaded_baked: contextvars.ContextVar[set[int] | None] = contextvars.ContextVar("ember_loaded_baked", default=None)

# The configuration of the compile under way. An entry holds the settings it was compiled with,
# which equal these but for the cache directory (not in the tag): a hit builds its kernels in this
# compile's directory, never in the one of the process that saved the entry.
_loading_cfg: contextvars.ContextVar[Config | None] = contextvars.ContextVar("ember_loading_cfg", default=None)


def _torch_caches_on() -> bool:
    # where torch would bypass its cache anyway, keep the lazy backward compile of today
    return bool(torch._functorch.config.enable_autograd_cache
                and not getattr(torch.compiler.config, "force_disable_caches", False)
                and getattr(torch._inductor.config, "fx_graph_cache", True))


@contextlib.contextmanager
def _settings(tag: str) -> Iterator[None]:
    user_tag = torch.compiler.config.cache_key_tag
    with torch._functorch.config.patch(bundled_autograd_cache=True, force_non_lazy_backward_lowering=True), \
            torch.compiler.config.patch(cache_key_tag=f"{user_tag}|{tag}" if user_tag else tag):
        yield


def cache_tag(cfg: Config) -> str:
    """What of ember decides a compiled graph, beyond what torch's key holds already. Not the
    cache directory: a plan rebuilds its kernels from whichever one it runs with, so a cache
    copied or restored elsewhere (another $HOME, a CI cache) still hits."""
    settings = repr(dataclasses.replace(cfg, cache_dir=Path()))
    parts = (_SOURCE_DIGEST, settings, os.environ.get("TRITON_INTERPRET", "0"),
             str(torch.are_deterministic_algorithms_enabled()),
             str(torch.is_deterministic_algorithms_warn_only_enabled()))
    return "ember-" + hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _aliasing(example_inputs: Sequence[Any]) -> str:
    """Which inputs share memory, and how: AOTAutograd compiles inputs that alias each other
    differently (one storage, written once), and torch's cache key leaves it out, so a plan
    compiled for ``f(x, x)`` was loaded for ``f(x, y)``, and one for ``f(x, y)`` for ``f(x, x)``:
    wrong values, or a crash. Empty where nothing aliases (the common case keeps its key)."""
    first: dict[Any, int] = {}
    shared = []
    for i, x in enumerate(example_inputs):
        if not isinstance(x, torch.Tensor) or x.is_sparse:
            continue
        j = first.setdefault(storage_of(x), i)
        if j != i:
            shared.append((j, i))
    if not shared:
        return ""
    layout = {i: (example_inputs[i].storage_offset(), tuple(example_inputs[i].stride()))
              for pair in shared for i in pair}
    return "|aliasing:" + hashlib.sha256(repr((shared, sorted(layout.items()))).encode()).hexdigest()[:16]


def _scalar_values(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str | None:
    """The values of the Python numbers Dynamo passes as 0-d tensors (a float argument that
    changed between calls). AOTAutograd bakes such a value into the graph where an op takes it
    as a number (``torch.full((2,), a)``, ``clamp(max=a)``), and Dynamo recompiles for each new
    value, but torch's key holds only the tensor's metadata: the plan compiled for the first
    value was loaded for every later one. Empty where there are none; None where a value cannot
    be read (a fake tensor): that graph is not cached."""
    values = []
    for i, node in enumerate(gm.graph.find_nodes(op="placeholder")):
        arg = node.meta.get("grapharg")
        x = example_inputs[i] if i < len(example_inputs) else None
        if getattr(arg, "pass_arg_as_tensor", False) and isinstance(x, torch.Tensor) and x.dim() == 0:
            if is_fake(x):
                return None
            values.append((i, repr(x.item())))  # (repr tells -0.0 from 0.0)
    return "|scalars:" + hashlib.sha256(repr(values).encode()).hexdigest()[:16] if values else ""


def _scalar_floats(gm: torch.fx.GraphModule) -> list[tuple[int, torch.SymFloat]]:
    """The symbolic values (Dynamo's ``item()`` of each) of the float arguments Dynamo passes as
    0-d tensors, with their placeholder positions."""
    found = []
    for i, node in enumerate(gm.graph.find_nodes(op="placeholder")):
        if not getattr(node.meta.get("grapharg"), "pass_arg_as_tensor", False):
            continue
        for user in node.users:
            value = user.meta.get("example_value")
            if user.op == "call_method" and user.target == "item" and isinstance(value, torch.SymFloat):
                found.append((i, value))
    return found


# (a module global of its own, which tests replace)
_SOURCE_DIGEST = SOURCE_DIGEST


def _serializable(kind: str, compile_fn: Callable[[torch.fx.GraphModule, Sequence[Any]], Any],
                  cfg: Config, made: list[EmberOutputCode], floats: Sequence[tuple[int, torch.SymFloat]] = ()) -> Any:
    def compile_and_wrap(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> EmberOutputCode:
        start = time.perf_counter_ns()
        program = compile_fn(gm, example_inputs)
        # the floats this graph holds as constants (AOTAutograd specialized them, guarding on
        # their values): a hit must guard on them too
        baked = tuple(i for i, value in floats if is_concrete_float(value))
        if kind == "backward":
            _no_donated_buffers()
        plan = None
        if isinstance(program, (CompiledProgram, TimedChoice)):
            plan, program.plan = program.plan, None
        made.append(EmberOutputCode(program, kind, cfg, plan, time.perf_counter_ns() - start, baked,
                                    eager=gm if kind == "backward" else None))
        return made[-1]
    return SerializableAOTDispatchCompiler(EmberOutputCode, compile_and_wrap)


def _no_donated_buffers() -> None:
    """Tell AOTAutograd that ember's backward takes over none of the forward's saved buffers
    (it never writes into its inputs). AOTAutograd forbids ``backward(retain_graph=True)`` for a
    backward compiled with donated buffers; compiled lazily it drops them itself, but a backward
    compiled with the forward (as here) would keep them, in the cache entry too. Backends read
    the list at the same place (Inductor's ``get_donated_idxs``)."""
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    if getattr(meta, "bw_donated_idxs", None):
        meta.bw_donated_idxs = []


class EmberOutputCode(OutputCode):
    """A compiled graph as torch's AOTAutograd cache holds it: at run time the ember program, on
    disk the plan it was built from. Called in AOTAutograd's boxed convention."""

    def __init__(self, program: Callable[..., Any], kind: str, cfg: Config,
                 plan: tuple[Any, Any] | list[tuple[Any, Any]] | None, time_taken_ns: int,
                 baked: tuple[int, ...] = (), eager: torch.fx.GraphModule | None = None):
        self._boxed_call = True
        # a backward's ATen graph, which a hit's program runs for vmap's batched gradients
        # (runtime/program.py eager_for_batched_calls), as the compiled one does
        self._eager = eager
        self._tangents = tangent_positions(eager) if eager is not None else ()
        self._baked = baked  # (_scalar_floats' positions, of the floats held as constants)
        self._kind = kind
        self._cfg = cfg
        # (IR graph, schedule), a list of them for a timed choice; None: this graph is not cached
        self._plan = plan
        self._plan_bytes: bytes | None = None
        # a timed choice's graph fingerprint: the key of its choices saved on disk (runtime/choice.py)
        self._fingerprint: str | None = getattr(program, "fingerprint", None)
        # torch adds these up on a cache hit (the compile time the hit saved)
        self._time_taken_ns = time_taken_ns
        self._set_program(program)

    def _set_program(self, program: Callable[..., Any] | None) -> None:
        self._program = program
        # AOTAutograd calls with the argument list; a CompiledProgram's own __call__ also takes
        # the arguments spread out, one frame more
        self._run = program.run if isinstance(program, (CompiledProgram, TimedChoice)) else program

    def __call__(self, *args: Any) -> Any:
        if len(args) == 1 and type(args[0]) is list and not capture.active:
            return self._run(args[0])
        return self._program(*args)

    # --- torch's OutputCode protocol -------------------------------------------------------

    def prepare_for_serialization(self) -> None:
        """Runs on a copy, right before torch pickles the entry."""
        self._plan_bytes = self._pickled_plan()
        self._eager = self._pickled_eager()
        self._plan = None
        self._set_program(None)

    def _pickled_plan(self) -> bytes:
        if self._plan_bytes is not None:
            return self._plan_bytes
        if self._plan is None:
            raise BypassAOTAutogradCache("ember: this graph is not cached (it runs through ATen, "
                                         "or holds tensor constants)")
        try:
            return _dump_plan(self._plan)
        except Exception as e:  # noqa: BLE001 -- whatever does not pickle is simply not cached
            raise BypassAOTAutogradCache(f"ember: the plan does not pickle ({type(e).__name__}: {e})") from e

    def _pickled_eager(self) -> bytes | None:
        if self._eager is None or isinstance(self._eager, bytes):
            return self._eager
        try:
            return pickle.dumps(self._eager)
        except Exception as e:  # noqa: BLE001 -- a hit without it would crash on batched gradients
            raise BypassAOTAutogradCache(f"ember: the backward's ATen graph does not pickle "
                                         f"({type(e).__name__}: {e})") from e

    def post_compile(self, example_inputs: Sequence[Any], constants: Any, graph_kwargs: Any) -> None:
        """On a cache hit: build the program from the plan. Any failure propagates, and torch
        then compiles the graph afresh."""
        if self._program is None:
            self._cfg = _loading_cfg.get() or self._cfg
            program = driver.rebuild(_load_plan(self._plan_bytes), self._kind, self._cfg, self._fingerprint)
            if isinstance(self._eager, bytes):  # (unpickled at the first batched call only)
                data = self._eager
                eager_for_batched_calls(program, lambda: boxed(pickle.loads(data)), self._tangents)
            self._set_program(program)
            baked = _loaded_baked.get()
            if baked is not None:
                baked.update(self._baked)

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        pass  # ember's Triton kernels live in its own cache directory

    # --- pickling: the plan, never the built program --------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        return {"kind": self._kind, "cfg": self._cfg, "plan": self._pickled_plan(), "ns": self._time_taken_ns,
                "baked": self._baked, "eager": self._pickled_eager(), "tangents": self._tangents,
                "fingerprint": self._fingerprint}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._boxed_call = True
        self._kind, self._cfg, self._plan_bytes = state["kind"], state["cfg"], state["plan"]
        self._time_taken_ns = state["ns"]
        self._baked = state.get("baked", ())
        self._eager = state.get("eager")  # (pickled)
        self._tangents = state.get("tangents", ())
        self._fingerprint = state.get("fingerprint")
        self._plan = None
        self._set_program(None)

    def __copy__(self) -> EmberOutputCode:
        # torch copies the entry before prepare_for_serialization: a shallow copy that keeps
        # the plan (the default copy would go through __getstate__)
        other = EmberOutputCode.__new__(EmberOutputCode)
        other.__dict__.update(self.__dict__)
        return other

    # OutputCode is a dataclass: identity, not field-wise equality (the fields hold programs)
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"<EmberOutputCode {self._kind} {'built' if self._program is not None else 'not built'}>"

    @property
    def _fx_graph_cache_key(self) -> str:
        # An Inductor (FX graph cache) entry has this key; ember's never does. Torch saves
        # un-bundled entries for compiled graphs that carry one, so hiding the attribute keeps
        # ember's graphs out of that path, whatever the torch version checks (hasattr or None).
        raise AttributeError("_fx_graph_cache_key")


class _PlanPickler(pickle.Pickler):
    """Pickles ATen operators (the targets of ATen calls in a plan) by name."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch._ops.OpOverload):
            namespace, name = obj._schema.name.split("::")
            return _operator, (namespace, name, obj._overloadname)
        if isinstance(obj, torch._ops.OpOverloadPacket):
            namespace, name = obj._qualified_op_name.split("::")
            return _operator, (namespace, name, None)
        return NotImplemented


def _operator(namespace: str, name: str, overload: str | None) -> Any:
    packet = getattr(getattr(torch.ops, namespace), name)
    return packet if overload is None else getattr(packet, overload)


def _dump_plan(plan: tuple[Any, Any] | list[tuple[Any, Any]]) -> bytes:
    with io.BytesIO() as stream:
        _PlanPickler(stream, protocol=pickle.HIGHEST_PROTOCOL).dump(plan)
        return stream.getvalue()


def _load_plan(data: bytes | None) -> tuple[Any, Any] | list[tuple[Any, Any]]:
    if data is None:
        raise RuntimeError("ember: cache entry without a plan")
    return pickle.loads(data)
