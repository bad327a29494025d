"""Graph -> Graph rewrites, and the pipeline that runs them."""

from .cse import cse
from .dce import dce
from .fold import fold_constants
from .pipeline import PIPELINE, PassRecord, run_pipeline
from .views import simplify_views

__all__ = ["PIPELINE", "PassRecord", "cse", "dce", "fold_constants", "run_pipeline", "simplify_views"]
