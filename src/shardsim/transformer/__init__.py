"""The transformer under a Plan: sharded blocks as explicit steps, and :func:`run_model`.

>>> from shardsim.transformer import run_model, ModelResult
>>> run_model.__name__
'run_model'
"""

from __future__ import annotations

from .checks import ModelInputError
from .demo import walk, walk_all
from .run import ModelResult, run_model

__all__ = ["ModelInputError", "ModelResult", "run_model", "walk", "walk_all"]
