"""Training steps under every scheme and ZeRO stage against single-device steps."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import shardsim as ss
from shardsim import mlp
from shardsim.dtypes import tolerance
from shardsim.training import SGD, Adam, AdamW, Precision, Trainer, optim, train_step
from strategies_core import MLP_SCHEMES, scheme_meshes
from training_reference import Bound, Opt, _step, gradient_rel_error, train, weight_ulp


def shardsim_optimizer(opt: Opt) -> SGD | Adam:
    if opt.kind == "sgd":
        return SGD(lr=opt.lr, weight_decay=opt.weight_decay)
    if opt.kind == "momentum":
        return SGD(lr=opt.lr, momentum=opt.momentum, weight_decay=opt.weight_decay)
    if opt.kind == "adamw":
        return AdamW(lr=opt.lr, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay)
    return Adam(lr=opt.lr, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay)


@st.composite
def training_cases(draw):
    name, sizes, shape = draw(scheme_meshes(max_size=4, max_pair=2))
    layers = draw(st.integers(1, 3))
    kind = draw(st.sampled_from(["sgd", "momentum", "adam", "adamw"]))
    dtype = draw(st.sampled_from(["float32", "float64"]))
    opt = Opt(
        kind,
        lr=draw(st.sampled_from([1e-3, 1e-2, 1e-1])),
        weight_decay=draw(st.sampled_from([0.0, 0.01])),
    )
    return dict(
        name=name,
        sizes=sizes,
        shape=shape,
        layers=layers,
        opt=opt,
        dtype=dtype,
        steps=draw(st.integers(1, 5)),
        activation=draw(st.sampled_from(["identity", "relu", "gelu"])),
        residual=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


def data(b: int, d: int, f: int, layers: int, dtype: str, seed: int):
    rng = np.random.default_rng(seed)
    params = mlp.init_stack(layers, d, f, seed=seed + 1, dtype=dtype)
    x = rng.standard_normal((b, d)).astype(dtype)
    y = rng.standard_normal((b, d)).astype(dtype)
    return params, x, y


@settings(max_examples=100)
@given(training_cases())
def test_k_steps_equal_k_single_device_steps(case) -> None:
    b, d, f = case["shape"]
    params, x, y = data(b, d, f, case["layers"], case["dtype"], case["seed"])
    kw = dict(activation=case["activation"], residual=case["residual"])
    bound = Bound(rel=gradient_rel_error(case["dtype"], b, d, f, case["layers"]), ulp=weight_ulp(case["dtype"]))
    want, losses = train(params, x, y, case["opt"], case["steps"], bound=bound, **kw)
    assume(bound.stable())  # a diverging run amplifies any rounding difference

    trainer = Trainer(case["name"], ss.Mesh(case["sizes"]), params, shardsim_optimizer(case["opt"]), **kw)
    got_losses = [trainer.step(x, y).loss for _ in range(case["steps"])]
    got = trainer.params_global()
    for k in want:
        assert got[k].dtype == np.dtype(case["dtype"])
        err = np.abs(got[k] - want[k])
        limit = 2 * bound.err[k]  # 2x: the gradients of later steps also see the earlier drift
        worst = np.unravel_index(np.argmax(err - limit), err.shape)
        assert (err <= limit).all(), f"{k}{worst}: |error| {err[worst]:.3g} > {limit[worst]:.3g}"
    # the first loss sees only this step's rounding; later ones are held through the weights
    sum_rel = tolerance(case["dtype"], b * d)  # the loss sums B·D squares
    assert abs(got_losses[0] - losses[0]) <= 2 * bound.first_loss_error(losses[0], sum_rel)


# -- what a step reports ---------------------------------------------------------------------
B, D, F, L = 8, 16, 32, 2


def small(dtype: str = "float32", layers: int = L):
    return data(B, D, F, layers, dtype, seed=3)


def test_the_loss_per_step_is_the_same_under_every_scheme() -> None:
    params, x, y = small("float64")
    _, want = train(params, x, y, Opt("adam", lr=1e-2), 3, activation="gelu")
    for name, roles in MLP_SCHEMES.items():
        mesh = ss.Mesh(X=2, Y=2) if len(roles) == 2 else ss.Mesh({roles[0]: 4})
        t = Trainer(name, mesh, params, Adam(lr=1e-2), activation="gelu")
        got = [t.step(x, y).loss for _ in range(3)]
        np.testing.assert_allclose(got, want, rtol=gradient_rel_error("float64", B, D, F, L), err_msg=name)


def test_step_phases_and_layouts() -> None:
    params, x, y = small()
    r = Trainer("zero1", ss.Mesh(X=4), params, Adam()).step(x, y)
    assert [e.phase for e in r.trace if e.is_collective] == ["loss"] + ["optimizer"] * 4 * L
    assert [e.label for e in r.trace if e.op == "slice"] == ["W_in.0", "W_out.0", "W_in.1", "W_out.1"]  # float32:
    # no master copy, each chip takes its slice of the weights to update (no communication)
    assert r.trace.collectives("backward") == []
    rs, ag = ("reduce_scatter", ("X",)), ("all_gather", ("X",))
    assert r.trace.collectives("optimizer") == [rs, rs, ag, ag] * L  # per block: ReduceScatter, update, AllGather
    assert r.layouts == {
        "x": "[B_X, D]",
        "w_in": "[D, F]",
        "w_out": "[F, D]",
        "out": "[B_X, D]",
        "dw_in": "[D_X, F]",
        "dw_out": "[F_X, D]",
        "opt_w_in": "[D_X, F]",
        "opt_w_out": "[F_X, D]",
    }
    assert r.step == 1 and set(r.memory) >= {"params", "grads", "optimizer", "activations", "total"}


def test_train_step_returns_the_updated_weights() -> None:
    params, x, y = small("float64")
    opt = Opt("momentum", lr=0.1)
    want, losses = train(params, x, y, opt, 1)
    r = train_step("zero2", ss.Mesh(X=2), params, x, y, shardsim_optimizer(opt))
    assert r.loss == pytest.approx(losses[0], rel=1e-12)
    for k in want:
        np.testing.assert_allclose(r.params[k], want[k], rtol=1e-12, atol=1e-15)


def test_tp_and_fsdp_tp_keep_optimizer_state_like_their_weights() -> None:
    params, x, y = small()
    for name, mesh in (("tp", ss.Mesh(Y=4)), ("fsdp_tp", ss.Mesh(X=2, Y=2))):
        t = Trainer(name, mesh, params, Adam())
        r = t.step(x, y)
        assert r.layouts["opt_w_in"] == r.layouts["w_in"] == r.layouts["dw_in"]
        assert r.trace.collectives("optimizer") == []
        for m in t.moments[0]["w_in"].values():
            assert str(m.layout) == r.layouts["w_in"] and m.category == "optimizer"


def test_shape_only_training_traces_the_same_program() -> None:
    params, x, y = small()
    spec = {k: ss.ShapeDtype(v.shape, "float32") for k, v in params.items()}
    xs = ss.ShapeDtype(x.shape, "float32")
    data_run = Trainer("zero2", ss.Mesh(X=4), params, Adam()).step(x, y)
    only = Trainer("zero2", ss.Mesh(X=4), spec, Adam()).step(xs, xs)
    assert only.loss is None

    def program(t):
        return [(e.op, e.axes, e.label, e.after, e.phase, e.sent_bytes, e.flops) for e in t]

    assert program(only.trace) == program(data_run.trace)
    for c in ("params", "grads", "optimizer"):
        np.testing.assert_array_equal(only.model_state[c], data_run.model_state[c])


# -- the optimizers on their own ---------------------------------------------------------------
def test_adam_matches_the_formulas_step_by_step() -> None:
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(6)
    grads = [rng.standard_normal(6) for _ in range(4)]
    for kind, ours in (("adam", Adam(lr=0.01, weight_decay=0.1)), ("adamw", AdamW(lr=0.01, weight_decay=0.1))):
        opt = Opt(kind, lr=0.01, weight_decay=0.1)
        w, state = w0.copy(), ours.init_state(w0)
        ref_w, ref_state = w0.copy(), {}
        for t, g in enumerate(grads, 1):
            ours.update(w, g, state, t)
            ref_w, _ = _step(opt, ref_w, g, ref_state, t)
            np.testing.assert_allclose(w, ref_w, rtol=1e-14, atol=1e-15, err_msg=f"{kind} step {t}")


def test_sgd_with_momentum_by_hand() -> None:
    w = np.array([1.0, 2.0])
    opt = SGD(lr=0.5, momentum=0.5)
    s = opt.init_state(w)
    opt.update(w, np.array([1.0, -1.0]), s, 1)  # buf = g;        w = w - 0.5 g
    opt.update(w, np.array([1.0, -1.0]), s, 2)  # buf = 0.5 g + g; w -= 0.75 g
    np.testing.assert_array_equal(w, [1.0 - 0.5 - 0.75, 2.0 + 0.5 + 0.75])


def test_unknown_names() -> None:
    params, _, _ = small()
    with pytest.raises(ss.ShardingError, match="unknown precision 'fp8'; choose one of"):
        Trainer("ddp", ss.Mesh(X=2), params, precision="fp8")
    with pytest.raises(ss.ShardingError, match="unknown optimizer 'adagrad'; choose one of"):
        Trainer("ddp", ss.Mesh(X=2), params, "adagrad")
    with pytest.raises(ss.ShardingError, match="unknown optimizer 'lion'"):
        optim.get("lion")
    with pytest.raises(ss.ShardingError, match=r"optimizer 'adam' has no option\(s\) \['momentum'\]"):
        optim.get("adam", momentum=0.9)
    with pytest.raises(ss.ShardingError, match=r"optimizer must be shardsim\.training\.SGD, Adam or AdamW"):
        Trainer("ddp", ss.Mesh(X=2), params, object())
    with pytest.raises(ss.ShardingError, match="unknown scheme 'zero4'"):
        Trainer("zero4", ss.Mesh(X=2), params)
    with pytest.raises(ss.ShardingError, match=r"same L"):
        Trainer("ddp", ss.Mesh(X=2), {"w_in": params["w_in"], "w_out": params["w_out"][:1]})


def test_optimizer_names_are_names() -> None:
    params, x, y = small()
    by_name = Trainer("zero2", ss.Mesh(X=2), params, "momentum").step(x, y)
    by_value = Trainer("zero2", ss.Mesh(X=2), params, SGD(lr=0.01, momentum=0.9)).step(x, y)
    assert by_name.loss == by_value.loss


@pytest.mark.parametrize(
    "make, match",
    [
        # these raised nothing, or ZeroDivisionError, or "math domain error", or a NumPy type error
        (lambda: SGD(lr=-0.1), "SGD lr must be a finite number above 0, got -0.1"),
        (lambda: SGD(lr=0.0), "SGD lr must be a finite number above 0"),
        (lambda: Adam(lr=float("nan")), "Adam lr must be a finite number above 0, got nan"),
        (lambda: AdamW(lr=float("inf")), "AdamW lr must be a finite number above 0"),
        (lambda: SGD(lr="0.1"), r"SGD lr must be a number, got '0.1' \(str\)"),
        (lambda: SGD(momentum=-0.5), "SGD momentum must be a finite number at least 0"),
        (lambda: Adam(b1=1.0), "Adam b1 must be a finite number at least 0 and below 1, got 1.0"),
        (lambda: Adam(b2=2.0), "Adam b2 must be a finite number at least 0 and below 1, got 2.0"),
        (lambda: Adam(eps=0.0), "Adam eps must be a finite number above 0"),
        (lambda: Adam(weight_decay=-1.0), "Adam weight_decay must be a finite number at least 0"),
        (lambda: Adam().update(np.ones(2), np.ones(2), Adam().init_state(np.ones(2)), 0), "counts from 1, got 0"),
        (lambda: SGD().update(np.ones(2), np.ones(2), {}, -3), "counts from 1, got -3"),
        (lambda: SGD().update(np.ones(2), np.ones(2), {}, 1.5), "whole number counting from 1, got 1.5"),
    ],
)
def test_optimizer_options_that_make_no_sense(make, match: str) -> None:
    with pytest.raises(ss.ShardingError, match=match):
        make()


def test_trainer_arguments_that_make_no_sense() -> None:
    params, _, _ = small()
    with pytest.raises(ss.ShardingError, match="Trainer needs params"):  # was StopIteration
        Trainer("ddp", ss.Mesh(X=2), {})
    with pytest.raises(ss.ShardingError, match=r"Trainer needs a shardsim\.Mesh, got dict"):
        Trainer("ddp", {"X": 2}, params)  # type: ignore[arg-type]
    with pytest.raises(ss.ShardingError, match=r"loss_scale must be a finite number above 0, got 0\.0"):  # was 1 / 0
        Trainer("ddp", ss.Mesh(X=2), params, precision="fp16", loss_scale=0)
    with pytest.raises(ss.ShardingError, match="no closed form"):
        _ = Precision.of("fp64").formula_name


@pytest.mark.parametrize(
    "microbatches, error, match",
    [
        (3, ss.DivisibilityError, r"microbatches=3: the 8 rows .* do not divide by 3; pass one of \[1, 2, 4, 8\]"),
        (0, ss.ShardingError, "option microbatches must be a whole number >= 1, got 0"),  # was: the default
        (-2, ss.ShardingError, "option microbatches must be a whole number >= 1, got -2"),
        (2.5, ss.ShardingError, "got 2.5"),  # was: 2
        ("a", ss.ShardingError, "got 'a'"),  # was: ValueError from int()
    ],
)
def test_pipeline_microbatches_that_do_not_divide(microbatches, error, match: str) -> None:
    params = ss.strategies.get("pp").init(8, 16)
    x = np.ones((8, 8), np.float32)
    with pytest.raises(error, match=match):
        ss.run_strategy("pp", ss.Mesh(Z=2), params, x, x, microbatches=microbatches)


def test_train_command_prints_losses_and_memory(capsys) -> None:
    import argparse

    from shardsim.cli.train import add_train_arguments, train_command

    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    assert train_command(parser.parse_args(["--steps", "2", "--precision", "bf16", "--recompute"])) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["zero1"], ["zero2"], ["zero3"])]
    losses = {tuple(r[2:4]) for r in rows if r[1].startswith("(")}  # loss table rows: scheme, mesh, steps
    assert len(losses) == 1  # the same printed losses under every stage
    assert "model state" in out and out.count("PASS") == 6
    with pytest.raises(ss.ShardingError, match="unknown scheme 'zero9'"):
        train_command(parser.parse_args(["--scheme", "zero9"]))
