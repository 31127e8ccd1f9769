"""The planner: its plans replay exactly, its bounds are bounds, its table and its errors.

Soundness: the top plans of several searches at toy sizes run exactly (``run_model`` on
data) and match the single-device reference. Bounds: on every candidate of a toy space the
memory and time lower bounds the search prunes by are at most the traced figures.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardsim.cli import main
from shardsim.cost import get_hardware
from shardsim.cost.layer_program import LayerCache
from shardsim.errors import PlannerError, ShardsimError
from shardsim.models import get
from shardsim.planner import Candidate, days_to_train, fewest_chips, plan
from shardsim.planner.bounds import memory_bound, stage_bound, stage_memory_bound, state_bytes, time_bound
from shardsim.planner.evaluate import evaluate
from shardsim.planner.space import FIXABLE, Constraints, candidates
from shardsim.plans import Plan
from shardsim.training import model_memory, policies
from shardsim.training.stage_memory import stage_layers
from test_run_model import check_against_reference

LLAMA = get("llama-tiny").scaled(layers=4)
GPT = get("gpt-tiny")
MOE = get("moe-tiny")

# (model, chips, constraints): free searches and searches held to each dimension of the space:
# pipelines, the interleaved schedule, ZeRO-3, TP with selective recomputation, CP with TP, CP
# inside a pipeline, all-gather CP, TP without SP, EP on a mixture of experts, microbatches of 8
# sequences
SEARCHES = [
    (LLAMA, 2, {}),
    (LLAMA, 8, {"pp": 2}),
    (LLAMA, 8, {"pp": 2, "schedule": "interleaved"}),
    (GPT, 4, {"zero": 3}),
    (LLAMA, 4, {"tp": 2, "recompute": "selective"}),
    (LLAMA, 4, {"cp": 2, "tp": 2}),
    (LLAMA, 8, {"cp": 2, "pp": 2, "tp": 2}),
    (LLAMA, 4, {"cp": 2, "cp_method": "all_gather"}),
    (LLAMA, 4, {"tp": 2, "sp": False}),
    (MOE, 4, {"ep": 2}),
    (LLAMA, 1, {"micro_range": (8, 8)}),
]


# one cache of traced layer programs per toy model, shared by the searches and checks below
CACHES = {m.name: LayerCache(m, "h100", seq=16) for m in (LLAMA, GPT, MOE)}


@pytest.mark.parametrize(("model", "chips", "cons"), SEARCHES)
def test_top_plans_replay_exactly(model, chips, cons):
    cache = CACHES[model.name]
    small = {} if not cons or "micro_range" in cons else {"micro_range": (1, 2)}  # toy spaces: the microbatch apart
    table = plan(model, "h100", chips, batch_tokens=8 * model.seq, seq=model.seq, cache=cache, **cons, **small)
    assert table.rows, table.no_plan_reason()
    for row in table.rows[:3]:
        for key, value in cons.items():
            assert getattr(row.plan, key) == value if key in FIXABLE else row.candidate.micro == value[0]
        check_against_reference(model, row.plan, "float64", row.candidate.batch, None)


def test_context_parallel_attention_is_searched_as_a_ring_and_as_an_all_gather():
    """Both context-parallel attentions are in the space wherever CP is (Llama 3 ran the
    all-gather one), and fixing one keeps the other out; without CP the method is moot."""

    def methods(**fixed):
        space = candidates(LLAMA, chips=4, batch_tokens=128, seq=16, domain=8, constraints=Constraints.of(**fixed))
        return {c.plan.cp_method for c in space}

    assert methods(cp=2) == {"ring", "all_gather"}
    assert methods(cp=2, cp_method="all_gather") == {"all_gather"}
    assert methods(cp=1) == {"ring"}


_CACHE = CACHES[LLAMA.name]
_SPACE = list(candidates(LLAMA, chips=8, batch_tokens=16 * 16, seq=16, domain=8))


@given(st.sampled_from(_SPACE))
def test_bounds_are_lower_bounds(c):
    est = evaluate(_CACHE, c)
    hw = get_hardware("h100")
    _, eff = _CACHE.placement(c.plan, c.order)
    assert memory_bound(LLAMA, c, seq=16) <= est.memory["total"]
    assert time_bound(LLAMA, c, hw, eff, seq=16) <= est.step_s * (1 + 1e-9)
    lay = _CACHE.layer(c.plan, c.micro, c.order)
    per = lay.per_layer
    assert stage_bound(LLAMA, c, _CACHE.compute_per_layer(c.plan, c.micro)) <= est.step_s * (1 + 1e-9)
    assert stage_bound(LLAMA, c, per.fwd + per.bwd) <= est.step_s * (1 + 1e-9)
    if c.plan.pp > 1:
        assert stage_memory_bound(LLAMA, c, lay) <= est.memory["total"]


_POLICY_CACHES = {name: LayerCache(LLAMA, "h100", seq=16, policy=name) for name in policies.names()}


@given(st.sampled_from(policies.names()), st.sampled_from(_SPACE))
def test_memory_bound_is_below_the_ledger_under_every_byte_policy(name, c):
    """The closed form ``(w + g + o)Ψ`` of :func:`state_bytes` only ever bounds the ledger from below."""
    policy = policies.get(name)
    if policy.zero is not None:
        c = Candidate(c.plan.replace(zero=policy.zero), c.micro, c.batch, c.order)
    est = evaluate(_POLICY_CACHES[name], c)
    assert memory_bound(LLAMA, c, seq=16, state=state_bytes(name)) <= est.memory["total"]


@pytest.mark.parametrize(("policy", "k"), [(None, 12), ("zero-mixed", 12), ("bf16", 4), ("scaling-book", 8)])
def test_zero1_optimizer_state_is_k_bytes_per_parameter_over_dp(policy, k):
    """ZeRO §3.1: ``K`` bytes of optimizer state per parameter (float32 master weights and two
    Adam moments: 12; bf16 moments alone: 4; float32 moments, no master: 8), split ``1/dp``
    from ZeRO-1 on; read off the training step's ledger at dp 4 and 8 (off the runs at 2 and 4)."""
    cache = LayerCache(LLAMA, "h100", seq=16, policy=policy)
    for dp in (1, 4, 8):
        est = evaluate(cache, Candidate(Plan(dp=dp, zero=1 if dp > 1 else 0), 1, dp))
        assert est.memory["optimizer"] == k * LLAMA.param_count() // dp


def test_a_shared_cache_is_reused_and_must_match_the_search():
    cache = LayerCache(LLAMA, "h100", seq=16)
    first = plan(LLAMA, "h100", 4, batch_tokens=8 * 16, seq=16, zero=0, recompute="none", cache=cache)
    again = plan(LLAMA, "h100", 4, batch_tokens=8 * 16, seq=16, zero=0, recompute="none", cache=cache)
    assert first.traced > 0 and again.traced == 0  # every layer program came from the cache
    assert [r.step_s for r in again.rows] == [r.step_s for r in first.rows]
    with pytest.raises(PlannerError, match=r"cache= holds the layer programs of another search \(seq 16, not 32\)"):
        plan(LLAMA, "h100", 4, batch_tokens=8 * 32, seq=32, cache=cache)
    with pytest.raises(PlannerError, match=r"\(policy None, not BytePolicy"):
        plan(LLAMA, "h100", 4, batch_tokens=8 * 16, seq=16, cache=cache, policy="bf16")


def test_layer_programs_are_shared_across_pipeline_depths():
    cache = LayerCache(LLAMA, "h100", seq=16)
    for pp in (1, 2, 4):
        cache.layer(Plan(dp=8 // pp, pp=pp, microbatches=2), micro=1)
    assert cache.traced == 1


def test_placements_that_route_the_layers_axes_alike_share_its_time_lines():
    """On 8-chip nodes the model axis of tp=4 is NVLink and a data axis of 4 outside two pipeline
    stages or four crosses four nodes: the layer is timed once, as a fresh cache times it; a
    data axis inside the node is timed on its own."""
    shared = LayerCache(LLAMA, "h100", seq=16)
    deep, shallow = Plan(dp=4, tp=4, pp=4, microbatches=4), Plan(dp=4, tp=4, pp=2, microbatches=4)
    a, b = shared.layer(shallow, micro=1), shared.layer(deep, micro=1)
    fresh = LayerCache(LLAMA, "h100", seq=16).layer(deep, micro=1)
    assert a.timeline is b.timeline and b.per_layer == fresh.per_layer and b.edge == fresh.edge
    inside = shared.layer(Plan(dp=2, tp=4), micro=1)  # the same layer program, its data axis on NVLink
    assert inside.per_layer == LayerCache(LLAMA, "h100", seq=16).layer(Plan(dp=2, tp=4), micro=1).per_layer
    assert inside.per_layer.sync < a.per_layer.sync


def test_memory_reads_the_ledger_and_the_schedule():
    """1F1B on p stages stashes p microbatches on the first stage, GPipe all m (Narayanan et al.),
    the head's logits among them on the last: the difference is the traced pipeline's ledger's."""
    cache = LayerCache(LLAMA, "h100", seq=16)
    base = Plan(dp=1, pp=2, microbatches=4)
    one = evaluate(cache, Candidate(base, 1, 4))
    gpipe = evaluate(cache, Candidate(base.replace(schedule="gpipe"), 1, 4))
    cfg = LLAMA.scaled(tie_embeddings=False)
    ledger = [model_memory(cfg, q, batch=4, seq=16, full=True)[0] for q in (base, base.replace(schedule="gpipe"))]
    assert (
        gpipe.memory["activations"] - one.memory["activations"] == ledger[1]["activations"] - ledger[0]["activations"]
    )
    assert gpipe.memory["activations"] > one.memory["activations"]


def test_stage_layers_balance_as_llama3():
    assert stage_layers(126, 16) == 8  # two stages of 7 (with the embedding and the head)
    assert stage_layers(128, 16) == 8
    assert stage_layers(120, 16) is None


def test_table_text_html_json_and_why():
    table = plan(LLAMA, "h100", 4, batch_tokens=8 * 16, seq=16, recompute="none", zero=0, cache=_CACHE)
    text = str(table)
    assert text.splitlines()[0].startswith("llama-tiny(layers=4) on 4 h100")
    assert "why: " in text and str(table.best.plan) in text
    html = table._repr_html_()
    assert "<table>" in html and "<pre>" in html
    doc = json.loads(table.to_json())
    assert doc["rows"][0]["plan"] == str(table.best.plan)
    assert doc["considered"] == table.considered >= doc["kept"] == table.kept
    assert table.best.step_s == min(r.step_s for r in table.rows)


def test_days_to_train_and_fewest_chips():
    table = plan(LLAMA, "h100", 4, batch_tokens=8 * 16, seq=16, recompute="none", zero=0, cache=_CACHE)
    assert days_to_train(table, 86400 * table.best.tokens_per_s * 3) == pytest.approx(3.0)
    target = table.best.tokens_per_s * 0.999
    n, found = fewest_chips(
        LLAMA,
        "h100",
        batch_tokens=8 * 16,
        seq=16,
        tokens_per_s=target,
        chips=[1, 2, 4, 8],
        recompute="none",
        zero=0,
        cache=_CACHE,
    )
    assert n <= 4 and found.best.tokens_per_s >= target
    if n > 1:  # the count before it does not reach the target
        below = plan(LLAMA, "h100", n // 2, batch_tokens=8 * 16, seq=16, recompute="none", zero=0, cache=_CACHE)
        assert below.best.tokens_per_s < target


# -- bad input ---------------------------------------------------------------------------------
def test_a_model_that_fits_nowhere_says_by_how_much_and_what_helps():
    with pytest.raises(PlannerError, match=r"fits under no plan on 8 h100 .* short; try more chips"):
        plan("llama3-405b", "h100", 8, batch_tokens=16 * 8192, seq=8192)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"tp": 8, "allow": ("dp",)}, r"tp=8 is fixed but 'tp' is not among the allowed"),
        ({"tp": 3}, r"do not divide 16 chips"),
        ({"headroom": 1.5}, r"headroom=1.5"),
        ({"allow": ("dp", "magic")}, r"'magic' is not a parallelism"),
        ({"tpp": 2}, r"unknown planner option 'tpp'"),
        ({"tp": 16, "pp": 1, "dp": 1}, r"satisfies the constraints"),
        ({"policy": "fp8"}, r"policy='fp8': unknown byte policy 'fp8'; the presets are"),
        ({"policy": "megatron", "zero": 1}, r"policy='megatron' counts ZeRO stage 0 but zero=1 is fixed"),
        ({"cp_method": "zigzag"}, r"cp_method='zigzag': choose one of \['ring', 'all_gather'\]"),
    ],
)
def test_contradictory_constraints(options, match):
    with pytest.raises(PlannerError, match=match):
        plan(LLAMA, "h100", 16, batch_tokens=16 * 16, seq=16, **options)


def test_chip_counts_the_hardware_cannot_form():
    with pytest.raises(PlannerError, match="do not form whole nodes of 8"):
        plan(LLAMA, "h100", 12, batch_tokens=12 * 16, seq=16)
    with pytest.raises(PlannerError, match="cannot be laid out"):
        plan(LLAMA, "tpu-v5p", 16384, batch_tokens=16384 * 16, seq=16)
    with pytest.raises(PlannerError, match="whole number of 16-token sequences"):
        plan(LLAMA, "h100", 8, batch_tokens=100, seq=16)


def test_planner_error_is_a_shardsim_error():
    assert issubclass(PlannerError, ShardsimError) and issubclass(PlannerError, ValueError)


# -- the command line ---------------------------------------------------------------------------
def test_cli_plan_table_json_and_one_line_errors(capsys):
    argv = ["plan", "--model", "gpt-tiny", "--chips", "2", "--batch-tokens", "64", "--seq", "16", "--top", "3"]
    argv += ["--fix", "recompute=none"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("gpt-tiny on 2 h100") and "why: " in out
    assert main([*argv, "--json", "--fix", "tp=2,recompute=none"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # FlashAttention, the default, goes unsaid in the plans and is named among the defaults
    assert all(r["plan"].find("tp=2") >= 0 and "attention=" not in r["plan"] for r in doc["rows"])
    assert doc["defaults"]["attention"] == "flash" and doc["defaults"]["hardware"] == "h100"
    assert main(["plan", "--model", "llama3-405b", "--chips", "8", "--batch-tokens", "64K", "--seq", "8192"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fits under no plan" in err
    assert main([*argv, "--json", "--fix", "attention=standard,recompute=none"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rows"] and all("attention=standard" in r["plan"] for r in doc["rows"])  # said: not the default
    assert "attention" not in doc["defaults"]
    assert main([*argv, "--fix", "tp=two"]) == 2
    assert "expected a whole number" in capsys.readouterr().err
    assert main([*argv, "--policy", "fp8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "policy='fp8': unknown byte policy" in err


def test_progress_counter_writes_one_line_only_when_enabled():
    import io

    from shardsim.planner.progress import Progress

    out = io.StringIO()
    bar = Progress(10, enabled=True, stream=out)
    bar.update(considered=5, traced=2, kept=1, force=True)
    bar.close()
    assert out.getvalue().startswith("\rplanning: 5/10 candidates, 2 layer programs traced, 1 plans kept")
    assert out.getvalue().endswith("\n")
    quiet = io.StringIO()
    Progress(10, stream=quiet).update(considered=1, traced=1, kept=1, force=True)  # not a terminal
    assert quiet.getvalue() == ""


def test_batch_range_and_headroom_constraints():
    hbm = get_hardware("h100").hbm_capacity
    table = plan(LLAMA, "h100", 4, batch_tokens=6 * 16, seq=16, batch_range=(4 * 16, 8 * 16), headroom=0.5, zero=0,
                 cache=_CACHE)  # fmt: skip
    for row in table.rows:
        assert 4 <= row.candidate.batch <= 8 and row.candidate.batch % row.plan.dp == 0
        assert row.memory["total"] <= 0.5 * hbm and row.tokens == row.candidate.batch * 16
    with pytest.raises(PlannerError, match="whole number of 16-token sequences"):
        plan(LLAMA, "h100", 4, batch_tokens=6 * 16 + 1, seq=16)


_REAL = LayerCache(get("llama3-8b"), "h100", seq=8192)


@pytest.mark.parametrize(
    "text, micro",
    [
        ("dp=2,zero=1", 1),
        ("dp=2,tp=16,sp", 2),  # more chips on the model axis than KV heads: KV replicated
        ("dp=2,tp=4,recompute=full,microbatches=2", 1),
        ("dp=2,cp=2,tp=2,attention=flash", 1),
        ("dp=2,tp=2,pp=2,microbatches=4", 1),
        ("dp=4,zero=3,tp=8,pp=4,schedule=interleaved,virtual_stages=2,microbatches=8", 1),
    ],
)
def test_bounds_hold_at_real_sizes(text, micro):
    """At Llama 3 8B's shapes (matmuls near the efficiency curve's plateau, KV heads replicated
    over a wide model axis) the untraced and the traced bounds stay under the traced figures."""
    plan = Plan.parse(text)
    c = Candidate(plan, micro=micro, batch=plan.dp * plan.microbatches * micro)
    est = evaluate(_REAL, c)
    hw = get_hardware("h100")
    _, eff = _REAL.placement(plan, c.order)
    assert time_bound(_REAL.model, c, hw, eff, seq=8192) <= est.step_s
    assert memory_bound(_REAL.model, c, seq=8192) <= est.memory["total"]
    lay = _REAL.layer(plan, micro, c.order)
    assert stage_bound(_REAL.model, c, lay.per_layer.fwd + lay.per_layer.bwd) <= est.step_s * (1 + 1e-9)
    assert stage_bound(_REAL.model, c, _REAL.compute_per_layer(plan, micro)) <= est.step_s * (1 + 1e-9)
    if plan.pp > 1:
        assert stage_memory_bound(_REAL.model, c, lay) <= est.memory["total"]


def test_a_pipelined_memory_bound_counts_the_gradients_beside_the_stash():
    """Under 1F1B with more microbatches than stages the first stage runs a forward after its
    first backward: its gradients live beside the stash, so the bound counts the traced layer's
    weights, gradients and optimizer state and the stash of all but one chunk in flight, and
    stays under the traced pipeline's memory."""
    plan = Plan.parse("dp=2,tp=8,pp=2,microbatches=4,recompute=full")
    c = Candidate(plan, micro=1, batch=8)
    lay = _REAL.layer(plan, 1)
    state = sum(lay.state_at(k, 3) - lay.state_at(k, 2) for k in ("params", "grads", "optimizer"))
    stash = lay.bytes_at("activations", 3) - lay.bytes_at("activations", 2)
    n = 16  # 32 layers on two stages; the first holds p = 2 microbatches at once (Narayanan et al.)
    assert stage_memory_bound(_REAL.model, c, lay) == n * state + (2 - 1) * n * stash
    assert stage_memory_bound(_REAL.model, c, lay) <= evaluate(_REAL, c).memory["total"]
