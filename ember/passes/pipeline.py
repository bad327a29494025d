"""The middle-end: a flat, named list of Graph -> Graph passes, run top to bottom.

Each pass is a pure function. With EMBER_DEBUG set the verifier runs after every pass, and
``run_pipeline`` can record the IR after each one (``ember.explain`` shows them in order).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from ..config import Config, config, log
from ..ir.node import Graph
from ..ir.verify import verify
from .chunks import CHUNKS_PER_SM, CHUNKS_PER_SM_ONE_SUM, CUDA_CHUNKS_PER_SM, chunk_column_sums
from .cse import cse
from .dce import dce
from .erf import one_plus_erf
from .fold import fold_constants
from .masks import mask_multiplies
from .matmul import fold_matmul_adds, matmul_epilogues
from .onehot import one_hot_sums
from .ragged import ragged_writes_as_gathers
from .scans import padded_scans, reversed_scans
from .softmax import softmax_reciprocals
from .views import simplify_views

Pass = Callable[[Graph], Graph]

PIPELINE: list[tuple[str, Pass]] = [
    ("dce", dce),
    ("fold_constants", fold_constants),
    ("simplify_views", simplify_views),
    ("ragged_writes_as_gathers", ragged_writes_as_gathers),
    ("cse", cse),
    ("one_plus_erf", one_plus_erf),
    ("softmax_reciprocals", softmax_reciprocals),
    ("reversed_scans", reversed_scans),
    ("padded_scans", padded_scans),
    ("one_hot_sums", one_hot_sums),
    ("matmul_epilogues", matmul_epilogues),
    ("fold_matmul_adds", fold_matmul_adds),
    ("chunk_column_sums", chunk_column_sums),
    ("dce_final", dce),
]

# With the ``skip_masked`` option: products with 0/1 masks become selects, so kernels skip the
# masked-out elements (masks.py); CSE again, as the rewrite derives conditions afresh.
MASKED_PIPELINE: list[tuple[str, Pass]] = [
    *PIPELINE[:-2],
    ("mask_multiplies", mask_multiplies),
    ("cse_masks", cse),
    *PIPELINE[-2:],
]


PASS_NAMES = tuple(dict.fromkeys(name for name, _ in MASKED_PIPELINE))


def check_pass_names(names: tuple[str, ...], setting: str) -> None:
    """ValueError naming the passes when ``names`` (option or variable ``setting``) has others."""
    unknown = [n for n in names if n not in PASS_NAMES]
    if unknown:
        raise ValueError(f"{setting}: no pass named {unknown}; the passes are {list(PASS_NAMES)}")


def pipeline_for(cfg: Config) -> list[tuple[str, Pass]]:
    passes = MASKED_PIPELINE if cfg.skip_masked else PIPELINE
    check_pass_names(cfg.passes_off, "EMBER_PASSES_OFF")
    cuda = (cfg.target or cfg.gpu_backend) == "cuda"
    chunked = functools.partial(chunk_column_sums, chunks=cfg.row_chunks,
                                per_sm=CUDA_CHUNKS_PER_SM if cuda else CHUNKS_PER_SM, target=cfg.target,
                                per_sm_one_sum=None if cuda else CHUNKS_PER_SM_ONE_SUM)
    epilogues = functools.partial(matmul_epilogues, target=cfg.target, gpu_backend=cfg.gpu_backend,
                                  mode=cfg.matmul_epilogues)
    folds = functools.partial(fold_matmul_adds, target=cfg.target, gpu_backend=cfg.gpu_backend)
    reciprocals = functools.partial(softmax_reciprocals, target=cfg.target)
    chosen = {chunk_column_sums: chunked, matmul_epilogues: epilogues, fold_matmul_adds: folds,
              softmax_reciprocals: reciprocals}
    return [(name, chosen.get(fn, fn)) for name, fn in passes
            if (fn is not matmul_epilogues or cfg.matmul_epilogues != "off") and name not in cfg.passes_off]


class PassRecord:
    """A pass's name, time, node count, and the IR it left (``ir``, printed when first read:
    printing a graph's symbolic shapes costs more than most passes, and a report that keeps
    every pass's IR is rarely read in full)."""

    def __init__(self, name: str, graph: Graph, ms: float, nodes: int):
        self.name, self.ms, self.nodes = name, ms, nodes
        self._graph: Graph | None = graph  # (passes never edit a graph: it prints the same later)
        self._ir = ""

    @property
    def ir(self) -> str:
        if self._graph is not None:
            self._ir, self._graph = str(self._graph), None
        return self._ir

    def __repr__(self) -> str:
        return f"PassRecord({self.name!r}, {self.nodes} nodes, {self.ms:.2f} ms)"


def run_pipeline(graph: Graph, cfg: Config | None = None, record: list[PassRecord] | None = None,
                 passes: list[tuple[str, Pass]] | None = None) -> Graph:
    cfg = cfg or config
    if record is not None:
        record.append(PassRecord("frontend", graph, 0.0, len(graph.nodes)))
    for name, fn in passes or pipeline_for(cfg):
        start = time.perf_counter()
        graph = fn(graph)
        ms = (time.perf_counter() - start) * 1e3
        if cfg.verifying:
            verify(graph, after=name)
        if record is not None:
            record.append(PassRecord(name, graph, ms, len(graph.nodes)))
        if cfg.debug >= 2:
            log(2, f"after {name} ({ms:.2f} ms, {len(graph.nodes)} nodes):\n{graph}", cfg)
    return graph
