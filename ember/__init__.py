"""ember: a compiler for PyTorch programs, into fused CPU (and GPU) kernels.

    fast = ember.compile(model_or_fn)            # or torch.compile(fn, backend="ember")
    report = ember.explain(fn, *example_args)    # IR after each pass, kernels, ATen calls
    ember.stats()                                # graphs compiled, kernels built, cache hits, ...
    step = ember.cuda_graph(train_step)          # captured once per ragged capacity, replayed
"""

from . import ragged
from .api import compile, ember_backend, explain, reset_stats, stats, wait_for_kernels
from .config import Config, config
from .cudagraphs import cuda_graph
from .report import GraphReport, KernelReport, Report

__version__ = "0.1.0"

__all__ = [
    "Config", "GraphReport", "KernelReport", "Report", "compile", "config", "cuda_graph", "ember_backend",
    "explain", "ragged", "reset_stats", "stats", "wait_for_kernels",
]
