"""How a step's time splits: exposed communication never more than the communication, the
rest of the idle time the pipeline's bubble, and the words saying what the fields hold.

For every registered scheme, a few sizes and both efficiency modes, on the chips the totals
describe: ``comm_exposed_s <= comm_s``, ``comm_hidden_s + comm_exposed_s == comm_s``,
``compute_s + comm_exposed_s + bubble_s == step_s``, and the summary prints those fields.

The pipeline case is held to its schedule worked by hand. ``pp`` on ``Mesh(Z=4)`` with
``batch=32768``, ``D=4096``, ``F=16384``, 8 layers: 2 layers a stage, the per-chip batch the
whole 32768 rows cut into the default 8 microbatches of ``b = 4096`` (the largest divisor not
above twice the stages), under 1F1B (p = 4, m = 8). At the ideal rates on the H100 (the
preset's bf16 peak 990e12 FLOP/s; NVLink 450 GB/s a direction):

- a stage's forward of one microbatch is 2 layers x 2 matmuls of ``2 b D F`` FLOPs,
  ``t_f = 4 · 2bDF / 990e12``, its backward twice that, ``t_b = 2 t_f``;
- a send between stages (``ppermute``) moves ``b x D`` bf16, ``c = 2 b D / 450e9`` (no latency
  term at the ideal rates).

Without sends, 1F1B's step is ``(m + p - 1)(t_f + t_b)`` and each stage idles ``(p - 1)(t_f +
t_b)``, the bubble fraction ``(p - 1)/(m + p - 1) = 3/11``. With them, the longest chain of
dependent work is microbatch 0 forward through the four stages and its gradient back (6
sends), stage 0's next forward (microbatch 4) out to stage 2 and microbatch 3's gradient back
(4 sends), then microbatch 7 forward through all stages and back (6 sends): 11 forwards and 11
backwards on it, and 16 sends, so ``step = 11 (t_f + t_b) + 16 c``. Every stage computes
``8 (t_f + t_b)``, so each is idle ``3 (t_f + t_b) + 16 c``: its bubble plus its exposed sends.
Stage Z1 (a busiest stage, with the most sends) sends 8 activations and 8 gradients, ``16 c``.
"""

from __future__ import annotations

import pytest

from shardsim import Mesh, strategies
from shardsim.cost import estimate
from shardsim.cost.critical import ROLE_DEFAULTS
from shardsim.strategies.plans import min_layers

SIZES = [(2048, 512, 2048, 1), (32768, 4096, 16384, 2)]  # batch, d_model, d_ff, layers per stage


def mesh_of(scheme: str) -> Mesh:
    """Two chips on each of the scheme's mesh axes (four for a scheme with one)."""
    roles = strategies.get(scheme).roles
    return Mesh({ROLE_DEFAULTS[r]: 2 if len(roles) > 1 else 4 for r in roles})


def close(a: float, b: float, step: float) -> bool:
    return abs(a - b) <= 1e-9 * step


@pytest.mark.parametrize("efficiency", ["ideal", "calibrated"])
@pytest.mark.parametrize(("batch", "d_model", "d_ff", "layers"), SIZES)
@pytest.mark.parametrize("scheme", strategies.names())
def test_the_step_splits_into_compute_exposed_comm_and_bubble(
    scheme: str, batch: int, d_model: int, d_ff: int, layers: int, efficiency: str
) -> None:
    mesh = mesh_of(scheme)
    layers = layers * min_layers(scheme, mesh)  # a layer per stage (and chunk) at least
    e = estimate(scheme, mesh, "h100", batch, d_model, d_ff, layers, efficiency=efficiency)
    step = e.step_s
    assert 0.0 <= e.comm_exposed_s <= e.comm_s + 1e-12 * step
    assert close(e.comm_hidden_s + e.comm_exposed_s, e.comm_s, step)
    assert close(e.compute_s + e.comm_exposed_s + e.bubble_s, step, step)
    parts = e.timeline.comm_parts()
    assert close(sum(parts.values()), e.comm_s, step)
    assert parts["exposed"] == pytest.approx(e.comm_exposed_s, abs=1e-9 * step)
    pipelined = scheme in ("pp", "pp_interleaved", "dp_pp", "dp_pp_tp")
    assert (e.bubble_s > 0.01 * step) == pipelined  # only a pipeline idles with nothing to wait on
    if not pipelined:
        assert e.bubble_s <= 1e-9 * step
    for t in e.timeline.per_chips():  # every stage's own figures obey the same sums
        assert t.exposed_s <= t.comm_s + 1e-12 * step
        assert close(t.compute_s + t.exposed_s + t.bubble_s, step, step)
    words = e.comm_words()
    assert f"exposed {ms(e.comm_exposed_s)}" in words and f"comm {ms(e.comm_s)} ms" in words
    assert (f"bubble {ms(e.bubble_s)} ms" in words) == pipelined


def ms(seconds: float) -> str:
    from shardsim.cost.numbers import ms as fmt

    return fmt(seconds)


def test_the_pipeline_bubble_against_the_hand_worked_1f1b_schedule() -> None:
    p, m, b, d, f = 4, 8, 32768 // 8, 4096, 16384
    e = estimate("pp", Mesh(Z=4), "h100", batch=32768, d_model=d, d_ff=f, layers=8, efficiency="ideal")
    t_f = 4 * 2 * b * d * f / 990e12
    t_b = 2 * t_f
    c = 2 * b * d / 450e9
    assert e.step_s == pytest.approx((m + p - 1) * (t_f + t_b) + 16 * c, rel=1e-12)
    assert e.compute_s == pytest.approx(m * (t_f + t_b), rel=1e-12)
    assert e.comm_s == pytest.approx(16 * c, rel=1e-12)  # Z1's own sends, not all four stages'
    idle = (p - 1) * (t_f + t_b) + 16 * c
    assert e.bubble_s + e.comm_exposed_s == pytest.approx(idle, rel=1e-12)
    assert e.comm_exposed_s <= e.comm_s
    textbook = (p - 1) / (m + p - 1)  # 3/11, the bubble with free sends
    assert textbook <= e.bubble_s / e.step_s <= textbook + 16 * c / e.step_s
    assert textbook <= e.bubble <= textbook + 16 * c / e.step_s  # the stages' mean, the same bounds
    assert "bubble" in e.summary() and f"bubble {ms(e.bubble_s)} ms" in e.summary()


def test_the_brief_case_reports_less_exposed_than_comm() -> None:
    """The calibrated case: 1F1B's bubble (29.4 ms of idle) is not communication."""
    e = estimate("pp", Mesh(Z=4), "h100", batch=32768, d_model=4096, d_ff=16384, layers=8)
    assert e.comm_exposed_s <= e.comm_s < 0.02 * e.step_s
    assert e.bubble_s > 0.25 * e.step_s
    assert e.comm_hidden_s == pytest.approx(e.comm_s - e.comm_exposed_s)
    assert e.comm_hidden_s > 0
