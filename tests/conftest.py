"""Shared test set-up: hypothesis profiles, and the tests and tools folders on ``sys.path``.

pytest runs with ``--import-mode=importlib``, which does not put the tests folder on the path,
so the shared strategies (``strategies_core``) are made importable here, and so are the
maintainer's tools of the repository's ``tools`` folder (``support_matrix``).

Every test runs with the objects alive before it frozen (:func:`gc.freeze`): a test that calls
:func:`gc.collect` to see its values freed (the memory ledger's tests, the trainers' peaks)
then scans only the objects it made, not the whole session's heap, whose size grows with the
tests run before it (a collection over the full heap took seconds late in the suite). Nothing
is lost: the frozen objects are handed back to the collector when the test ends.

Profiles: ``ci`` (default) keeps the property tests bounded and derandomized, so the suite
stays fast on two cores and gives the same verdict on every run; ``dev`` runs many more,
random examples. Choose with ``HYPOTHESIS_PROFILE=dev pytest ...``.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "tools"))

settings.register_profile(
    "ci",
    max_examples=30,
    derandomize=True,  # the same examples on every run: CI is reproducible; the dev profile explores
    deadline=None,  # first calls pay NumPy/BLAS warm-up; timing is not what these tests check
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("dev", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _young_heap() -> Iterator[None]:
    """The session's objects frozen for one test, so its ``gc.collect()`` scans what it made."""
    gc.freeze()
    yield
    gc.unfreeze()
