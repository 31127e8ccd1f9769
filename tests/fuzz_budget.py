"""How many examples the fuzz and the reliability property tests run.

CI runs a fixed (derandomized), bounded set; ``SHARDSIM_FUZZ_SCALE=100`` runs 100 times as
many, freshly drawn, for a long campaign by hand.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

SCALE = int(os.environ.get("SHARDSIM_FUZZ_SCALE", "1"))


def budget(n: int) -> settings:
    """Settings for ``n`` examples times the campaign scale."""
    return settings(
        max_examples=n * SCALE,
        deadline=None,
        derandomize=SCALE == 1,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )
