"""Full recomputation in a 1F1B pipeline keeps each layer's input per microbatch in flight.

Korthikanti et al. 2022 (arXiv:2205.05198), §4 and Eq. 5: under full recomputation a layer
keeps only its input, ``2sbh`` bytes (``2sbh/t`` with sequence parallelism), and the first
stage of a 1F1B pipeline holds ``p`` microbatches of ``L/p`` layers; stage ``s`` holds
``min(p - s, m)``. On top of that a stage needs one layer's working set while it recomputes
and runs that layer's backward. The gradients summed over the microbatches are a buffer for
the reduction after the flush, not something a microbatch keeps: they are not activations.

The expected bytes per stage are

    min(p - s, m) x (L/p) x 2sbh / tau  +  W  +  [s > 0] x 2sbh / tau  +  (m - 1) x 8bs

with ``tau = t`` under sequence parallelism (else 1), ``W`` one layer's working set, the
second term the activation a later stage has received for its next microbatch, and the last
the microbatches' int32 tokens and targets beyond the first. ``W`` is read from the same
layer's program without a pipeline (one microbatch, no stages): its activation peak less its
own layers' inputs. The comparison is exact.
"""

from __future__ import annotations

import numpy as np
import pytest

from shardsim import ShapeDtype
from shardsim.models import TransformerConfig, get, reference
from shardsim.plans import Plan
from shardsim.training import model_memory
from shardsim.transformer.run import run_model

T, P, M = 8, 8, 8  # GPT-3 175B as PTD-P shards it: TP 8 in a node, 8 stages, m = p microbatches


def gpt3(layers: int) -> TransformerConfig:
    # PTD-P's vocabulary (51,200 divides by t); a pipeline places an untied LM head on the last stage
    return get("gpt3-175b").scaled(layers=layers, vocab=51200, tie_embeddings=False)


def _activations(
    cfg: TransformerConfig, plan: Plan, params: dict, b: int, s: int, data: object = None, seed: int | None = None
) -> np.ndarray:
    """The run's activation peak per chip, one entry per pipeline stage (every chip of a stage alike)."""
    tokens = ShapeDtype((b, s), "int32") if data is None else data
    res = run_model(cfg, plan, plan.mesh(), params, tokens, tokens, dropout_seed=seed)  # type: ignore[arg-type]
    act = res.memory["activations"]
    pipe = plan.axis("pipe")
    if pipe is None:
        return np.array([act.max()])
    per = np.moveaxis(act, plan.mesh().axis_names.index(pipe), 0).reshape(plan.pp, -1)
    assert (per == per[:, :1]).all()
    return per[:, 0]


def _shapes(cfg: TransformerConfig) -> dict:
    return {k: ShapeDtype(v, "bfloat16") for k, v in cfg.param_shapes().items()}


def _working_set(
    cfg: TransformerConfig, sp: bool, b: int, params: dict, data: object = None, seed: int | None = None
) -> int:
    """W: the un-pipelined full-recompute step's activation peak less its layers' kept inputs."""
    plan = Plan(tp=T if cfg.d_model > 64 else 2, sp=sp, attention="standard", recompute="full")
    tau = plan.tp if sp else 1
    itemsize = 2 if data is None else 8
    peak = int(_activations(cfg, plan, params, b, cfg.seq, data, seed)[0])
    return peak - cfg.layers * itemsize * cfg.seq * b * cfg.d_model // tau


def expected(p: int, m: int, k: int, kept: int, w: int, b: int, s: int) -> list[int]:
    """Korthikanti's rule per stage (module docstring); ``kept`` one layer's input per microbatch."""
    tokens = (m - 1) * 2 * 4 * b * s
    return [min(p - st, m) * k * kept + w + (kept if st else 0) + tokens for st in range(p)]


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_gpt3_stages_hold_korthikantis_full_recompute_rule(sp: bool) -> None:
    """Korthikanti's setting (dropout on: the recomputed forward draws its masks again, none is
    kept), two layers a stage: every stage's peak is the rule's, byte for byte."""
    s, b, h, k = 2048, 1, 12288, 2
    tau = T if sp else 1
    kept = 2 * s * b * h // tau  # one layer's bf16 input
    w = _working_set(gpt3(2), sp, b, _shapes(gpt3(2)), seed=0)
    cfg = gpt3(P * k)
    plan = Plan(tp=T, sp=sp, pp=P, microbatches=M, attention="standard", recompute="full")
    assert plan.schedule == "1f1b"
    got = _activations(cfg, plan, _shapes(cfg), b * M, s, seed=0)
    assert got.tolist() == expected(P, M, k, kept, w, b, s)


def test_gpt3_175b_first_stage_holds_p_microbatches_of_its_layers_inputs() -> None:
    """The whole 96-layer model (12 layers a stage): the first stage's activations are
    8 x 12 x 2sbh = 4.83 GB plus one layer's working set (1.04 GB), not the layers' weight
    gradients' running sums on top (5.44 GB more before)."""
    s, b, h = 2048, 1, 12288
    kept = 2 * s * b * h
    assert P * 12 * kept == 4_831_838_208
    w = _working_set(gpt3(2), False, b, _shapes(gpt3(2)))
    peak, _ = model_memory(gpt3(96), Plan(tp=T, pp=P, microbatches=M, attention="standard", recompute="full"), batch=M)
    assert peak["activations"] == expected(P, M, 96 // P, kept, w, b, s)[0]


def test_a_small_model_with_data_holds_the_rule_exactly() -> None:
    """gpt-tiny in float64 with real weights and tokens: every stage's ledger is the rule's,
    the same as the shape-only run's, and the step's loss is the un-pipelined one's."""
    cfg = get("gpt-tiny").scaled(layers=8, tie_embeddings=False)
    b, s, p, m, k = 1, cfg.seq, 4, 6, 2
    params = reference.init(cfg, seed=3, dtype="float64")
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab, (b * m, s)).astype(np.int32)
    w = _working_set(cfg, False, b, params, tokens[:b])
    kept = 8 * s * b * cfg.d_model
    plan = Plan(tp=2, pp=p, microbatches=m, attention="standard", recompute="full")
    got = _activations(cfg, plan, params, b * m, s, tokens)
    assert got.tolist() == expected(p, m, k, kept, w, b, s)
    shapes = {key: ShapeDtype(v, "float64") for key, v in cfg.param_shapes().items()}
    assert _activations(cfg, plan, shapes, b * m, s).tolist() == got.tolist()
    piped = run_model(cfg, plan, plan.mesh(), params, tokens, tokens)
    whole = run_model(cfg, Plan(tp=2, recompute="full"), Plan(tp=2).mesh(), params, tokens, tokens)
    assert piped.loss == pytest.approx(whole.loss, rel=1e-12)
