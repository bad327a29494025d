"""The Dynamo backend: AOTAutograd with core-ATen decompositions, one ember compile per graph.

Inference graphs, and the forward and backward graphs of training (partitioned by
``partition.py``: a scalar loss's gradient computed in the forward where that moves fewer bytes,
else AOTAutograd's min-cut rematerialization, which recomputes cheap pointwise chains in the
backward instead of saving them), all go through the same ``compile_graph`` callback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd

from ..config import Config
from .autograd_decomps import eager_decompositions
from .decompositions import decomposition_table
from .overlap import may_overlap
from .partition import partition

aten = torch.ops.aten

GraphCompiler = Callable[[torch.fx.GraphModule, Sequence[Any], str], Callable[..., Any]]


def make_backend(compile_graph: GraphCompiler, cfg: Config | None = None, wrap: Callable[..., Any] | None = None
                 ) -> Callable[[torch.fx.GraphModule, list[Any]], Any]:
    """A Dynamo backend that hands every ATen graph AOTAutograd produces to ``compile_graph``;
    ``cfg`` holds the settings the training partitioner reads. ``wrap(kind, compiler)`` may
    replace each compiler (``aot_cache.py`` makes them cacheable)."""

    def compiler(kind: str) -> Callable[[torch.fx.GraphModule, Sequence[Any]], Any]:
        fn = lambda gm, example_inputs: compile_graph(gm, example_inputs, kind)
        return wrap(kind, fn) if wrap is not None else fn

    backend = aot_autograd(
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        decompositions=decomposition_table(),
        partition_fn=functools.partial(partition, cfg=cfg),
        keep_inference_input_mutations=True,  # (the program writes them: codegen/input_writes.py)
    )

    @functools.wraps(backend)
    def trace(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        # (torch decomposes a few ops at the Autograd key, before the table above is read)
        with eager_decompositions(cpu_embedding_bag=cfg is not None and cfg.cpu_embedding_bag), \
                _scalars_read_from_tensors(gm), _tangents_contiguous_where_outputs_overlap(gm):
            return backend(gm, example_inputs)

    return trace


@contextlib.contextmanager
def _tangents_contiguous_where_outputs_overlap(gm: torch.fx.GraphModule | torch.nn.Module) -> Any:
    """While AOTAutograd traces ``gm``, trace the tangents in the outputs' memory formats
    (contiguous, channels_last), not in their strides, where an output's elements may share memory
    (``x.unfold(0, 2, 1)``: strides (1, 1)). torch gives an output's tangent the output's
    strides unless the output surely overlaps itself (``_debug_has_internal_overlap`` says yes,
    not "too hard to tell"), and at run time copies the incoming gradient into a tensor of those
    strides: elements sharing memory kept one of their values, and the gradient came back wrong
    (under aot_eager and Inductor too). Outputs of symbolic strides as well: a dynamic graph's
    windows along dim 0 of a (n, 33, 1) tensor, strides (33, 1, 1, 33), got their tangent so."""
    from torch._functorch import config as functorch_config

    outputs = gm.graph.find_nodes(op="output") if isinstance(gm, torch.fx.GraphModule) else ()
    values = [a.meta.get("example_value") for node in outputs for a in node.all_input_nodes]
    strided = [v for v in values if isinstance(v, torch.Tensor) and v.layout == torch.strided]
    if not hasattr(functorch_config, "guess_tangent_strides_as_outputs") or not any(map(may_overlap, strided)):
        yield
        return
    with functorch_config.patch(guess_tangent_strides_as_outputs=False):
        yield


# Ops Dynamo records with a 0-d tensor where the op takes an int, which the op reads with
# .item(): narrow's start (x.narrow(dim, t, n) with t a tensor).
_READ_AS_SCALARS = {torch.narrow: 2, torch.Tensor.narrow: 2, "narrow": 2}


@contextlib.contextmanager
def _scalars_read_from_tensors(gm: torch.fx.GraphModule | torch.nn.Module) -> Any:
    """While AOTAutograd traces ``gm``, let an op read a tensor's value as a size (an unbacked
    symbol, which the program binds from the tensor when it runs: one sync, as eager's op
    makes) where ``gm`` calls such an op with a tensor. Fake tensors refuse ``.item()``
    otherwise, and the whole graph ran eagerly. Only then: Dynamo's own ``.item()`` calls keep
    their graph breaks (``capture_scalar_outputs`` decides those)."""
    nodes = gm.graph.nodes if isinstance(gm, torch.fx.GraphModule) else ()  # (or a module AOTAutograd traces)
    env = _dynamo_shape_env() if any(_reads_a_tensor_as_scalar(n) for n in nodes) else None
    settings = getattr(env, "settings", None)  # (frozen: fake tensors' dispatch cache keys read it)
    if settings is None or settings.allow_scalar_outputs:
        yield
        return
    env.settings = dataclasses.replace(settings, allow_scalar_outputs=True)
    try:
        yield
    finally:
        env.settings = settings


def _reads_a_tensor_as_scalar(node: torch.fx.Node) -> bool:
    at = _READ_AS_SCALARS.get(node.target) if node.op in ("call_function", "call_method") else None
    if at is None:
        return False
    arg = node.args[at] if len(node.args) > at else node.kwargs.get("start")
    return isinstance(arg, torch.fx.Node) and isinstance(arg.meta.get("example_value"), torch.Tensor)


def _dynamo_shape_env() -> Any:
    context = torch._guards.TracingContext.try_get()
    fake_mode = getattr(context, "fake_mode", None)
    return getattr(fake_mode, "shape_env", None)


def donated_inputs(gm: torch.fx.GraphModule) -> frozenset[int]:
    """Placeholder indices of a backward graph whose memory nothing outside it can see: the saved
    tensors AOTAutograd calls donated buffers (not aliases of the forward's inputs or outputs, or
    of the gradients it returns), minus any that share storage with another input. Empty outside
    an AOTAutograd backward compile, or with ``torch._functorch.config.donated_buffer`` off."""
    from torch._functorch import config as functorch_config
    from torch.multiprocessing.reductions import StorageWeakRef

    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None) if context is not None else None
    indices = getattr(meta, "bw_donated_idxs", None)
    if not indices or not functorch_config.donated_buffer:
        return frozenset()
    placeholders = gm.graph.find_nodes(op="placeholder")
    storages: dict[Any, int] = {}
    for node in placeholders:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and not val.is_sparse:
            ref = StorageWeakRef(val.untyped_storage())
            storages[ref] = storages.get(ref, 0) + 1
    out = set()
    for i in indices:
        val = placeholders[i].meta.get("val") if 0 <= i < len(placeholders) else None
        if isinstance(val, torch.Tensor) and not val.is_sparse and storages[StorageWeakRef(val.untyped_storage())] == 1:
            out.add(i)
    return frozenset(out)
