"""One Dynamo frame per module class for compiled ``torch.nn`` modules.

torch's compiled module calls a ``torch.nn`` module (``Sequential``, ``Linear``, ``LSTM``...)
through an extra frame, ``external_utils.wrap_inline``'s ``inner``, because Dynamo skips frames
in ``torch/nn``. Every such module in the process shares that one code object, and Dynamo keeps
its compiled frames, its recompile limit and its "skip this code" mark on the code object. So
compiling an ``nn.LSTM`` (a frame Dynamo refuses and marks skipped) made every ``torch.nn``
module compiled after it in the process run eagerly, silently; and after eight different ones
(the recompile limit) the rest ran eagerly too. A user's own module class has its own
``forward`` code and none of that; this gives each ``torch.nn`` class the same: a copy of
``inner``'s code per class, so instances of one class still share their compiled frames.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from torch._dynamo import external_utils

_SHARED_CODE = external_utils.wrap_inline(len).__code__
_CODE_PER_CLASS: weakref.WeakKeyDictionary[type, Any] = weakref.WeakKeyDictionary()


def own_frame_per_class(forward: Callable[..., Any], module_class: type) -> None:
    """Give the ``wrap_inline`` frame under ``forward`` (a compiled module's, followed through
    ``__wrapped__``) the code object of ``module_class``, if it has one."""
    fn: Any = forward
    for _ in range(8):  # (a chain of wrappers: Dynamo's context's, wrap_inline's)
        if fn is None:
            return
        if getattr(fn, "__code__", None) is _SHARED_CODE:
            code = _CODE_PER_CLASS.get(module_class)
            if code is None:
                # (replace() makes a new code object even with nothing changed; the name shows
                # in Dynamo's logs and recompile messages)
                code = _CODE_PER_CLASS[module_class] = _SHARED_CODE.replace(
                    co_name=f"{module_class.__name__}_forward")
            fn.__code__ = code
            return
        fn = getattr(fn, "__wrapped__", None)
