"""Axis names are names, not letters: every scheme on meshes whose axes are words.

``Mesh(data=2)`` must train and run exactly as ``Mesh(X=2)``: the same losses, weights,
moments and gradients bit for bit (the chips compute the same blocks in the same order; only
the names differ), the same collectives on the corresponding axes, and layouts that name the
word axes (in brace form, ``[D_{data}, F]``).
"""

from __future__ import annotations

import numpy as np
import pytest

import shardsim as ss
from fault_injection import same_state, trainer_state
from shardsim import checkpoint, mlp, strategies
from shardsim.training import Adam, Trainer

LETTERS = {"data": "X", "model": "Y", "pipe": "Z", "expert": "Y"}  # the default axis of each role
TRAINER_SCHEMES = ("ddp", "zero1", "zero2", "zero3", "fsdp", "tp", "fsdp_tp")


def meshes(scheme: str) -> tuple[ss.Mesh, ss.Mesh]:
    """The scheme's mesh with letter axes (``X``, ``Y``, ``Z``) and with its roles' words as axes."""
    roles = strategies.get(scheme).roles
    return ss.Mesh({LETTERS[r]: 2 for r in roles}), ss.Mesh({r: 2 for r in roles})


def rename(axes: tuple[str, ...], scheme: str) -> tuple[str, ...]:
    words = {LETTERS[r]: r for r in strategies.get(scheme).roles}
    return tuple(words[a] for a in axes)


def batches(n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(3)
    return [(rng.standard_normal((8, 8)), rng.standard_normal((8, 8))) for _ in range(n)]


@pytest.mark.parametrize("precision", ["fp64", "bf16"])
@pytest.mark.parametrize("scheme", TRAINER_SCHEMES)
def test_the_trainer_on_word_axes_equals_the_trainer_on_letters(scheme: str, precision: str) -> None:
    params = mlp.init_stack(2, 8, 16, seed=2, dtype="float64")
    letters, words = meshes(scheme)
    a = Trainer(scheme, letters, params, Adam(lr=1e-2), precision=precision, activation="gelu")
    b = Trainer(scheme, words, params, Adam(lr=1e-2), precision=precision, activation="gelu")
    for x, y in batches(3):
        ra, rb = a.step(x, y), b.step(x, y)
        assert (ra.loss, ra.step) == (rb.loss, rb.step)
        assert [(op, rename(ax, scheme)) for op, ax in ra.trace.collectives()] == rb.trace.collectives()
    assert same_state(trainer_state(a), trainer_state(b))
    assert set(rb.axes.values()) == set(words.axis_names)
    for name, text in rb.layouts.items():  # every layout names the word axes and parses back on the mesh
        assert "X" not in text and "Y" not in text, (name, text)
        assert str(ss.Layout.parse(text, words.axis_names)) == text


def test_fsdp_on_a_data_mesh() -> None:
    # Trainer("fsdp", Mesh(data=2), ...) raised LayoutParseError after the update was applied
    params = mlp.init(4, 8, dtype="float64")
    t = Trainer("fsdp", ss.Mesh(data=2), params, Adam(lr=0.1))
    r = t.step(np.ones((2, 4)), np.zeros((2, 4)))
    assert r.layouts["opt_w_in"] == "[D_{data}, F]" and t.step_count == 1


@pytest.mark.parametrize("scheme", strategies.names())
def test_run_strategy_on_word_axes_equals_letters(scheme: str) -> None:
    sc = strategies.get(scheme)
    params = sc.init(8, 16)
    rng = np.random.default_rng(0)
    x, dout = (rng.standard_normal((16, 8)).astype(np.float32) for _ in range(2))
    letters, words = meshes(scheme)
    a, b = ss.run_strategy(scheme, letters, params, x, dout), ss.run_strategy(scheme, words, params, x, dout)
    assert a.out.tobytes() == b.out.tobytes()
    assert a.grads.keys() == b.grads.keys() and all(a.grads[k].tobytes() == b.grads[k].tobytes() for k in a.grads)
    assert [(op, rename(ax, scheme)) for op, ax in a.trace.collectives()] == b.trace.collectives()


@pytest.mark.parametrize("scheme", ["zero1", "fsdp", "fsdp_tp"])
def test_trainer_state_checkpoints_on_word_axes(scheme: str, tmp_path) -> None:
    params = mlp.init_stack(2, 8, 16, seed=2, dtype="float64")
    letters, words = meshes(scheme)
    data = batches(4)
    straight = Trainer(scheme, letters, params, Adam(lr=1e-2))
    for x, y in data:
        straight.step(x, y)
    first = Trainer(scheme, words, params, Adam(lr=1e-2))
    for x, y in data[:2]:
        first.step(x, y)
    path = checkpoint.save(tmp_path / "step_2", first.state())
    resumed = Trainer(scheme, meshes(scheme)[1], params, Adam(lr=1e-2))
    resumed.restore(checkpoint.load(path, resumed.mesh))
    assert resumed.step_count == 2
    for x, y in data[2:]:
        resumed.step(x, y)
    assert same_state(trainer_state(resumed), trainer_state(straight))
