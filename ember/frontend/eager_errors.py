"""An op's error raised while Dynamo traces a user's function, re-raised as eager raises it.

Dynamo reports an op's error (wrong shapes, dtypes, devices) as its own TorchRuntimeError, and
torch's Python decompositions and meta functions check some things in another order or with
another exception type than eager's kernels. ``unwrap_errors`` wraps a compiled function so that
its caller gets eager's exception type, with the op named in the message; the rest of this module
recognizes each known difference by where in torch the error was raised.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from .dtype_refusals import eager_kernel_refusal, traceback_frames


def unwrap_errors(compiled: Callable[..., Any]) -> Callable[..., Any]:
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
            elif type(original) in (RuntimeError, IndexError) and (refusal := _argmax_of_bools(original)):
                # (torch 2.11's Dynamo wraps the meta function's IndexError; 2.13's lets it through)
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
