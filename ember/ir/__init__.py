"""ember's IR: one node type, an op enum, symbolic shapes, a printer and a verifier."""

from . import dtypes, shapes
from .builder import GraphBuilder, structurally_equal
from .node import (
    ArgRef,
    ExternCall,
    Graph,
    InputSpec,
    IRError,
    Node,
    TensorConst,
    make,
    rewrite,
    toposort,
)
from .ops import Op
from .printer import format_graph
from .verify import VerifyError, verify

__all__ = [
    "ArgRef", "ExternCall", "Graph", "GraphBuilder", "IRError", "InputSpec", "Node", "Op", "TensorConst",
    "VerifyError", "dtypes", "format_graph", "make", "rewrite", "shapes", "structurally_equal", "toposort", "verify",
]
