"""The transformer under a Plan: sharded blocks as explicit steps, and :func:`run_model`."""

from __future__ import annotations
